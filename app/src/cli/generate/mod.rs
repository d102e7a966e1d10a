//! `latent-studio generate`: txt2img from the command line, writing PNGs with A1111 parameters.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use latent_engine::image_io::{RgbImage, encode_png, load_image, save_atomic};
use latent_engine::model_cache::{CacheSettings, LoadSource, ModelCache};
use latent_engine::parameters::Parameters;
use latent_engine::pipeline::{
    DecodeOptions, Generated, HiresFix, HiresUpscaler, InitImage, Notice, RefinerSwitch, StepState,
    Txt2ImgRequest, txt2img_refined,
};
use latent_engine::preview::{
    Frame, FrameSink, FrameStore, PreviewMethod, PreviewSettings, Previewer,
};
use latent_engine::prompt::Embeddings;
use latent_engine::taesd::TaesdDecoder;
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::vae_tiling::TilingConfig;
use latent_engine::{LoadOptions, Precision};
use latent_studio::run::{Destination, RunEvents, SaveEach, random_seed};
use latent_studio::stall::StallWatch;

mod args;
use args::size_conditioning;
pub use args::{GenerateArgs, OnOff};

/// The TAESD decoder for previews, if one is wanted and loads; a failure is a warning, never an
/// error: previews fall back to latent2rgb.
fn load_taesd(
    args: &GenerateArgs,
    device: &burn::tensor::Device,
    precision: Precision,
    family: latent_engine::checkpoint::Family,
) -> Option<TaesdDecoder> {
    if !matches!(args.preview, PreviewMethod::Taesd | PreviewMethod::Auto) {
        return None;
    }
    let path = match &args.taesd {
        Some(p) => p.clone(),
        None => latent_studio::paths::taesd_for(&args.model, family, None)?,
    };
    match TaesdDecoder::open(&path, device, precision.dtype()) {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!(
                "warning: TAESD decoder {} not loaded ({e}); previews use latent2rgb",
                path.display()
            );
            None
        }
    }
}

/// Writes each published preview as `dir/step_NNN.png` (atomically replaced).
fn preview_writer(dir: PathBuf) -> FrameSink {
    Box::new(move |frame: &Frame| {
        let image = RgbImage {
            width: frame.width,
            height: frame.height,
            pixels: frame
                .rgba
                .chunks_exact(4)
                .flat_map(|p| [p[0], p[1], p[2]])
                .collect(),
        };
        let path = dir.join(format!("step_{:03}.png", frame.step));
        let written = encode_png(&image, None).and_then(|png| save_atomic(&path, &png, true));
        if let Err(e) = written {
            eprintln!("warning: preview {} not written: {e}", path.display());
        }
    })
}

/// The command line's side of a run (`latent_studio::run::SaveEach` saves the images):
/// `step n/N, it/s` on stderr, each saved path on stdout, and a beat of the stall watch at every
/// sign of progress.
struct Cli {
    watch: Option<StallWatch>,
}

impl Cli {
    fn beat(&self) {
        if let Some(w) = &self.watch {
            w.beat();
        }
    }
}

impl RunEvents for Cli {
    fn notice(&mut self, notice: &Notice) {
        eprintln!("warning: {notice}");
        self.beat();
    }

    fn step(&mut self, s: &StepState<'_>) {
        let secs = s.elapsed.as_secs_f64().max(1e-9);
        eprintln!(
            "image {} step {}/{} ({:.2} it/s)",
            s.image + 1,
            s.step,
            s.total,
            s.step as f64 / secs
        );
        self.beat();
    }

    fn decoding(&mut self, _tiles: usize) {
        self.beat();
    }

    fn tuning(&mut self, width: usize, height: usize) {
        eprintln!(
            "tuning kernels for {width}x{height} on this GPU (first run at this size; the first \
             step may take minutes; kept for later runs)"
        );
        self.beat();
    }

    fn saved(&mut self, _: &Generated, _: Parameters, path: PathBuf) {
        self.beat();
        println!("{}", path.display());
    }
}

