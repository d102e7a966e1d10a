//! img2img's starting point: the artist's image encoded by the VAE and noised to the first step
//! that runs, as diffusers' `StableDiffusionImg2ImgPipeline.prepare_latents` does it.

use std::sync::Arc;

use burn::tensor::{DType, Tensor, TensorData};

use super::decode::all_finite;
use crate::error::{Error, Result};
use crate::image_io::{ResizeMode, RgbImage, resize};
use crate::model::StableDiffusion;
use crate::noise::TorchRng;
use crate::schedulers::StartCoefficients;

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
}

/// The encoded image, once for every image of a batch count: the latent distribution's mean and
/// standard deviation, both times the VAE's scaling factor, in f32.
pub(super) struct Encoded {
    mean: Tensor<4>,
    std: Tensor<4>,
}

/// Fits the init image to `width`×`height` and encodes it with the model's VAE encoder (loaded
/// with [`crate::LoadOptions::vae_encoder`]).
pub(super) fn encode(
    model: &StableDiffusion,
    init: &InitImage,
    width: usize,
    height: usize,
) -> Result<Encoded> {
    let image = resize(&init.image, width, height, init.resize)?;
    let (w, h) = (image.width, image.height);
    let plane = w * h;
    if image.pixels.len() != plane * 3 {
        return Err(Error::InvalidInput(format!(
            "the init image has {} bytes for {w}x{h} RGB pixels",
            image.pixels.len()
        )));
    }
    // `VaeImageProcessor`: x / 255 in float32, then 2x − 1; channels first.
    let mut data = vec![0f32; 3 * plane];
    for (i, px) in image.pixels.chunks_exact(3).enumerate() {
        for (c, &v) in px.iter().enumerate() {
            data[c * plane + i] = f32::from(v) / 255.0 * 2.0 - 1.0;
        }
    }
    let device = &model.device;
    let pixels = Tensor::<4>::from_data(TensorData::new(data, [1, 3, h, w]), (device, DType::F32));
    let (mean, logvar) = model
        .vae
        .encode(pixels.cast(model.precision.dtype()))
        .map_err(|_| {
            Error::InvalidInput(
                "img2img needs the VAE encoder, which this model was loaded without (or has \
                 no weights for)"
                    .into(),
            )
        })?;
    let mean = mean.cast(DType::F32);
    let std = (logvar.cast(DType::F32) * 0.5).exp() * model.config.vae.scaling_factor;
    if !all_finite(&mean)? || !all_finite(&std)? {
        return Err(Error::InvalidInput(
            "the VAE encoded the init image to NaN or infinite values (try f32 precision)".into(),
        ));
    }
    Ok(Encoded { mean, std })
}

impl Encoded {
    /// The first latent of one seed: a sample of the latent distribution, then the scheduler's
    /// `add_noise` at the first step, both drawn from the seed's generator in that order (as
    /// diffusers draws them), so the sampler's own noise continues the same stream.
    pub(super) fn start(&self, rng: &mut TorchRng, at: StartCoefficients) -> Tensor<4> {
        let shape = self.mean.dims();
        let numel = shape.iter().product();
        let device = self.mean.device();
        let mut randn = || {
            Tensor::<4>::from_data(
                TensorData::new(rng.randn(numel), shape),
                (&device, DType::F32),
            )
        };
        let x0 = self.mean.clone() + self.std.clone() * randn();
        x0 * at.sample + randn() * at.noise
    }
}
