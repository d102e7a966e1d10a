//! SDXL's refiner: the second of diffusers' "ensemble of expert denoisers", which takes over an
//! SDXL run for its last, low-noise steps (A1111's "Refiner" with "Refiner switch at", ComfyUI's
//! second advanced sampler). It has its own text encoder (OpenCLIP bigG alone), its own UNet
//! (conditioned on an aesthetic score instead of the target size) and SDXL's VAE, which the base
//! model's decodes for it.

use burn::tensor::Device;

use crate::checkpoint::{Checkpoint, Component, Family, ModelConfig};
use crate::clip::ClipTextModel;
use crate::error::{Error, Result};
use crate::prompt::ConditioningMemo;
use crate::unet::UNet2DConditionModel;

use super::Precision;

/// diffusers' and A1111's default aesthetic scores: the prompt's, and the negative's
/// (`aesthetic_score`, `negative_aesthetic_score`; A1111's `sdxl_refiner_high/low_aesthetic_score`).
pub const AESTHETIC_SCORE: f32 = 6.0;
pub const NEGATIVE_AESTHETIC_SCORE: f32 = 2.5;

/// A loaded refiner, on one device in one dtype.
pub struct Refiner {
    /// OpenCLIP ViT-bigG with its projection (the base's second encoder; the refiner has no
    /// first).
    pub text_encoder: ClipTextModel,
    pub unet: UNet2DConditionModel,
    pub config: ModelConfig,
    pub device: Device,
    pub precision: Precision,
    /// The last request's conditioning (a repeated prompt encodes nothing).
    pub(crate) conditioning: ConditioningMemo,
}

impl Refiner {
    /// Loads the refiner of `checkpoint` (opened with [`Checkpoint::open_refiner`]); its VAE is
    /// not read (the base model's decodes).
    pub fn load(checkpoint: &Checkpoint, device: &Device, precision: Precision) -> Result<Self> {
        if checkpoint.family != Family::SdxlRefiner {
            return Err(Error::NotARefiner {
                found: checkpoint.family.describe().to_string(),
                path: checkpoint.path.clone(),
            });
        }
        let config = checkpoint.config.clone();
        let te_config = config.text_encoder_2.clone().ok_or_else(|| {
            Error::Config("the SDXL refiner's text_encoder_2 config is missing".into())
        })?;
        let dtype = precision.dtype();
        let te = checkpoint
            .text_encoder_2_weights(device, dtype)
            .ok_or_else(|| Error::MissingTensor {
                component: "SDXL refiner",
                name: "text_encoder_2 (its text encoder's weights)".into(),
            })?;
        let uw = checkpoint.unet_weights(device, dtype);
        let (text_encoder, unet) = crate::device::loaded(device, || -> Result<_> {
            Ok((
                ClipTextModel::load(&te, &te_config)?,
                UNet2DConditionModel::load(&uw, &config.unet)?,
            ))
        })?;
        for (w, component) in [(&te, Component::TextEncoder2), (&uw, Component::Unet)] {
            let r = w.report(checkpoint.stored_prefix(component));
            tracing::info!(
                component = r.component,
                tensors = r.loaded,
                unused = r.unused.len(),
                "refiner loaded"
            );
        }
        let refiner = Self {
            text_encoder,
            unet,
            config,
            device: device.clone(),
            precision,
            conditioning: ConditioningMemo::default(),
        };
        refiner.added_values()?;
        Ok(refiner)
    }

    /// A full-size refiner of `config` with random weights, for benchmarks.
    pub fn random(config: &ModelConfig, device: &Device, precision: Precision) -> Result<Self> {
        let te_config = config.text_encoder_2.clone().ok_or_else(|| {
            Error::Config("the SDXL refiner's text_encoder_2 config is missing".into())
        })?;
        let dtype = precision.dtype();
        let (text_encoder, unet) = crate::device::loaded(device, || -> Result<_> {
            let te = crate::weights::Weights::random("refiner text encoder", device, dtype);
            let uw = crate::weights::Weights::random("refiner UNet", device, dtype);
            Ok((
                ClipTextModel::load(&te, &te_config)?,
                UNet2DConditionModel::load(&uw, &config.unet)?,
            ))
        })?;
        Ok(Self {
            text_encoder,
            unet,
            config: config.clone(),
            device: device.clone(),
            precision,
            conditioning: ConditioningMemo::default(),
        })
    }

    /// The added conditioning's values beside the pooled embedding: the refiner's five (sizes,
    /// crop, aesthetic score); an error for a UNet that takes another count.
    pub fn added_values(&self) -> Result<usize> {
        let pooled = self
            .config
            .text_encoder_2
            .as_ref()
            .and_then(|c| c.projection_dim)
            .unwrap_or(0);
        match self.config.unet.added_values(pooled) {
            Some(5) => Ok(5),
            other => Err(Error::Config(format!(
                "the refiner's UNet takes {} added values beside a pooled embedding of {pooled}; \
                 an SDXL refiner takes 5 (original size, crop, aesthetic score)",
                other.map_or("no".to_string(), |n| n.to_string())
            ))),
        }
    }

    /// How many conditionings were encoded (not remembered) so far.
    pub fn conditioning_encodes(&self) -> usize {
        self.conditioning.encodes()
    }
}
