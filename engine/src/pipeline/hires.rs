//! Hires fix as A1111 runs it: the image is made at the request's size, its latent (or its decoded
//! image, with Lanczos) upscaled by a factor, and a second img2img pass at the larger size
//! denoises it at the hires strength.
//!
//! A1111's second pass (`sample_hr_pass`, `setup_img2img_steps` with steps given) runs exactly
//! the hires steps (the first pass's count when 0) as the last steps of a schedule of
//! ⌊steps ÷ min(strength, 0.999)⌋, with noise from a new generator of the image's seed. The
//! "Latent" upscaler is `interpolate(mode="bilinear", antialias=False)`.

use std::fmt;
use std::str::FromStr;

use burn::tensor::{DType, Tensor, TensorData};

use super::{DecodeOptions, InitImage, Observer, Txt2ImgRequest, decode, init, randn};
use crate::error::{Error, Result};
use crate::image_io::ResizeMode;
use crate::noise::TorchRng;
use crate::schedulers::{self, Plan, SchedulerConfig};
use crate::stable_diffusion::StableDiffusion;

/// The hires fix of a txt2img request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HiresFix {
    /// Factor on the width and height (A1111's "Upscale by").
    pub scale: f64,
    /// Steps of the second pass; 0 takes the request's (A1111's "Hires steps").
    pub steps: usize,
    /// How much the second pass redraws (A1111's denoising strength, 0.7 by default there).
    pub strength: f64,
    pub upscaler: HiresUpscaler,
}

impl Default for HiresFix {
    fn default() -> Self {
        Self {
            scale: 2.0,
            steps: 0,
            strength: 0.7,
            upscaler: HiresUpscaler::Latent,
        }
    }
}

/// What enlarges the first pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum HiresUpscaler {
    /// The latent, bilinear (A1111's "Latent"): no decode or encode between the passes.
    #[default]
    Latent,
    /// The decoded image, Lanczos, encoded again (needs the VAE encoder).
    Lanczos,
}

impl HiresUpscaler {
    pub const ALL: [HiresUpscaler; 2] = [HiresUpscaler::Latent, HiresUpscaler::Lanczos];

    /// The name A1111 shows and writes (`Hires upscaler: Latent`).
    pub fn a1111_name(self) -> &'static str {
        match self {
            HiresUpscaler::Latent => "Latent",
            HiresUpscaler::Lanczos => "Lanczos",
        }
    }
}

impl fmt::Display for HiresUpscaler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.a1111_name())
    }
}

impl FromStr for HiresUpscaler {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|u| u.a1111_name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                Error::InvalidInput(format!(
                    "unknown hires upscaler `{s}` (expected Latent or Lanczos)"
                ))
            })
    }
}

/// The largest hires factor (A1111's slider ends at 4).
pub const MAX_SCALE: f64 = 4.0;

impl HiresFix {
    /// The second pass's size for a first pass of `width`×`height`: A1111's `int(size × scale)`,
    /// down to the VAE's multiple of 8.
    pub fn target(&self, width: usize, height: usize) -> (usize, usize) {
        let side = |v: usize| ((v as f64 * self.scale) as usize / 8 * 8).max(8);
        (side(width), side(height))
    }

