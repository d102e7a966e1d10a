//! `latent-studio generate`: txt2img from the command line, writing PNGs with A1111 parameters.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use latent_engine::device::DeviceChoice;
use latent_engine::image_io::{ResizeMode, RgbImage, encode_png, load_image, save_atomic};
use latent_engine::model_cache::{CacheSettings, LoadSource, ModelCache};
use latent_engine::parameters::Parameters;
use latent_engine::pipeline::{
    DecodeOptions, Generated, HiresFix, HiresUpscaler, InitImage, MaskedContent, Notice, StepState,
    Txt2ImgRequest, txt2img,
};
use latent_engine::preview::{
    Frame, FrameSink, FrameStore, PreviewMethod, PreviewSettings, Previewer,
};
use latent_engine::prompt::{Embeddings, Emphasis};
use latent_engine::schedulers::{SamplerKind, Schedule};
use latent_engine::taesd::TaesdDecoder;
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::vae_tiling::{TilingConfig, TilingMode};
use latent_engine::{LoadOptions, Precision};
use latent_studio::run::{Destination, RunEvents, SaveEach, random_seed};
use latent_studio::stall::StallWatch;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// A `.safetensors` checkpoint (A1111/ComfyUI layout) or a diffusers folder.
    #[arg(long)]
    model: PathBuf,
    #[arg(long)]
    prompt: String,
    #[arg(long, default_value = "")]
    negative: String,
    /// Random when not given; always recorded in the PNG.
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long, default_value_t = Txt2ImgRequest::default().steps)]
    steps: usize,
    #[arg(long, default_value_t = Txt2ImgRequest::default().cfg_scale, allow_negative_numbers = true)]
    cfg: f32,
    /// euler, euler_a, dpmpp_2m, ddim or lcm.
    #[arg(long, default_value = "euler")]
    sampler: SamplerKind,
    /// normal or karras.
    #[arg(long, default_value = "normal")]
    schedule: Schedule,
    /// Default the model's native size (512; 768 for SD 2.x v), or with --init-image that
    /// image's width rounded down to a multiple of 8.
    #[arg(long)]
    width: Option<usize>,
    /// Default the model's native size (512; 768 for SD 2.x v), or with --init-image that
    /// image's height rounded down to a multiple of 8.
    #[arg(long)]
    height: Option<usize>,
    /// img2img: start from this image (PNG, JPEG or WebP) instead of pure noise.
    #[arg(long)]
    init_image: Option<PathBuf>,
    /// img2img: how much of the image is redrawn, in (0, 1]: of --steps, the last
    /// ⌊steps × strength⌋ run (A1111's denoising strength).
    #[arg(long, default_value_t = 0.75)]
    denoising_strength: f64,
    /// img2img, when the image is not at --width × --height: just-resize, crop-and-resize or
    /// resize-and-fill (A1111's resize modes; Lanczos resampling).
    #[arg(long, default_value = "just-resize")]
    resize_mode: ResizeMode,
    /// Inpainting, with --init-image: a mask image, white where the picture is repainted (a
    /// 4-channel checkpoint: the rest is blended back after every step, as diffusers does).
    #[arg(long)]
    mask: Option<PathBuf>,
    /// Inpainting: after the decode, the original is put back outside the mask, feathered by a
    /// Gaussian blur of the mask of this many pixels (A1111's mask blur and overlay); a negative
    /// value keeps the decoded image as it is (diffusers' output).
    #[arg(long, default_value_t = 4.0, allow_negative_numbers = true)]
    mask_blur: f32,
    /// Inpainting: what the masked area starts from: fill, original, latent-noise or latent-nothing
    /// (A1111's masked content).
    #[arg(long, default_value = "original")]
    masked_content: MaskedContent,
    /// Inpainting: redraw only the mask's box grown by --inpaint-padding, at --width × --height,
    /// and paste it back into the picture, which keeps its size (A1111's "Only masked").
    #[arg(long)]
    only_masked: bool,
    /// Outpainting, with --init-image: extend the picture by LEFT,RIGHT,TOP,BOTTOM pixels (grown
    /// to multiples of 8), fill the bands with its edge pixels and inpaint them (with some of the
    /// picture beside them); use with --masked-content latent-noise --denoising-strength 1.
    #[arg(long, value_name = "LEFT,RIGHT,TOP,BOTTOM")]
    outpaint: Option<latent_engine::image_io::Sides>,
    /// Outpainting: pixels of the picture repainted beside each extended side.
    #[arg(long, default_value_t = 8)]
    outpaint_overlap: usize,
    /// Inpainting with --only-masked: pixels of context around the mask (A1111's padding).
    #[arg(long, default_value_t = latent_engine::pipeline::InpaintArea::DEFAULT_PADDING)]
    inpaint_padding: usize,
    /// A folder of textual-inversion embeddings (`<name>.safetensors`, A1111's format): a name in
    /// the prompt is replaced by its vectors.
    #[arg(long)]
    embeddings: Option<PathBuf>,
    /// A folder of LoRAs (`<name>.safetensors`, kohya/A1111 or diffusers/PEFT; subfolders are
    /// searched): `<lora:name:0.8>` in the prompt merges one in (A1111's syntax,
    /// `<lora:name:te:unet>` for separate strengths).
    #[arg(long)]
    loras: Option<PathBuf>,
    /// Adds `<lora:NAME:…>` to the prompt: NAME, NAME:STRENGTH or NAME:TE:UNET (repeatable).
    #[arg(long = "lora", value_name = "NAME[:TE[:UNET]]")]
    lora: Vec<String>,
    /// Hires fix: a second pass at this factor of the size (1 to 4; A1111's "Upscale by").
    #[arg(long)]
    hires_scale: Option<f64>,
    /// Hires fix: steps of the second pass (0: --steps), run as the last steps of a schedule of
    /// steps ÷ strength as A1111 does.
    #[arg(long, default_value_t = 0)]
    hires_steps: usize,
    /// Hires fix: denoising strength of the second pass.
    #[arg(long, default_value_t = HiresFix::default().strength)]
    hires_strength: f64,
    /// Hires fix: Latent (bilinear, no decode between the passes) or Lanczos (the image).
    #[arg(long, default_value = "Latent")]
    hires_upscaler: HiresUpscaler,
    /// SDXL: the size the model is told the source image had (diffusers' `original_size`,
    /// ComfyUI's width/height on CLIPTextEncodeSDXL). Default: --width x --height.
    #[arg(long, value_name = "WxH", value_parser = sdxl_size)]
    sdxl_original_size: Option<[usize; 2]>,
    /// SDXL: the top-left corner of the crop the model is told was taken (diffusers'
    /// `crops_coords_top_left`), LEFTxTOP pixels. Default: 0x0.
    #[arg(long, value_name = "LEFTxTOP", value_parser = sdxl_crop)]
    sdxl_crop: Option<[usize; 2]>,
    /// SDXL: the target size the model is told (diffusers' `target_size`). Default: --width x
    /// --height.
    #[arg(long, value_name = "WxH", value_parser = sdxl_size)]
    sdxl_target_size: Option<[usize; 2]>,
    /// auto, cpu, gpu, gpu:N or part of an adapter name (`arc`, `lavapipe`).
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
    /// Seconds that opening the device and compiling its first kernels may take before giving
    /// up with an error (a stuck driver thread is left behind; the process still exits).
    #[arg(long, default_value_t = 60.0)]
    device_timeout: f64,
    /// With `--device auto`, try a GPU adapter not seen before in a child process first, so a
    /// driver crash or hang costs the child (verdicts are remembered per adapter and driver, and
    /// adapters whose probe failed are skipped even with `off`). Off by default: a probe compiles
    /// kernels in a second process.
    #[arg(long, value_enum, default_value_t = OnOff::Off)]
    probe: OnOff,
    /// f32 or f16 (default: f16 on a GPU that supports it, else f32).
    #[arg(long)]
    precision: Option<Precision>,
    /// Output PNG; without it, a new numbered file in --outputs.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Replace --out if it exists.
    #[arg(long)]
    overwrite: bool,
    /// Folder for numbered outputs.
    #[arg(long, default_value = "outputs")]
    outputs: PathBuf,
    /// Images in a row, seeds seed, seed+1, …
    #[arg(long, default_value_t = 1)]
    batch_count: usize,
    /// Text encoder layers to skip from the end, A1111's way (1 = the last layer).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=12))]
    clip_skip: u16,
    /// How `(word:1.3)` weights apply: Original (A1111), "No norm", ComfyUI, Ignore, None.
    #[arg(long, default_value = "Original", value_parser = parse_emphasis)]
    emphasis: Emphasis,
    /// Live preview method: none, latent2rgb, taesd, full or auto (never changes the image).
    #[arg(long, default_value = "none")]
    preview: PreviewMethod,
    /// Make a preview every N steps.
    #[arg(long, default_value_t = 1)]
    preview_interval: usize,
    /// TAESD decoder for `--preview taesd|auto`: madebyollin's taesd_decoder.safetensors or a
    /// diffusers AutoencoderTiny folder (default: taesd_decoder.safetensors next to the model, or in `vae_approx/` there or one
    /// folder up, as ComfyUI keeps it).
    #[arg(long)]
    taesd: Option<PathBuf>,
    /// Write every published preview there as step_NNN.png.
    #[arg(long)]
    preview_dir: Option<PathBuf>,
    /// Disk cache of converted weights (keyed by the checkpoint's hash, dtype and format): the
    /// next launch loads faster. Off by default here so scripts never fill the cache unasked; the
    /// studio's setting defaults to on.
    #[arg(long, value_enum, default_value_t = OnOff::Off)]
    model_cache: OnOff,
    /// Disk cache folder (default: $LATENT_STUDIO_CACHE, else the platform's cache folder).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Disk cache size bound in GiB; least recently used entries are deleted first.
    #[arg(long, default_value_t = 20.0)]
    cache_limit_gib: f64,
    /// Our fused GroupNorm+SiLU kernels for the VAE decode, verified against the plain path at
    /// first use (on by default: 18 % faster per 512² decode on an H200, see BENCHMARKS.md).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    vae_compile: OnOff,
    /// Decode in 512-pixel tiles (same image as untiled, smaller GPU buffers): auto (images over
    /// 1024x1024 pixels, or when a decoder buffer would pass 1 GiB), on, or off.
    #[arg(long, default_value = "auto")]
    vae_tiling: TilingMode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

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
        None => {
            let folders = latent_studio::paths::taesd_folders_for(&args.model);
            let file = latent_studio::paths::taesd_file(family);
            latent_studio::paths::find_taesd(&folders, file)?
        }
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

    fn saved(&mut self, _: &Generated, _: Parameters, path: PathBuf) {
        self.beat();
        println!("{}", path.display());
    }
}

