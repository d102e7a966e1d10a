//! `latent-studio bench`: full-size SD 1.5 with random weights, timed per component. Medians over
//! repeated runs after warm-up (the first runs compile and autotune kernels).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result};
use burn::tensor::{Device, Distribution, Tensor};
use clap::Args;
use latent_engine::checkpoint::ModelConfig;
use latent_engine::checkpoint::Weights;
use latent_engine::device::DeviceChoice;
use latent_engine::model_cache::{CacheSettings, DiskCache, ModelCache};
use latent_engine::nn::Kernels;
use latent_engine::pipeline::{Observer, StepState};
use latent_engine::pipeline::{Quiet, Txt2ImgRequest, txt2img};
use latent_engine::preview::{
    Frame, FrameSink, FrameStore, PreviewMethod, PreviewSettings, Previewer,
};
use latent_engine::schedulers::{SamplerKind, Schedule};
use latent_engine::taesd::{TaesdConfig, TaesdDecoder};
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::{LoadOptions, Precision, StableDiffusion};

mod conv;
mod kernels;
mod linear;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// auto, cpu, gpu, gpu:N or part of an adapter name (`arc`, `lavapipe`).
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
    /// Only the end-to-end txt2img (for measuring a process's peak device memory from outside).
    #[arg(long)]
    pipeline_only: bool,
    /// Skip the preview-overhead runs after the end-to-end txt2img.
    #[arg(long)]
    no_previews: bool,
    /// Skip the op-by-op kernel report.
    #[arg(long)]
    no_ops: bool,
    /// Skip the UNet step with burn ops in place of our kernels (it tunes kernels of its own:
    /// minutes on a fresh GPU).
    #[arg(long)]
    no_burn_ops: bool,
    /// Only the UNet step (and its host enqueue time).
    #[arg(long)]
    unet_only: bool,
    /// Only the attention report: every SD 1.5 attention shape, burn's and each tiling of ours.
    #[arg(long)]
    attention_only: bool,
    /// Only the convolution report: every SD 1.5 UNet 3×3 convolution shape, burn's and ours.
    #[arg(long)]
    conv_only: bool,
    /// Skip the per-block UNet profile (a sync after each block: it tunes fused kernels of its
    /// own, minutes on a fresh GPU, and does not describe the unsynchronised step).
    #[arg(long)]
    no_profile: bool,
    /// Diagnostic: divide the UNet's channel widths by this (the same ops and op count at smaller
    /// sizes), to profile the host's per-op cost on a slow device such as lavapipe.
    #[arg(long, default_value_t = 1, hide = true)]
    unet_divisor: usize,
    /// Instead of the random-weight model: time the model cache with this checkpoint (load from
    /// the checkpoint, from the disk cache, resident; second-generation start with cache on/off).
    #[arg(long)]
    cache_model: Option<std::path::PathBuf>,
    /// After the UNet step, the same step under other rules for the planes attention kernel
    /// (without the prefetch, wider heads, fewer keys), interleaved over three rounds in the same
    /// process.
    #[arg(long)]
    planes_ab: bool,
    /// Only the VAE decode (plain and compiled) and the GroupNorm kernels.
    #[arg(long)]
    vae_only: bool,
    /// Disk cache folder for `--cache-model` (emptied first).
    #[arg(long)]
    cache_dir: Option<std::path::PathBuf>,
    /// Where cubecl writes its autotune decisions (JSON lines; default: a temporary file).
    #[arg(long)]
    decisions: Option<std::path::PathBuf>,
}

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
    let device =
        latent_engine::device::create_watched(&args.device, latent_engine::device::DEFAULT_TIMEOUT)
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
    if let Some(path) = &args.cache_model {
        return cache_bench(&args, path, &device, &tokenizer);
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
            vae_bench(&model, &device, precision, args.runs)?;
            continue;
        }
        if args.pipeline_only {
            let req = bench_request(args.steps);
            let cancel = AtomicBool::new(false);
            let total = time_ms(&device, 1, args.runs, || {
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
        let unet = time_ms(&device, 3, args.runs, || {
            let _ = model.unet.forward(x.clone(), &[500.0], &ctx);
        })?;
        println!("[{precision:?}] UNet step, batch 2 (CFG), 64x64 latents: median {unet:.2} ms");
        // Host-bound or device-bound: how long enqueueing one step takes on this thread, against
        // the step with its sync. Enqueue close to the whole means the GPU waits on the host.
        let mut enqueue = Vec::new();
        for _ in 0..args.runs.max(1) {
            let t = Instant::now();
            let _ = model.unet.forward(x.clone(), &[500.0], &ctx);
            enqueue.push(t.elapsed().as_secs_f64() * 1e3);
            sync(&device)?;
        }
        enqueue.sort_by(f64::total_cmp);
        println!(
            "[{precision:?}]   host time to enqueue one step (no sync): median {:.2} ms",
            enqueue[enqueue.len() / 2]
        );
        graph_bench(&model, &device, precision, args.runs, &x, &ctx, unet)?;
        if args.planes_ab {
            use latent_engine::kernels::attention::{
                PLANES_MIN_KEYS, WIDEST_PLANES, set_planes_rule,
            };
            // The same step, same process (kernels already tuned), under other planes rules,
            // the rules interleaved over rounds so that drift over the run falls on each alike.
            let rules = [
                (None, WIDEST_PLANES, PLANES_MIN_KEYS, "default rule"),
                (
                    Some(false),
                    WIDEST_PLANES,
                    PLANES_MIN_KEYS,
                    "no prefetch of the next key/value tile",
                ),
                (None, 80, PLANES_MIN_KEYS, "planes also for 80-wide heads"),
                (
                    None,
                    80,
                    0,
                    "planes for 80-wide heads and the 77-token cross-attention",
                ),
                (
                    None,
                    WIDEST_PLANES,
                    0,
                    "planes also for the cross-attention up to 64 wide",
                ),
                (
                    None,
                    160,
                    PLANES_MIN_KEYS,
                    "planes for self-attention up to 160 wide",
                ),
            ];
            let mut times = vec![Vec::new(); rules.len()];
            for _ in 0..3 {
                for (i, &(prefetch, widest, min_keys, _)) in rules.iter().enumerate() {
                    set_planes_rule(prefetch, widest, min_keys);
                    let ms = time_ms(&device, 2, args.runs, || {
                        let _ = model.unet.forward(x.clone(), &[500.0], &ctx);
                    });
                    set_planes_rule(None, WIDEST_PLANES, PLANES_MIN_KEYS);
                    times[i].push(ms?);
                }
            }
            for ((.., what), t) in rules.iter().zip(&times) {
                let mut sorted = t.clone();
                sorted.sort_by(f64::total_cmp);
                println!(
                    "[{precision:?}] UNet step, planes rule: {what}: median of rounds {:.2} ms (rounds {})",
                    sorted[sorted.len() / 2],
                    t.iter()
                        .map(|m| format!("{m:.2}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        if latent_engine::kernels::available(&device) && !args.no_burn_ops {
            // The same step with burn ops where our kernels (GroupNorm+SiLU, LayerNorm) run.
            latent_engine::kernels::set_enabled(false);
            let plain = time_ms(&device, 3, args.runs, || {
                let _ = model.unet.forward(x.clone(), &[500.0], &ctx);
            });
            latent_engine::kernels::set_enabled(true);
            let plain = plain?;
            println!(
                "[{precision:?}] UNet step with burn ops instead of our kernels: median {plain:.2} ms (ours {:+.1}%)",
                (unet / plain - 1.0) * 100.0
            );
        }
        if args.unet_only {
            continue;
        }
        if !args.no_profile {
            let dev = device.clone();
            let profile = model.unet.forward_profiled(x.clone(), &[500.0], &ctx, &|| {
                let _ = dev.sync();
            });
            for (block, t) in profile {
                println!(
                    "[{precision:?}]   UNet {block:<28} {:8.2} ms",
                    t.as_secs_f64() * 1e3
                );
            }
        }

        vae_bench(&model, &device, precision, args.runs)?;
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
                "[{precision:?}] device memory reserved (pool high-water mark): {:.2} GiB",
                usage.bytes_reserved as f64 / (1u64 << 30) as f64
            );
        }
        drop(model);
        device.memory_cleanup();
    }
    Ok(())
}

/// Stops a generation after its first step and notes when that step finished.
struct FirstStep<'a> {
    cancel: &'a AtomicBool,
    at: Option<std::time::Duration>,
    started: Instant,
}

impl Observer for FirstStep<'_> {
    fn step(&mut self, _: &StepState<'_>) {
        self.at.get_or_insert(self.started.elapsed());
        self.cancel
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// From "generate" to the first finished UNet step: model lookup (resident, or a reload), prompt
/// encoding, one step, synchronised.
fn start_latency(
    cache: &mut ModelCache,
    path: &std::path::Path,
    device: &Device,
    options: LoadOptions,
    tokenizer: &ClipTokenizer,
) -> Result<f64> {
    let started = Instant::now();
    let (model, _, _) = cache.get(path, device, options)?;
    let cancel = AtomicBool::new(false);
    let mut first = FirstStep {
        cancel: &cancel,
        at: None,
        started,
    };
    let req = Txt2ImgRequest {
        prompt: "a photograph of an astronaut riding a horse".into(),
        steps: 20,
        ..Default::default()
    };
    let _ = txt2img(&model, tokenizer, &req, &cancel, &mut first);
    sync(device)?;
    Ok(first.at.unwrap_or_else(|| started.elapsed()).as_secs_f64() * 1e3)
}

fn cache_bench(
    args: &BenchArgs,
    path: &std::path::Path,
    device: &Device,
    tokenizer: &ClipTokenizer,
) -> Result<()> {
    let dir = args
        .cache_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("latent-studio-bench-cache"));
    let on = CacheSettings {
        enabled: true,
        memory_budget: 64 << 30,
        disk_dir: Some(dir.clone()),
        disk_limit: 64 << 30,
    };
    for &precision in &args.precision {
        DiskCache::new(&dir, 0).clear()?;
        let options = LoadOptions {
            precision,
            vae_encoder: false,
        };
        let load = |settings: CacheSettings| -> Result<(f64, ModelCache)> {
            let mut cache = ModelCache::new(settings);
            let t = Instant::now();
            let (model, _, source) = cache.get(path, device, options)?;
            let _ = model.text_encoder.forward(&[vec![49406u32; 77]], 1);
            sync(device)?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            tracing::info!(?source, ms, "bench load");
            Ok((ms, cache))
        };
        // Warm the page cache and the kernels once, so every row reads the file from memory.
        let _ = load(CacheSettings::off())?;
        let (checkpoint_ms, _) = load(CacheSettings::off())?;
        let (write_ms, _) = load(on.clone())?;
        let bytes = DiskCache::new(&dir, 0).total_bytes();
        let (disk_ms, _) = load(on.clone())?;
        println!(
            "[{precision:?}] load (page cache warm, incl. first text-encoder pass): from the checkpoint {checkpoint_ms:.0} ms; first load with the disk cache (writes {:.2} GiB) {write_ms:.0} ms; next launch, from the disk cache {disk_ms:.0} ms",
            bytes as f64 / (1u64 << 30) as f64
        );
        let mut resident = ModelCache::new(on.clone());
        let mut off = ModelCache::new(CacheSettings::off());
        let mut on_ms = Vec::new();
        let mut off_ms = Vec::new();
        // The first generation of each warms kernels; the next ones are "second generations".
        start_latency(&mut resident, path, device, options, tokenizer)?;
        start_latency(&mut off, path, device, options, tokenizer)?;
        for _ in 0..args.runs.clamp(1, 5) {
            on_ms.push(start_latency(
                &mut resident,
                path,
                device,
                options,
                tokenizer,
            )?);
            off_ms.push(start_latency(&mut off, path, device, options, tokenizer)?);
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "[{precision:?}] second-generation start (generate -> first step done): cache on {:.0} ms, cache off {:.0} ms (median of {})",
            median(on_ms.clone()),
            median(off_ms),
            on_ms.len()
        );
    }
    DiskCache::new(&dir, 0).clear()?;
    Ok(())
}

/// VAE decode 512x512, plain and compiled, and the GroupNorm+SiLU kernels alone.
fn vae_bench(
    model: &StableDiffusion,
    device: &Device,
    precision: Precision,
    runs: usize,
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
        kernels::vae_attention_report(device, dtype, precision, runs)?;
    } else {
        println!(
            "[{precision:?}] VAE compilation: our kernels do not run on this device (CPU backend)"
        );
    }

    Ok(())
}

/// The UNet step replayed from a captured graph (what `txt2img` runs after its first steps):
/// its median, its host time, and its agreement with the step run launch by launch.
fn graph_bench(
    model: &StableDiffusion,
    device: &Device,
    precision: Precision,
    runs: usize,
    x: &Tensor<4>,
    ctx: &Tensor<3>,
    plain_ms: f64,
) -> Result<()> {
    use latent_engine::unet::graph::{UNetSteps, WARMUP_RUNS};
    let mut steps = UNetSteps::new(&model.unet, ctx.clone());
    for _ in 0..=WARMUP_RUNS {
        let _ = steps.forward(x.clone(), 500.0);
        sync(device)?;
    }
    if !steps.is_replaying() {
        println!("[{precision:?}] UNet step from a captured graph: not recorded (see the warning)");
        return Ok(());
    }
    let replayed = time_ms(device, 2, runs, || {
        let _ = steps.forward(x.clone(), 500.0);
    })?;
    let mut enqueue = Vec::new();
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        let _ = steps.forward(x.clone(), 500.0);
        enqueue.push(t.elapsed().as_secs_f64() * 1e3);
        sync(device)?;
    }
    enqueue.sort_by(f64::total_cmp);
    let read = |t: Tensor<4>| -> Result<Vec<f32>> {
        t.cast(burn::tensor::DType::F32)
            .into_data()
            .try_to_vec::<f32>()
            .map_err(|e| anyhow::anyhow!("{e:?}"))
    };
    let want = read(model.unet.forward(x.clone(), &[500.0], ctx))?;
    let got = read(steps.forward(x.clone(), 500.0))?;
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    let diff = want
        .iter()
        .zip(&got)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale;
    println!(
        "[{precision:?}] UNet step replayed from a captured graph: median {replayed:.2} ms \
         ({:+.1}% against {plain_ms:.2} ms launch by launch); host time to enqueue {:.2} ms; \
         max relative difference {diff:.2e}",
        (replayed / plain_ms - 1.0) * 100.0,
        enqueue[enqueue.len() / 2]
    );
    Ok(())
}
