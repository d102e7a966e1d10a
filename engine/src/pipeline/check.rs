//! A request checked against a model before any work, and the sampler's plan for it.

use super::Txt2ImgRequest;
use crate::error::{Error, Result};
use crate::schedulers::{self, SchedulerConfig};
use crate::stable_diffusion::StableDiffusion;

/// Validates a request against a model without running anything.
pub fn check_request(model: &StableDiffusion, req: &Txt2ImgRequest) -> Result<()> {
    let scale = model.config.vae.downscale();
    let bad = |m: String| Err(Error::InvalidInput(m));
    if req.steps == 0 {
        return bad("steps must be at least 1".into());
    }
    // The model was trained on 1000 noise levels; more steps would repeat them (ComfyUI allows
    // 10,000 and silently does so). Refused here so the GUI can say so before any work.
    let max_steps = req.sampler.max_steps(req.schedule, &model.config.scheduler);
    if req.steps > max_steps {
        return bad(format!(
            "{} steps is too many: {} with the {} schedule takes at most {max_steps}",
            req.steps,
            req.sampler.a1111_name(),
            req.schedule.a1111_name()
        ));
    }
    if req.width == 0
        || req.height == 0
        || !req.width.is_multiple_of(scale)
        || !req.height.is_multiple_of(scale)
    {
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
    if let Some(init) = &req.init {
        let (w, h) = (init.image.width, init.image.height);
        if w == 0 || h == 0 || init.image.pixels.len() != w * h * 3 {
            return bad(format!("the init image ({w}x{h}) has no pixels"));
        }
        if let Some(mask) = &init.mask {
            let (w, h) = (mask.width, mask.height);
            if w == 0 || h == 0 || mask.pixels.len() != w * h * 3 {
                return bad(format!("the mask ({w}x{h}) has no pixels"));
            }
        }
        schedulers::img2img_begin(req.steps, init.strength)
            .map_err(|e| Error::InvalidInput(e.to_string()))?;
    }
    if req.size_conditioning.is_some() && model.text_encoder_2.is_none() {
        return bad("size and crop conditioning applies to SDXL models only".into());
    }
    if let Some(hires) = &req.hires {
        hires.check(req, &model.config.scheduler)?;
    }
    Ok(())
}

/// The sampler's plan for `req`: every step for txt2img, the last ⌊steps × strength⌋ for img2img.
pub fn request_plan(req: &Txt2ImgRequest, config: &SchedulerConfig) -> Result<schedulers::Plan> {
    match &req.init {
        None => schedulers::plan(req.sampler, req.schedule, req.steps, config),
        Some(init) => {
            schedulers::img2img_plan(req.sampler, req.schedule, req.steps, init.strength, config)
        }
    }
    .map_err(|e| Error::InvalidInput(e.to_string()))
}
