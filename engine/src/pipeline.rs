//! txt2img, as diffusers' `StableDiffusionPipeline` does it, in numbered stages. The denoising loop
//! keeps everything on the device: the scheduler's update is a linear combination whose
//! coefficients are computed up front on the host, so no step reads a tensor back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use burn::tensor::{DType, Tensor, TensorData};

use crate::error::{Error, Result};
use crate::image_io::RgbImage;
use crate::model::StableDiffusion;
use crate::noise::TorchRng;
use crate::prompt;
use crate::schedulers::{self, SamplerKind, Schedule, SchedulerConfig};
use crate::tokenizer::ClipTokenizer;
use crate::unet::graph::UNetSteps;
use crate::vae_tiling::TilingConfig;

/// How a request's images are decoded. Part of the request, not of the (shared, cached) model,
/// so that one front end's choice never changes another's decode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeOptions {
    /// Tiled or whole; the device's limits can still force tiles
    /// ([`crate::vae_tiling::TilingConfig::fit_to`]).
    pub tiling: TilingConfig,
    /// Our verified GroupNorm+SiLU kernels ([`crate::vae_compile`]), else burn's plain ops.
    pub compile: bool,
}

impl Default for DecodeOptions {
    /// Auto tiling, burn's plain ops: the engine compiles nothing it is not asked to. The CLI's
    /// `--vae-compile` and the studio's setting turn compilation on by default.
    fn default() -> Self {
        Self {
            tiling: TilingConfig::default(),
            compile: false,
        }
    }
}

/// One txt2img request, as the CLI and GUI fill it.
#[derive(Debug, Clone, PartialEq)]
pub struct Txt2ImgRequest {
    pub prompt: String,
    pub negative_prompt: String,
    pub seed: u64,
    pub steps: usize,
    pub cfg_scale: f32,
    pub sampler: SamplerKind,
    pub schedule: Schedule,
    pub width: usize,
    pub height: usize,
    /// Images made one after another with seeds `seed, seed + 1, …` (A1111's batch count).
    pub batch_count: usize,
    /// A1111 convention: 1 = last text encoder layer, 2 = penultimate.
    pub clip_skip: usize,
    /// How `(word:1.3)` weights apply (A1111's emphasis mode).
    pub emphasis: crate::prompt::Emphasis,
    pub decode: DecodeOptions,
}

impl Default for Txt2ImgRequest {
    fn default() -> Self {
        Self {
            prompt: String::new(),
            negative_prompt: String::new(),
            seed: 0,
            steps: 20,
            cfg_scale: 7.0,
            sampler: SamplerKind::Euler,
            schedule: Schedule::Normal,
            width: 512,
            height: 512,
            batch_count: 1,
            clip_skip: 1,
            emphasis: crate::prompt::Emphasis::default(),
            decode: DecodeOptions::default(),
        }
    }
}

/// Where the pipeline is, for progress bars and previews.
pub struct StepState<'a> {
    /// Index of the image within the batch count.
    pub image: usize,
    /// Steps done so far (1-based after a step).
    pub step: usize,
    pub total: usize,
    pub elapsed: Duration,
    /// The latent the sampler continues from. Read it, never mutate it.
    pub latents: &'a Tensor<4>,
    /// The predicted denoised latent of this step (a new tensor, safe to hand to previews).
    pub denoised: &'a Tensor<4>,
}

/// Things worth telling the artist that are not errors.
#[derive(Debug, Clone, PartialEq)]
pub enum Notice {
    /// The prompt passed [`prompt::MAX_CHUNKS`] chunks of 75 tokens; the rest was not read.
    PromptTruncated {
        which: &'static str,
        tokens: usize,
        kept: usize,
    },
    PreviewFallback {
        wanted: &'static str,
        used: &'static str,
        reason: &'static str,
    },
    /// VAE compilation was abandoned for this model; the plain path decodes from now on.
    VaeCompileFallback { reason: String },
    /// The f16 VAE decoded NaN or infinite pixels; the image was decoded again in f32, and this
    /// model's VAE stays in f32 from now on (A1111's automatic `--no-half-vae`).
    VaeRetriedInF32,
}

