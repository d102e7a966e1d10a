//! A loaded Stable Diffusion model: text encoder, UNet and VAE on one device in one dtype.

use burn::tensor::{DType, Device};

use crate::checkpoint::{Checkpoint, Component, LoadReport, ModelConfig, Weights};
use crate::clip::ClipTextModel;
use crate::error::Result;
use crate::unet::UNet2DConditionModel;
use crate::vae::AutoencoderKL;

/// Float precision of a model's weights and activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    #[default]
    F32,
    F16,
}

impl Precision {
    pub fn dtype(self) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::F16 => DType::F16,
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" | "fp32" => Ok(Precision::F32),
            "f16" | "fp16" => Ok(Precision::F16),
            other => Err(format!("unknown precision `{other}` (use f32 or f16)")),
        }
    }
}

/// What to load besides the always-needed parts.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    pub precision: Precision,
    /// img2img and inpainting need the VAE encoder; txt2img does not.
    pub vae_encoder: bool,
}

pub struct StableDiffusion {
    pub text_encoder: ClipTextModel,
    pub unet: UNet2DConditionModel,
    pub vae: AutoencoderKL,
    pub config: ModelConfig,
    pub device: Device,
    pub precision: Precision,
    /// Per component: how many tensors were read and which stored keys went unused.
    pub reports: Vec<LoadReport>,
}

impl StableDiffusion {
    pub fn load(checkpoint: &Checkpoint, device: &Device, options: LoadOptions) -> Result<Self> {
        let dtype = options.precision.dtype();
        let c = &checkpoint.config;
        let te = checkpoint.text_encoder_weights(device, dtype);
        let text_encoder = ClipTextModel::load(&te, &c.text_encoder)?;
        let uw = checkpoint.unet_weights(device, dtype);
        let unet = UNet2DConditionModel::load(&uw, &c.unet)?;
        let vw = checkpoint.vae_weights(device, dtype);
        let vae = AutoencoderKL::load(&vw, &c.vae, options.vae_encoder)?;
        let reports = vec![
            te.report(checkpoint.stored_prefix(Component::TextEncoder)),
            uw.report(checkpoint.stored_prefix(Component::Unet)),
            vw.report(checkpoint.stored_prefix(Component::Vae)),
        ];
        for r in &reports {
            if !r.unused.is_empty() {
                tracing::debug!(component = r.component, unused = ?r.unused, "checkpoint keys not used");
            }
            tracing::info!(
                component = r.component,
                tensors = r.loaded,
                unused = r.unused.len(),
                "loaded"
            );
        }
        Ok(Self {
            text_encoder,
            unet,
            vae,
            config: c.clone(),
            device: device.clone(),
            precision: options.precision,
            reports,
        })
    }

    /// Full-size SD 1.5 with random weights, for benchmarks.
    pub fn random(config: &ModelConfig, device: &Device, precision: Precision) -> Result<Self> {
        let dtype = precision.dtype();
        Ok(Self {
            text_encoder: ClipTextModel::load(
                &Weights::random("text encoder", device, dtype),
                &config.text_encoder,
            )?,
            unet: UNet2DConditionModel::load(
                &Weights::random("UNet", device, dtype),
                &config.unet,
            )?,
            vae: AutoencoderKL::load(&Weights::random("VAE", device, dtype), &config.vae, false)?,
            config: config.clone(),
            device: device.clone(),
            precision,
            reports: Vec::new(),
        })
    }
}
