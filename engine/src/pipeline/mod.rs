//! txt2img and img2img, as diffusers' `StableDiffusionPipeline` and
//! `StableDiffusionImg2ImgPipeline` do them, in numbered stages. The denoising loop keeps
//! everything on the device: the scheduler's update is a linear combination whose coefficients are
//! computed up front on the host, so no step reads a tensor back.
//!
//! `decode.rs`: latents to pixels (NaN guard, tiling). `init.rs`: img2img's encoded start and
//! inpainting's blend. `inpaint_model.rs`: what an inpainting UNet takes beside the latents.
//! `hires.rs`: A1111's hires fix, a second img2img pass at a larger size. `sdxl.rs`: SDXL's
//! second encoder, empty negative and size conditioning. `check.rs`: a request checked against a
//! model before any work. `observer.rs`: what a run reports (steps, notices, finished images).
//! `tuning.rs`: whether a pass is the first at its shapes (its kernels tune first).
//! `refiner.rs`: SDXL's refiner taking over a run's last steps.

mod check;
mod conditioning;
mod decode;
pub mod hires;
mod init;
pub mod inpaint_area;
mod inpaint_model;
mod observer;
mod parameters;
pub mod refiner;
pub mod sdxl;
mod tuning;

pub use check::{check_request, request_plan};
pub use decode::{all_finite, decode, to_rgb8};
pub use hires::{HiresFix, HiresUpscaler};
pub use init::{DEFAULT_MASK_BLUR, DEFAULT_STRENGTH, InitImage, MaskedContent};
pub use inpaint_area::InpaintArea;
pub use observer::{Generated, Notice, Observer, Quiet, StepState};
pub use refiner::RefinerSwitch;
pub use sdxl::SizeConditioning;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use burn::tensor::{DType, Tensor, TensorData};

use crate::error::{Error, Result};
use crate::noise::TorchRng;
use crate::prompt::{self, Conditioning};
use crate::schedulers::{self, SamplerKind, Schedule};
use crate::stable_diffusion::{Refiner, StableDiffusion};
use crate::tokenizer::ClipTokenizer;
use crate::unet::graph::UNetSteps;
use crate::unet::{Context, UNet2DConditionModel};
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
    /// img2img: start from this image instead of pure noise.
    pub init: Option<InitImage>,
    /// txt2img: a second pass at a larger size (A1111's hires fix).
    pub hires: Option<HiresFix>,
    /// Textual-inversion embeddings the prompts may name.
    pub embeddings: Option<std::sync::Arc<prompt::Embeddings>>,
    /// LoRAs merged into the text encoder and UNet for this request (the front ends read them
    /// from the prompt's `<lora:…>` tags: [`crate::lora::LoraLibrary::resolve`]).
    pub loras: crate::lora::LoraSet,
    /// SDXL's size and crop conditioning; `None`: the image's own size, no crop.
    pub size_conditioning: Option<SizeConditioning>,
    /// SDXL: the refiner takes over the last steps ([`txt2img_refined`] brings the model).
    pub refiner: Option<RefinerSwitch>,
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
            init: None,
            hires: None,
            embeddings: None,
            loras: crate::lora::LoraSet::default(),
            size_conditioning: None,
            refiner: None,
        }
    }
}

/// Runs txt2img, or img2img when the request has an init image (the model then needs its VAE
/// encoder). `cancel` is checked before every step and before the decode.
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
    txt2img_refined(model, None, tokenizer, req, cancel, observer)
}

/// [`txt2img`] with SDXL's refiner for a request that names one ([`Txt2ImgRequest::refiner`]);
/// a request that names one without a refiner loaded is refused.
pub fn txt2img_refined(
    model: &StableDiffusion,
    refiner: Option<&Refiner>,
    tokenizer: &ClipTokenizer,
    req: &Txt2ImgRequest,
    cancel: &AtomicBool,
    observer: &mut dyn Observer,
) -> Result<Vec<Generated>> {
    let result = generate(model, refiner, tokenizer, req, cancel, observer);
    // Whatever this run tuned (a cancelled or failed one too) serves the next launch.
    if !crate::device::is_cpu(&model.device) {
        crate::device::tuning::save_quietly();
    }
    if releases_pool_after_run(model) {
        crate::device::release_free(&model.device);
    }
    result
}