/// The init image of an img2img run, fitted to the request's size, and that size: as given, else
/// the image's own rounded down to a multiple of 8 (diffusers' img2img), else the default.
fn init_image(args: &GenerateArgs) -> Result<(Option<InitImage>, usize, usize)> {
    let defaults = Txt2ImgRequest::default();
    let Some(path) = &args.init_image else {
        if args.mask.is_some() {
            bail!("--mask needs --init-image (the picture to inpaint)");
        }
        if args.outpaint.is_some() {
            bail!("--outpaint needs --init-image (the picture to extend)");
        }
        return Ok((
            None,
            args.width.unwrap_or(defaults.width),
            args.height.unwrap_or(defaults.height),
        ));
    };
    let image = load_image(path)?;
    let round = |v: usize| (v / 8 * 8).max(8);
    let (image, mask) = match (&args.outpaint, &args.mask) {
        (Some(_), Some(_)) => bail!("--outpaint makes its own mask; leave out --mask"),
        (Some(sides), None) => {
            let sides = sides.to_multiple(image.width, image.height, 8);
            let (canvas, mask) =
                latent_engine::image_io::extend_canvas(&image, sides, args.outpaint_overlap)?;
            (canvas, Some(std::sync::Arc::new(mask)))
        }
        (None, Some(path)) => (image, Some(std::sync::Arc::new(load_image(path)?))),
        (None, None) => (image, None),
    };
    let width = args.width.unwrap_or(round(image.width));
    let height = args.height.unwrap_or(round(image.height));
    let init = InitImage {
        image: std::sync::Arc::new(image),
        strength: args.denoising_strength,
        resize: args.resize_mode,
        mask_blur: (mask.is_some() && args.mask_blur >= 0.0).then_some(args.mask_blur),
        masked_content: args.masked_content,
        area: match args.only_masked {
            true => latent_engine::pipeline::InpaintArea::OnlyMasked {
                padding: args.inpaint_padding,
            },
            false => Default::default(),
        },
        mask,
    };
    Ok((Some(init), width, height))
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let seed = args.seed.unwrap_or_else(random_seed);
    let (init, width, height) = init_image(&args)?;
    let mut request = Txt2ImgRequest {
        prompt: args.prompt.clone(),
        negative_prompt: args.negative.clone(),
        seed,
        steps: args.steps,
        cfg_scale: args.cfg,
        sampler: args.sampler,
        schedule: args.schedule,
        width,
        height,
        batch_count: args.batch_count,
        clip_skip: usize::from(args.clip_skip),
        emphasis: args.emphasis,
        decode: DecodeOptions {
            tiling: TilingConfig::with_mode(args.vae_tiling),
            compile: args.vae_compile == OnOff::On,
        },
        init,
        hires: args.hires_scale.map(|scale| HiresFix {
            scale,
            steps: args.hires_steps,
            strength: args.hires_strength,
            upscaler: args.hires_upscaler,
        }),
        embeddings: None,
        loras: Default::default(),
        // SDXL: the image's own size and no crop (diffusers' and ComfyUI's defaults) unless set.
        size_conditioning: size_conditioning(&args, width, height),
        // Named once the refiner is open (its name and hash go into the parameters text).
        refiner: None,
    };
    for tag in &args.lora {
        request.prompt = format!("{} <lora:{tag}>", request.prompt.trim_end());
    }
    // The prompt's LoRAs are opened before the model loads (a missing file costs no load);
    // `run::prepare_request` attaches them once it has (the library keeps what it opened).
    let loras = latent_engine::lora::LoraLibrary::new(args.loras.clone());
    let (_, ignored) = loras
        .resolve(&request.prompt)
        .map_err(|e| match args.loras {
            None => anyhow::anyhow!("{e}; pass --loras <folder>"),
            Some(_) => e.into(),
        })?;
    for tag in ignored {
        eprintln!(
            "warning: {tag} is not a LoRA tag Latent Studio applies; it was removed from the prompt"
        );
    }
    if args.out.is_some() && args.batch_count > 1 {
        bail!("--out names one file; use --outputs with --batch-count > 1");
    }
    // Refuse before any work if the target exists.
    if let Some(out) = &args.out {
        if out.exists() && !args.overwrite {
            bail!("{} exists; pass --overwrite to replace it", out.display());
        }
        let parent = out.parent().filter(|p| !p.as_os_str().is_empty());
        if let Some(dir) = parent
            && !dir.is_dir()
        {
            bail!("the output folder {} does not exist", dir.display());
        }
    }
    // The family's schedule is not known before the model opens: SD 1.5's catches what any
    // model would refuse (zero or too many steps, strength); the model's own is checked again.
    latent_engine::pipeline::request_plan(&request, &Default::default())?;

    if !(args.device_timeout.is_finite() && args.device_timeout > 0.0) {
        bail!("--device-timeout must be a number of seconds > 0");
    }
    let timeout = std::time::Duration::from_secs_f64(args.device_timeout.min(1e9));
    let (choice, device) = latent_studio::probe::open_device(
        &args.device,
        args.probe == OnOff::On,
        timeout,
        &mut latent_studio::probe::print_note,
    )
    .context("opening the device")?;
    let restored = latent_engine::device::tuning::restored();
    if restored.entries > 0 {
        eprintln!(
            "kernel tuning restored: {} results from earlier runs",
            restored.entries
        );
    }
    let precision = args
        .precision
        .unwrap_or_else(|| latent_engine::device::preferred_precision(&device));
    let lanczos_hires = request
        .hires
        .is_some_and(|h| h.upscaler == HiresUpscaler::Lanczos);
    // An inpainting model conditions even txt2img on an encoded (blank) picture.
    let inpainting = latent_engine::checkpoint::Checkpoint::open(&args.model)
        .is_ok_and(|c| c.config.unet.is_inpainting());
    let options = LoadOptions {
        precision,
        vae_encoder: request.init.is_some() || lanczos_hires || inpainting,
        text_encoders: args.text_encoders,
    };
    let cache_settings = if args.model_cache == OnOff::On {
        if !(args.cache_limit_gib.is_finite() && args.cache_limit_gib >= 0.0) {
            bail!("--cache-limit-gib must be a number ≥ 0");
        }
        // One model per run: no memory limit.
        CacheSettings::sized(
            true,
            None,
            args.cache_dir
                .clone()
                .unwrap_or_else(latent_studio::paths::weights_cache),
            args.cache_limit_gib,
        )
    } else {
        CacheSettings::off()
    };
    let mut cache = ModelCache::new(cache_settings);
    let started = Instant::now();
    let (model, checkpoint, source) = cache
        .get(&args.model, &device, options)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let from = match source {
        LoadSource::DiskCache => "the disk cache",
        _ => "the checkpoint",
    };
    eprintln!(
        "model loaded from {from} in {:.2} s ({}, {})",
        started.elapsed().as_secs_f64(),
        checkpoint.model_name(),
        model.config.scheduler.prediction
    );
    if let Some(few) = checkpoint.few_step {
        let p = few.preset(checkpoint.family);
        let size = p
            .size
            .map(|s| format!(" --width {s} --height {s}"))
            .unwrap_or_default();
        eprintln!(
            "note: a {} model; its settings: --steps {} --cfg {} --sampler {}{size}",
            few.name(),
            p.steps,
            p.cfg_scale,
            p.sampler.id()
        );
    }
    if latent_studio::test_seam::vae_compile_fails() {
        model.vae_compile.force_failure(true);
    }
    // Without a size or a picture to take it from, the model's native one (768 for SD 2.x v).
    if request.init.is_none() && args.width.is_none() && args.height.is_none() {
        let side = model.config.native_size();
        (request.width, request.height) = (side, side);
    }
    let refiner = match &args.refiner {
        Some(_) if model.text_encoder_2.is_none() => bail!(
            "--refiner takes over an SDXL model's last steps; {} is loaded",
            checkpoint.model_name()
        ),
        Some(path) => {
            let switch = RefinerSwitch {
                switch_at: args.refiner_switch_at,
                name: String::new(),
            };
            switch.check().context("--refiner-switch-at")?;
            let started = Instant::now();
            let checkpoint = latent_engine::checkpoint::Checkpoint::open_refiner(path)
                .with_context(|| format!("opening the refiner {}", path.display()))?;
            // Parked where the setting says (`auto`: below 15 GiB of device memory): the two
            // UNets then take turns on the device, which an 8 GB card needs.
            let refiner = latent_engine::Refiner::load_with(
                &checkpoint,
                &device,
                precision,
                args.text_encoders,
            )
            .with_context(|| format!("loading the refiner {}", path.display()))?;
            eprintln!("refiner loaded in {:.2} s", started.elapsed().as_secs_f64());
            // A1111's `Refiner` value: the checkpoint's short title, `name [hash]`.
            let name = match cache.short_hash(&checkpoint) {
                Some(hash) => format!("{} [{hash}]", checkpoint.display_name()),
                None => checkpoint.display_name(),
            };
            request.refiner = Some(RefinerSwitch { name, ..switch });
            Some(refiner)
        }
        None => None,
    };
    let tokenizer = ClipTokenizer::new()?;
    let embeddings = match &args.embeddings {
        Some(dir) => {
            let width = model.config.text_encoder.hidden_size;
            let second = model.config.text_encoder_2.as_ref().map(|c| c.hidden_size);
            let (library, notes) = Embeddings::load_dir(dir, &tokenizer, width, second)?;
            for note in notes {
                eprintln!("warning: {note}");
            }
            Some(std::sync::Arc::new(library))
        }
        None => None,
    };
    // The ignored tags were reported when the LoRAs were first opened.
    let _ = latent_studio::run::prepare_request(&model, &mut request, &loras, embeddings)?;
    if !request.loras.0.is_empty() {
        let started = Instant::now();
        // Parked text encoders take theirs when they come up for the prompt.
        if model.parked() {
            model.unet_for(&request.loras)?;
        } else {
            model.networks(&request.loras)?;
        }
        eprintln!(
            "LoRAs merged in {:.2} s: {}",
            started.elapsed().as_secs_f64(),
            request.loras.a1111_hashes()
        );
    }
    let cancel = AtomicBool::new(false);
    // A device that stops making progress (a kernel compiled at first use that never finishes)
    // is reported once after twice the device timeout. Only reported: a first use that is merely
    // slow looks the same (lavapipe under load took over 120 s for a first UNet step), and
    // killing it would be worse than waiting. Finished images are saved by then. The CPU backend
    // cannot hang in a driver and may be slow on large images: unwatched.
    let watch = (!latent_engine::device::is_cpu(&device) || latent_studio::test_seam::stall_set())
        .then(|| {
            let limit = timeout.saturating_mul(2);
            let label = choice.to_string();
            StallWatch::start(limit, move |since| {
                eprintln!(
                    "warning: no progress for {:.0} s on {label}: the driver may be stuck \
                     compiling kernels or hung (new sizes compile new kernels, slow on software \
                     adapters). Finished images are saved. Ctrl+C stops; --device cpu avoids \
                     this adapter.",
                    since.as_secs_f64()
                );
            })
        });
    let destination = match &args.out {
        Some(path) => Destination::File {
            path: path.clone(),
            overwrite: args.overwrite,
        },
        None => Destination::Numbered(args.outputs.clone()),
    };
    let mut progress = SaveEach::new(
        Cli { watch },
        &request,
        cache.short_hash(&checkpoint),
        checkpoint.display_name(),
        destination,
        &cancel,
    );
    let settings = PreviewSettings::new(args.preview, args.preview_interval);
    let store = FrameStore::new();
    let taesd = load_taesd(&args, &device, precision, checkpoint.family);
    let sink = match &args.preview_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating the preview folder {}", dir.display()))?;
            Some(preview_writer(dir.clone()))
        }
        None => None,
    };
    let mut previewer = Previewer::with(
        &model,
        settings,
        store.clone(),
        taesd.as_ref(),
        sink,
        &mut progress,
    )?;
    let result = txt2img_refined(
        &model,
        refiner.as_ref(),
        &tokenizer,
        &request,
        &cancel,
        &mut previewer,
    );
    previewer.finish();
    if let Some(e) = progress.error.take() {
        return Err(e);
    }
    let images = result?;
    let last = store.latest();
    if last.step > 0 {
        eprintln!(
            "last preview: step {}/{} ({}x{})",
            last.step, last.total, last.width, last.height
        );
    }
    debug_assert_eq!(images.len(), progress.saved.len());
    Ok(())
}
