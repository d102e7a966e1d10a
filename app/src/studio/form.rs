//! The prompt panel's values, and how they map to a request and back from PNG parameters.

use std::sync::Arc;

use latent_engine::image_io::{ResizeMode, RgbImage};
use latent_engine::parameters::Parameters;
use latent_engine::pipeline::{
    HiresFix, InitImage, MaskedContent, RefinerSwitch, SizeConditioning, Txt2ImgRequest,
};
use latent_engine::prompt::Emphasis;
use latent_engine::schedulers::{SamplerKind, Schedule};

/// Size presets, all multiples of 8 (SD 1.x native sizes first).
pub const SIZE_PRESETS: &[(usize, usize)] = &[
    (512, 512),
    (512, 768),
    (768, 512),
    (768, 768),
    (640, 448),
    (448, 640),
];

#[derive(Debug, Clone, PartialEq)]
pub struct Form {
    pub prompt: String,
    pub negative: String,
    pub seed: u64,
    /// Locked: the seed stays; unlocked: a new random seed per Generate.
    pub seed_locked: bool,
    pub steps: usize,
    pub cfg: f32,
    pub sampler: SamplerKind,
    pub schedule: Schedule,
    pub width: usize,
    pub height: usize,
    pub batch_count: usize,
    /// A1111's clip skip (1 = last layer) and emphasis mode, as restored from a PNG.
    pub clip_skip: usize,
    pub emphasis: Emphasis,
    /// img2img: the image to start from (none: txt2img), how much of it is redrawn and how it is
    /// fitted to the size.
    pub init: Option<InitSource>,
    /// Inpainting: the mask (white is repainted), used with an init image.
    pub mask: Option<InitSource>,
    /// A1111's mask blur: the original comes back outside the mask, feathered by this many pixels.
    pub mask_blur: f32,
    pub masked_content: MaskedContent,
    /// Whole picture, or only the masked part at the generation size (A1111's inpaint area).
    pub inpaint_area: latent_engine::pipeline::InpaintArea,
    pub strength: f64,
    pub resize_mode: ResizeMode,
    /// Hires fix (txt2img only: an init image turns it off) and its settings.
    pub hires_on: bool,
    pub hires: HiresFix,
    /// SDXL's size and crop conditioning; `None`: the image's own size, no crop (diffusers' and
    /// ComfyUI's defaults). Other families ignore it.
    pub size_conditioning: Option<SizeConditioning>,
    /// SDXL: the chosen refiner takes over the last steps, past this fraction of the noise
    /// (A1111's "Refiner switch at"). Other families ignore it.
    pub refiner_on: bool,
    pub refiner_switch_at: f64,
}

/// An init image and where it came from (a file's name, or "gallery").
#[derive(Debug, Clone, PartialEq)]
pub struct InitSource {
    pub name: String,
    pub image: Arc<RgbImage>,
}

impl Default for Form {
    fn default() -> Self {
        // The engine's request defaults, the command line's too.
        let request = Txt2ImgRequest::default();
        Self {
            prompt: String::new(),
            negative: String::new(),
            seed: 1,
            seed_locked: false,
            steps: request.steps,
            cfg: request.cfg_scale,
            sampler: request.sampler,
            schedule: request.schedule,
            width: request.width,
            height: request.height,
            batch_count: request.batch_count,
            clip_skip: request.clip_skip,
            emphasis: request.emphasis,
            init: None,
            mask: None,
            mask_blur: latent_engine::pipeline::DEFAULT_MASK_BLUR,
            masked_content: MaskedContent::default(),
            inpaint_area: Default::default(),
            strength: latent_engine::pipeline::DEFAULT_STRENGTH,
            resize_mode: ResizeMode::default(),
            hires_on: false,
            hires: HiresFix::default(),
            size_conditioning: None,
            refiner_on: false,
            refiner_switch_at: RefinerSwitch::DEFAULT_SWITCH_AT,
        }
    }
}

