//! `latent-studio bench`: full-size SD 1.5 with random weights, timed per component. Medians over
//! repeated runs after warm-up (the first runs compile and autotune kernels).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result};
use burn::tensor::{Device, Distribution, Tensor};
use latent_engine::checkpoint::ModelConfig;
use latent_engine::checkpoint::Weights;
use latent_engine::nn::Kernels;
use latent_engine::pipeline::{Quiet, Txt2ImgRequest, txt2img};
use latent_engine::preview::{
    Frame, FrameSink, FrameStore, PreviewMethod, PreviewSettings, Previewer,
};
use latent_engine::schedulers::{SamplerKind, Schedule};
use latent_engine::taesd::{TaesdConfig, TaesdDecoder};
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::{Precision, StableDiffusion};

mod args;
mod attention_ceiling;
mod cache;
mod ceiling;
mod conv;
mod kernels;
mod linear;
mod lora;
mod norm;
mod pipeline;
mod profile;
mod refiner;
mod sdxl;
mod simt;
mod unet;
mod vae;
mod workgroup;

pub use args::BenchArgs;

/// The benchmarked txt2img: 512², Euler, CFG 7.5, as the PyTorch anchor runs it.
fn bench_request(steps: usize) -> Txt2ImgRequest {
    Txt2ImgRequest {
        prompt: "a photograph of an astronaut riding a horse".into(),
        steps,
        cfg_scale: 7.5,
        sampler: SamplerKind::Euler,
        schedule: Schedule::Normal,
        // As the CLI and the studio decode by default.
        decode: latent_engine::pipeline::DecodeOptions {
            compile: true,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A tensor's values as f32 on the host.
fn read_f32<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>> {
    t.cast(burn::tensor::DType::F32)
        .into_data()
        .try_to_vec::<f32>()
        .map_err(|e| anyhow::anyhow!("{e:?}"))
}

fn sync(device: &Device) -> Result<()> {
    device
        .sync()
        .map_err(|e| anyhow::anyhow!("device sync failed: {e:?}"))
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
    // Before anything reads cubecl's configuration: where autotune writes its decisions.
    let decisions_path = args
        .decisions
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("latent-studio-autotune-decisions.jsonl"));
    let mut decisions = kernels::DecisionLog::install(&decisions_path);
    if decisions.is_none() {
        eprintln!("warning: autotune decisions are not logged; kernels will not be named");
    }
    let (_, device) = latent_studio::probe::open_device(
        &args.device,
        false,
        latent_engine::device::DEFAULT_TIMEOUT,
        &mut latent_studio::probe::print_note,
    )
    .context("opening the device")?;
    println!("device: {device:?}");
    match latent_engine::compiler::of_device(&device) {
        Some(c) => println!("shader compiler: {c} (runtime {})", c.runtime),
        None => println!("shader compiler: none (burn's CPU backend)"),
    }
    let mut config = ModelConfig::sd15();
    if args.unet_divisor > 1 {
        let unet = &mut config.unet;
        for c in &mut unet.block_out_channels {
            *c /= args.unet_divisor;
        }
        unet.validate()
            .map_err(|e| anyhow::anyhow!("--unet-divisor {}: {e}", args.unet_divisor))?;
    }
    let tokenizer = ClipTokenizer::new()?;
    args.apply_kernel_rules()?;
    if let Some(path) = &args.cache_model {
        return cache::cache_bench(&args, path, &device, &tokenizer);
    }
    if args.sdxl && args.attention_only {
        return kernels::attention_report(
            &kernels::long_attention_shapes(),
            &device,
            Precision::F16,
            args.runs,
        );
    }
    if args.sdxl {
        return sdxl::sdxl_bench(&device, &tokenizer, &args);
    }
    for &precision in &args.precision {
        let dtype = precision.dtype();
        if args.attention_only {
            kernels::attention_report(
                &kernels::sd15_attention_shapes(),
                &device,
                precision,
                args.runs,
            )?;
            continue;
        }
        if args.mma_ceiling {
            ceiling::report(&device, precision, args.runs)?;
            continue;
        }
        if args.workgroup_gemm {
            workgroup::report(&device, args.runs)?;
            continue;
        }
        if args.attention_ceiling {
            attention_ceiling::report(&device, precision, args.runs)?;
            continue;
        }
        if args.gemm_only {
            // A large square product first (counted 0 times in the sums): the kernel's peak.
            let peak = linear::linear_shape(4096, 4096, 4096, false);
            let shapes: Vec<_> = std::iter::once((peak, 0))
                .chain(linear::sd15_linear_shapes())
                .collect();
            linear::gemm_report(&shapes, &device, precision, args.runs)?;
            conv::gemm_report(&kernels::sd15_conv_shapes(), &device, precision, args.runs)?;
            conv::gemm_report(&kernels::vae_conv_shapes(), &device, precision, args.runs)?;
            continue;
        }
        if args.linear_only {
            linear::report(
                &linear::sd15_linear_shapes(),
                &device,
                dtype,
                precision,
                args.runs,
            )?;
            continue;
        }
        if args.conv_only {
            conv::report(
                &kernels::sd15_conv_shapes(),
                &device,
                dtype,
                precision,
                args.runs,
            )?;
            continue;
        }
        let t = Instant::now();
        let model = StableDiffusion::random(&config, &device, precision)?;
        sync(&device)?;
        println!(
            "[{precision:?}] build full-size SD 1.5 (random weights): {:.0} ms",
            t.elapsed().as_secs_f64() * 1e3
        );

        if args.vae_only {
            vae_bench(&model, &device, precision, args.runs, args.kernel_profile)?;
            if args.conv_ab {
                conv::vae_ab(&model.vae, &device, precision, args.runs)?;
            }
            continue;
        }
        if args.pipeline_only {
            let req = bench_request(args.steps);
            let cancel = AtomicBool::new(false);
            // The process's first: its kernels tune here, unless an earlier launch's tuning was
            // restored (`device::tuning`).
            let restored = latent_engine::device::tuning::restored().entries;
            let t = Instant::now();
            txt2img(&model, &tokenizer, &req, &cancel, &mut Quiet)?;
            sync(&device)?;
            println!(
                "[{precision:?}] first txt2img in this process ({restored} tuning results restored): {:.0} ms",
                t.elapsed().as_secs_f64() * 1e3
            );
            let total = time_ms(&device, 0, args.runs, || {
                let _ = txt2img(&model, &tokenizer, &req, &cancel, &mut Quiet);
            })?;
            println!(
                "[{precision:?}] txt2img 512x512, {} Euler steps, CFG 7.5: median {total:.0} ms",
                args.steps
            );
            continue;
        }
        let ids = vec![
            tokenizer
                .encode_padded("a photograph of an astronaut riding a horse")
                .ids
                .to_vec(),
        ];
        let clip = time_ms(&device, 2, args.runs, || {
            let _ = model.text_encoder.forward(&ids, 1);
        })?;
        println!("[{precision:?}] CLIP encode (1x77): median {clip:.2} ms");

        if !args.no_ops {
            kernels::unet_report(&model, &device, precision, args.runs, decisions.as_mut())?;
        }

        let x = Tensor::<4>::random(
            [2, 4, 64, 64],
            Distribution::Normal(0.0, 1.0),
            (&device, dtype),
        );
        let ctx = Tensor::<3>::random(
            [2, 77, 768],
            Distribution::Normal(0.0, 1.0),
            (&device, dtype),
        );
        let base_unet = model.unet()?;
        let unet = time_ms(&device, 3, args.runs, || {
            let _ = base_unet.forward(x.clone(), &[500.0], &ctx);
        })?;
        println!("[{precision:?}] UNet step, batch 2 (CFG), 64x64 latents: median {unet:.2} ms");
        // Host-bound or device-bound: how long enqueueing one step takes on this thread, against
        // the step with its sync. Enqueue close to the whole means the GPU waits on the host.
        let mut enqueue = Vec::new();
        for _ in 0..args.runs.max(1) {
            let t = Instant::now();
            let _ = model.unet()?.forward(x.clone(), &[500.0], &ctx);
            enqueue.push(t.elapsed().as_secs_f64() * 1e3);
            sync(&device)?;
        }
        enqueue.sort_by(f64::total_cmp);
        println!(
            "[{precision:?}]   host time to enqueue one step (no sync): median {:.2} ms",
            enqueue[enqueue.len() / 2]
        );
        let label = format!("{precision:?}");
        unet::graph_bench(&model, &device, &label, args.runs, &x, &ctx, None, unet)?;
        if let Some(steps) = args.kernel_profile {
            profile::kernel_profile(&model, &device, precision, steps, &x, &ctx)?;
            if args.profile_linears {
                // The linears on the other product, then back: device time, not wall time.
                use latent_engine::kernels::matmul::{mma_linears, set_mma_linears};
                let first = mma_linears();
                for on in [!first, first] {
                    set_mma_linears(on);
                    println!(
                        "[{precision:?}] linears on {}:",
                        if on { "our GEMM" } else { "burn's matmul" }
                    );
                    profile::kernel_profile(&model, &device, precision, steps, &x, &ctx)?;
                }
            }
        }
        if args.planes_ab {
            unet::planes_ab(&model, &device, precision, args.runs, &x, &ctx)?;
        }
        if args.rows_ab {
            let read = || read_f32(model.unet()?.forward(x.clone(), &[500.0], &ctx));
            unet::rows_ab(precision, Some(&read), |_| {
                unet::step_ms(&model, &device, args.runs, &x, &ctx)
            })?;
        }
        if args.conv_ab {
            unet::conv_ab(&model, &device, precision, args.runs, &x, &ctx)?;
        }
        if args.simt_ab {
            simt::simt_ab(&model, &device, precision, args.runs, &x, &ctx)?;
        }
        if let Some(choices) = &args.product_ab {
            simt::product_ab(&model, &device, precision, args.runs, &x, &ctx, choices)?;
        }
        if args.gemm_ab {
            unet::gemm_ab(&model, &device, precision, args.runs, &x, &ctx)?;
        }
        for set in norm::RuleSet::asked(args.norm_ab, args.context_ab, args.conv_tiles_ab) {
            norm::norm_ab(
                precision,
                &format!("{precision:?}"),
                set,
                &mut || unet::replayed_output(&model, &device, &x, &ctx, None),
                &mut || unet::step_ms(&model, &device, args.runs, &x, &ctx),
            )?;
        }
        if let Some(rank) = args.lora_rank {
            lora::lora_bench(&model, &device, precision, rank, args.runs, &x, &ctx)?;
        }
        if latent_engine::kernels::available(&device) && !args.no_burn_ops {
            // The same step with burn ops where our kernels (GroupNorm+SiLU, LayerNorm) run.
            let read = read_f32::<4>;
            let ours = read(model.unet()?.forward(x.clone(), &[500.0], &ctx));
            latent_engine::kernels::set_enabled(false);
            let base_unet = model.unet()?;
            let plain = time_ms(&device, 3, args.runs, || {
                let _ = base_unet.forward(x.clone(), &[500.0], &ctx);
            });
            let burn_out = read(model.unet()?.forward(x.clone(), &[500.0], &ctx));
            latent_engine::kernels::set_enabled(true);
            let plain = plain?;
            // Every kernel of ours against burn's ops on the whole step: a wrong kernel shows
            // as a difference of the order of the output, not of f16 rounding.
            let diff = latent_engine::vae_compile::relative_difference(&ours?, &burn_out?);
            println!(
                "[{precision:?}] UNet step with burn ops instead of our kernels: median {plain:.2} ms (ours {:+.1}%); ours against it: max relative difference {diff:.2e}",
                (unet / plain - 1.0) * 100.0
            );
        }
        if args.unet_only {
            continue;
        }
        if !args.no_profile {
            let dev = device.clone();
            let profile = model
                .unet()?
                .forward_profiled(x.clone(), &[500.0], &ctx, &|| {
                    let _ = dev.sync();
                });
            for (block, t) in profile {
                println!(
                    "[{precision:?}]   UNet {block:<28} {:8.2} ms",
                    t.as_secs_f64() * 1e3
                );
            }
        }

        vae_bench(&model, &device, precision, args.runs, None)?;
        if args.conv_ab {
            conv::vae_ab(&model.vae, &device, precision, args.runs)?;
        }
        let z = Tensor::<4>::random(
            [1, 4, 64, 64],
            Distribution::Normal(0.0, 1.0),
            (&device, dtype),
        );
        if !args.no_pipeline {
            let req = bench_request(args.steps);
            let cancel = AtomicBool::new(false);
            let total = time_ms(&device, 1, 3, || {
                let _ = txt2img(&model, &tokenizer, &req, &cancel, &mut Quiet);
            })?;
            println!(
                "[{precision:?}] txt2img 512x512, {} Euler steps, CFG 7.5: median {total:.0} ms",
                args.steps
            );
            println!(
                "[{precision:?}]   per step incl. decode: {:.1} ms",
                total / args.steps as f64
            );
            if args.pipeline_anatomy {
                pipeline::anatomy(&model, &tokenizer, &device, precision, args.steps)?;
            }
            if let Some(scale) = args.hires_scale {
                let fix = latent_engine::pipeline::HiresFix {
                    scale,
                    steps: (args.steps / 2).max(1),
                    strength: 0.5,
                    upscaler: latent_engine::pipeline::HiresUpscaler::Latent,
                };
                let req = Txt2ImgRequest {
                    hires: Some(fix),
                    ..bench_request(args.steps)
                };
                let hires = time_ms(&device, 1, 2, || {
                    let _ = txt2img(&model, &tokenizer, &req, &cancel, &mut Quiet);
                })?;
                let (w, h) = fix.target(req.width, req.height);
                println!(
                    "[{precision:?}] txt2img 512x512 + hires fix to {w}x{h} ({} + {} Euler steps, Latent): median {hires:.0} ms",
                    args.steps, fix.steps
                );
            }
            // Full-size TAESD (64 channels, blocks 3-3-3-1) with random weights.
            let taesd = TaesdDecoder::load(
                &Weights::random("taesd", &device, dtype),
                &TaesdConfig::standard(),
            )?;
            let decode = time_ms(&device, 2, args.runs, || {
                let _ = taesd.decode(z.clone());
            })?;
            println!(
                "[{precision:?}] TAESD decode 64x64 latents -> 512x512: median {decode:.2} ms"
            );
            let methods: &[PreviewMethod] = if args.no_previews {
                &[]
            } else {
                &[
                    PreviewMethod::Latent2Rgb,
                    PreviewMethod::Taesd,
                    PreviewMethod::Full,
                ]
            };
            for &method in methods {
                let store = FrameStore::new();
                let latencies = Arc::new(Mutex::new(Vec::new()));
                let with = time_ms(&device, 1, 3, || {
                    let settings = PreviewSettings::new(method, 1);
                    let mut quiet = Quiet;
                    let seen = latencies.clone();
                    let sink: FrameSink = Box::new(move |f: &Frame| {
                        if let Ok(mut l) = seen.lock() {
                            l.push(f.latency.as_secs_f64() * 1e3);
                        }
                    });
                    if let Ok(mut previewer) = Previewer::with(
                        &model,
                        settings,
                        store.clone(),
                        Some(&taesd),
                        Some(sink),
                        &mut quiet,
                    ) {
                        let _ = txt2img(&model, &tokenizer, &req, &cancel, &mut previewer);
                        previewer.finish();
                    }
                })?;
                let frame = store.latest();
                let mut lat = latencies.lock().map(|l| l.clone()).unwrap_or_default();
                lat.sort_by(f64::total_cmp);
                let median_latency = lat.get(lat.len() / 2).copied().unwrap_or(f64::NAN);
                println!(
                    "[{precision:?}] txt2img with {} preview every step: median {with:.0} ms ({:+.1}% vs none, {:.1} ms/step), {} frames published of {} steps x 4 runs, readback latency median {median_latency:.1} ms, {} bytes per frame ({}x{} RGBA8)",
                    method.id(),
                    (with / total - 1.0) * 100.0,
                    with / args.steps as f64,
                    lat.len(),
                    args.steps,
                    frame.rgba.len(),
                    frame.width,
                    frame.height,
                );
            }
        }
        if let Some(usage) = device.memory_pool_usage() {
            println!(
                "[{precision:?}] device memory pool reserved after the runs: {:.2} GiB",
                usage.bytes_reserved as f64 / (1u64 << 30) as f64
            );
        }
        drop(model);
        device.memory_cleanup();
    }
    // What this run tuned outside a txt2img (the op reports, the UNet and VAE alone).
    if let Some(n) = latent_engine::device::tuning::save()? {
        println!("kernel tuning saved: {n} results");
    }
    Ok(())
}

/// VAE decode 512x512, plain and compiled, and the GroupNorm+SiLU kernels alone; with
/// `kernel_profile`, every kernel of that many compiled decodes timed on the device.
fn vae_bench(
    model: &StableDiffusion,
    device: &Device,
    precision: Precision,
    runs: usize,
    kernel_profile: Option<usize>,
) -> Result<()> {
    let dtype = precision.dtype();
    let z = Tensor::<4>::random(
        [1, 4, 64, 64],
        Distribution::Normal(0.0, 1.0),
        (device, dtype),
    );
    let vae = time_ms(device, 2, runs.min(5), || {
        let _ = model.vae.decode(z.clone());
    })?;
    println!("[{precision:?}] VAE decode 512x512: median {vae:.2} ms");
    if latent_engine::kernels::available(device) {
        let fused = time_ms(device, 2, runs.min(5), || {
            let _ = model.vae.decode_with(z.clone(), Kernels::Fused);
        })?;
        let read = |t: Tensor<4>| {
            t.cast(burn::tensor::DType::F32)
                .into_data()
                .try_to_vec::<f32>()
                .unwrap_or_default()
        };
        let rel = latent_engine::vae_compile::relative_difference(
            &read(model.vae.decode_with(z.clone(), Kernels::Fused)),
            &read(model.vae.decode(z.clone())),
        );
        println!(
            "[{precision:?}] VAE decode 512x512 compiled (our GroupNorm+SiLU kernels): median {fused:.2} ms ({:+.1}% vs plain), max rel diff {rel:.1e}",
            (fused / vae - 1.0) * 100.0
        );
        // As the pipeline decodes: compiled and replayed from a recorded graph (the second call
        // in a row records), against the same kernels launch by launch, interleaved over five
        // rounds; the difference is a replay's.
        let autoencoder = &model.vae;
        for _ in 0..2 {
            let _ = read(autoencoder.decode_compiled(z.clone()));
        }
        let rel = latent_engine::vae_compile::relative_difference(
            &read(autoencoder.decode_compiled(z.clone())),
            &read(autoencoder.decode_with(z.clone(), Kernels::Fused)),
        );
        let mut times = vec![Vec::new(); 2];
        for _ in 0..5 {
            times[0].push(time_ms(device, 1, runs.min(5), || {
                let _ = autoencoder.decode_with(z.clone(), Kernels::Fused);
            })?);
            times[1].push(time_ms(device, 1, runs.min(5), || {
                let _ = autoencoder.decode_compiled(z.clone());
            })?);
        }
        unet::print_rounds(
            precision,
            "VAE decode 512x512 compiled,",
            &["launch by launch", "replayed from a recorded graph"],
            &times,
        );
        println!(
            "[{precision:?}] VAE decode replays: {} (recorded: {}), max rel diff from launch by launch {rel:.1e}",
            autoencoder.recording().replays(),
            autoencoder.recording().is_recorded()
        );
        autoencoder.recording().release();
        if let Some(decodes) = kernel_profile {
            profile::kernel_profile_of(device, &format!("{precision:?} VAE"), decodes, || {
                let _ = model.vae.decode_with(z.clone(), Kernels::Fused);
            })?;
        }
        let gn_x = Tensor::<4>::random(
            [1, 128, 512, 512],
            Distribution::Normal(0.5, 1.0),
            (device, dtype),
        );
        let gamma = Tensor::<1>::ones([128], (device, burn::tensor::DType::F32));
        let beta = Tensor::<1>::zeros([128], (device, burn::tensor::DType::F32));
        let norm =
            latent_engine::nn::GroupNorm::from_tensors(gamma.clone(), beta.clone(), 32, 1e-6);
        let plain = time_ms(device, 2, runs, || {
            let _ = norm.forward_with(gn_x.clone(), true, Kernels::Plain);
        })?;
        let fused = time_ms(device, 2, runs, || {
            let _ = latent_engine::kernels::group_norm::group_norm(
                &gn_x, &gamma, &beta, 32, 1e-6, true,
            );
        })?;
        println!(
            "[{precision:?}] GroupNorm(32)+SiLU [1,128,512,512]: burn ops {plain:.3} ms, our kernels {fused:.3} ms"
        );
        vae::vae_attention_report(device, dtype, precision, runs)?;
        vae::vae_wide_heads_ab(model, device, precision, runs, kernel_profile)?;
    } else {
        println!(
            "[{precision:?}] VAE compilation: our kernels do not run on this device (CPU backend)"
        );
    }

    Ok(())
}
