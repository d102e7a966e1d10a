//! Latents to pixels: the VAE decode with its NaN guard, tiled or whole.

use burn::tensor::{DType, Tensor};

use super::{DecodeOptions, Notice, Observer};
use crate::error::{Error, Result};
use crate::image_io::RgbImage;
use crate::nn::Kernels;
use crate::stable_diffusion::StableDiffusion;

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
        if model.vae_upcast() {
            // The f16 decoder decodes no more: its recording's pages go.
            model.vae.recording().release();
        }
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
    model.vae.recording().release();
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
        .kernels(options.compile, vae, &latents, &mut |reason| {
            observer.notice(&Notice::VaeCompileFallback { reason })
        });
    if tiling.should_tile(vae.config(), dims) || too_large {
        tracing::debug!(?dims, ?tiling, "tiled VAE decode");
        // A recorded whole decode's pages serve the tiles instead.
        vae.recording().release();
        observer.decoding(tiling.tile_count(dims));
        crate::vae_tiling::tiled_decode(vae, latents, &tiling, kernels)
    } else {
        observer.decoding(1);
        match kernels {
            // Compiled: our kernels, replayed from a recorded graph where it fits.
            Kernels::Fused => vae.decode_compiled(latents),
            Kernels::Plain => {
                vae.recording().release();
                vae.decode_with(latents, kernels)
            }
        }
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
