//! A request as A1111's parameters text records it, and the pipeline's settings read back from one:
//! the text format itself is `crate::io::parameters`, which knows nothing of requests.

use crate::io::parameters::{Parameters, fmt_number};
use crate::pipeline::{
    HiresFix, InpaintArea, MaskedContent, RefinerSwitch, SizeConditioning, Txt2ImgRequest,
};

/// What an inpainting run's masked area started from (A1111's "Masked content").
const MASKED_CONTENT_KEY: &str = "Masked content";

/// A1111's keys for the refiner: `Refiner: name [hash]`, `Refiner switch at: 0.8`.
const REFINER_KEY: &str = "Refiner";
const REFINER_SWITCH_KEY: &str = "Refiner switch at";

/// The request's settings A1111 writes only when they are not their defaults.
fn request_extras(request: &Txt2ImgRequest) -> Vec<(String, String)> {
    let mut extra = Vec::new();
    if request.clip_skip > 1 {
        extra.push(("Clip skip".to_string(), request.clip_skip.to_string()));
    }
    if request.emphasis != crate::prompt::Emphasis::Original {
        extra.push(("Emphasis".to_string(), request.emphasis.name().to_string()));
    }
    if let Some(init) = &request.init {
        extra.push(("Denoising strength".to_string(), init.strength.to_string()));
        if let (Some(_), Some(blur)) = (&init.mask, init.mask_blur) {
            extra.push(("Mask blur".to_string(), fmt_number(blur)));
        }
        // A1111's img2img panel's label and values (SD.Next and Forge paste them back).
        if init.mask.is_some() {
            extra.push((
                MASKED_CONTENT_KEY.to_string(),
                init.masked_content.a1111_name().to_string(),
            ));
        }
        if let (Some(_), InpaintArea::OnlyMasked { padding }) = (&init.mask, init.area) {
            extra.push(("Inpaint area".to_string(), "Only masked".to_string()));
            extra.push(("Masked area padding".to_string(), padding.to_string()));
        }
    }
    // A1111's order: the strength, then the hires keys (steps only when set).
    if let Some(h) = &request.hires {
        extra.push(("Denoising strength".to_string(), h.strength.to_string()));
        extra.push(("Hires upscale".to_string(), h.scale.to_string()));
        if h.steps > 0 {
            extra.push(("Hires steps".to_string(), h.steps.to_string()));
        }
        extra.push((
            "Hires upscaler".to_string(),
            h.upscaler.a1111_name().to_string(),
        ));
    }
    if let Some(r) = &request.refiner {
        extra.push((REFINER_KEY.to_string(), r.name.clone()));
        extra.push((REFINER_SWITCH_KEY.to_string(), r.switch_at.to_string()));
    }
    if !request.loras.is_empty() {
        extra.push(("Lora hashes".to_string(), request.loras.a1111_hashes()));
    }
    if let Some(c) = &request.size_conditioning {
        extra.extend(c.parameters(request.width, request.height));
    }
    extra
}

impl Parameters {
    /// What one image of `request` was made with (`seed` is that image's seed in a batch count).
    pub fn for_request(
        request: &Txt2ImgRequest,
        seed: u64,
        model_hash: Option<String>,
        model: Option<String>,
    ) -> Self {
        Self {
            prompt: request.prompt.clone(),
            negative_prompt: request.negative_prompt.clone(),
            steps: request.steps,
            sampler: request.sampler.a1111_name().to_string(),
            schedule: request.schedule.a1111_name().to_string(),
            cfg_scale: request.cfg_scale,
            seed,
            width: request.width,
            height: request.height,
            model_hash,
            model,
            extra: request_extras(request),
        }
    }

    /// The hires fix a parameters text names (`Hires upscale` present), or why it cannot be
    /// used (an upscaler other than Latent or Lanczos, a bad number).
    pub fn hires(&self) -> Option<crate::error::Result<HiresFix>> {
        let get = |key: &str| self.extra_value(key);
        let scale = get("Hires upscale")?;
        let parse = || -> Result<HiresFix, String> {
            let mut fix = HiresFix {
                scale: scale
                    .parse()
                    .map_err(|_| format!("hires upscale `{scale}`"))?,
                ..Default::default()
            };
            if let Some(steps) = get("Hires steps") {
                fix.steps = steps
                    .parse()
                    .map_err(|_| format!("hires steps `{steps}`"))?;
            }
            if let Some(s) = self.denoising_strength() {
                fix.strength = s;
            }
            if let Some(u) = get("Hires upscaler") {
                fix.upscaler = u.parse().map_err(|_| format!("hires upscaler `{u}`"))?;
            }
            Ok(fix)
        };
        Some(parse().map_err(crate::error::Error::InvalidInput))
    }

