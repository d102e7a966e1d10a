//! The bench's A/Bs of the kernels that run on plain lanes (no cooperative matrices, or f32):
//! the per-row attention and SIMT convolution rules (`--simt-ab`, `--simt-conv`) and the linears'
//! products (`--product-ab`, `--simt-linears`), each on the same replayed step.

use anyhow::Result;
use burn::tensor::{Device, Tensor};
use latent_engine::{Precision, StableDiffusion};

use super::unet::{interleaved, step_ms};

/// The same step, same process, with the per-row attention's two query rows a lane off (the
/// default gives them from [`ROWS_PAIRS_MIN_QUERIES`] queries on) and with f16's SIMT
/// convolution in 8 × 8 lane blocks, 16 deep with prefetch (f32's rule), 32 deep (f16's
/// staging) or 16 deep without prefetch, and in 4 × 4 blocks 16 deep with and without
/// prefetch, interleaved over five rounds. Where no layer takes the SIMT kernels (cooperative
/// matrices in f16) the rounds are alike; in f32 only the `-16n` rules differ from the default
/// (they turn the prefetch off for f32 too).
///
/// [`ROWS_PAIRS_MIN_QUERIES`]: latent_engine::kernels::attention::ROWS_PAIRS_MIN_QUERIES
pub(super) fn simt_ab(
    model: &StableDiffusion,
    device: &Device,
    precision: Precision,
    runs: usize,
    x: &Tensor<4>,
    ctx: &Tensor<3>,
) -> Result<()> {
    use latent_engine::kernels::attention::{ROWS_PAIRS_MIN_QUERIES, set_rows_pairs};
    use latent_engine::kernels::conv::{conv_rules, set_conv_rules};
    let d = conv_rules();
    let rules = |choice| simt_conv(choice).unwrap_or(d);
    let pairs = ROWS_PAIRS_MIN_QUERIES;
    let variants = [
        ("default", pairs, d),
        ("attention: one row a lane", usize::MAX, d),
        ("f16 conv 4 x 4, 16 deep, prefetch", pairs, rules("4x4-16")),
        ("f16 conv 8 x 8, 16 deep, prefetch", pairs, rules("8x8-16")),
        ("f16 conv 8 x 8, 32 deep", pairs, rules("8x8")),
        (
            "f16 conv 8 x 8, 16 deep, no prefetch",
            pairs,
            rules("8x8-16n"),
        ),
        (
            "f16 conv 4 x 4, 16 deep, no prefetch",
            pairs,
            rules("4x4-16n"),
        ),
    ];
    let names: Vec<&str> = variants.iter().map(|v| v.0).collect();
    interleaved(precision, "SIMT kernels", &names, 5, |i| {
        set_rows_pairs(variants[i].1);
        set_conv_rules(variants[i].2);
        let ms = step_ms(model, device, runs, x, ctx);
        set_rows_pairs(ROWS_PAIRS_MIN_QUERIES);
        set_conv_rules(d);
        ms
    })
}

/// The f16 SIMT convolution rules for `--simt-conv`: `4x4` (the default: 4 × 4 lane blocks, 32
/// reduction indices a step), `8x8` (8 × 8 blocks where 128 channels divide the layer), and
/// each with `-16`: 16 indices a step with the next one prefetched (f32's staging), or `-16n`:
/// 16 without the prefetch (the fewest registers live across the products; in f32 too).
pub(super) fn simt_conv(choice: &str) -> Option<latent_engine::kernels::conv::ConvRules> {
    let (wide, deep, prefetch) = match choice.trim() {
        "4x4" => (false, true, true),
        "4x4-16" => (false, false, true),
        "4x4-16n" => (false, false, false),
        "8x8" => (true, true, true),
        "8x8-16" => (true, false, true),
        "8x8-16n" => (true, false, false),
        _ => return None,
    };
    Some(latent_engine::kernels::conv::ConvRules {
        simt_wide_f16: wide,
        simt_deep_f16: deep,
        simt_prefetch: prefetch,
        ..latent_engine::kernels::conv::ConvRules::DEFAULT
    })
}

