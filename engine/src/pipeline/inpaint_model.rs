//! An inpainting UNet's extra input (SD 1.x/2.x/XL inpainting checkpoints, 9 channels): beside
//! the latents it takes the mask at the latent's size and the latents of the picture with the
//! masked area blanked, concatenated in that order, as diffusers' `StableDiffusionInpaintPipeline`
//! gives them.
//!
//! Without a mask (txt2img, img2img, the hires pass) the whole picture counts as masked: a mask
//! of ones over a blank (all-zero, mid-grey) picture, which is what A1111 conditions such a model
//! on (`txt2img_image_conditioning`, and its img2img one at the default inpainting mask weight 1).
//! The blank is the encoder's mean rather than a sample, so that it draws nothing from the seed's
//! generator and a seed's noise stays the one txt2img draws.

use burn::tensor::{DType, Tensor, TensorData};

use super::decode::all_finite;
use crate::error::{Error, Result};
use crate::image_io::{RgbImage, grey};
use crate::stable_diffusion::StableDiffusion;

/// The encoder's distribution of a picture: mean and standard deviation, times the VAE's scaling
/// factor, in f32, `[1, c, h/8, w/8]`.
pub(super) struct Distribution {
    pub mean: Tensor<4>,
    pub std: Tensor<4>,
}

/// `VaeImageProcessor`'s pixels: x / 255, then 2x − 1, channels first; masked pixels (where
/// `masked` says) are 0, as diffusers' `init_image * (mask < 0.5)`.
pub(super) fn pixels(image: &RgbImage, masked: Option<&[bool]>) -> Result<Vec<f32>> {
    let plane = image.width * image.height;
    if image.pixels.len() != plane * 3 || masked.is_some_and(|m| m.len() != plane) {
        return Err(Error::InvalidInput(format!(
            "the init image has {} bytes for {}x{} RGB pixels",
            image.pixels.len(),
            image.width,
            image.height
        )));
    }
    let mut data = vec![0f32; 3 * plane];
    for (i, px) in image.pixels.chunks_exact(3).enumerate() {
        if masked.is_some_and(|m| m[i]) {
            continue;
        }
        for (c, &v) in px.iter().enumerate() {
            data[c * plane + i] = f32::from(v) / 255.0 * 2.0 - 1.0;
        }
    }
    Ok(data)
}

/// Encodes `width`×`height` pixels (from [`pixels`]) with the model's VAE encoder.
pub(super) fn encode(
    model: &StableDiffusion,
    data: Vec<f32>,
    width: usize,
    height: usize,
) -> Result<Distribution> {
    let device = &model.device;
    let pixels = Tensor::<4>::from_data(
        TensorData::new(data, [1, 3, height, width]),
        (device, DType::F32),
    );
    let (mean, logvar) = model
        .vae
        .encode(pixels.cast(model.precision.dtype()))
        .map_err(|_| {
            let what = match model.config.unet.is_inpainting() {
                true => "an inpainting model (and img2img)",
                false => "img2img",
            };
            Error::InvalidInput(format!(
                "{what} needs the VAE encoder, which this model was loaded without (or has no \
                 weights for)"
            ))
        })?;
    // `encode` scales the mean already.
    let mean = mean.cast(DType::F32);
    let std = (logvar.cast(DType::F32) * 0.5).exp() * model.config.vae.scaling_factor;
    if !all_finite(&mean)? || !all_finite(&std)? {
        return Err(Error::InvalidInput(
            "the VAE encoded the init image to NaN or infinite values (try f32 precision)".into(),
        ));
    }
    Ok(Distribution { mean, std })
}

/// Where a fitted mask repaints, per pixel: grey as PIL's `convert("L")`, binarized at 50 % as
/// diffusers' mask processor does.
pub(super) fn repainted(mask: &RgbImage) -> Vec<bool> {
    mask.pixels
        .chunks_exact(3)
        .map(|p| f32::from(grey(p)) / 255.0 >= 0.5)
        .collect()
}

/// The UNet's extra input: the latent mask `[1, 1, h/8, w/8]` and the masked picture's latents.
pub(super) fn input(mask: &Tensor<4>, masked_latents: Tensor<4>) -> Tensor<4> {
    Tensor::cat(vec![mask.clone(), masked_latents], 1)
}

/// The extra input without a mask: ones over the blank picture's mean latents, at
/// `width`×`height`.
pub(super) fn blank(model: &StableDiffusion, width: usize, height: usize) -> Result<Tensor<4>> {
    let blank = encode(model, vec![0.0; 3 * width * height], width, height)?;
    let [_, _, h, w] = blank.mean.dims();
    let ones = Tensor::<4>::ones([1, 1, h, w], (&model.device, DType::F32));
    Ok(input(&ones, blank.mean))
}
