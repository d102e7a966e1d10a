//! latent2rgb: a preview straight from the latents, each pixel a linear map of its latent
//! channels (ComfyUI's factors per family, `assets/latent_rgb_factors.json`).

use burn::tensor::{DType, Tensor, TensorData};
use serde::Deserialize;

use crate::error::{Error, Result};

#[derive(Deserialize)]
struct FactorFile {
    sd1: Factors,
    sdxl: Factors,
}

/// Per-family latent→RGB factors, from `assets/latent_rgb_factors.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct Factors {
    /// `[latent channel][r, g, b]`
    pub factors: Vec<[f32; 3]>,
    pub bias: [f32; 3],
}

impl Factors {
    fn file() -> Result<FactorFile> {
        serde_json::from_str(include_str!("../../../assets/latent_rgb_factors.json"))
            .map_err(|e| Error::InvalidInput(format!("latent_rgb_factors.json: {e}")))
    }

    /// SD 1.x's (SD 2.x shares its VAE and latents).
    pub fn sd1() -> Result<Self> {
        Ok(Self::file()?.sd1)
    }

    /// SDXL's, with their bias (its VAE's latents are another space).
    pub fn sdxl() -> Result<Self> {
        Ok(Self::file()?.sdxl)
    }

    /// The factors of `config`'s family: SDXL's for a model with a second text encoder.
    pub fn for_model(config: &crate::checkpoint::ModelConfig) -> Result<Self> {
        match config.text_encoder_2 {
            Some(_) => Self::sdxl(),
            None => Self::sd1(),
        }
    }
}

/// latent2rgb on the device: `[1, c, h, w]` x0 -> `[h, w, 3]` in 0..=255, as ComfyUI maps it:
/// `clamp((x0ᵀ·F + b + 1) / 2, 0, 1) · 255`.
pub fn latent2rgb(x0: Tensor<4>, factors: &Factors) -> Tensor<3> {
    let [_, c, h, w] = x0.dims();
    let device = x0.device();
    let flat: Vec<f32> = factors.factors.iter().take(c).flatten().copied().collect();
    let f = Tensor::<2>::from_data(TensorData::new(flat, [c, 3]), (&device, DType::F32));
    let b = Tensor::<1>::from_data(
        TensorData::new(factors.bias.to_vec(), [3]),
        (&device, DType::F32),
    );
    let pixels = x0.cast(DType::F32).reshape([c, h * w]).swap_dims(0, 1); // [hw, c]
    let rgb = burn::tensor::module::linear(pixels, f, Some(b)); // [hw, 3]
    (((rgb + 1.0) / 2.0).clamp(0.0, 1.0) * 255.0).reshape([h, w, 3])
}

/// The plain reference of [`latent2rgb`] on host data, for tests.
pub fn latent2rgb_reference(
    x0: &[f32],
    c: usize,
    h: usize,
    w: usize,
    factors: &Factors,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(h * w * 3);
    for i in 0..h * w {
        for (ch, &bias) in factors.bias.iter().enumerate() {
            let v: f32 = (0..c)
                .map(|k| x0[k * h * w + i] * factors.factors[k][ch])
                .sum::<f32>()
                + bias;
            out.push(((v + 1.0) / 2.0).clamp(0.0, 1.0) * 255.0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both families' factors (SDXL's with a bias), on the CPU backend and wgpu; the model's
    /// family picks them.
    #[test]
    fn latent2rgb_matches_its_reference_on_every_backend() {
        let sd1 = Factors::sd1().unwrap();
        assert_eq!(sd1.factors[0], [0.3512, 0.2297, 0.3227]);
        let sdxl = Factors::sdxl().unwrap();
        assert_eq!(sdxl.bias, [0.1084, -0.0175, -0.0011]);
        let picked = Factors::for_model(&crate::checkpoint::ModelConfig::sdxl()).unwrap();
        assert_eq!(picked.factors, sdxl.factors);
        let picked = Factors::for_model(&crate::checkpoint::ModelConfig::sd2(true)).unwrap();
        assert_eq!(picked.factors, sd1.factors);
        let (c, h, w) = (4, 5, 7);
        let x0: Vec<f32> = (0..c * h * w)
            .map(|i| ((i * 37 % 23) as f32 / 11.5) - 1.0)
            .collect();
        for factors in [sd1, sdxl] {
            let want = latent2rgb_reference(&x0, c, h, w, &factors);
            for device in [
                burn::tensor::Device::flex(),
                burn::tensor::Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
            ] {
                let t = Tensor::<4>::from_data(TensorData::new(x0.clone(), [1, c, h, w]), &device);
                let got = latent2rgb(t, &factors)
                    .into_data()
                    .try_to_vec::<f32>()
                    .unwrap();
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(worst < 1e-3, "{device:?} bias {:?}: {worst}", factors.bias);
            }
        }
    }
}
