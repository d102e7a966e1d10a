//! `generate`'s command-line arguments and the values they parse into.

use std::path::PathBuf;

use clap::Args;
use latent_engine::device::DeviceChoice;
use latent_engine::image_io::ResizeMode;
use latent_engine::pipeline::{
    HiresFix, HiresUpscaler, MaskedContent, RefinerSwitch, SizeConditioning, Txt2ImgRequest,
};
use latent_engine::preview::PreviewMethod;
use latent_engine::prompt::Emphasis;
use latent_engine::schedulers::{SamplerKind, Schedule};
use latent_engine::vae_tiling::TilingMode;
use latent_engine::{Precision, TextEncoders};

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// A `.safetensors` checkpoint (A1111/ComfyUI layout) or a diffusers folder.
    #[arg(long)]
    pub(super) model: PathBuf,
    #[arg(long)]
    pub(super) prompt: String,
    #[arg(long, default_value = "")]
    pub(super) negative: String,
    /// Random when not given; always recorded in the PNG.
    #[arg(long)]
    pub(super) seed: Option<u64>,
    #[arg(long, default_value_t = Txt2ImgRequest::default().steps)]
    pub(super) steps: usize,
    #[arg(long, default_value_t = Txt2ImgRequest::default().cfg_scale, allow_negative_numbers = true)]
    pub(super) cfg: f32,
    /// euler, euler_a, dpmpp_2m, ddim or lcm.
    #[arg(long, default_value_t = Txt2ImgRequest::default().sampler)]
    pub(super) sampler: SamplerKind,
    /// normal or karras.
    #[arg(long, default_value_t = Txt2ImgRequest::default().schedule)]
    pub(super) schedule: Schedule,
    /// Default the model's native size (512; 768 for SD 2.x v), or with --init-image that
    /// image's width rounded down to a multiple of 8.
    #[arg(long)]
    pub(super) width: Option<usize>,
    /// Default the model's native size (512; 768 for SD 2.x v), or with --init-image that
    /// image's height rounded down to a multiple of 8.
    #[arg(long)]
    pub(super) height: Option<usize>,
    /// img2img: start from this image (PNG, JPEG or WebP) instead of pure noise.
    #[arg(long)]
    pub(super) init_image: Option<PathBuf>,
    /// img2img: how much of the image is redrawn, in (0, 1]: of --steps, the last
    /// ⌊steps × strength⌋ run (A1111's denoising strength).
    #[arg(long, default_value_t = latent_engine::pipeline::DEFAULT_STRENGTH)]
    pub(super) denoising_strength: f64,
    /// img2img, when the image is not at --width × --height: just-resize, crop-and-resize or
    /// resize-and-fill (A1111's resize modes; Lanczos resampling).
    #[arg(long, default_value = "just-resize")]
    pub(super) resize_mode: ResizeMode,
    /// Inpainting, with --init-image: a mask image, white where the picture is repainted (a
    /// 4-channel checkpoint: the rest is blended back after every step, as diffusers does).
    #[arg(long)]
    pub(super) mask: Option<PathBuf>,
    /// Inpainting: after the decode, the original is put back outside the mask, feathered by a
    /// Gaussian blur of the mask of this many pixels (A1111's mask blur and overlay); a negative
    /// value keeps the decoded image as it is (diffusers' output).
    #[arg(long, default_value_t = latent_engine::pipeline::DEFAULT_MASK_BLUR, allow_negative_numbers = true)]
    pub(super) mask_blur: f32,
    /// Inpainting: what the masked area starts from: fill, original, latent-noise or latent-nothing
    /// (A1111's masked content).
    #[arg(long, default_value = "original")]
    pub(super) masked_content: MaskedContent,
    /// Inpainting: redraw only the mask's box grown by --inpaint-padding, at --width × --height,
    /// and paste it back into the picture, which keeps its size (A1111's "Only masked").
    #[arg(long)]
    pub(super) only_masked: bool,
    /// Outpainting, with --init-image: extend the picture by LEFT,RIGHT,TOP,BOTTOM pixels (grown
    /// to multiples of 8), fill the bands with its edge pixels and inpaint them (with some of the
    /// picture beside them); use with --masked-content latent-noise --denoising-strength 1.
    #[arg(long, value_name = "LEFT,RIGHT,TOP,BOTTOM")]
    pub(super) outpaint: Option<latent_engine::image_io::Sides>,
    /// Outpainting: pixels of the picture repainted beside each extended side.
    #[arg(long, default_value_t = 8)]
    pub(super) outpaint_overlap: usize,
    /// Inpainting with --only-masked: pixels of context around the mask (A1111's padding).
    #[arg(long, default_value_t = latent_engine::pipeline::InpaintArea::DEFAULT_PADDING)]
    pub(super) inpaint_padding: usize,
    /// A folder of textual-inversion embeddings (`<name>.safetensors`, A1111's format): a name in
    /// the prompt is replaced by its vectors.
    #[arg(long)]
    pub(super) embeddings: Option<PathBuf>,
    /// A folder of LoRAs (`<name>.safetensors`, kohya/A1111 or diffusers/PEFT; subfolders are
    /// searched): `<lora:name:0.8>` in the prompt merges one in (A1111's syntax,
    /// `<lora:name:te:unet>` for separate strengths).
    #[arg(long)]
    pub(super) loras: Option<PathBuf>,
    /// Adds `<lora:NAME:…>` to the prompt: NAME, NAME:STRENGTH or NAME:TE:UNET (repeatable).
    #[arg(long = "lora", value_name = "NAME[:TE[:UNET]]")]
    pub(super) lora: Vec<String>,
    /// Hires fix: a second pass at this factor of the size (1 to 4; A1111's "Upscale by").
    #[arg(long)]
    pub(super) hires_scale: Option<f64>,
    /// Hires fix: steps of the second pass (0: --steps), run as the last steps of a schedule of
    /// steps ÷ strength as A1111 does.
    #[arg(long, default_value_t = 0)]
    pub(super) hires_steps: usize,
    /// Hires fix: denoising strength of the second pass.
    #[arg(long, default_value_t = HiresFix::default().strength)]
    pub(super) hires_strength: f64,
    /// Hires fix: Latent (bilinear, no decode between the passes) or Lanczos (the image).
    #[arg(long, default_value = "Latent")]
    pub(super) hires_upscaler: HiresUpscaler,
    /// SDXL: a refiner (single file or diffusers folder) that takes over the last steps
    /// (A1111's Refiner, diffusers' ensemble of experts).
    #[arg(long, value_name = "PATH")]
    pub(super) refiner: Option<PathBuf>,
    /// SDXL: the fraction of the steps' noise the model removes before the refiner takes over
    /// (A1111's "Refiner switch at", diffusers' `denoising_end`).
    #[arg(long, default_value_t = RefinerSwitch::DEFAULT_SWITCH_AT)]
    pub(super) refiner_switch_at: f64,
    /// SDXL: the size the model is told the source image had (diffusers' `original_size`,
    /// ComfyUI's width/height on CLIPTextEncodeSDXL). Default: --width x --height.
    #[arg(long, value_name = "WxH", value_parser = sdxl_size)]
    pub(super) sdxl_original_size: Option<[usize; 2]>,
    /// SDXL: the top-left corner of the crop the model is told was taken (diffusers'
    /// `crops_coords_top_left`), LEFTxTOP pixels. Default: 0x0.
    #[arg(long, value_name = "LEFTxTOP", value_parser = sdxl_crop)]
    pub(super) sdxl_crop: Option<[usize; 2]>,
    /// SDXL: the target size the model is told (diffusers' `target_size`). Default: --width x
    /// --height.
    #[arg(long, value_name = "WxH", value_parser = sdxl_size)]
    pub(super) sdxl_target_size: Option<[usize; 2]>,
    /// auto, cpu, gpu, gpu:N or part of an adapter name (`arc`, `lavapipe`).
    #[arg(long, default_value = "auto")]
    pub(super) device: DeviceChoice,
    /// Seconds that opening the device and compiling its first kernels may take before giving
    /// up with an error (a stuck driver thread is left behind; the process still exits).
    #[arg(long, default_value_t = 60.0)]
    pub(super) device_timeout: f64,
    /// With `--device auto`, try a GPU adapter not seen before in a child process first, so a
    /// driver crash or hang costs the child (verdicts are remembered per adapter and driver, and
    /// adapters whose probe failed are skipped even with `off`). Off by default: a probe compiles
    /// kernels in a second process.
    #[arg(long, value_enum, default_value_t = OnOff::Off)]
    pub(super) probe: OnOff,
    /// f32 or f16 (default: f16 on a GPU that supports it, else f32).
    #[arg(long)]
    pub(super) precision: Option<Precision>,
    /// Where the text encoders wait while the UNet runs: `host` (main memory: they come to the
    /// GPU only to encode the prompt; SDXL's 1.6 GB then leave room for the image on an 8 GB
    /// card), `device`, or `auto` (host for SDXL). A refiner (`--refiner`) follows it: parked
    /// (`host`; `auto` on a GPU reporting less than 15 GiB, or no size, as with `--device gpu`),
    /// its encoder and UNet wait in main memory and the two UNets take turns on the GPU: it fits
    /// 8 GB, at 5-6 s of uploads an image (18 s against 4 s an image on an H200).
    #[arg(long, default_value_t = TextEncoders::Auto)]
    pub(super) text_encoders: TextEncoders,
    /// Output PNG; without it, a new numbered file in --outputs.
    #[arg(long)]
    pub(super) out: Option<PathBuf>,
    /// Replace --out if it exists.
    #[arg(long)]
    pub(super) overwrite: bool,
    /// Folder for numbered outputs.
    #[arg(long, default_value = "outputs")]
    pub(super) outputs: PathBuf,
    /// Images in a row, seeds seed, seed+1, …
    #[arg(long, default_value_t = 1)]
    pub(super) batch_count: usize,
    /// Text encoder layers to skip from the end, A1111's way (1 = the last layer).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=12))]
    pub(super) clip_skip: u16,
    /// How `(word:1.3)` weights apply: Original (A1111), "No norm", ComfyUI, Ignore, None.
    #[arg(long, default_value = "Original", value_parser = parse_emphasis)]
    pub(super) emphasis: Emphasis,
    /// Live preview method: none, latent2rgb, taesd, full or auto (never changes the image).
    #[arg(long, default_value = "none")]
    pub(super) preview: PreviewMethod,
    /// Make a preview every N steps.
    #[arg(long, default_value_t = 1)]
    pub(super) preview_interval: usize,
    /// TAESD decoder for `--preview taesd|auto`: madebyollin's taesd_decoder.safetensors or a
    /// diffusers AutoencoderTiny folder (default: taesd_decoder.safetensors next to the model, or in `vae_approx/` there or one
    /// folder up, as ComfyUI keeps it).
    #[arg(long)]
    pub(super) taesd: Option<PathBuf>,
    /// Write every published preview there as step_NNN.png.
    #[arg(long)]
    pub(super) preview_dir: Option<PathBuf>,
    /// Disk cache of converted weights (keyed by the checkpoint's hash, dtype and format): the
    /// next launch loads faster. Off by default here so scripts never fill the cache unasked; the
    /// studio's setting defaults to on.
    #[arg(long, value_enum, default_value_t = OnOff::Off)]
    pub(super) model_cache: OnOff,
    /// Disk cache folder (default: $LATENT_STUDIO_CACHE, else the platform's cache folder).
    #[arg(long)]
    pub(super) cache_dir: Option<PathBuf>,
    /// Disk cache size bound in GiB; least recently used entries are deleted first.
    #[arg(long, default_value_t = 20.0)]
    pub(super) cache_limit_gib: f64,
    /// Our fused GroupNorm+SiLU kernels for the VAE decode, verified against the plain path at
    /// first use (on by default: 18 % faster per 512² decode on an H200, see BENCHMARKS.md).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub(super) vae_compile: OnOff,
    /// Decode in 512-pixel tiles (same image as untiled, less GPU memory, about twice the time):
    /// auto (images over 768x768 pixels, such as SDXL's, or when a decoder buffer would pass
    /// 1 GiB), on, or off.
    #[arg(long, default_value = "auto")]
    pub(super) vae_tiling: TilingMode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