/// The product rules for `--simt-linears`: `burn`, `4x4` or `8x8` on every card (`4x4v`,
/// `8x8v`: the staging read as vectors; `4x4vp`, `8x8vp`: and the next step prefetched).
pub(super) fn simt_linears(choice: &str) -> Option<latent_engine::kernels::matmul::ProductRules> {
    let (on, wide, vector, prefetch) = match choice.trim() {
        "burn" => (false, false, false, false),
        "4x4" => (true, false, false, false),
        "8x8" => (true, true, false, false),
        "4x4v" => (true, false, true, false),
        "8x8v" => (true, true, true, false),
        "4x4vp" => (true, false, true, true),
        "8x8vp" => (true, true, true, true),
        _ => return None,
    };
    Some(latent_engine::kernels::matmul::ProductRules {
        f32_cards: on,
        f16_cards: on,
        wide,
        vector,
        prefetch,
    })
}

/// `--product-ab`'s choices when none are named.
pub(super) const PRODUCT_AB_DEFAULT: &str = "burn,4x4,8x8,4x4v,8x8v";

/// The same step, same process, with the linears on each of `choices` ([`simt_linears`]:
/// burn's matmul or the SIMT product in 4 × 4 or 8 × 8 lane blocks, staged as scalars or
/// vectors; where the product's rules reach, elsewhere the rounds are alike), interleaved over
/// five rounds.
pub(super) fn product_ab(
    model: &StableDiffusion,
    device: &Device,
    precision: Precision,
    runs: usize,
    x: &Tensor<4>,
    ctx: &Tensor<3>,
    choices: &[String],
) -> Result<()> {
    use latent_engine::kernels::matmul::{product_rules, set_product_rules};
    let d = product_rules();
    let mut rules = Vec::new();
    for choice in choices {
        let r = simt_linears(choice)
            .ok_or_else(|| anyhow::anyhow!("--product-ab {choice}: see --simt-linears"))?;
        rules.push(r);
    }
    let names: Vec<String> = choices.iter().map(|c| format!("linears {c}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    interleaved(precision, "linear product", &names, 5, |i| {
        set_product_rules(rules[i]);
        let ms = step_ms(model, device, runs, x, ctx);
        set_product_rules(d);
        ms
    })
}

#[cfg(test)]
mod tests {
    use super::{simt_conv, simt_linears};

    /// Every name `--simt-linears` and `--product-ab` document parses to its rules; anything
    /// else is refused (the caller turns `None` into an error naming the choices).
    #[test]
    fn linear_choices_parse_or_are_refused() {
        let burn = simt_linears("burn").expect("burn");
        assert!(!burn.f16_cards && !burn.f32_cards);
        let vp = simt_linears(" 8x8vp ").expect("8x8vp");
        assert!(vp.f16_cards && vp.wide && vp.vector && vp.prefetch);
        let plain = simt_linears("4x4").expect("4x4");
        assert!(plain.f32_cards && !plain.wide && !plain.vector && !plain.prefetch);
        for choice in super::PRODUCT_AB_DEFAULT.split(',') {
            assert!(simt_linears(choice).is_some(), "{choice}");
        }
        for bad in ["", "4x4x", "16x16", "BURN4"] {
            assert!(simt_linears(bad).is_none(), "{bad:?}");
        }
        // `--simt-conv`: the f16 convolution's blocks and staging depth.
        let d = latent_engine::kernels::conv::ConvRules::DEFAULT;
        assert_eq!(simt_conv("4x4"), Some(d), "the default");
        let wide16 = simt_conv("8x8-16").expect("8x8-16");
        assert!(wide16.simt_wide_f16 && !wide16.simt_deep_f16);
        assert!(simt_conv("8x8").expect("8x8").simt_deep_f16);
        let lean = simt_conv("8x8-16n").expect("8x8-16n");
        assert!(lean.simt_wide_f16 && !lean.simt_deep_f16 && !lean.simt_prefetch);
        // Every choice `--simt-ab` names (a typo there would silently time the default).
        for choice in ["4x4-16", "8x8-16", "8x8", "8x8-16n", "4x4-16n"] {
            assert!(simt_conv(choice).is_some(), "{choice}");
        }
        for bad in ["", "8x8-32", "wide"] {
            assert!(simt_conv(bad).is_none(), "{bad:?}");
        }
    }
}