/// An emphasis mode by its A1111 name.
fn parse_emphasis(name: &str) -> std::result::Result<Emphasis, String> {
    Emphasis::from_name(name).ok_or_else(|| {
        format!("unknown emphasis `{name}`: Original, No norm, ComfyUI, Ignore or None")
    })
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

fn sdxl_size(s: &str) -> Result<[usize; 2], String> {
    latent_engine::pipeline::sdxl::parse_wxh(s, false)
}

fn sdxl_crop(s: &str) -> Result<[usize; 2], String> {
    latent_engine::pipeline::sdxl::parse_wxh(s, true)
}

/// SDXL's size and crop conditioning where any of its flags is given, the rest the image's own.
fn size_conditioning(
    args: &GenerateArgs,
    width: usize,
    height: usize,
) -> Option<latent_engine::pipeline::SizeConditioning> {
    if args.sdxl_original_size.is_none()
        && args.sdxl_crop.is_none()
        && args.sdxl_target_size.is_none()
    {
        return None;
    }
    let own = latent_engine::pipeline::SizeConditioning::of_image(width, height);
    Some(latent_engine::pipeline::SizeConditioning {
        original: args.sdxl_original_size.unwrap_or(own.original),
        crop_top_left: args.sdxl_crop.unwrap_or(own.crop_top_left),
        target: args.sdxl_target_size.unwrap_or(own.target),
    })
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
    };
    for tag in &args.lora {
        request.prompt = format!("{} <lora:{tag}>", request.prompt.trim_end());
    }
    // The prompt's LoRAs are opened before the model loads: a missing file costs no load.
    let loras = latent_engine::lora::LoraLibrary::new(args.loras.clone());
    let (set, ignored) = loras
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
    request.loras = set;
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
    let choice = latent_studio::probe::select_device(
        &args.device,
        args.probe == OnOff::On,
        timeout,
        &mut |note| match note {
            latent_studio::probe::ResolveNote::Status(s) => eprintln!("{s}"),
            latent_studio::probe::ResolveNote::Notice(s) => eprintln!("warning: {s}"),
        },
    );
    let device =
        latent_engine::device::create_watched(&choice, timeout).context("opening the device")?;
    let precision = args
        .precision
        .unwrap_or_else(|| latent_engine::device::preferred_precision(&device));
    let lanczos_hires = request
        .hires
        .is_some_and(|h| h.upscaler == HiresUpscaler::Lanczos);
    let options = LoadOptions {
        precision,
        vae_encoder: request.init.is_some() || lanczos_hires,
    };
    let cache_settings = if args.model_cache == OnOff::On {
        if !(args.cache_limit_gib.is_finite() && args.cache_limit_gib >= 0.0) {
            bail!("--cache-limit-gib must be a number ≥ 0");
        }
        CacheSettings {
            enabled: true,
            memory_budget: u64::MAX,
            disk_dir: Some(
                args.cache_dir
                    .clone()
                    .unwrap_or_else(latent_studio::studio::Settings::default_cache_dir),
            ),
            disk_limit: (args.cache_limit_gib * (1u64 << 30) as f64) as u64,
        }
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
        checkpoint.family.short_name(),
        model.config.scheduler.prediction
    );
    if std::env::var_os("LATENT_STUDIO_FAIL_VAE_COMPILE").is_some() {
        model.vae_compile.force_failure(true);
    }
    // Without a size or a picture to take it from, the model's native one (768 for SD 2.x v).
    if request.init.is_none() && args.width.is_none() && args.height.is_none() {
        let side = model.config.native_size();
        (request.width, request.height) = (side, side);
    }
    latent_engine::pipeline::check_request(&model, &request)?;
    let tokenizer = ClipTokenizer::new()?;
    if let Some(dir) = &args.embeddings {
        let width = model.config.text_encoder.hidden_size;
        let (library, notes) = Embeddings::load_dir(dir, &tokenizer, width)?;
        for note in notes {
            eprintln!("warning: {note}");
        }
        request.embeddings = Some(std::sync::Arc::new(library));
    }
    if !request.loras.0.is_empty() {
        let started = Instant::now();
        model.networks(&request.loras)?;
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
    let watch = (!latent_engine::device::is_cpu(&device) || latent_studio::stall::test_stall_set())
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
    let result = txt2img(&model, &tokenizer, &request, &cancel, &mut previewer);
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
