//! `bench --cache-model`: loading through the model cache and the start of a second generation.

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::Result;
use burn::tensor::Device;
use latent_engine::LoadOptions;
use latent_engine::model_cache::{CacheSettings, DiskCache, ModelCache};
use latent_engine::pipeline::{Observer, StepState, Txt2ImgRequest, txt2img};
use latent_engine::tokenizer::ClipTokenizer;

use super::{BenchArgs, sync};

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

pub(super) fn cache_bench(
    args: &BenchArgs,
    path: &std::path::Path,
    device: &Device,
    tokenizer: &ClipTokenizer,
) -> Result<()> {
    let dir = args
        .cache_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("latent-studio-bench-cache"));
    let on = CacheSettings::sized(true, Some(64.0), dir.clone(), 64.0);
    for &precision in &args.precision {
        DiskCache::new(&dir, 0).clear()?;
        let options = LoadOptions {
            precision,
            vae_encoder: false,
            ..LoadOptions::default()
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
