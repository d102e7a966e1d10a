//! A model's configs: the networks' and the schedule's, the family presets, a sidecar's
//! overrides and their validation.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::check_scheduler;
use crate::clip::ClipConfig;
use crate::error::{Error, Result};
use crate::schedulers::SchedulerConfig;
use crate::unet::UNetConfig;
use crate::vae::VaeConfig;

/// The configs of an SD model: its networks and its training schedule (under diffusers' names,
/// as a folder's `*/config.json` and `scheduler/scheduler_config.json` hold them, or a single
/// file's sidecar).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelConfig {
    pub text_encoder: ClipConfig,
    /// SDXL's second text encoder (OpenCLIP ViT-bigG with its projection); `None` for SD 1.x
    /// and 2.x.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text_encoder_2: Option<ClipConfig>,
    pub unet: UNetConfig,
    pub vae: VaeConfig,
    pub scheduler: SchedulerConfig,
    /// diffusers' `force_zeros_for_empty_prompt` (an SDXL folder's `model_index.json`): an empty
    /// negative prompt conditions on zeros instead of the encoded empty string. Single files
    /// follow ComfyUI and A1111, which always encode it (false), unless the sidecar says.
    pub force_zeros_for_empty_prompt: bool,
}

impl ModelConfig {
    /// diffusers: stable-diffusion-v1-5 (text_encoder, unet, vae configs).
    pub fn sd15() -> Self {
        Self::default()
    }

    /// Stable Diffusion 2.x: 2.1 (768-v) when `v`, else 2.1-base (512, epsilon).
    pub fn sd2(v: bool) -> Self {
        Self {
            text_encoder: ClipConfig::sd2(),
            unet: UNetConfig::sd2(v),
            scheduler: SchedulerConfig::sd2(v),
            ..Self::sd15()
        }
    }

    /// Stable Diffusion XL base 1.0: CLIP ViT-L and OpenCLIP ViT-bigG, the three-level UNet
    /// with added conditioning, the VAE scaled by 0.13025, Euler's "leading" schedule.
    pub fn sdxl() -> Self {
        Self {
            text_encoder: ClipConfig::sd15(),
            text_encoder_2: Some(ClipConfig::sdxl_g()),
            unet: UNetConfig::sdxl(),
            vae: VaeConfig::sdxl(),
            scheduler: SchedulerConfig::sdxl(),
            force_zeros_for_empty_prompt: false,
        }
    }

    /// The SDXL refiner 1.0: OpenCLIP ViT-bigG alone (as `text_encoder_2`; the refiner has no
    /// first encoder and `text_encoder` is not read), the four-level UNet with aesthetic-score
    /// conditioning, SDXL's VAE and schedule.
    pub fn sdxl_refiner() -> Self {
        Self {
            unet: UNetConfig::sdxl_refiner(),
            ..Self::sdxl()
        }
    }

    /// The size the model was trained at, in pixels (each side): 512 for SD 1.x and 2.x base,
    /// 768 for SD 2.x v.
    pub fn native_size(&self) -> usize {
        self.unet.sample_size * self.vae.downscale()
    }

    /// `self` with the fields `sidecar` (a JSON object of the same shape) sets, objects merged
    /// key by key, anything else replaced: a sidecar need only say what differs from the family.
    pub(super) fn overridden(&self, sidecar: &serde_json::Value, path: &Path) -> Result<Self> {
        fn merge(base: &mut serde_json::Value, over: &serde_json::Value) {
            match (base, over) {
                (serde_json::Value::Object(base), serde_json::Value::Object(over)) => {
                    for (k, v) in over {
                        merge(base.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                    }
                }
                (base, over) => *base = over.clone(),
            }
        }
        let invalid = |reason: String| Error::InvalidConfig {
            reason,
            path: path.to_path_buf(),
        };
        if let Some(scheduler) = sidecar.get("scheduler") {
            check_scheduler(scheduler).map_err(invalid)?;
        }
        let mut value = serde_json::to_value(self).map_err(|e| invalid(e.to_string()))?;
        merge(&mut value, sidecar);
        let mut config: Self = serde_json::from_value(value).map_err(|e| invalid(e.to_string()))?;
        // What a config file cannot say: the tokenizer's padding and the second encoder's
        // projection are the family's.
        config.text_encoder.pad_token = self.text_encoder.pad_token;
        if let (Some(ours), Some(theirs)) = (&self.text_encoder_2, &mut config.text_encoder_2) {
            theirs.pad_token = ours.pad_token;
            theirs.with_projection = ours.with_projection;
        }
        Ok(config)
    }

    /// Every field of the three configs within [`crate::bounds`]: the first problem, in words.
    pub fn validate(&self) -> crate::Result<()> {
        self.text_encoder.validate()?;
        if let Some(te2) = &self.text_encoder_2 {
            te2.validate()?;
        }
        self.unet.validate()?;
        self.vae.validate()?;
        // The UNet denoises the VAE's latents; an inpainting UNet also takes the mask and the
        // masked picture's latents beside them.
        let (latent, unet) = (self.vae.latent_channels, &self.unet);
        if unet.out_channels != latent || ![latent, 2 * latent + 1].contains(&unet.in_channels) {
            return Err(crate::Error::Config(format!(
                "the UNet takes {} channels and predicts {} for a VAE of {latent} latent \
                 channels: only ordinary models ({latent} in) and inpainting models ({} in) \
                 are supported",
                unet.in_channels,
                unet.out_channels,
                2 * latent + 1
            )));
        }
        Ok(())
    }

    /// [`Self::validate`] as the engine's error for the file that supplied the config.
    pub(super) fn checked(self, path: &Path) -> Result<Self> {
        self.validate().map_err(|e| e.in_file(path))?;
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::ModelConfig;

    /// Ordinary (4 in) and inpainting (9 in) UNets pass; another width, or a prediction that is
    /// not the VAE's latent, is refused in words.
    #[test]
    fn the_unet_must_fit_the_vae_latents() {
        let with = |in_channels: usize, out_channels: usize| {
            let mut config = ModelConfig::sd15();
            (config.unet.in_channels, config.unet.out_channels) = (in_channels, out_channels);
            config.validate()
        };
        assert!(with(4, 4).is_ok());
        assert!(with(9, 4).is_ok());
        assert!(ModelConfig::sd15().unet.in_channels == 4);
        for (i, o) in [(8, 4), (5, 4), (9, 9), (4, 3)] {
            let e = with(i, o).unwrap_err().to_string();
            assert!(e.contains("inpainting models (9 in)"), "{i}/{o}: {e}");
        }
    }
}