/// Whether a run on `model` returns the pool's free pages to the driver when it ends: for a
/// model that parks its text encoders (SDXL's default; the memory-saving mode), so that the
/// next run's steps do not grow the pool beside the pages the last decode left free, pages that
/// in-use bytes never need again until that decode (SDXL at 1024² held 10.1 GiB between its
/// first image and the next run's steps, BENCHMARKS.md twenty-ninth session).
/// `LATENT_STUDIO_KEEP_POOL=1` keeps them (to measure what this saves).
fn releases_pool_after_run(model: &StableDiffusion) -> bool {
    model.parked() && std::env::var("LATENT_STUDIO_KEEP_POOL").as_deref() != Ok("1")
}

fn generate(
    model: &StableDiffusion,
    refiner: Option<&Refiner>,
    tokenizer: &ClipTokenizer,
    req: &Txt2ImgRequest,
    cancel: &AtomicBool,
    observer: &mut dyn Observer,
) -> Result<Vec<Generated>> {
    // 1. Check inputs.
    check_request(model, req)?;
    let plan = request_plan(req, &model.config.scheduler)?;
    let device = &model.device;
    // 2. Encode the prompts (or reuse the last request's conditioning when they match).
    let guided = req.cfg_scale > 1.0;
    let (Conditioning { context, pooled }, ti_hashes) =
        conditioning::encode(model, tokenizer, req, guided, observer)?;
    let mut refiner = match (&req.refiner, refiner) {
        (Some(switch), Some(r)) => Some(refiner::Stage::prepare(
            model, r, switch, tokenizer, req, guided,
        )?),
        (Some(_), None) => {
            return Err(Error::InvalidInput(
                "the request names a refiner, but none is loaded".into(),
            ));
        }
        (None, _) => None,
    };
    let unet = model.unet_for(&req.loras)?;
    let size = req
        .size_conditioning
        .unwrap_or_else(|| SizeConditioning::of_image(req.width, req.height));
    let added = pooled
        .as_ref()
        .map(|p| sdxl::added(&unet, p, size))
        .transpose()?;
    // The hires pass's size (its own conditioning, tuning and blank picture are at it).
    let hires_size = req.hires.as_ref().map(|h| h.target(req.width, req.height));
    // SDXL's hires pass conditions on its own size, as A1111 conditions it (`hr_upscale_to_x/y`).
    let hires_added = match (&pooled, hires_size) {
        (Some(p), Some((w, h))) => Some(sdxl::added(&unet, p, SizeConditioning::of_image(w, h))?),
        _ => None,
    };

    let scale = model.config.vae.downscale();
    let shape = [
        1,
        model.config.unet.out_channels,
        req.height / scale,
        req.width / scale,
    ];
    // An inpainting UNet with no mask to go by is conditioned on a blank picture, at each
    // pass's size.
    let inpainting = model.config.unet.is_inpainting();
    let unmasked = req.init.as_ref().is_none_or(|i| i.mask.is_none());
    let blank = match inpainting && unmasked {
        true => Some(inpaint_model::blank(model, req.width, req.height)?),
        false => None,
    };
    let dtype = model.precision.dtype();
    let hires_blank = match (hires_size, inpainting) {
        (Some((w, h)), true) => Some(inpaint_model::blank(model, w, h)?.cast(dtype)),
        _ => None,
    };
    // A pass that is the first at its shapes on this GPU waits for the kernels' tuning: said.
    let pass_shape = |width, height| tuning::PassShape {
        device,
        dtype,
        unet: &model.config.unet,
        batch: if guided { 2 } else { 1 },
        width,
        height,
    };
    let first_pass = tuning::first_run(pass_shape(req.width, req.height));
    if first_pass && tuning::announce(pass_shape(req.width, req.height)) {
        observer.tuning(req.width, req.height);
    }
    // img2img encodes its image once; each seed then samples and noises it.
    let encoded = match &req.init {
        Some(init) => Some(init::encode(model, init, req.width, req.height)?),
        None => None,
    };
    let hires = req
        .hires
        .as_ref()
        .map(|h| h.plan(req, &model.config.scheduler))
        .transpose()?;
    let total = plan.num_steps() + hires.as_ref().map_or(0, |h| h.plan.num_steps());
    let mut out = Vec::with_capacity(req.batch_count);
    // Every step of every image has one shape: after a few, the step replays a recorded graph.
    // The hires pass, of another shape, runs launch by launch (one recorded graph at a time).
    // The model's own UNet (no LoRA) at SD 1.x/2.x sizes keeps its recorded step between
    // generations: the next one of the same shapes replays from its first step. SDXL's and the
    // hires fix's are released before their decode, whose peak needs those pages.
    let keep_steps = req.loras.is_empty() && added.is_none() && req.hires.is_none();
    let parked = model.parked_steps.take().filter(|_| keep_steps);
    let new_steps = |unet: &UNet2DConditionModel, tuned: bool| {
        let mut steps = UNetSteps::new(unet, context.clone());
        if tuned {
            steps = steps.tuned();
        }
        if let Some(added) = &added {
            steps = steps.with_added(added.clone());
        }
        steps
    };
    let resumed = parked.and_then(|r| UNetSteps::resume(&unet, context.clone(), added.clone(), r));
    // `None` while a parked refiner runs (the base UNet is off the device then).
    let mut steps = Some(resumed.unwrap_or_else(|| new_steps(&unet, !first_pass)));
    // The hires pass's UNet (a refined run has no hires pass: `refiner::check_pair`). No other
    // handle on the base UNet stays here, so that a parked refiner's switch frees its memory.
    let hires_unet = req.hires.is_some().then(|| unet.clone());
    drop(unet);
    // The prompt's keys and values for the hires pass's steps, projected at its first.
    let mut hires_kv: Option<Vec<Tensor<3>>> = None;
    let mut second = |x: Tensor<4>, t: f32| -> Result<Tensor<4>> {
        let unet = hires_unet
            .as_ref()
            .ok_or_else(|| Error::InvalidInput("a hires pass without a hires request".into()))?;
        let b = x.dims()[0];
        let kv = hires_kv.get_or_insert_with(|| unet.project_context(&context));
        let context = Context::projected(&context, kv);
        Ok(unet.forward_context(x, &vec![t; b], context, hires_added.as_ref()))
    };
    for image in 0..req.batch_count {
        let seed = req.seed.wrapping_add(image as u64);
        let start = Instant::now();
        // 3. Timesteps come from the plan. 4. Latents: torch.randn with the seed, on the CPU.
        let mut rng = TorchRng::new(seed);
        // f32 like diffusers' latents.
        let strength = req.init.as_ref().map_or(1.0, |i| i.strength);
        let (latents, blend, unet_input) = match &encoded {
            Some(encoded) => {
                let s = encoded.start(&mut rng, &plan, strength);
                (s.latents, s.blend, s.unet_input.or_else(|| blank.clone()))
            }
            None => (
                randn(&mut rng, shape, device) * plan.init_noise_sigma,
                None,
                blank.clone(),
            ),
        };
        // 5. Denoise.
        let mut pass = Pass {
            image,
            start,
            done: 0,
            total,
            dtype,
            blend,
            unet_input: unet_input.map(|t| t.cast(dtype)),
        };
        // The refiner, where there is one, takes the steps past its switch. A parked one's UNet
        // comes to the device as the base's leaves (its recorded step first), and the base's
        // comes back for the next image's steps.
        let mut first = |x: Tensor<4>, t: f32| -> Result<Tensor<4>> {
            if let Some(stage) = refiner.as_mut()
                && stage.takes(t)
            {
                if stage.swaps() && steps.take().is_some() {
                    model.evict_unet()?;
                }
                return stage.forward(x, t);
            }
            let steps = match &mut steps {
                Some(steps) => steps,
                None => steps.insert(new_steps(&model.unet_for(&req.loras)?, true)),
            };
            Ok(steps.forward(x, t))
        };
        let denoised = pass.denoise(&mut first, &plan, latents, &mut rng, req, cancel, observer);
        // A parked refiner's UNet leaves before the decode, whatever the steps came to (the
        // steps' error first where both failed).
        let put_away = refiner.as_mut().map_or(Ok(()), |stage| stage.put_away());
        let denoised = denoised?;
        put_away?;
        if image + 1 == req.batch_count
            && let Some(steps) = steps.as_mut()
        {
            // The recorded step keeps every page it touched for itself: released before the
            // last decode, that memory serves the decode (SDXL's peak at 1024²), or parked for
            // the next generation. Earlier images of a batch keep it, or each would record again.
            match keep_steps {
                true => {
                    if let Some(recording) = steps.park() {
                        model.parked_steps.put(recording);
                    }
                }
                false => steps.release(),
            }
        }
        let Some(mut latents) = denoised else {
            return cancelled(out);
        };
        // 5b. Hires fix: upscale, noise again from the seed, denoise at the larger size.
        if let Some(hires) = &hires {
            if cancel.load(Ordering::Relaxed) {
                return cancelled(out);
            }
            let mut rng = TorchRng::new(seed);
            let start = hires.start(model, latents, &req.decode, &mut rng, observer)?;
            if let Some((w, h)) = hires_size
                && tuning::first_run(pass_shape(w, h))
                && tuning::announce(pass_shape(w, h))
            {
                observer.tuning(w, h);
            }
            pass.blend = None;
            pass.unet_input = hires_blank.clone();
            match pass.denoise(
                &mut second,
                &hires.plan,
                start,
                &mut rng,
                req,
                cancel,
                observer,
            )? {
                Some(l) => latents = l,
                None => return cancelled(out),
            }
        }

        // 6. Decode, unless cancelled after the last step: the decode of a large image takes
        // seconds the artist asked not to spend.
        if cancel.load(Ordering::Relaxed) {
            return cancelled(out);
        }
        let mut image = decode(model, latents, &req.decode, observer)?;
        if let Some(encoded) = &encoded {
            encoded.paste_original(&mut image)?;
        }
        let generated = Generated {
            image,
            seed,
            ti_hashes: ti_hashes.clone(),
        };
        observer.image(&generated);
        out.push(generated);
    }
    Ok(out)
}

