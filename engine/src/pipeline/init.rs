//! img2img's starting point: the artist's image encoded by the VAE and noised to the first step
//! that runs, as diffusers' `StableDiffusionImg2ImgPipeline.prepare_latents` does it; with a mask,
//! inpainting with an ordinary (4-channel) checkpoint as `StableDiffusionInpaintPipeline` does it:
//! after every step the unmasked latents are put back, noised to the next step's level.

use std::sync::Arc;

use burn::tensor::{DType, Tensor, TensorData};

use crate::error::{Error, Result};
use crate::image_io::{ResizeMode, RgbImage, grey, resize};
use crate::noise::TorchRng;
use crate::schedulers::Plan;
use crate::stable_diffusion::StableDiffusion;

use super::inpaint_area::{self, InpaintArea, Region};
use super::inpaint_model::{self, Distribution, pixels};

/// A1111's default denoising strength, the studio's and the command line's.
pub const DEFAULT_STRENGTH: f64 = 0.75;
/// A1111's default mask blur (pixels), the studio's and the command line's.
pub const DEFAULT_MASK_BLUR: f32 = 4.0;

/// An image to start from (img2img), of any size: the run fits it to the request's width and
/// height as `resize` says ([`crate::image_io::resize`]), on the engine's thread.
#[derive(Debug, Clone, PartialEq)]
pub struct InitImage {
    /// Shared: a request is cloned per queue entry and per run.
    pub image: Arc<RgbImage>,
    /// A1111's denoising strength, diffusers' `strength`: of the request's steps, the last
    /// ⌊steps × strength⌋ run ([`crate::schedulers::img2img_plan`]).
    pub strength: f64,
    pub resize: ResizeMode,
    /// Inpainting: white (≥ 50 % grey) is repainted, black kept; fitted like the image.
    pub mask: Option<Arc<RgbImage>>,
    /// Inpainting, A1111's overlay: after the decode the original picture is put back outside
    /// the mask, feathered by a Gaussian blur of the mask of this many pixels (A1111's "Mask
    /// blur", 4 by default there). `None`: the decoded image as it is (diffusers' output).
    pub mask_blur: Option<f32>,
    /// Inpainting: what the masked area starts from (A1111's "Masked content").
    pub masked_content: MaskedContent,
    /// Inpainting: the whole picture, or only the masked part at the request's size (the
    /// result keeps the picture's own size).
    pub area: InpaintArea,
}

/// What the masked area of an inpainting run starts from, before it is noised (A1111's "Masked
/// content").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum MaskedContent {
    /// The picture with its masked area painted from the surroundings
    /// ([`crate::image_io::fill`]), encoded.
    Fill,
    /// The picture's own latent (A1111's default, and diffusers').
    #[default]
    Original,
    /// Fresh noise: the masked area is invented anew.
    LatentNoise,
    /// Zeros: a blank start.
    LatentNothing,
}

impl MaskedContent {
    pub const ALL: [MaskedContent; 4] = [
        MaskedContent::Fill,
        MaskedContent::Original,
        MaskedContent::LatentNoise,
        MaskedContent::LatentNothing,
    ];

    /// The identifier of the command line.
    pub fn id(self) -> &'static str {
        match self {
            MaskedContent::Fill => "fill",
            MaskedContent::Original => "original",
            MaskedContent::LatentNoise => "latent-noise",
            MaskedContent::LatentNothing => "latent-nothing",
        }
    }

    /// The content an A1111 label names (`Masked content: latent noise`), any case.
    pub fn from_a1111_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|m| m.a1111_name().eq_ignore_ascii_case(name.trim()))
    }

    /// A1111's label.
    pub fn a1111_name(self) -> &'static str {
        match self {
            MaskedContent::Fill => "fill",
            MaskedContent::Original => "original",
            MaskedContent::LatentNoise => "latent noise",
            MaskedContent::LatentNothing => "latent nothing",
        }
    }
}

impl std::str::FromStr for MaskedContent {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|m| m.id() == s || m.a1111_name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                Error::InvalidInput(format!(
                    "unknown masked content `{s}` (expected fill, original, latent-noise or latent-nothing)"
                ))
            })
    }
}