impl std::fmt::Display for Notice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Notice::PromptTruncated {
                which,
                tokens,
                kept,
            } => write!(
                f,
                "the {which} has {tokens} tokens; only the first {kept} are read"
            ),
            Notice::PreviewFallback {
                wanted,
                used,
                reason,
            } => {
                write!(
                    f,
                    "preview: {wanted} is not available ({reason}); showing {used} instead"
                )
            }
            Notice::VaeCompileFallback { reason } => write!(
                f,
                "VAE compilation is off for this model: {reason}. Decoding uses the plain path; images are unaffected"
            ),
            Notice::VaeRetriedInF32 => f.write_str(
                "the VAE produced NaN in f16, so the image was decoded again in f32; \
                 this model's VAE stays in f32 from now on (slower, more memory)",
            ),
        }
    }
}

/// What the pipeline reports while it runs.
pub trait Observer {
    fn notice(&mut self, _notice: &Notice) {}
    fn step(&mut self, _state: &StepState<'_>) {}
    /// An image of the batch count is finished (decoded), before the next one starts: save it
    /// now, so that a later failure or a stuck device never costs the finished ones.
    fn image(&mut self, _generated: &Generated) {}
    /// A VAE decode starts, in `tiles` tiles (1: the whole latent at once). A tiled decode gives
    /// the untiled image, so this is the one sign of it.
    fn decoding(&mut self, _tiles: usize) {}
}

/// An observer that ignores everything.
pub struct Quiet;
impl Observer for Quiet {}

/// One finished image and the seed it came from.
#[derive(Debug, Clone)]
pub struct Generated {
    pub image: RgbImage,
    pub seed: u64,
}

/// Validates a request against a model without running anything.
pub fn check_request(model: &StableDiffusion, req: &Txt2ImgRequest) -> Result<()> {
    let scale = model.config.vae.downscale();
    let bad = |m: String| Err(Error::InvalidInput(m));
    if req.steps == 0 {
        return bad("steps must be at least 1".into());
    }
    // The model was trained on 1000 noise levels; more steps would repeat them (ComfyUI allows
    // 10,000 and silently does so). Refused here so the GUI can say so before any work.
    let max_steps = req
        .sampler
        .max_steps(req.schedule, &SchedulerConfig::sd15());
    if req.steps > max_steps {
        return bad(format!(
            "{} steps is too many: {} with the {} schedule takes at most {max_steps}",
            req.steps,
            req.sampler.a1111_name(),
            req.schedule.a1111_name()
        ));
    }
    if req.width == 0 || req.height == 0 || req.width % scale != 0 || req.height % scale != 0 {
        return bad(format!(
            "width and height must be positive multiples of {scale}, got {}x{}",
            req.width, req.height
        ));
    }
    if req.width > 8192 || req.height > 8192 {
        return bad(format!(
            "{}x{} is larger than the 8192 pixel limit",
            req.width, req.height
        ));
    }
    if !req.cfg_scale.is_finite() || req.cfg_scale < 0.0 {
        return bad(format!(
            "CFG scale must be a finite number ≥ 0, got {}",
            req.cfg_scale
        ));
    }
    if req.batch_count == 0 {
        return bad("batch count must be at least 1".into());
    }
    Ok(())
}

/// Runs txt2img. `cancel` is checked before every step and before the decode.
///
/// A cancelled run returns [`Error::Cancelled`] when no image was finished, and otherwise the
/// images of the batch count finished before the cancel (fewer than `batch_count`), as A1111's
/// Interrupt keeps a batch's finished images.
pub fn txt2img(
    model: &StableDiffusion,
    tokenizer: &ClipTokenizer,
    req: &Txt2ImgRequest,
    cancel: &AtomicBool,
    observer: &mut dyn Observer,
) -> Result<Vec<Generated>> {
    // 1. Check inputs.
    check_request(model, req)?;
    let scheduler_config = SchedulerConfig::sd15();
    let plan = schedulers::plan(req.sampler, req.schedule, req.steps, &scheduler_config)
        .map_err(|e| Error::InvalidInput(e.to_string()))?;
    let device = &model.device;
    let dtype = model.precision.dtype();

    // 2. Encode the prompt in A1111's 75-token chunks with its emphasis weights. CFG ≤ 1 skips
    // the unconditional pass, as diffusers does.
    let guided = req.cfg_scale > 1.0;
    let encode =
        |text: &str, which: &'static str, observer: &mut dyn Observer| -> Result<Tensor<3>> {
            let chunks = prompt::Chunks::new(tokenizer, text, req.emphasis);
            if chunks.truncated {
                let notice = Notice::PromptTruncated {
                    which,
                    tokens: chunks.token_count,
                    kept: prompt::MAX_CHUNKS * crate::tokenizer::MAX_PROMPT_TOKENS,
                };
                tracing::warn!("{notice}");
                observer.notice(&notice);
            }
            prompt::encode(&model.text_encoder, &chunks, req.clip_skip, req.emphasis)
        };
    let cond = encode(&req.prompt, "prompt", observer)?;
    let context = if guided {
        let uncond = encode(&req.negative_prompt, "negative prompt", observer)?;
        // Different chunk counts meet at their least common multiple (exact for attention).
        let chunks = |t: &Tensor<3>| t.dims()[1] / crate::tokenizer::CONTEXT_LEN;
        let common = prompt::common_chunks(chunks(&cond), chunks(&uncond));
        let (uncond, cond) = (
            prompt::repeat_chunks(uncond, common),
            prompt::repeat_chunks(cond, common),
        );
        Tensor::cat(vec![uncond, cond], 0) // [2, 77·k, d]: unconditional first, as diffusers
    } else {
        cond
    };

