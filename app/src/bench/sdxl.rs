//! SDXL at its native size on random full-size weights (f16): the UNet step at 128² latents
//! (batch 2, CFG) with its added conditioning, as `bench/torch_anchor.py`'s `sdxl` part runs it,
//! and a whole 1024² txt2img (both encoders, the steps, the decode), as its `sdxl_e2e` part does,
//! with the memory pool's high-water mark (issue 15 asks for at most 8 GiB, decode included;
//! `bench/gpu_issue13.sh` samples the process's true peak from outside).

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::Result;
use burn::tensor::{Device, Distribution, Tensor};
use latent_engine::checkpoint::ModelConfig;
use latent_engine::pipeline::{
    DecodeOptions, Quiet, SizeConditioning, Txt2ImgRequest, decode, txt2img,
};
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::vae_tiling::{TilingConfig, TilingMode};
use latent_engine::{Precision, StableDiffusion};

use super::args::BenchArgs;
use super::{bench_request, sync, time_ms};

/// With `--pipeline-only`, the txt2img alone: its runs' high-water mark is then the run's own.
pub(super) fn sdxl_bench(
    device: &Device,
    tokenizer: &ClipTokenizer,
    args: &BenchArgs,
) -> Result<()> {
    let (runs, steps, size) = (args.runs, args.steps, args.sdxl_size);
    let precision = Precision::F16;
    let dtype = precision.dtype();
    let t = Instant::now();
    let model =
        StableDiffusion::random_with(&ModelConfig::sdxl(), device, precision, args.text_encoders)?;
    sync(device)?;
    println!(
        "[SDXL] build full-size SDXL (random weights, f16, text encoders {}): {:.0} ms",
        if model.parked() {
            "parked in host memory"
        } else {
            "on the device"
        },
        t.elapsed().as_secs_f64() * 1e3
    );
    memory(device, "the weights loaded");
    if args.pipeline_only {
        return txt2img_runs(device, tokenizer, &model, [steps, runs, size]);
    }
    let normal = Distribution::Normal(0.0, 1.0);
    let latent = size / model.config.vae.downscale();
    let context = model.config.unet.cross_attention_dim;
    let x = Tensor::<4>::random([2, 4, latent, latent], normal, (device, dtype));
    let ctx = Tensor::<3>::random([2, 77, context], normal, (device, dtype));
    let pooled_width = model
        .text_encoder_2
        .as_ref()
        .and_then(|te| te.config().projection_dim)
        .ok_or_else(|| anyhow::anyhow!("the SDXL model has no projected second text encoder"))?;
    let pooled = Tensor::<2>::random([2, pooled_width], normal, (device, dtype));
    let ids = SizeConditioning::of_image(size, size).time_ids();
    let added = model.unet.added_conditioning(&pooled, &[ids; 2])?;
    let unet = time_ms(device, 2, runs, || {
        let _ = model.unet.forward_added(x.clone(), &[500.0], &ctx, &added);
    })?;
    println!("[SDXL] UNet step, batch 2 (CFG), {latent}x{latent} latents: median {unet:.2} ms");
    memory(device, "after the UNet steps");
    if let Some(steps) = args.kernel_profile {
        super::profile::kernel_profile_of(device, "SDXL", steps, || {
            let _ = model.unet.forward_added(x.clone(), &[500.0], &ctx, &added);
        })?;
    }
    drop((x, ctx, pooled, added));
    // The decode alone, tiled first (the pool's high-water mark only rises): how much of the
    // txt2img's peak the whole-image decode is.
    let z = Tensor::<4>::random([1, 4, latent, latent], normal, (device, dtype));
    for (name, mode) in [
        ("tiled (64-latent tiles)", TilingMode::Always),
        ("whole", TilingMode::Never),
    ] {
        let options = DecodeOptions {
            tiling: TilingConfig::with_mode(mode),
            compile: true,
        };
        decode(&model, z.clone(), &options, &mut Quiet)?;
        let ms = time_ms(device, 0, runs.min(3), || {
            let _ = decode(&model, z.clone(), &options, &mut Quiet);
        })?;
        println!("[SDXL] VAE decode {size}x{size}, {name}: median {ms:.1} ms");
        memory(device, &format!("after the {name} decode"));
    }
    if !args.no_pipeline {
        txt2img_runs(device, tokenizer, &model, [steps, runs, size])?;
    }
    Ok(())
}

/// A first `size`² txt2img (its errors surface), two timed (unless `runs` is 1), and the pool.
fn txt2img_runs(
    device: &Device,
    tokenizer: &ClipTokenizer,
    model: &StableDiffusion,
    [steps, runs, size]: [usize; 3],
) -> Result<()> {
    {
        let req = Txt2ImgRequest {
            width: size,
            height: size,
            ..bench_request(steps)
        };
        let cancel = AtomicBool::new(false);
        // The first run's errors surface (the timed runs' results are dropped).
        let t = Instant::now();
        txt2img(model, tokenizer, &req, &cancel, &mut Quiet)?;
        println!(
            "[SDXL] txt2img {size}x{size}, {steps} Euler steps, CFG 7.5, first run: {:.0} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
        memory(device, "after the first txt2img");
        // `--runs 1`: the first run only (a slow adapter's memory measurement).
        if runs > 1 {
            let total = time_ms(device, 0, 2, || {
                let _ = txt2img(model, tokenizer, &req, &cancel, &mut Quiet);
            })?;
            println!(
                "[SDXL] txt2img {size}x{size}, {steps} Euler steps, CFG 7.5: median {total:.0} ms"
            );
            memory(device, "after the txt2img runs");
        }
    }
    Ok(())
}

/// The memory pool's bytes in use and reserved (its high-water mark: pages are kept) at `when`.
fn memory(device: &Device, when: &str) {
    if let Some(usage) = device.memory_pool_usage() {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        println!(
            "[SDXL] device memory {when}: {:.2} GiB in use, {:.2} GiB reserved (pool high-water mark)",
            gib(usage.bytes_in_use),
            gib(usage.bytes_reserved)
        );
    }
}
