//! `bench --norm-ab`: the UNet step (SD 1.5's, or SDXL's with `--sdxl`) with GroupNorm's small
//! channels-last maps in one launch a norm or in three, replayed from a graph recorded under
//! each rule and interleaved over three rounds, each rule's output against the default's.

use anyhow::Result;
use latent_engine::Precision;
use latent_engine::kernels::group_norm::{SLAB_MAX, set_slab_max, slab_max};

/// The largest slab (elements of one image's group) each rule normalises in one launch, the
/// default first, and its name.
pub(super) fn rules() -> Vec<(usize, String)> {
    let named = |max: usize| match max {
        0 => "three launches everywhere (the kernels before)".to_string(),
        m if m == SLAB_MAX => format!("one launch up to {} Ki elements a slab (default)", m >> 10),
        m => format!("one launch up to {} Ki elements a slab", m >> 10),
    };
    [SLAB_MAX, 0, 1 << 18, 1 << 20]
        .into_iter()
        .map(|m| (m, named(m)))
        .collect()
}

/// Runs `compare(i)` (rule `i` set) for each rule but the first, then times each with `time`,
/// interleaved; the rule in force before is restored after each.
pub(super) fn norm_ab(
    precision: Precision,
    label: &str,
    mut compare: impl FnMut() -> Result<Vec<f32>>,
    mut time: impl FnMut() -> Result<f64>,
) -> Result<()> {
    let rules = rules();
    let before = slab_max();
    let want = compare()?;
    for (max, name) in rules.iter().skip(1) {
        set_slab_max(*max);
        let got = compare();
        set_slab_max(before);
        let diff = latent_engine::vae_compile::relative_difference(&got?, &want);
        println!(
            "[{label}] UNet step, GroupNorm rule {name}: max relative difference from the default {diff:.2e}"
        );
    }
    let names: Vec<&str> = rules.iter().map(|r| r.1.as_str()).collect();
    let what = format!("{label} GroupNorm rule (replayed)");
    super::unet::interleaved(precision, &what, &names, 3, |i| {
        set_slab_max(rules[i].0);
        let ms = time();
        set_slab_max(before);
        ms
    })
}
