//! Where a model's text encoders wait between prompts, and bringing parked ones to the device.

use std::sync::Arc;
use std::time::Instant;

use burn::tensor::{DType, Device};

use super::StableDiffusion;
use crate::checkpoint::{ModelConfig, Weights};
use crate::clip::ClipTextModel;
use crate::error::{Error, Result};
use crate::lora::{self, LoraSet, keys::Net};
use crate::weights::kept::TensorMap;

/// Where a model's text encoders wait between prompts. Parked on the host, they come to the
/// device only to encode a prompt the model has not just encoded ([`StableDiffusion::networks`])
/// and leave before the UNet runs: SDXL's two (1.6 GB in f16) are what keeps a 1024² SDXL run
/// from fitting an 8 GB card (BENCHMARKS.md), as A1111's `--medvram-sdxl` and ComfyUI's low-VRAM
/// mode park them. The cost is one upload per new prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TextEncoders {
    /// Parked for SDXL (two encoders, 1.6 GB), on the device for SD 1.x/2.x (0.25/0.7 GB).
    #[default]
    Auto,
    /// Always on the device: no upload per prompt.
    Device,
    /// Always parked on the host.
    Host,
}

impl TextEncoders {
    /// Whether a model of `config` parks its encoders.
    pub fn parked(self, config: &ModelConfig) -> bool {
        match self {
            TextEncoders::Auto => config.text_encoder_2.is_some(),
            TextEncoders::Device => false,
            TextEncoders::Host => true,
        }
    }

    /// Where a model of `config` for `device` loads its encoders: the CPU backend's host memory
    /// when parked (and `device` is not the CPU already), else `device`.
    pub fn device_for(self, config: &ModelConfig, device: &Device) -> Device {
        if self.parked(config) && !crate::device::is_cpu(device) {
            Device::flex()
        } else {
            device.clone()
        }
    }
}

/// Whether encoders built on `te_device` for a model on `device` are parked: on the host while
/// the rest is on a device.
pub(super) fn parked_on(te_device: &Device, device: &Device) -> bool {
    crate::device::is_cpu(te_device) && !crate::device::is_cpu(device)
}

impl std::fmt::Display for TextEncoders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TextEncoders::Auto => "auto",
            TextEncoders::Device => "device",
            TextEncoders::Host => "host",
        })
    }
}

impl std::str::FromStr for TextEncoders {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(TextEncoders::Auto),
            "device" => Ok(TextEncoders::Device),
            "host" => Ok(TextEncoders::Host),
            other => Err(format!(
                "unknown text encoder place `{other}` (use auto, device or host)"
            )),
        }
    }
}

/// Parked encoders built on the host again from their tensors as shared host bytes
/// ([`TensorMap::into_host`]): the first modules go, so the bytes are given up without a copy,
/// and the new ones share them, so every later upload copies each tensor once, into the
/// device's staging (from CPU tensors shared with a module burn copied each one out first).
/// The token tables, kept in row chunks, stay CPU tensors and are still copied twice.
pub(super) fn as_host_bytes(
    (first, second): (ClipTextModel, Option<ClipTextModel>),
    kept: super::Kept,
    (home, dtype): (&Device, DType),
    config: &ModelConfig,
) -> Result<(ClipTextModel, Option<ClipTextModel>, super::Kept)> {
    drop((first, second));
    let kept = super::Kept {
        text_encoder: TensorMap::given_to_host(kept.text_encoder),
        text_encoder_2: kept.text_encoder_2.map(TensorMap::given_to_host),
    };
    let build = |label, map: &Arc<TensorMap>, config| {
        let none = Arc::new(TensorMap::default());
        ClipTextModel::load(
            &Weights::kept(label, map.clone(), none, home, dtype),
            config,
        )
    };
    let first = build("text encoder", &kept.text_encoder, &config.text_encoder)?;
    let second = match (&kept.text_encoder_2, &config.text_encoder_2) {
        (Some(map), Some(c)) => Some(build("second text encoder", map, c)?),
        _ => None,
    };
    Ok((first, second, kept))
}

impl StableDiffusion {
    /// The parked encoders on the device, built from their kept tensors with `set`'s
    /// text-encoder LoRAs merged (the checkpoint is not read).
    pub(super) fn encoders_on_device(
        &self,
        set: &LoraSet,
    ) -> Result<(ClipTextModel, Option<ClipTextModel>)> {
        let kept = self.kept.as_ref().ok_or_else(|| {
            Error::InvalidInput("parked text encoders need the tensors they were built from".into())
        })?;
        let start = Instant::now();
        let (device, dtype) = (&self.device, self.precision.dtype());
        let te_alias = |module: &str| module.strip_prefix("text_model.").map(str::to_string);
        let build = |net: Net, label: &'static str, map: &TensorMap, config| -> Result<_> {
            let base = Arc::new(map.to_device(device));
            let patches = lora::patches(net, &base, set, &te_alias, device, dtype)?;
            let w = Weights::kept(label, base, Arc::new(patches), device, dtype);
            ClipTextModel::load(&w, config)
        };
        let first = build(
            Net::TextEncoder,
            "text encoder",
            &kept.text_encoder,
            &self.config.text_encoder,
        )?;
        let second = match (&kept.text_encoder_2, &self.config.text_encoder_2) {
            (Some(map), Some(config)) => Some(build(
                Net::TextEncoder2,
                "second text encoder",
                map,
                config,
            )?),
            _ => None,
        };
        tracing::debug!(
            ms = start.elapsed().as_secs_f64() * 1e3,
            "parked text encoders brought to the device"
        );
        Ok((first, second))
    }
}

#[cfg(test)]
mod tests {
    use super::TextEncoders;
    use crate::checkpoint::ModelConfig;

    /// Auto parks SDXL's two encoders only; the names round-trip as the CLI and settings write
    /// them.
    #[test]
    fn auto_parks_sdxl_only_and_names_round_trip() {
        let sd15 = ModelConfig::sd15();
        let sdxl = ModelConfig::sdxl();
        assert!(sdxl.text_encoder_2.is_some() && sd15.text_encoder_2.is_none());
        assert!(TextEncoders::Auto.parked(&sdxl));
        assert!(!TextEncoders::Auto.parked(&sd15));
        assert!(TextEncoders::Host.parked(&sd15));
        assert!(!TextEncoders::Device.parked(&sdxl));
        for t in [TextEncoders::Auto, TextEncoders::Device, TextEncoders::Host] {
            assert_eq!(t.to_string().parse::<TextEncoders>(), Ok(t));
        }
        assert!("gpu".parse::<TextEncoders>().is_err());
        assert_eq!(TextEncoders::default(), TextEncoders::Auto);
    }

    /// On the CPU backend there is nowhere else to park: the encoders stay where the model is.
    #[test]
    fn the_cpu_backend_keeps_its_encoders() {
        let cpu = burn::tensor::Device::flex();
        let sdxl = ModelConfig::sdxl();
        assert!(crate::device::is_cpu(
            &TextEncoders::Host.device_for(&sdxl, &cpu)
        ));
    }
}