    let scale = model.config.vae.downscale();
    let shape = [
        1,
        model.config.unet.in_channels,
        req.height / scale,
        req.width / scale,
    ];
    let numel: usize = shape.iter().product();
    let mut out = Vec::with_capacity(req.batch_count);
    // Every step of every image has one shape: after a few, the step replays a recorded graph.
    let mut unet = UNetSteps::new(&model.unet, context);
    for image in 0..req.batch_count {
        let seed = req.seed.wrapping_add(image as u64);
        let start = Instant::now();
        // 3. Timesteps come from the plan. 4. Latents: torch.randn with the seed, on the CPU.
        let mut rng = TorchRng::new(seed);
        let noise = |rng: &mut TorchRng| {
            Tensor::<4>::from_data(
                TensorData::new(rng.randn(numel), shape),
                (device, DType::F32),
            )
        };
        let mut latents = noise(&mut rng) * plan.init_noise_sigma; // f32 like diffusers' latents
        let mut prev_x0: Option<Tensor<4>> = None;

        // 5. Denoise.
        for (i, &t) in plan.timesteps.iter().enumerate() {
            if cancel.load(Ordering::Relaxed) {
                return cancelled(out);
            }
            let input = (latents.clone() * plan.input_scale[i]).cast(dtype);
            let input = if guided {
                Tensor::cat(vec![input.clone(), input], 0)
            } else {
                input
            };
            let eps = unet.forward(input, t).cast(DType::F32);
            let eps = if guided {
                let [uncond, text] = split_batch(eps);
                uncond.clone() + (text - uncond) * req.cfg_scale
            } else {
                eps
            };
            let x0 = plan.x0[i];
            let denoised = latents.clone() * x0.sample + eps.clone() * x0.model_output;
            let c = plan.steps[i];
            let mut next = latents.clone() * c.sample + eps * c.model_output;
            if let Some(x0) = &prev_x0 {
                if c.prev_x0 != 0.0 {
                    next = next + x0.clone() * c.prev_x0;
                }
            }
            if plan.draws_noise {
                // Drawn every step (even when its weight is 0) to stay in step with diffusers' stream.
                let n = noise(&mut rng);
                if c.noise != 0.0 {
                    next = next + n * c.noise;
                }
            }
            latents = next;
            observer.step(&StepState {
                image,
                step: i + 1,
                total: plan.timesteps.len(),
                elapsed: start.elapsed(),
                latents: &latents,
                denoised: &denoised,
            });
            prev_x0 = Some(denoised);
        }

        // 6. Decode, unless cancelled after the last step: the decode of a large image takes
        // seconds the artist asked not to spend.
        if cancel.load(Ordering::Relaxed) {
            return cancelled(out);
        }
        let generated = Generated {
            image: decode(model, latents, &req.decode, observer)?,
            seed,
        };
        observer.image(&generated);
        out.push(generated);
    }
    Ok(out)
}

/// What a cancel returns: the finished images of the batch count, or `Cancelled` when none is.
fn cancelled(done: Vec<Generated>) -> Result<Vec<Generated>> {
    if done.is_empty() {
        Err(Error::Cancelled)
    } else {
        Ok(done)
    }
}

