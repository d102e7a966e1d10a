//! The VAE mid block's 512-wide head: each of our kernels against the sliced matmuls, and the
//! whole compiled decode with either.

use anyhow::Result;
use burn::tensor::{DType, Device, Distribution, Tensor};
use latent_engine::{Precision, StableDiffusion};

use super::time_ms;

/// The VAE mid block's single 512-wide head over a 64×64 latent (a 512² decode) and a 128×128
/// one (SDXL's 1024²): the sliced matmuls (burn's, the score matrix bounded) against each of our
/// tilings that fits, timed and compared.
pub fn vae_attention_report(
    device: &Device,
    dtype: DType,
    precision: Precision,
    runs: usize,
) -> Result<()> {
    use latent_engine::attention::{Heads, wide_head_attention};
    use latent_engine::kernels::attention::{attention_planned, plans};
    let d = 512;
    // The mid block's tokens at 512² (64² latents) and at 1024² (SDXL's 128²).
    for n in [4096, 16384] {
        let flops = 4.0 * (n * n * d) as f64;
        let make =
            || Tensor::<3>::random([1, n, d], Distribution::Normal(0.0, 1.0), (device, dtype));
        let (q, k, v) = (make(), make(), make());
        let runs = if n > 4096 { runs.min(3) } else { runs };
        let ms = time_ms(device, 1, runs, || {
            let _ = wide_head_attention(q.clone(), k.clone(), v.clone());
        })?;
        let tflops = |ms: f64| flops / (ms * 1e-3) / 1e12;
        println!(
            "[{precision:?}] VAE attention 1x512 q{n} k{n}: the sliced matmuls {ms:.3} ms ({:.1} TFLOP/s)",
            tflops(ms)
        );
        let want = super::read_f32(wide_head_attention(q.clone(), k.clone(), v.clone()))?;
        let at = |tensor| Heads { tensor, column: 0 };
        for plan in plans(device, dtype, d) {
            let Some(out) = attention_planned(at(&q), at(&k), at(&v), 1, d, plan) else {
                continue;
            };
            let rel =
                latent_engine::vae_compile::relative_difference(&super::read_f32(out)?, &want);
            let ms = time_ms(device, 1, runs, || {
                let _ = attention_planned(at(&q), at(&k), at(&v), 1, d, plan);
            })?;
            println!(
                "[{precision:?}]   ours {plan}: {ms:.3} ms ({:.1} TFLOP/s), max rel diff from the sliced matmuls {rel:.1e}",
                tflops(ms)
            );
        }
    }
    Ok(())
}

/// The compiled decode with the mid block's 512-wide head on ours (where the device takes it:
/// the wide-head kernel on cooperative matrices) or on the sliced matmuls: at 512², replayed from
/// a graph recorded under each rule (as the pipeline decodes), interleaved over five rounds, and
/// each rule's kernels by class; at 1024² (SDXL's size, whole) launch by launch, three rounds.
/// Outputs compared.
pub fn vae_wide_heads_ab(
    model: &StableDiffusion,
    device: &Device,
    precision: Precision,
    runs: usize,
    kernel_profile: Option<usize>,
) -> Result<()> {
    use latent_engine::kernels::attention::set_wide_heads;
    use latent_engine::nn::Kernels;
    let vae = &model.vae;
    let rules = ["the sliced matmuls", "ours where the device takes it"];
    let set = |ours: bool| set_wide_heads(ours, false);
    for side in [64, 128] {
        let z = Tensor::<4>::random(
            [1, 4, side, side],
            Distribution::Normal(0.0, 1.0),
            (device, precision.dtype()),
        );
        let size = side * 8;
        let mut outs = Vec::new();
        for ours in [false, true] {
            set(ours);
            outs.push(super::read_f32(vae.decode_with(z.clone(), Kernels::Fused))?);
        }
        let rel = latent_engine::vae_compile::relative_difference(&outs[1], &outs[0]);
        let replayed = side == 64;
        let mut times = vec![Vec::new(); 2];
        for _ in 0..if replayed { 5 } else { 3 } {
            for (i, ours) in [false, true].into_iter().enumerate() {
                set(ours);
                // A recording holds the rule it was made under: made afresh for each.
                vae.recording().release();
                let ms = time_ms(device, 2, runs.min(5), || {
                    let _ = match replayed {
                        true => vae.decode_compiled(z.clone()),
                        false => vae.decode_with(z.clone(), Kernels::Fused),
                    };
                });
                times[i].push(ms?);
            }
        }
        vae.recording().release();
        let how = if replayed {
            "replayed"
        } else {
            "whole, launch by launch"
        };
        super::unet::print_rounds(
            precision,
            &format!("VAE decode {size}x{size} compiled, {how}, mid block's head on"),
            &rules,
            &times,
        );
        println!(
            "[{precision:?}] VAE decode {size}x{size}, ours against the sliced matmuls: max rel diff {rel:.1e}"
        );
        if let (Some(decodes), true) = (kernel_profile, replayed) {
            for (rule, ours) in rules.iter().zip([false, true]) {
                set(ours);
                super::profile::kernel_profile_of(
                    device,
                    &format!("{precision:?} VAE {size}, head on {rule}"),
                    decodes,
                    || {
                        let _ = vae.decode_with(z.clone(), Kernels::Fused);
                    },
                )?;
            }
        }
    }
    set_wide_heads(true, false);
    Ok(())
}