/// An emphasis mode by its A1111 name.
fn parse_emphasis(name: &str) -> std::result::Result<Emphasis, String> {
    Emphasis::from_name(name).ok_or_else(|| {
        format!("unknown emphasis `{name}`: Original, No norm, ComfyUI, Ignore or None")
    })
}

fn sdxl_size(s: &str) -> Result<[usize; 2], String> {
    latent_engine::pipeline::sdxl::parse_wxh(s, false).map_err(|e| e.to_string())
}

fn sdxl_crop(s: &str) -> Result<[usize; 2], String> {
    latent_engine::pipeline::sdxl::parse_wxh(s, true).map_err(|e| e.to_string())
}

/// SDXL's size and crop conditioning where any of its flags is given, the rest the image's own.
pub(super) fn size_conditioning(
    args: &GenerateArgs,
    width: usize,
    height: usize,
) -> Option<SizeConditioning> {
    if args.sdxl_original_size.is_none()
        && args.sdxl_crop.is_none()
        && args.sdxl_target_size.is_none()
    {
        return None;
    }
    let own = SizeConditioning::of_image(width, height);
    Some(SizeConditioning {
        original: args.sdxl_original_size.unwrap_or(own.original),
        crop_top_left: args.sdxl_crop.unwrap_or(own.crop_top_left),
        target: args.sdxl_target_size.unwrap_or(own.target),
    })
}