impl Form {
    pub fn request(&self) -> Txt2ImgRequest {
        Txt2ImgRequest {
            prompt: self.prompt.clone(),
            negative_prompt: self.negative.clone(),
            seed: self.seed,
            steps: self.steps,
            cfg_scale: self.cfg,
            sampler: self.sampler,
            schedule: self.schedule,
            width: self.width,
            height: self.height,
            batch_count: self.batch_count,
            clip_skip: self.clip_skip,
            emphasis: self.emphasis,
            // The window adds its VAE compilation setting ([`super::app`]).
            decode: Default::default(),
            init: self.init.as_ref().map(|source| InitImage {
                image: source.image.clone(),
                strength: self.strength,
                resize: self.resize_mode,
                mask: self.mask.as_ref().map(|m| m.image.clone()),
                mask_blur: self.mask.as_ref().map(|_| self.mask_blur),
                masked_content: self.masked_content,
                area: self.inpaint_area,
            }),
            hires: (self.hires_on && self.init.is_none()).then_some(self.hires),
            // The window adds the embeddings folder's library.
            embeddings: None,
            // The engine reads the prompt's `<lora:…>` tags with the LoRA folder's library.
            loras: Default::default(),
            size_conditioning: self.size_conditioning,
            // The engine names the refiner it has chosen.
            refiner: self.refiner_on.then(|| RefinerSwitch {
                switch_at: self.refiner_switch_at,
                name: String::new(),
            }),
        }
    }

    /// A few-step model's settings: steps, CFG, sampler, schedule and, where it was distilled
    /// at another size than its family's (SDXL-Turbo), that size; the prompt, seed and the
    /// rest stay.
    pub fn apply_preset(&mut self, p: &latent_engine::checkpoint::Preset) {
        self.steps = p.steps;
        self.cfg = p.cfg_scale;
        self.sampler = p.sampler;
        self.schedule = p.schedule;
        if let Some(side) = p.size {
            (self.width, self.height) = (side, side);
        }
    }

    /// Restores what a PNG's parameters say (A1111 or ours). Unknown sampler or schedule names
    /// leave those fields as they are; the returned list names what could not be applied.
    pub fn apply(&mut self, p: &Parameters) -> Vec<String> {
        let mut skipped = Vec::new();
        self.prompt = p.prompt.clone();
        self.negative = p.negative_prompt.clone();
        self.seed = p.seed;
        self.seed_locked = true; // the point of restoring is to reproduce
        self.steps = p.steps.clamp(1, 150);
        self.cfg = p.cfg_scale;
        match SamplerKind::ALL
            .iter()
            .find(|s| s.a1111_name() == p.sampler)
        {
            Some(s) => self.sampler = *s,
            None => skipped.push(format!("sampler `{}`", p.sampler)),
        }
        match Schedule::ALL
            .iter()
            .find(|s| s.a1111_name().eq_ignore_ascii_case(&p.schedule))
        {
            Some(s) => self.schedule = *s,
            None if p.schedule.is_empty() => {}
            None => skipped.push(format!("schedule `{}`", p.schedule)),
        }
        match p.clip_skip() {
            Some(n) => self.clip_skip = n,
            None => skipped.push("clip skip".to_string()),
        }
        match p.emphasis() {
            Some(e) => self.emphasis = e,
            None => skipped.push("emphasis mode".to_string()),
        }
        let extra = |key: &str| {
            p.extra
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.trim())
        };
        self.inpaint_area = match (extra("Inpaint area"), extra("Masked area padding")) {
            (Some("Only masked"), padding) => latent_engine::pipeline::InpaintArea::OnlyMasked {
                padding: padding
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(latent_engine::pipeline::InpaintArea::DEFAULT_PADDING),
            },
            _ => Default::default(),
        };
        match p.masked_content() {
            Some(Ok(m)) => self.masked_content = m,
            Some(Err(e)) => skipped.push(unusable(e)),
            None => {}
        }
        if let Some((_, blur)) = p.extra.iter().find(|(k, _)| k == "Mask blur") {
            match blur.trim().parse::<f32>() {
                Ok(b) if b.is_finite() && b >= 0.0 => self.mask_blur = b,
                _ => skipped.push(format!("mask blur `{blur}`")),
            }
        }
        match p.size_conditioning() {
            Some(Ok(c)) => self.size_conditioning = Some(c),
            Some(Err(e)) => skipped.push(unusable(e)),
            None => self.size_conditioning = None,
        }
        // The refiner's switch comes back; which refiner is the panel's choice.
        match p.refiner() {
            Some(Ok(r)) => (self.refiner_on, self.refiner_switch_at) = (true, r.switch_at),
            Some(Err(e)) => skipped.push(unusable(e)),
            None => self.refiner_on = false,
        }
        match p.hires() {
            Some(Ok(h)) => (self.hires_on, self.hires) = (true, h),
            Some(Err(e)) => skipped.push(unusable(e)),
            None => {
                self.hires_on = false;
                // The image is not in the parameters: the strength waits for one.
                if let Some(s) = p.denoising_strength() {
                    self.strength = s;
                }
            }
        }
        if p.width.is_multiple_of(8) && p.height.is_multiple_of(8) && p.width > 0 && p.height > 0 {
            self.width = p.width;
            self.height = p.height;
        } else {
            skipped.push(format!("size {}x{}", p.width, p.height));
        }
        skipped
    }
}

