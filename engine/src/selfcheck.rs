//! Device self-check (`latent-studio doctor`, later "Verify device" in settings): runs one model's
//! text encoder, one UNet step and the VAE decoder on a device and on burn's CPU backend with the
//! same inputs, and compares. A driver that computes wrong numbers (Arc's results changing with
//! an unrelated grad mode) shows up here as a component that disagrees, instead of as a subtly
//! wrong image.

use std::path::Path;

use burn::tensor::{DType, Device, Tensor, TensorData};

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::noise::randn;
use crate::stable_diffusion::{LoadOptions, Precision, StableDiffusion};
use crate::tokenizer::ClipTokenizer;

/// Relative L2 error allowed in f32 (kernels may sum in another order, nothing more).
pub const F32_TOLERANCE: f32 = 1e-3;
/// Relative L2 error allowed in f16 (11-bit mantissa through dozens of layers).
pub const F16_TOLERANCE: f32 = 2e-2;

/// How one component's output on the device compares with the CPU's.
#[derive(Debug, Clone, PartialEq)]
pub struct ComponentCheck {
    pub component: &'static str,
    /// Largest absolute difference of one element (infinite when an output is not finite).
    pub max_abs: f32,
    /// ‖device − cpu‖₂ / ‖cpu‖₂ (infinite when an output is not finite or the shapes differ).
    pub rel: f32,
    pub tolerance: f32,
}

impl ComponentCheck {
    pub fn passed(&self) -> bool {
        self.rel <= self.tolerance
    }
}

impl std::fmt::Display for ComponentCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<12} max abs diff {:.3e}, rel error {:.3e} (tolerance {:.0e}): {}",
            self.component,
            self.max_abs,
            self.rel,
            self.tolerance,
            if self.passed() { "ok" } else { "DISAGREES" }
        )
    }
}

/// The result of [`self_check`]: one line per component.
#[derive(Debug, Clone, PartialEq)]
pub struct SelfCheckReport {
    pub device: String,
    pub precision: Precision,
    pub components: Vec<ComponentCheck>,
}

impl SelfCheckReport {
    pub fn passed(&self) -> bool {
        self.components.iter().all(ComponentCheck::passed)
    }

    pub fn failures(&self) -> impl Iterator<Item = &ComponentCheck> {
        self.components.iter().filter(|c| !c.passed())
    }
}

/// Compares a device's output with the CPU reference. Non-finite values or a length mismatch
/// fail outright: NaN must never compare as "close".
pub fn compare(
    component: &'static str,
    reference: &[f32],
    got: &[f32],
    tolerance: f32,
) -> ComponentCheck {
    let failed = ComponentCheck {
        component,
        max_abs: f32::INFINITY,
        rel: f32::INFINITY,
        tolerance,
    };
    let finite = |v: &[f32]| v.iter().all(|x| x.is_finite());
    if reference.len() != got.len() || !finite(reference) || !finite(got) {
        return failed;
    }
    let mut max_abs = 0f32;
    let (mut num, mut den) = (0f64, 0f64);
    for (r, g) in reference.iter().zip(got) {
        max_abs = max_abs.max((r - g).abs());
        num += f64::from(r - g).powi(2);
        den += f64::from(*r).powi(2);
    }
    ComponentCheck {
        component,
        max_abs,
        rel: (num / den.max(1e-30)).sqrt() as f32,
        tolerance,
    }
}

fn host<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>> {
    let data = t.cast(DType::F32).into_data();
    data.try_to_vec::<f32>()
        .map_err(|e| Error::Device(format!("cannot read a result back: {e:?}")))
}

/// Outputs of the three components for the fixed self-check inputs.
struct Outputs {
    text: Vec<f32>,
    unet: Vec<f32>,
    vae: Vec<f32>,
}

/// Runs the components on `model`. Each gets the same host inputs on every device (the UNet is
/// given the CPU's text embedding, not this device's), so a disagreement names its component.
fn run_components(
    model: &StableDiffusion,
    ids: &[u32],
    context: &[f32],
    context_shape: [usize; 3],
    latents: &[f32],
    latent_shape: [usize; 4],
) -> Result<Outputs> {
    let device = &model.device;
    let dtype = model.precision.dtype();
    let text = host(model.text_encoder.forward(&[ids.to_vec()], 1)?)?;
    let context = Tensor::<3>::from_data(
        TensorData::new(context.to_vec(), context_shape),
        (device, DType::F32),
    )
    .cast(dtype);
    let x = Tensor::<4>::from_data(
        TensorData::new(latents.to_vec(), latent_shape),
        (device, DType::F32),
    )
    .cast(dtype);
    // One step at t = 500, mid-schedule, where both noise and signal matter.
    let unet = host(model.unet()?.forward(x.clone(), &[500.0], &context))?;
    let vae = host(model.vae.decode(x))?;
    Ok(Outputs { text, unet, vae })
}