    /// Checks the settings against `req` (called by [`super::check_request`]).
    pub(super) fn check(&self, req: &Txt2ImgRequest, config: &SchedulerConfig) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidInput(m));
        if req.init.is_some() {
            return bad("hires fix is for txt2img; an init image was given too".into());
        }
        if !(self.scale >= 1.0 && self.scale <= MAX_SCALE) {
            return bad(format!(
                "hires upscale must be between 1 and {MAX_SCALE}, got {}",
                self.scale
            ));
        }
        if !(self.strength > 0.0 && self.strength <= 1.0) {
            return bad(format!(
                "hires denoising strength must be in (0, 1], got {}",
                self.strength
            ));
        }
        let (w, h) = self.target(req.width, req.height);
        if w > 8192 || h > 8192 {
            return bad(format!("hires fix to {w}x{h} passes the 8192 pixel limit"));
        }
        self.plan(req, config).map(|_| ())
    }

    /// The second pass's plan and size for `req`.
    pub(super) fn plan(&self, req: &Txt2ImgRequest, config: &SchedulerConfig) -> Result<HiresPass> {
        let run = if self.steps == 0 {
            req.steps
        } else {
            self.steps
        };
        let total = (run as f64 / self.strength.min(0.999)) as usize;
        let plan = schedulers::plan_window(
            req.sampler,
            req.schedule,
            total,
            total.saturating_sub(run),
            config,
        )
        .map_err(|e| {
            Error::InvalidInput(format!(
                "hires fix: {run} steps at strength {} need a schedule of {total}: {e}",
                self.strength
            ))
        })?;
        let (width, height) = self.target(req.width, req.height);
        Ok(HiresPass {
            plan,
            width,
            height,
            upscaler: self.upscaler,
        })
    }
}

/// The second pass of one request.
pub(super) struct HiresPass {
    pub plan: Plan,
    width: usize,
    height: usize,
    upscaler: HiresUpscaler,
}

impl HiresPass {
    /// The second pass's first latent from the first pass's `latents` `[1, c, h, w]` (f32):
    /// upscaled, then noised to the plan's first step with `rng` (a new generator of the seed).
    pub(super) fn start(
        &self,
        model: &StableDiffusion,
        latents: Tensor<4>,
        options: &DecodeOptions,
        rng: &mut TorchRng,
        observer: &mut dyn Observer,
    ) -> Result<Tensor<4>> {
        let at = self.plan.start[0];
        match self.upscaler {
            HiresUpscaler::Latent => {
                let scale = model.config.vae.downscale();
                let x0 = bilinear(latents, self.height / scale, self.width / scale)?;
                let noise = randn(rng, x0.dims(), &x0.device());
                Ok(x0 * at.sample + noise * at.noise)
            }
            HiresUpscaler::Lanczos => {
                let image = decode(model, latents, options, observer)?;
                let init = InitImage {
                    image: std::sync::Arc::new(image),
                    strength: 1.0,
                    resize: ResizeMode::JustResize,
                    mask: None,
                    mask_blur: None,
                    masked_content: Default::default(),
                    area: Default::default(),
                };
                let encoded = init::encode(model, &init, self.width, self.height)?;
                Ok(encoded.start(rng, &self.plan, 0.0).latents)
            }
        }
    }
}