/// The encoded image, once for every image of a batch count: the latent distribution's mean and
/// standard deviation, both times the VAE's scaling factor, in f32.
pub(super) struct Encoded {
    mean: Tensor<4>,
    std: Tensor<4>,
    /// Inpainting: 1 where the latent is repainted, `[1, 1, h/8, w/8]`, and its complement.
    mask: Option<(Tensor<4>, Tensor<4>)>,
    /// Inpainting with an inpainting UNet: the picture with its masked area blanked, encoded.
    masked: Option<Distribution>,
    masked_content: MaskedContent,
    /// Inpainting with A1111's overlay: the fitted picture and each pixel's weight of the
    /// generated image, 0..=1 (the blurred mask; doubled and clipped for the whole picture).
    overlay: Option<(RgbImage, Vec<f32>)>,
    /// Only masked: where the generated image goes back into the picture.
    paste: Option<Region>,
}

/// One seed's start: the latent to denoise, and (inpainting) what each step blends back in or
/// what an inpainting UNet takes beside the latents.
pub(super) struct Start {
    pub latents: Tensor<4>,
    pub blend: Option<Blend>,
    pub unet_input: Option<Tensor<4>>,
}

/// Inpainting's blend after each step: `mask · latents + (1 − mask) · (x0 noised to the next
/// step with the start's noise)`, the clean `x0` after the last.
pub(super) struct Blend {
    x0: Tensor<4>,
    noise: Tensor<4>,
    mask: Tensor<4>,
    /// `1 − mask`, made once rather than at every step.
    keep: Tensor<4>,
}

impl Blend {
    /// The latents after step `i` of `plan`, blended.
    pub(super) fn apply(&self, latents: Tensor<4>, plan: &Plan, i: usize) -> Tensor<4> {
        let proper = match plan.start.get(i + 1) {
            Some(at) => self.x0.clone() * at.sample + self.noise.clone() * at.noise,
            None => self.x0.clone(),
        };
        latents * self.mask.clone() + proper * self.keep.clone()
    }
}

/// Fits the init image to `width`×`height` and encodes it with the model's VAE encoder (loaded
/// with [`crate::LoadOptions::vae_encoder`]).
pub(super) fn encode(
    model: &StableDiffusion,
    init: &InitImage,
    width: usize,
    height: usize,
) -> Result<Encoded> {
    // `fill_mask`: what A1111's fill paints through, its blurred mask where there is a blur.
    let (image, fitted_mask, fill_mask, overlay, paste) = match (&init.mask, init.area) {
        (Some(mask), InpaintArea::OnlyMasked { padding }) => {
            let masked = only_masked(init, mask, padding, width, height)?;
            let (overlay, region) = (Some(masked.overlay), Some(masked.region));
            (
                masked.image,
                Some(masked.mask),
                Some(masked.blurred),
                overlay,
                region,
            )
        }
        _ => {
            let image = resize(&init.image, width, height, init.resize)?;
            // The mask fitted as the picture is, once for the latent mask and the overlay.
            let fitted_mask = match &init.mask {
                Some(mask) => Some(resize(mask, width, height, init.resize)?),
                None => None,
            };
            let (fill_mask, overlay) = match (&fitted_mask, init.mask_blur) {
                (Some(mask), Some(blur)) => {
                    let (fill, weights) = whole_picture_masks(mask, blur);
                    (Some(fill), Some((image.clone(), weights)))
                }
                _ => (fitted_mask.clone(), None),
            };
            (image, fitted_mask, fill_mask, overlay, None)
        }
    };
    // A1111's fill: the encoded picture has its masked area painted from the surroundings (the
    // overlay keeps the original).
    let image = match (&fill_mask, init.masked_content) {
        (Some(mask), MaskedContent::Fill) => crate::image_io::fill(&image, mask),
        _ => image,
    };
    let (w, h) = (image.width, image.height);
    let Distribution { mean, std } = inpaint_model::encode(model, pixels(&image, None)?, w, h)?;
    // An inpainting UNet also takes the picture with the masked area blanked, encoded.
    let masked = match &fitted_mask {
        Some(mask) if model.config.unet.is_inpainting() => {
            let blanked = pixels(&image, Some(&inpaint_model::repainted(mask)))?;
            Some(inpaint_model::encode(model, blanked, w, h)?)
        }
        _ => None,
    };
    // With a mask blur (A1111's inpainting) an ordinary checkpoint blends by A1111's latent
    // mask, made from the blurred mask; without one, and for an inpainting UNet (which takes
    // the mask as an input too), diffusers' rule, which the parity tests hold it to.
    let a1111 = init.mask_blur.is_some_and(|b| b > 0.0) && !model.config.unet.is_inpainting();
    let mask = fitted_mask.as_ref().map(|mask| {
        let mask = match (&fill_mask, a1111) {
            (Some(blurred), true) => latent_mask_blurred(model, blurred),
            _ => latent_mask(model, mask, width, height),
        };
        let keep = mask.clone().neg() + 1.0;
        (mask, keep)
    });
    Ok(Encoded {
        mean,
        std,
        mask,
        masked,
        masked_content: init.masked_content,
        overlay,
        paste,
    })
}

