//! `latent-studio bench`: full-size SD 1.5 with random weights, timed per component. Medians over
//! repeated runs after warm-up (the first runs compile and autotune kernels).

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::{Context, Result};
use burn::tensor::{Device, Distribution, Tensor};
use clap::Args;
use latent_engine::checkpoint::ModelConfig;
use latent_engine::device::DeviceChoice;
use latent_engine::pipeline::{Quiet, Txt2ImgRequest, txt2img};
use latent_engine::schedulers::{SamplerKind, Schedule};
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::{Precision, StableDiffusion};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// auto, cpu, gpu or gpu:N.
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
    /// Precisions to measure, comma separated.
    #[arg(long, default_value = "f32,f16", value_delimiter = ',')]
    precision: Vec<Precision>,
    /// Timed repetitions per measurement.
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// Steps of the end-to-end run.
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Skip the end-to-end txt2img run.
    #[arg(long)]
    no_pipeline: bool,
}

fn sync(device: &Device) -> Result<()> {
    device.sync().map_err(|e| anyhow::anyhow!("device sync failed: {e:?}"))
}

/// Median wall time in ms of `f` (which must enqueue work), synchronising after each run.
fn time_ms(device: &Device, warmup: usize, runs: usize, mut f: impl FnMut()) -> Result<f64> {
    for _ in 0..warmup {
        f();
        sync(device)?;
    }
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        f();
        sync(device)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

pub fn run(args: BenchArgs) -> Result<()> {
    let device = latent_engine::device::create(args.device).context("creating the device")?;
    println!("device: {device:?}");
    let config = ModelConfig::sd15();
    let tokenizer = ClipTokenizer::new()?;
    for &precision in &args.precision {
        let dtype = precision.dtype();
        let t = Instant::now();
        let model = StableDiffusion::random(&config, &device, precision)?;
        sync(&device)?;
        println!("[{precision:?}] build full-size SD 1.5 (random weights): {:.0} ms", t.elapsed().as_secs_f64() * 1e3);

        let ids = vec![tokenizer.encode_padded("a photograph of an astronaut riding a horse").ids.to_vec()];
        let clip = time_ms(&device, 2, args.runs, || {
            let _ = model.text_encoder.forward(&ids, 1);
        })?;
        println!("[{precision:?}] CLIP encode (1x77): median {clip:.2} ms");

        let x = Tensor::<4>::random([2, 4, 64, 64], Distribution::Normal(0.0, 1.0), (&device, dtype));
        let ctx = Tensor::<3>::random([2, 77, 768], Distribution::Normal(0.0, 1.0), (&device, dtype));
        let unet = time_ms(&device, 3, args.runs, || {
            let _ = model.unet.forward(x.clone(), &[500.0], &ctx);
        })?;
        println!("[{precision:?}] UNet step, batch 2 (CFG), 64x64 latents: median {unet:.2} ms");

        let z = Tensor::<4>::random([1, 4, 64, 64], Distribution::Normal(0.0, 1.0), (&device, dtype));
        let vae = time_ms(&device, 2, args.runs.min(5), || {
            let _ = model.vae.decode(z.clone());
        })?;
        println!("[{precision:?}] VAE decode 512x512: median {vae:.2} ms");

        if !args.no_pipeline {
            let req = Txt2ImgRequest {
                prompt: "a photograph of an astronaut riding a horse".into(),
                steps: args.steps,
                cfg_scale: 7.5,
                sampler: SamplerKind::Euler,
                schedule: Schedule::Normal,
                ..Default::default()
            };
            let cancel = AtomicBool::new(false);
            let total = time_ms(&device, 1, 3, || {
                let _ = txt2img(&model, &tokenizer, &req, &cancel, &mut Quiet);
            })?;
            println!("[{precision:?}] txt2img 512x512, {} Euler steps, CFG 7.5: median {total:.0} ms", args.steps);
        }
        if let Some(usage) = device.memory_pool_usage() {
            println!(
                "[{precision:?}] device memory reserved (pool high-water mark): {:.2} GiB",
                usage.bytes_reserved as f64 / (1u64 << 30) as f64
            );
        }
        drop(model);
        device.memory_cleanup();
    }
    Ok(())
}