/// `torch.nn.functional.interpolate(x, (h, w), mode="bilinear", align_corners=False)` of f32
/// latents, on the host (one small read-back per image; exact, whatever the backend).
fn bilinear(x: Tensor<4>, out_h: usize, out_w: usize) -> Result<Tensor<4>> {
    let [b, c, h, w] = x.dims();
    let device = x.device();
    let data = x
        .cast(DType::F32)
        .into_data()
        .try_into_vec::<f32>()
        .map_err(|e| Error::Device(format!("cannot read the latents back: {e:?}")))?;
    // Source coordinate and weights of each output index, as torch's `area_pixel_compute_scale`
    // and `area_pixel_compute_source_index` (negative sources clamp to 0).
    let taps = |size: usize, out: usize| -> Vec<(usize, usize, f32)> {
        let scale = size as f32 / out as f32;
        (0..out)
            .map(|o| {
                let src = ((o as f32 + 0.5) * scale - 0.5).max(0.0);
                let i0 = (src as usize).min(size - 1);
                let i1 = (i0 + 1).min(size - 1);
                (i0, i1, src - i0 as f32)
            })
            .collect()
    };
    let (ys, xs) = (taps(h, out_h), taps(w, out_w));
    let mut out = Vec::with_capacity(b * c * out_h * out_w);
    for plane in data.chunks_exact(h * w) {
        for &(y0, y1, ly) in &ys {
            for &(x0, x1, lx) in &xs {
                let at = |y: usize, x: usize| plane[y * w + x];
                let top = at(y0, x0) * (1.0 - lx) + at(y0, x1) * lx;
                let bottom = at(y1, x0) * (1.0 - lx) + at(y1, x1) * lx;
                out.push(top * (1.0 - ly) + bottom * ly);
            }
        }
    }
    Ok(Tensor::<4>::from_data(
        TensorData::new(out, [b, c, out_h, out_w]),
        (&device, DType::F32),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(steps: usize) -> Txt2ImgRequest {
        Txt2ImgRequest {
            steps,
            ..Default::default()
        }
    }

    #[test]
    fn targets_round_down_to_multiples_of_8() {
        let h = HiresFix {
            scale: 1.5,
            ..Default::default()
        };
        assert_eq!(h.target(512, 768), (768, 1152));
        let odd = HiresFix {
            scale: 1.33,
            ..Default::default()
        };
        // int(512 × 1.33) = 680 → 680; int(520 × 1.33) = 691 → 688.
        assert_eq!(odd.target(512, 520), (680, 688));
    }

    /// A1111: the hires steps run as the last ones of a schedule of steps ÷ strength.
    #[test]
    fn the_second_pass_runs_the_hires_steps_of_a_longer_schedule() {
        let fix = HiresFix {
            steps: 10,
            strength: 0.5,
            ..Default::default()
        };
        let pass = fix.plan(&req(20), &SchedulerConfig::sd15()).unwrap();
        let full = schedulers::plan(
            schedulers::SamplerKind::Euler,
            schedulers::Schedule::Normal,
            20,
            &SchedulerConfig::sd15(),
        )
        .unwrap();
        assert_eq!(pass.plan.num_steps(), 10);
        assert_eq!(pass.plan.timesteps, full.timesteps[10..]);
        // 0 steps: the request's count, here over a schedule of ⌊20 ÷ 0.7⌋ = 28.
        let same = HiresFix::default()
            .plan(&req(20), &SchedulerConfig::sd15())
            .unwrap();
        assert_eq!(same.plan.num_steps(), 20);
        let long = schedulers::plan(
            schedulers::SamplerKind::Euler,
            schedulers::Schedule::Normal,
            28,
            &SchedulerConfig::sd15(),
        )
        .unwrap();
        assert_eq!(same.plan.timesteps, long.timesteps[8..]);
    }

    #[test]
    fn bad_settings_are_clear_errors() {
        let check = |fix: HiresFix, r: Txt2ImgRequest| {
            fix.check(&r, &SchedulerConfig::sd15())
                .unwrap_err()
                .to_string()
        };
        let scale = HiresFix {
            scale: 5.0,
            ..Default::default()
        };
        assert!(check(scale, req(20)).contains("between 1 and 4"));
        let strength = HiresFix {
            strength: 0.0,
            ..Default::default()
        };
        assert!(check(strength, req(20)).contains("strength"));
        // 150 steps at 0.1 would need a schedule of 1500.
        let long = HiresFix {
            steps: 150,
            strength: 0.1,
            ..Default::default()
        };
        assert!(check(long, req(20)).contains("schedule of 1500"));
    }

    /// Against values torch gives for `interpolate(x, (3, 5), mode="bilinear")` of a 2×3 ramp.
    #[test]
    fn bilinear_matches_torch() {
        let device = burn::tensor::Device::flex();
        let x = Tensor::<4>::from_data(
            TensorData::new(vec![0f32, 1., 2., 10., 11., 12.], [1, 1, 2, 3]),
            (&device, DType::F32),
        );
        let got = bilinear(x, 3, 5)
            .unwrap()
            .into_data()
            .try_into_vec::<f32>()
            .unwrap();
        // torch.nn.functional.interpolate(torch.tensor([[[[0.,1,2],[10,11,12]]]]), (3, 5),
        // mode="bilinear", align_corners=False)
        let want = [
            0.0, 0.4, 1.0, 1.6, 2.0, //
            5.0, 5.4, 6.0, 6.6, 7.0, //
            10.0, 10.4, 11.0, 11.6, 12.0,
        ];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-5, "{got:?}");
        }
    }
}