/// What [`only_masked`] makes.
struct OnlyMasked {
    /// The crop of the picture and of the mask, at the generation size.
    image: RgbImage,
    mask: RgbImage,
    /// The crop of the blurred mask (A1111 crops after blurring): what its fill paints through.
    blurred: RgbImage,
    /// The whole picture and each pixel's weight of the generated image (the blurred mask).
    overlay: (RgbImage, Vec<f32>),
    region: Region,
}

/// Only masked: the picture and mask cut to the mask's padded box (widened to the request's
/// ratio) and scaled to `width`×`height` (A1111's resize and fill), and the overlay at the
/// picture's own size. The box is taken on the blurred mask, as A1111 blurs before it crops.
fn only_masked(
    init: &InitImage,
    mask: &RgbImage,
    padding: usize,
    width: usize,
    height: usize,
) -> Result<OnlyMasked> {
    let picture = init.image.as_ref().clone();
    let (pw, ph) = (picture.width, picture.height);
    let mask = resize(mask, pw, ph, ResizeMode::JustResize)?;
    let weights = overlay_weights(&mask, init.mask_blur.unwrap_or(0.0));
    let grey: Vec<u8> = weights.iter().map(|w| (w * 255.0).round() as u8).collect();
    let region = inpaint_area::mask_box(&grey, pw, padding)
        .ok_or_else(|| Error::InvalidInput("the mask is empty: paint the area to redraw".into()))?;
    let region = inpaint_area::expand_to_ratio(region, width, height, pw, ph);
    let fill = ResizeMode::ResizeAndFill;
    let cut = |img: &RgbImage| resize(&inpaint_area::crop(img, region)?, width, height, fill);
    Ok(OnlyMasked {
        image: cut(&picture)?,
        mask: cut(&mask)?,
        blurred: cut(&grey_image(&weights, pw, ph))?,
        overlay: (picture, weights),
        region,
    })
}

/// A1111's masks for the whole picture with a mask blur: the blurred mask (what fill paints
/// through) and the overlay's weights, the blurred mask doubled and clipped (`mask_for_overlay`),
/// so the generated image reaches fully to the blur's midline.
fn whole_picture_masks(mask: &RgbImage, blur: f32) -> (RgbImage, Vec<f32>) {
    let blurred = overlay_weights(mask, blur);
    let doubled = blurred.iter().map(|&b| (2.0 * b).min(1.0)).collect();
    (grey_image(&blurred, mask.width, mask.height), doubled)
}

/// Weights in 0..=1 as a grey picture (a mask).
fn grey_image(weights: &[f32], width: usize, height: usize) -> RgbImage {
    let pixels = weights
        .iter()
        .flat_map(|w| [(w * 255.0).round() as u8; 3])
        .collect();
    RgbImage {
        width,
        height,
        pixels,
    }
}

/// The mask's grey (PIL's `convert("L")`) as an `image` buffer.
fn grey_mask(mask: &RgbImage) -> image::GrayImage {
    let grey: Vec<u8> = mask.pixels.chunks_exact(3).map(grey).collect();
    image::GrayImage::from_raw(mask.width as u32, mask.height as u32, grey)
        .unwrap_or_else(|| image::GrayImage::new(mask.width as u32, mask.height as u32))
}

/// The mask blurred by a Gaussian of `sigma` pixels (A1111's `GaussianBlur(mask_blur)`), as
/// weights in 0..=1.
fn overlay_weights(mask: &RgbImage, sigma: f32) -> Vec<f32> {
    let image = grey_mask(mask);
    let blurred = match sigma.is_finite() && sigma > 0.0 {
        true => image::imageops::blur(&image, sigma),
        false => image,
    };
    blurred
        .into_raw()
        .into_iter()
        .map(|v| f32::from(v) / 255.0)
        .collect()
}