/// Loads the model at `model_path` on `device` (in `precision`) and on the CPU backend (f32),
/// runs text encoder, one UNet step and VAE decode on both with identical inputs, and compares.
/// Meant for a tiny model (the built-in demo): it runs at 64x64.
pub fn self_check(
    model_path: &Path,
    device: &Device,
    precision: Precision,
) -> Result<SelfCheckReport> {
    let checkpoint = Checkpoint::open(model_path)?;
    let cpu = StableDiffusion::load(&checkpoint, &Device::flex(), LoadOptions::default())?;
    let options = LoadOptions {
        precision,
        vae_encoder: false,
        // The check runs the encoder on the device it checks.
        text_encoders: crate::TextEncoders::Device,
    };
    let dev = StableDiffusion::load(&checkpoint, device, options)?;

    let tokenizer = ClipTokenizer::new()?;
    let ids = tokenizer
        .encode_padded("a watercolor fox in the snow, self-check")
        .ids;
    let context = cpu.text_encoder.forward(&[ids.to_vec()], 1)?;
    let context_shape = context.dims();
    let context = host(context)?;
    let scale = cpu.config.vae.downscale();
    let latent_shape = [1, cpu.config.unet.in_channels, 64 / scale, 64 / scale];
    let latents = randn(42, latent_shape.iter().product());

    let want = run_components(&cpu, &ids, &context, context_shape, &latents, latent_shape)?;
    let got = run_components(&dev, &ids, &context, context_shape, &latents, latent_shape)?;
    let tolerance = match precision {
        Precision::F32 => F32_TOLERANCE,
        Precision::F16 => F16_TOLERANCE,
    };
    Ok(SelfCheckReport {
        device: format!("{device:?}"),
        precision,
        components: vec![
            compare("text encoder", &want.text, &got.text, tolerance),
            compare("UNet step", &want.unet, &got.unet, tolerance),
            compare("VAE decode", &want.vae, &got.vae, tolerance),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-sd.safetensors")
    }

    #[test]
    fn cpu_agrees_with_cpu() {
        let report = self_check(&tiny(), &Device::flex(), Precision::F32).unwrap();
        let names: Vec<_> = report.components.iter().map(|c| c.component).collect();
        assert_eq!(names, ["text encoder", "UNet step", "VAE decode"]);
        for c in &report.components {
            assert!(c.passed(), "{c}");
            assert_eq!(c.max_abs, 0.0, "the same backend is deterministic: {c}");
        }
        assert!(report.passed());
    }

    #[test]
    fn a_disagreement_is_flagged() {
        let reference: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let close: Vec<f32> = reference.iter().map(|v| v * (1.0 + 1e-5)).collect();
        assert!(compare("x", &reference, &close, F32_TOLERANCE).passed());

        let mut off = reference.clone();
        off[10] += 0.5; // one wrong element, as a miscompiled kernel tile gives
        let c = compare("UNet step", &reference, &off, F32_TOLERANCE);
        assert!(!c.passed(), "{c}");
        assert!((c.max_abs - 0.5).abs() < 1e-6, "{c}");
        assert!(c.to_string().contains("DISAGREES"), "{c}");

        let mut nan = reference.clone();
        nan[3] = f32::NAN;
        assert!(!compare("x", &reference, &nan, F32_TOLERANCE).passed());
        assert!(!compare("x", &reference, &reference[1..], F32_TOLERANCE).passed());

        let report = SelfCheckReport {
            device: "test".into(),
            precision: Precision::F32,
            components: vec![
                compare("text encoder", &reference, &close, F32_TOLERANCE),
                c,
            ],
        };
        assert!(!report.passed());
        let failed: Vec<_> = report.failures().map(|c| c.component).collect();
        assert_eq!(failed, ["UNet step"]);
    }
}
