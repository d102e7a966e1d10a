//! `bench --norm-ab`: the UNet step (SD 1.5's, or SDXL's with `--sdxl`) with GroupNorm's small
//! channels-last maps in one launch a norm or in three, and the skip connections joined by our
//! kernel or by burn's `cat`; `bench --context-ab`: with the prompt's keys and values projected
//! once for the generation or by each layer at every step; `bench --conv-tiles-ab`: the
//! channels-last convolutions on 128 × 128 tiles split by the fill rule, or tiled and split by
//! the GEMM's waves model as the linears are. Each replayed from a graph recorded under each
//! rule and interleaved over three rounds, each rule's output against the default's.

use anyhow::Result;
use latent_engine::Precision;
use latent_engine::kernels::concat;
use latent_engine::kernels::conv::{ConvRules, conv_rules, set_conv_rules};
use latent_engine::kernels::group_norm::{SLAB_MAX, set_slab_max, slab_max};
use latent_engine::kernels::matmul::{GemmKnobs, gemm_knobs, set_gemm_knobs};
use latent_engine::unet::graph::{context_once, set_context_once};

/// A rule: the largest slab (elements of one image's group) normalised in one launch, whether
/// our kernel joins the skip connections, whether the steps project the prompt's keys and values
/// once, the convolutions' rules, the GEMM's knobs, and its name.
struct Rule {
    slab_max: usize,
    join: bool,
    kv_once: bool,
    conv: ConvRules,
    gemm: GemmKnobs,
    name: String,
}

impl Rule {
    /// The defaults (the convolutions' rules in force), named.
    fn default_named(name: &str) -> Self {
        Self {
            slab_max: SLAB_MAX,
            join: true,
            kv_once: true,
            conv: conv_rules(),
            gemm: gemm_knobs(),
            name: name.into(),
        }
    }

    fn set(&self) {
        set_slab_max(self.slab_max);
        concat::set_on(self.join);
        set_context_once(self.kv_once);
        set_conv_rules(self.conv);
        set_gemm_knobs(self.gemm);
    }
}

/// Which rules an A/B compares.
#[derive(Debug, Clone, Copy)]
pub(super) enum RuleSet {
    /// GroupNorm's slab sizes and the skips' join (`--norm-ab`).
    Norm,
    /// The prompt's keys and values once a generation or every step (`--context-ab`).
    Context,
    /// The channels-last convolutions' tiles fixed or by the waves model (`--conv-tiles-ab`).
    ConvTiles,
}

impl RuleSet {
    /// The sets the flags ask for.
    pub(super) fn asked(norm: bool, context: bool, conv_tiles: bool) -> Vec<Self> {
        [
            (norm, Self::Norm),
            (context, Self::Context),
            (conv_tiles, Self::ConvTiles),
        ]
        .into_iter()
        .filter_map(|(on, set)| on.then_some(set))
        .collect()
    }

    /// The rules, the default first.
    fn rules(self) -> Vec<Rule> {
        match self {
            Self::Norm => norm_rules(),
            Self::Context => vec![
                Rule::default_named("keys and values projected once a generation (default)"),
                Rule {
                    kv_once: false,
                    ..Rule::default_named(
                        "keys and values projected by each layer at every step (before)",
                    )
                },
            ],
            Self::ConvTiles => vec![
                Rule::default_named(
                    "convolutions' tiles as in force (128 × 128, fill-rule splits)",
                ),
                Rule {
                    conv: ConvRules {
                        channels_last_tile: None,
                        ..conv_rules()
                    },
                    ..Rule::default_named("convolutions tiled and split by the waves model")
                },
                Rule {
                    gemm: GemmKnobs {
                        waves_fixed_tile: !gemm_knobs().waves_fixed_tile,
                        ..gemm_knobs()
                    },
                    ..Rule::default_named(if gemm_knobs().waves_fixed_tile {
                        "convolutions' fixed tiles split by the fill rule"
                    } else {
                        "convolutions' fixed tiles split by the waves model where it keeps them"
                    })
                },
            ],
        }
    }
}

/// GroupNorm's rules, the default first.
fn norm_rules() -> Vec<Rule> {
    let named = |max: usize, join: bool| {
        let norm = match max {
            0 => "GroupNorm in three launches everywhere (the kernels before)".to_string(),
            m => format!(
                "GroupNorm in one launch up to {} Ki elements a slab",
                m >> 10
            ),
        };
        let skips = if join { "our join" } else { "burn's cat" };
        let default = if max == SLAB_MAX && join {
            " (default)"
        } else {
            ""
        };
        format!("{norm}, skips by {skips}{default}")
    };
    [
        (SLAB_MAX, true),
        (SLAB_MAX, false),
        (0, true),
        (0, false),
        (1 << 18, true),
        (1 << 20, true),
    ]
    .into_iter()
    .map(|(slab_max, join)| Rule {
        slab_max,
        join,
        ..Rule::default_named(&named(slab_max, join))
    })
    .collect()
}

/// Runs `compare()` under each rule of `set` but the first (the default's output the
/// reference), then times each with `time`, interleaved; the rule in force before is restored
/// after each.
pub(super) fn norm_ab(
    precision: Precision,
    label: &str,
    set: RuleSet,
    compare: &mut dyn FnMut() -> Result<Vec<f32>>,
    time: &mut dyn FnMut() -> Result<f64>,
) -> Result<()> {
    let rules = set.rules();
    let before = Rule {
        slab_max: slab_max(),
        join: concat::on(),
        kv_once: context_once(),
        conv: conv_rules(),
        gemm: gemm_knobs(),
        name: String::new(),
    };
    let want = compare()?;
    for rule in rules.iter().skip(1) {
        rule.set();
        let got = compare();
        before.set();
        let diff = latent_engine::vae_compile::relative_difference(&got?, &want);
        println!(
            "[{label}] UNet step, {}: max relative difference from the default {diff:.2e}",
            rule.name
        );
    }
    let names: Vec<&str> = rules.iter().map(|r| r.name.as_str()).collect();
    let what = format!("{label} {set:?} rule (replayed)");
    super::unet::interleaved(precision, &what, &names, 3, |i| {
        rules[i].set();
        let ms = time();
        before.set();
        ms
    })
}