/// The fitted mask (`width`×`height`) at the latent's size: grey as PIL's `convert("L")`,
/// binarized at 50 % as diffusers' mask processor does, then nearest-neighbour down by the VAE's
/// factor (`interpolate` default).
fn latent_mask(model: &StableDiffusion, mask: &RgbImage, width: usize, height: usize) -> Tensor<4> {
    let scale = model.config.vae.downscale();
    let (lw, lh) = (width / scale, height / scale);
    let repainted = inpaint_model::repainted(mask);
    let data: Vec<f32> = (0..lh)
        .flat_map(|y| (0..lw).map(move |x| (y * scale) * width + x * scale))
        .map(|at| if repainted[at] { 1.0 } else { 0.0 })
        .collect();
    Tensor::<4>::from_data(
        TensorData::new(data, [1, 1, lh, lw]),
        (&model.device, DType::F32),
    )
}

/// A1111's latent mask from the blurred mask at the generation size: scaled down to the
/// latent's size by PIL's bicubic `resize` (Catmull-Rom, widened by the scale as PIL widens
/// it) and rounded (`mask_round`), so the blend follows the blur's midline where the mask's
/// edges do not fall on the VAE's 8-pixel grid.
fn latent_mask_blurred(model: &StableDiffusion, blurred: &RgbImage) -> Tensor<4> {
    let scale = model.config.vae.downscale();
    let (lw, lh) = (blurred.width / scale, blurred.height / scale);
    Tensor::<4>::from_data(
        TensorData::new(rounded_latent_mask(blurred, lw, lh), [1, 1, lh, lw]),
        (&model.device, DType::F32),
    )
}

/// [`latent_mask_blurred`]'s values: each latent cell's bicubic mean of the mask, rounded.
fn rounded_latent_mask(mask: &RgbImage, lw: usize, lh: usize) -> Vec<f32> {
    latent_mask_means(mask, lw, lh)
        .into_iter()
        .map(f32::round)
        .collect()
}

/// The mask's grey scaled to `lw`×`lh` by Catmull-Rom, in 0..=1.
fn latent_mask_means(mask: &RgbImage, lw: usize, lh: usize) -> Vec<f32> {
    let small = image::imageops::resize(
        &grey_mask(mask),
        lw as u32,
        lh as u32,
        image::imageops::FilterType::CatmullRom,
    );
    small
        .into_raw()
        .into_iter()
        .map(|v| f32::from(v) / 255.0)
        .collect()
}

impl Encoded {
    /// A1111's overlay: outside the (blurred) mask the fitted original, inside the generated
    /// image, mixed by the blurred mask. Nothing without a mask or without a mask blur.
    pub(super) fn paste_original(&self, generated: &mut RgbImage) -> Result<()> {
        let Some((original, weights)) = &self.overlay else {
            return Ok(());
        };
        if let Some(region) = self.paste {
            *generated = inpaint_area::uncrop(generated, original, region)?;
        }
        if original.pixels.len() != generated.pixels.len() {
            return Ok(());
        }
        for ((out, &orig), &m) in generated
            .pixels
            .chunks_exact_mut(3)
            .zip(original.pixels.chunks_exact(3))
            .zip(weights)
            .flat_map(|((o, p), m)| o.iter_mut().zip(p).map(move |x| (x, m)))
        {
            *out = (f32::from(*out) * m + f32::from(orig) * (1.0 - m)).round() as u8;
        }
        Ok(())
    }