/// What a parameter the engine could not use says, without the error's category.
fn unusable(e: latent_engine::error::Error) -> String {
    match e {
        latent_engine::error::Error::InvalidInput(what) => what,
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preset_sets_the_sampling_and_keeps_the_prompt() {
        use latent_engine::checkpoint::{Family, FewStep};
        let mut form = Form {
            prompt: "a fox".into(),
            seed: 9,
            width: 1024,
            height: 768,
            ..Form::default()
        };
        form.apply_preset(&FewStep::Lcm.preset(Family::Sdxl));
        assert_eq!(
            (form.steps, form.cfg, form.sampler),
            (4, 1.0, SamplerKind::Lcm)
        );
        assert_eq!((form.width, form.height), (1024, 768), "LCM keeps the size");
        form.apply_preset(&FewStep::Turbo.preset(Family::Sdxl));
        assert_eq!((form.steps, form.sampler), (1, SamplerKind::EulerAncestral));
        assert_eq!((form.width, form.height), (512, 512), "SDXL-Turbo's 512²");
        assert_eq!((form.prompt.as_str(), form.seed), ("a fox", 9));
    }

    /// Clip skip and emphasis travel through the PNG text: written only past their defaults (as
    /// A1111 writes them), read back into the form, an unknown mode reported.
    #[test]
    fn clip_skip_and_emphasis_round_trip() {
        let form = Form {
            prompt: "a (fox:1.2)".into(),
            clip_skip: 2,
            emphasis: Emphasis::NoNorm,
            ..Form::default()
        };
        let text = Parameters::for_request(&form.request(), 7, None, None).to_a1111();
        assert!(
            text.contains("Clip skip: 2") && text.contains("Emphasis: No norm"),
            "{text}"
        );
        let plain = Parameters::for_request(&Form::default().request(), 7, None, None).to_a1111();
        assert!(
            !plain.contains("Clip skip") && !plain.contains("Emphasis"),
            "{plain}"
        );

        let mut restored = Form::default();
        let p = Parameters::parse_a1111(&text).unwrap();
        assert!(restored.apply(&p).is_empty());
        assert_eq!(
            (restored.clip_skip, restored.emphasis),
            (2, Emphasis::NoNorm)
        );
        // A file without them restores the defaults.
        let p = Parameters::parse_a1111(&plain).unwrap();
        assert!(restored.apply(&p).is_empty());
        assert_eq!(
            (restored.clip_skip, restored.emphasis),
            (1, Emphasis::Original)
        );

        let odd = text.replace("No norm", "Sideways");
        let p = Parameters::parse_a1111(&odd).unwrap();
        assert_eq!(restored.apply(&p), vec!["emphasis mode".to_string()]);
    }

    #[test]
    fn parameters_restore_the_form() {
        let text = "a fox\nNegative prompt: blurry\nSteps: 30, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 5.5, Seed: 1234, Size: 512x768, Model hash: abcdef0123, Model: x";
        let p = Parameters::parse_a1111(text).unwrap();
        let mut form = Form::default();
        assert!(form.apply(&p).is_empty());
        assert_eq!(
            (
                form.prompt.as_str(),
                form.negative.as_str(),
                form.steps,
                form.cfg,
                form.seed
            ),
            ("a fox", "blurry", 30, 5.5, 1234)
        );
        assert_eq!(
            (form.sampler, form.schedule),
            (SamplerKind::DpmPp2M, Schedule::Karras)
        );
        assert_eq!(
            (form.width, form.height, form.seed_locked),
            (512, 768, true)
        );
        let req = form.request();
        assert_eq!((req.seed, req.width, req.height), (1234, 512, 768));
    }

    /// An init image makes the request img2img with the form's strength and resize mode, and the
    /// strength comes back from the PNG text (the image itself does not travel in it).
    #[test]
    fn init_image_and_strength_reach_the_request_and_return() {
        let image = Arc::new(RgbImage {
            width: 2,
            height: 1,
            pixels: vec![0; 6],
        });
        let form = Form {
            init: Some(InitSource {
                name: "a.png".into(),
                image: image.clone(),
            }),
            mask: Some(InitSource {
                name: "m.png".into(),
                image: image.clone(),
            }),
            strength: 0.4,
            resize_mode: ResizeMode::ResizeAndFill,
            ..Form::default()
        };
        let init = form.request().init.expect("img2img");
        // Hires fix is for txt2img: an init image turns it off.
        let both = Form {
            hires_on: true,
            ..form.clone()
        };
        assert!(both.request().hires.is_none() && both.request().init.is_some());
        assert!(
            Arc::ptr_eq(&init.image, &image),
            "the pixels are shared, not copied"
        );
        assert_eq!(
            (init.strength, init.resize),
            (0.4, ResizeMode::ResizeAndFill)
        );
        assert!(init.mask.is_some(), "the mask goes with the image");
        assert!(Form::default().request().init.is_none());

        let text = Parameters::for_request(&form.request(), 3, None, None).to_a1111();
        let mut restored = Form::default();
        assert!(
            restored
                .apply(&Parameters::parse_a1111(&text).unwrap())
                .is_empty()
        );
        assert_eq!((restored.strength, restored.init.is_none()), (0.4, true));
    }

    /// `req`'s parameters text, and a default form restored from it with nothing skipped.
    fn through_png(req: &Txt2ImgRequest) -> (String, Form) {
        let text = Parameters::for_request(req, 3, None, None).to_a1111();
        let mut restored = Form::default();
        let skipped = restored.apply(&Parameters::parse_a1111(&text).unwrap());
        assert!(skipped.is_empty(), "{skipped:?}");
        (text, restored)
    }

    /// Applies a default request's parameters to `form`, with nothing skipped.
    fn restore_plain(form: &mut Form) {
        let plain = Parameters::for_request(&Form::default().request(), 3, None, None);
        assert!(form.apply(&plain).is_empty());
    }

    #[test]
    fn hires_fix_reaches_the_request_and_returns_from_the_png() {
        let form = Form {
            hires_on: true,
            hires: HiresFix {
                scale: 1.5,
                steps: 12,
                ..HiresFix::default()
            },
            ..Form::default()
        };
        let req = form.request();
        assert_eq!(req.hires, Some(form.hires));
        let (text, mut restored) = through_png(&req);
        assert_eq!((restored.hires_on, restored.hires), (true, form.hires));
        // A file without it turns it off; an upscaler we lack is reported.
        restore_plain(&mut restored);
        assert!(!restored.hires_on);
        let esrgan = text.replace("Hires upscaler: Latent", "Hires upscaler: R-ESRGAN 4x+");
        let skipped = restored.apply(&Parameters::parse_a1111(&esrgan).unwrap());
        assert_eq!(skipped, ["hires upscaler `R-ESRGAN 4x+`"]);
    }

    /// The refiner's switch reaches the request (the engine names the refiner) and returns from
    /// a PNG that names one; a PNG without one turns it off.
    #[test]
    fn the_refiner_switch_reaches_the_request_and_returns_from_the_png() {
        let form = Form {
            refiner_on: true,
            refiner_switch_at: 0.7,
            ..Form::default()
        };
        let mut req = form.request();
        assert_eq!(req.refiner.as_ref().map(|r| r.switch_at), Some(0.7));
        if let Some(r) = &mut req.refiner {
            r.name = "sd_xl_refiner_1.0 [7440042bbd]".into();
        }
        let (_, mut restored) = through_png(&req);
        assert_eq!(
            (restored.refiner_on, restored.refiner_switch_at),
            (true, 0.7)
        );
        restore_plain(&mut restored);
        assert!(!restored.refiner_on);
        assert!(Form::default().request().refiner.is_none());
    }

    #[test]
    fn sdxl_conditioning_reaches_the_request_and_returns_from_the_png() {
        let conditioning = SizeConditioning {
            original: [2048, 1536],
            crop_top_left: [0, 64],
            target: [1024, 1024],
        };
        let form = Form {
            width: 1024,
            height: 1024,
            size_conditioning: Some(conditioning),
            ..Form::default()
        };
        let req = form.request();
        assert_eq!(req.size_conditioning, Some(conditioning));
        let (text, mut restored) = through_png(&req);
        assert_eq!(restored.size_conditioning, Some(conditioning));
        // A file without it returns to the image's own size; a bad value is reported.
        restore_plain(&mut restored);
        assert_eq!(restored.size_conditioning, None);
        let bad = text.replace("SDXL crop: 64x0", "SDXL crop: left");
        let skipped = restored.apply(&Parameters::parse_a1111(&bad).unwrap());
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        assert!(skipped[0].contains("SDXL crop"), "{skipped:?}");
    }

    #[test]
    fn the_inpaint_area_returns_from_the_png() {
        use latent_engine::pipeline::InpaintArea;
        let text = "x\nSteps: 20, Sampler: Euler, CFG scale: 7, Seed: 1, Size: 512x512, \
                    Denoising strength: 0.5, Mask blur: 4, Inpaint area: Only masked, \
                    Masked area padding: 16";
        let mut form = Form::default();
        assert!(
            form.apply(&Parameters::parse_a1111(text).unwrap())
                .is_empty()
        );
        assert_eq!(form.inpaint_area, InpaintArea::OnlyMasked { padding: 16 });
        let plain = "x\nSteps: 20, Sampler: Euler, CFG scale: 7, Seed: 1, Size: 512x512";
        assert!(
            form.apply(&Parameters::parse_a1111(plain).unwrap())
                .is_empty()
        );
        assert_eq!(form.inpaint_area, InpaintArea::WholePicture);
    }

    /// A1111's `Masked content` comes back into the inpainting row; an unknown one is named.
    #[test]
    fn masked_content_returns_from_the_png() {
        let text = |content: &str| {
            format!(
                "x\nSteps: 20, Sampler: Euler, CFG scale: 7, Seed: 1, Size: 512x512, Mask blur: 4, \
                 Masked content: {content}"
            )
        };
        let mut form = Form::default();
        let skipped = form.apply(&Parameters::parse_a1111(&text("latent noise")).unwrap());
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(form.masked_content, MaskedContent::LatentNoise);
        let skipped = form.apply(&Parameters::parse_a1111(&text("sparkles")).unwrap());
        assert_eq!(skipped, ["masked content `sparkles`"]);
        assert_eq!(
            form.masked_content,
            MaskedContent::LatentNoise,
            "left as it was"
        );
    }

    #[test]
    fn unknown_sampler_is_reported_not_guessed() {
        let text = "x\nSteps: 20, Sampler: LMS, CFG scale: 7, Seed: 1, Size: 512x512";
        let p = Parameters::parse_a1111(text).unwrap();
        let mut form = Form::default();
        let skipped = form.apply(&p);
        assert_eq!(form.sampler, SamplerKind::Euler);
        assert_eq!(skipped, ["sampler `LMS`"]);
    }
}