/// Decodes the sampler's f32 latents `[1, c, h, w]` to an image as `options` say (tiled or whole,
/// through the VAE compiler or not). Never returns a black image for NaN: non-finite
/// latents are [`Error::NonFiniteLatents`]; an f16 decode with non-finite pixels is decoded again
/// with an f32 copy of the VAE (one [`Notice::VaeRetriedInF32`], and f32 from then on), and pixels
/// still not finite are [`Error::NonFiniteImage`].
pub fn decode(
    model: &StableDiffusion,
    latents: Tensor<4>,
    options: &DecodeOptions,
    observer: &mut dyn Observer,
) -> Result<RgbImage> {
    let latents = latents.cast(DType::F32);
    if !all_finite(&latents)? {
        return Err(Error::NonFiniteLatents);
    }
    let f32_failure = Error::NonFiniteImage { precision: "f32" };
    if model.precision == crate::Precision::F32 || model.vae_upcast() {
        let (vae, _) = model.vae_f32();
        let pixels = decode_with(model, vae, latents, options, observer);
        return if all_finite(&pixels)? {
            to_rgb8(pixels)
        } else {
            Err(f32_failure)
        };
    }
    let pixels = decode_with(
        model,
        &model.vae,
        latents.clone().cast(model.precision.dtype()),
        options,
        observer,
    );
    if all_finite(&pixels)? {
        return to_rgb8(pixels);
    }
    let (vae, made) = model.vae_f32();
    if made {
        // The notice is the one warning: the CLI prints it, the studio shows and logs it.
        tracing::debug!("f16 VAE decode was not finite; retrying in f32");
        observer.notice(&Notice::VaeRetriedInF32);
    }
    let pixels = decode_with(model, vae, latents, options, observer);
    if all_finite(&pixels)? {
        to_rgb8(pixels)
    } else {
        Err(f32_failure)
    }
}

/// One decode with `vae` (the model's, or its f32 copy), tiled or whole as `options` say, with
/// the kernels VAE compilation chose.
fn decode_with(
    model: &StableDiffusion,
    vae: &crate::vae::AutoencoderKL,
    latents: Tensor<4>,
    options: &DecodeOptions,
    observer: &mut dyn Observer,
) -> Tensor<4> {
    let dims = latents.dims();
    let limit = crate::limits::DeviceLimits::of(&model.device).max_tensor_bytes();
    let tiling = options.tiling.fit_to(vae.config(), dims[0], limit);
    // The device's limit wins over "never": a decode that cannot fit would fail.
    let too_large = crate::vae_tiling::largest_decoder_buffer_bytes(vae.config(), dims) > limit;
    let kernels = model
        .vae_compile
        .kernels(options.compile, vae, &latents, &mut |n| observer.notice(&n));
    if tiling.should_tile(vae.config(), dims) || too_large {
        tracing::debug!(?dims, ?tiling, "tiled VAE decode");
        observer.decoding(tiling.tile_count(dims));
        crate::vae_tiling::tiled_decode(vae, latents, &tiling, kernels)
    } else {
        observer.decoding(1);
        vae.decode_with(latents, kernels)
    }
}

/// Whether every value is finite: one reduction on the device and a single value read back.
pub fn all_finite(t: &Tensor<4>) -> Result<bool> {
    t.clone()
        .is_finite()
        .all()
        .try_into_scalar::<bool>()
        .map_err(|e| Error::Device(format!("cannot read a finiteness check: {e:?}")))
}

/// Splits a batch of 2 into its halves.
fn split_batch(t: Tensor<4>) -> [Tensor<4>; 2] {
    let [b, c, h, w] = t.dims();
    let half = b / 2;
    [
        t.clone().slice([0..half, 0..c, 0..h, 0..w]),
        t.slice([half..b, 0..c, 0..h, 0..w]),
    ]
}

/// `[1, 3, h, w]` in about [-1, 1] -> RGB8, as diffusers: `round(clamp(x / 2 + 0.5, 0, 1) * 255)`.
/// Non-finite pixels are an error: a black image is never saved silently.
pub fn to_rgb8(pixels: Tensor<4>) -> Result<RgbImage> {
    let [_, c, h, w] = pixels.dims();
    let data = pixels
        .cast(DType::F32)
        .into_data()
        .try_to_vec::<f32>()
        .map_err(|e| Error::Device(format!("cannot read the decoded image: {e:?}")))?;
    if data.iter().any(|v| !v.is_finite()) {
        return Err(Error::InvalidInput(
            "the decoded image contains NaN or infinite values (try f32 precision)".into(),
        ));
    }
    let plane = h * w;
    let mut rgb = Vec::with_capacity(plane * 3);
    for i in 0..plane {
        for ch in 0..3 {
            let v = data[ch.min(c - 1) * plane + i];
            rgb.push(((v / 2.0 + 0.5).clamp(0.0, 1.0) * 255.0).round_ties_even() as u8); // numpy rounds half to even
        }
    }
    Ok(RgbImage {
        width: w,
        height: h,
        pixels: rgb,
    })
}