    /// The first latent of one seed: a sample of the latent distribution, then the scheduler's
    /// `add_noise` at the first step, both drawn from the seed's generator in that order (as
    /// diffusers draws them), so the sampler's own noise continues the same stream. Inpainting
    /// also draws the sample diffusers takes of the masked image (which only an inpainting UNet
    /// uses), and starts from pure noise at strength 1, as diffusers does; with an inpainting
    /// UNet diffusers samples the picture only when it noises it (below strength 1).
    pub(super) fn start(&self, rng: &mut TorchRng, plan: &Plan, strength: f64) -> Start {
        let at = plan.start[0];
        let shape = self.mean.dims();
        let numel = shape.iter().product();
        let device = self.mean.device();
        let mut randn = || {
            Tensor::<4>::from_data(
                TensorData::new(rng.randn(numel), shape),
                (&device, DType::F32),
            )
        };
        let sample = |n: Tensor<4>| self.mean.clone() + self.std.clone() * n;
        let Some((mask, keep)) = &self.mask else {
            let x0 = sample(randn());
            return Start {
                latents: x0 * at.sample + randn() * at.noise,
                blend: None,
                unet_input: None,
            };
        };
        let full = strength >= 1.0;
        let x0 = (self.masked.is_none() || !full).then(|| sample(randn()));
        let noise = randn();
        let masked_sample = randn();
        let unet_input = self
            .masked
            .as_ref()
            .map(|m| inpaint_model::input(mask, m.mean.clone() + m.std.clone() * masked_sample));
        // A1111's masked content replaces the latent under the mask before it is noised; the
        // blend keeps the picture's latent outside it either way. Its noise is drawn after
        // diffusers' draws.
        let start_x0 = x0.as_ref().map(|x0| match self.masked_content {
            MaskedContent::Original | MaskedContent::Fill => x0.clone(),
            MaskedContent::LatentNoise => x0.clone() * keep.clone() + randn() * mask.clone(),
            MaskedContent::LatentNothing => x0.clone() * keep.clone(),
        });
        let latents = match start_x0 {
            Some(start_x0) if !full => start_x0 * at.sample + noise.clone() * at.noise,
            _ => noise.clone() * plan.init_noise_sigma,
        };
        // An inpainting UNet sees the picture through its input; only an ordinary one needs the
        // unmasked latents put back after each step.
        let blend = match (&x0, unet_input.is_none()) {
            (Some(x0), true) => Some(Blend {
                x0: x0.clone(),
                noise,
                mask: mask.clone(),
                keep: keep.clone(),
            }),
            _ => None,
        };
        Start {
            latents,
            blend,
            unet_input,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The left half of a 32 × 8 mask white.
    fn half_mask() -> RgbImage {
        let pixels = (0..32 * 8)
            .flat_map(|i| [if i % 32 < 16 { 255u8 } else { 0 }; 3])
            .collect();
        RgbImage {
            width: 32,
            height: 8,
            pixels,
        }
    }

    #[test]
    fn the_whole_picture_overlay_is_the_blurred_mask_doubled() {
        let (fill, weights) = whole_picture_masks(&half_mask(), 2.0);
        let at = |x: usize| weights[4 * 32 + x];
        let blurred = |x: usize| f32::from(fill.pixels[(4 * 32 + x) * 3]) / 255.0;
        assert_eq!((at(0), at(31)), (1.0, 0.0));
        // Inside the blur: the fill mask is the blurred one, the overlay twice it up to 1.
        assert!(blurred(15) > 0.5 && blurred(15) < 1.0, "{}", blurred(15));
        assert_eq!(at(15), 1.0, "the generated image reaches the midline");
        assert!(blurred(17) > 0.05 && blurred(17) < 0.5, "{}", blurred(17));
        assert!((at(17) - 2.0 * blurred(17)).abs() < 1e-6);
        // No blur: both are the mask.
        let (fill, weights) = whole_picture_masks(&half_mask(), 0.0);
        assert_eq!(fill.pixels, half_mask().pixels);
        assert!(weights.iter().all(|&w| w == 0.0 || w == 1.0));
    }

    /// A1111's latent mask: PIL's bicubic scale to the latent, rounded. The means are PIL's
    /// (`Image.fromarray(m).convert("RGB").resize((8, 8))`, Pillow 13): a hard edge at x = 18
    /// gives column 2 a mean of 0.263 (rounded 0: diffusers' nearest sample at x = 16 says 1);
    /// a ramp from 255 at x = 24 to 0 at x = 40 gives 0.788 and 0.267 in columns 3 and 4.
    #[test]
    fn latent_mask_from_the_blurred_mask_as_a1111_scales_it() {
        let image = |value: &dyn Fn(usize) -> u8| RgbImage {
            width: 64,
            height: 64,
            pixels: (0..64 * 64).flat_map(|i| [value(i % 64); 3]).collect(),
        };
        let edge = image(&|x| if x < 18 { 255 } else { 0 });
        let means = latent_mask_means(&edge, 8, 8);
        assert!((means[2] - 0.263).abs() < 0.03, "{:?}", &means[..8]);
        assert_eq!(
            rounded_latent_mask(&edge, 8, 8)[..8],
            [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        );
        let ramp = image(&|x| (((40.0 - x as f32) / 16.0).clamp(0.0, 1.0) * 255.0) as u8);
        let means = latent_mask_means(&ramp, 8, 8);
        assert!((means[3] - 0.788).abs() < 0.03, "{:?}", &means[..8]);
        assert!((means[4] - 0.267).abs() < 0.03, "{:?}", &means[..8]);
        assert_eq!(
            rounded_latent_mask(&ramp, 8, 8)[..8],
            [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
        );
    }
}