    /// SDXL's size and crop conditioning a parameters text names (`None` where it names none:
    /// the image's own size, no crop), or why it cannot be used.
    pub fn size_conditioning(&self) -> Option<crate::error::Result<SizeConditioning>> {
        SizeConditioning::from_parameters(&self.extra, self.width, self.height)
    }

    /// The masked content a parameters text names (`None` where it names none), or why it
    /// cannot be used (a value A1111 does not write).
    pub fn masked_content(&self) -> Option<crate::error::Result<MaskedContent>> {
        let value = self.extra_value(MASKED_CONTENT_KEY)?;
        Some(
            MaskedContent::from_a1111_name(value).ok_or_else(|| {
                crate::error::Error::InvalidInput(format!("masked content `{value}`"))
            }),
        )
    }

    /// The refiner a parameters text names (`Refiner`, with A1111's default switch where
    /// `Refiner switch at` is missing), or why its switch cannot be used.
    pub fn refiner(&self) -> Option<crate::error::Result<RefinerSwitch>> {
        let get = |key: &str| self.extra_value(key);
        let name = get(REFINER_KEY)?.to_string();
        let switch_at = match get(REFINER_SWITCH_KEY) {
            None => Ok(RefinerSwitch::DEFAULT_SWITCH_AT),
            Some(v) => v
                .parse::<f64>()
                .map_err(|_| crate::error::Error::InvalidInput(format!("refiner switch at `{v}`"))),
        };
        Some(switch_at.and_then(|switch_at| {
            let r = RefinerSwitch { switch_at, name };
            r.check()?;
            Ok(r)
        }))
    }

    /// The emphasis mode a parameters text names (A1111 writes it only when not "Original").
    pub fn emphasis(&self) -> Option<crate::prompt::Emphasis> {
        match self.extra.iter().find(|(k, _)| k == "Emphasis") {
            Some((_, v)) => crate::prompt::Emphasis::from_name(v),
            None => Some(crate::prompt::Emphasis::Original),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::image_io::RgbImage;
    use crate::io::parameters::Parameters;
    use crate::pipeline::{InitImage, MaskedContent, Txt2ImgRequest};

    /// An inpainting run records what its masked area started from under A1111's label, and
    /// every value reads back; img2img without a mask writes none; an unknown value is reported.
    #[test]
    fn masked_content_round_trips() {
        let picture = Arc::new(RgbImage {
            width: 8,
            height: 8,
            pixels: vec![0; 8 * 8 * 3],
        });
        for content in MaskedContent::ALL {
            let req = Txt2ImgRequest {
                init: Some(InitImage {
                    image: picture.clone(),
                    strength: 0.75,
                    resize: Default::default(),
                    mask: Some(picture.clone()),
                    mask_blur: Some(4.0),
                    masked_content: content,
                    area: Default::default(),
                }),
                ..Default::default()
            };
            let text = Parameters::for_request(&req, 1, None, None).to_a1111();
            assert!(
                text.contains(&format!("Masked content: {}", content.a1111_name())),
                "{text}"
            );
            let back = Parameters::parse_a1111(&text).expect("parses");
            assert_eq!(back.masked_content().map(|r| r.ok()), Some(Some(content)));
        }
        let mut req = Txt2ImgRequest {
            init: Some(InitImage {
                image: picture,
                strength: 0.5,
                resize: Default::default(),
                mask: None,
                mask_blur: None,
                masked_content: MaskedContent::Fill,
                area: Default::default(),
            }),
            ..Default::default()
        };
        let text = Parameters::for_request(&req, 1, None, None).to_a1111();
        assert!(!text.contains("Masked content"), "{text}");
        req.init = None;
        let bad = format!(
            "{}, Masked content: sparkles",
            Parameters::for_request(&req, 1, None, None).to_a1111()
        );
        let back = Parameters::parse_a1111(&bad).expect("parses");
        match back.masked_content() {
            Some(Err(crate::error::Error::InvalidInput(what))) => {
                assert_eq!(what, "masked content `sparkles`")
            }
            other => panic!("{other:?}"),
        }
    }
}