/// Standard normal f32 latents of `shape` from the seed's generator (`torch.randn` on the CPU).
fn randn(rng: &mut TorchRng, shape: [usize; 4], device: &burn::tensor::Device) -> Tensor<4> {
    let numel = shape.iter().product();
    Tensor::<4>::from_data(
        TensorData::new(rng.randn(numel), shape),
        (device, DType::F32),
    )
}

/// One image's progress over its passes (the hires pass counts on from the first).
struct Pass {
    image: usize,
    start: Instant,
    done: usize,
    total: usize,
    /// The UNet's dtype (the sampler keeps f32).
    dtype: DType,
    /// Inpainting: what each step blends back in outside the mask.
    blend: Option<init::Blend>,
    /// An inpainting UNet's mask and masked-picture latents, in the UNet's dtype.
    unet_input: Option<Tensor<4>>,
}

impl Pass {
    /// Runs `plan` from `latents` with `unet` (the model's prediction for an input at a
    /// timestep); `None` when cancelled before a step.
    #[allow(clippy::too_many_arguments)]
    fn denoise(
        &mut self,
        unet: &mut dyn FnMut(Tensor<4>, f32) -> Result<Tensor<4>>,
        plan: &schedulers::Plan,
        mut latents: Tensor<4>,
        rng: &mut TorchRng,
        req: &Txt2ImgRequest,
        cancel: &AtomicBool,
        observer: &mut dyn Observer,
    ) -> Result<Option<Tensor<4>>> {
        let guided = req.cfg_scale > 1.0;
        let dtype = latents.dtype();
        let model_dtype = self.dtype;
        let mut prev_x0: Option<Tensor<4>> = None;
        for (i, &t) in plan.timesteps.iter().enumerate() {
            if cancel.load(Ordering::Relaxed) {
                return Ok(None);
            }
            let input = (latents.clone() * plan.input_scale[i]).cast(model_dtype);
            let input = match &self.unet_input {
                Some(extra) => Tensor::cat(vec![input, extra.clone()], 1),
                None => input,
            };
            let input = if guided {
                Tensor::cat(vec![input.clone(), input], 0)
            } else {
                input
            };
            let eps = unet(input, t)?.cast(dtype);
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
            if let Some(x0) = &prev_x0
                && c.prev_x0 != 0.0
            {
                next = next + x0.clone() * c.prev_x0;
            }
            if plan.draws_noise {
                // Drawn every step (even when its weight is 0) to stay in step with diffusers' stream.
                let n = randn(rng, latents.dims(), &latents.device());
                if c.noise != 0.0 {
                    next = next + n * c.noise;
                }
            }
            latents = match &self.blend {
                Some(blend) => blend.apply(next, plan, i),
                None => next,
            };
            self.done += 1;
            observer.step(&StepState {
                image: self.image,
                step: self.done,
                total: self.total,
                elapsed: self.start.elapsed(),
                latents: &latents,
                denoised: &denoised,
            });
            prev_x0 = Some(denoised);
        }
        Ok(Some(latents))
    }
}

/// What a cancel returns: the finished images of the batch count, or `Cancelled` when none is.
fn cancelled(done: Vec<Generated>) -> Result<Vec<Generated>> {
    if done.is_empty() {
        Err(Error::Cancelled)
    } else {
        Ok(done)
    }
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
