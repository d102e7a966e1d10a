//! SDXL's refiner: the second of diffusers' "ensemble of expert denoisers", which takes over an
//! SDXL run for its last, low-noise steps (A1111's "Refiner" with "Refiner switch at", ComfyUI's
//! second advanced sampler). It has its own text encoder (OpenCLIP bigG alone), its own UNet
//! (conditioned on an aesthetic score instead of the target size) and SDXL's VAE, which the base
//! model's decodes for it.

use std::sync::Arc;

use burn::tensor::Device;

use super::{TextEncoders, UnetHome};
use crate::checkpoint::{Checkpoint, Component, Family, ModelConfig};
use crate::clip::ClipTextModel;
use crate::error::{Error, Result};
use crate::prompt::ConditioningMemo;
use crate::unet::UNet2DConditionModel;
use crate::weights::Weights;
use crate::weights::kept::TensorMap;

use super::Precision;

/// diffusers' and A1111's default aesthetic scores: the prompt's, and the negative's
/// (`aesthetic_score`, `negative_aesthetic_score`; A1111's `sdxl_refiner_high/low_aesthetic_score`).
pub const AESTHETIC_SCORE: f32 = 6.0;
pub const NEGATIVE_AESTHETIC_SCORE: f32 = 2.5;

/// A loaded refiner, for one device in one dtype. Parked ([`TextEncoders`], as the base model
/// parks its encoders: SDXL's default), its encoder and UNet wait in host memory: the encoder
/// comes to the device for a new prompt, the UNet for the refiner's steps, while the base
/// model's UNet leaves it ([`crate::pipeline::txt2img_refined`]). SDXL's base and refiner UNets
/// together (9 GiB in f16) do not fit an 8 GB card.
pub struct Refiner {
    /// OpenCLIP ViT-bigG with its projection (the base's second encoder; the refiner has no
    /// first): on the device, or its tensors in host memory.
    text_encoder: Encoder,
    unet: UnetHome,
    pub config: ModelConfig,
    pub device: Device,
    pub precision: Precision,
    /// The last request's conditioning (a repeated prompt encodes nothing).
    pub(crate) conditioning: ConditioningMemo,
}

enum Encoder {
    Device(Box<ClipTextModel>),
    /// Parked: the tensors to build it from on the device, in host memory.
    Host(Arc<TensorMap>),
}

impl Refiner {
    /// Loads the refiner of `checkpoint` (opened with [`Checkpoint::open_refiner`]), parked or
    /// not as `TextEncoders::Auto` decides ([`parks`]); its VAE is not read (the base model's
    /// decodes).
    pub fn load(checkpoint: &Checkpoint, device: &Device, precision: Precision) -> Result<Self> {
        Self::load_with(checkpoint, device, precision, TextEncoders::Auto)
    }

    /// [`Self::load`], parked where `place` says ([`parks`]: `host` parks it, `device` keeps it on
    /// the device beside the base model). Parked, it is built in host memory.
    pub fn load_with(
        checkpoint: &Checkpoint,
        device: &Device,
        precision: Precision,
        place: TextEncoders,
    ) -> Result<Self> {
        if checkpoint.family != Family::SdxlRefiner {
            return Err(Error::NotARefiner {
                found: checkpoint.family.describe().to_string(),
                path: checkpoint.path.clone(),
            });
        }
        let config = checkpoint.config.clone();
        let te_config = te_config(&config)?;
        let dtype = precision.dtype();
        let home = match parks(place, device) {
            true => Device::flex(),
            false => device.clone(),
        };
        let te = checkpoint
            .text_encoder_2_weights(&home, dtype)
            .ok_or_else(|| Error::MissingTensor {
                component: "SDXL refiner",
                name: "text_encoder_2 (its text encoder's weights)".into(),
            })?
            .keeping();
        let uw = checkpoint.unet_weights(&home, dtype).keeping();
        let (text_encoder, unet) = crate::device::loaded(&home, || -> Result<_> {
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
                parked = super::encoders::parked_on(&home, device),
                "refiner loaded"
            );
        }
        let (te_kept, unet_kept) = (Arc::new(te.take_kept()), Arc::new(uw.take_kept()));
        let refiner = Self::placed(
            (text_encoder, te_kept),
            (unet, unet_kept),
            &home,
            config,
            device,
            precision,
        );
        refiner.added_values()?;
        Ok(refiner)
    }

    /// A full-size refiner of `config` with random weights, for benchmarks: built on the device
    /// and then, parked where `place` says, moved to host memory (random values are made faster
    /// there than on the CPU).
    pub fn random(
        config: &ModelConfig,
        device: &Device,
        precision: Precision,
        place: TextEncoders,
    ) -> Result<Self> {
        let te_config = te_config(config)?;
        let dtype = precision.dtype();
        let te = Weights::random("refiner text encoder", device, dtype).keeping();
        let uw = Weights::random("refiner UNet", device, dtype).keeping();
        let (text_encoder, unet) = crate::device::loaded(device, || -> Result<_> {
            Ok((
                ClipTextModel::load(&te, &te_config)?,
                UNet2DConditionModel::load(&uw, &config.unet)?,
            ))
        })?;
        let kept = (Arc::new(te.take_kept()), Arc::new(uw.take_kept()));
        let on_device = Self::placed(
            (text_encoder, kept.0.clone()),
            (unet, kept.1),
            device,
            config.clone(),
            device,
            precision,
        );
        if !parks(place, device) {
            return Ok(on_device);
        }
        let host = Arc::new(kept.0.to_host());
        drop(kept.0);
        on_device.unet.evict()?;
        let Self {
            text_encoder: on_device_encoder,
            unet,
            config,
            device: _,
            precision,
            conditioning,
        } = on_device;
        // The device's encoder goes before the pool's free pages are returned.
        drop(on_device_encoder);
        crate::device::release_free(device);
        Ok(Self {
            text_encoder: Encoder::Host(host),
            unet,
            config,
            device: device.clone(),
            precision,
            conditioning,
        })
    }

    /// A refiner of networks built on `home` (host memory when parked) from the kept tensors.
    fn placed(
        (text_encoder, te_kept): (ClipTextModel, Arc<TensorMap>),
        (unet, unet_kept): (UNet2DConditionModel, Arc<TensorMap>),
        home: &Device,
        config: ModelConfig,
        device: &Device,
        precision: Precision,
    ) -> Self {
        let dtype = precision.dtype();
        let label = "refiner UNet";
        let (text_encoder, unet) = match super::encoders::parked_on(home, device) {
            // The host-built modules go; their tensors stay, to be built on the device, as host
            // bytes that are then copied once an upload.
            true => {
                drop((text_encoder, unet));
                (
                    Encoder::Host(TensorMap::given_to_host(te_kept)),
                    UnetHome::on_host(
                        TensorMap::given_to_host(unet_kept),
                        &config.unet,
                        device,
                        dtype,
                        label,
                    ),
                )
            }
            false => (
                Encoder::Device(Box::new(text_encoder)),
                UnetHome::on_device(unet, unet_kept, &config.unet, device, dtype, label),
            ),
        };
        Self {
            text_encoder,
            unet,
            config,
            device: device.clone(),
            precision,
            conditioning: ConditioningMemo::default(),
        }
    }

    /// Whether the refiner waits in host memory between its runs' steps.
    pub fn parked(&self) -> bool {
        matches!(self.text_encoder, Encoder::Host(_))
    }

    /// Whether this refiner is where `place` would put it (a request with that setting can use
    /// it).
    pub fn parks_as(&self, place: TextEncoders) -> bool {
        parks(place, &self.device) == self.parked()
    }

    /// The text encoder on the device (a parked one built there for the caller, gone when the
    /// caller drops it).
    pub fn text_encoder(&self) -> Result<ClipTextModel> {
        match &self.text_encoder {
            Encoder::Device(te) => Ok(ClipTextModel::clone(te)),
            Encoder::Host(map) => {
                let (device, dtype) = (&self.device, self.precision.dtype());
                let base = Arc::new(map.to_device(device));
                let w = Weights::kept(
                    "refiner text encoder",
                    base,
                    Arc::new(TensorMap::default()),
                    device,
                    dtype,
                );
                ClipTextModel::load(&w, &te_config(&self.config)?)
            }
        }
    }

    /// The UNet on the device (a parked one brought there, and kept until
    /// [`Self::evict_unet`]).
    pub fn unet(&self) -> Result<UNet2DConditionModel> {
        self.unet.get()
    }

    /// Lets the UNet leave the device (its memory is free once the caller drops its handles).
    pub fn evict_unet(&self) -> Result<()> {
        self.unet.evict()
    }

    /// Whether the UNet is on the device now.
    pub fn unet_on_device(&self) -> bool {
        self.unet.is_on_device()
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

/// The refiner's encoder config (bigG, its `text_encoder_2`).
fn te_config(config: &ModelConfig) -> Result<crate::clip::ClipConfig> {
    config
        .text_encoder_2
        .clone()
        .ok_or_else(|| Error::Config("the SDXL refiner's text_encoder_2 config is missing".into()))
}

/// Device memory under which `auto` parks a refiner: SDXL's base and refiner both on the device
/// with a 1024² run peaked at 14.35 GiB on an H200 (BENCHMARKS.md, thirty-eighth session), and
/// taking turns cost ~14 s an image there (5–6 s of it uploads). 15 GiB, so that a 16 GB card
/// (whose heap reads a little under 16 GiB) keeps both.
pub const PAIR_RESIDENT_BYTES: u64 = 15 << 30;

/// Whether a refiner for `device` placed by `place` is parked in host memory: `host` always,
/// `device` never, `auto` unless the device reports at least [`PAIR_RESIDENT_BYTES`] of memory
/// (an unknown size parks it: it fits, only slower; the size is known for a device opened from a
/// Vulkan adapter the engine chose or was named, not for `--device gpu`). The CPU backend parks
/// nothing.
pub fn parks(place: TextEncoders, device: &Device) -> bool {
    if crate::device::is_cpu(device) {
        return false;
    }
    auto_or(place, crate::device::device_memory(device))
}

/// [`parks`] for a device of `memory` bytes (`None`: unknown).
fn auto_or(place: TextEncoders, memory: Option<u64>) -> bool {
    match place {
        TextEncoders::Host => true,
        TextEncoders::Device => false,
        TextEncoders::Auto => memory.is_none_or(|bytes| bytes < PAIR_RESIDENT_BYTES),
    }
}

#[cfg(test)]
mod tests {
    use super::{PAIR_RESIDENT_BYTES, TextEncoders, auto_or};

    /// `auto` keeps the pair on a 16 GB card (its heap reads 16376 MiB) or larger, parks it on an
    /// 8 or 12 GB one and where the size is unknown; the explicit places are what they say.
    #[test]
    fn auto_parks_a_refiner_where_the_pair_would_not_fit() {
        let gib = |n: u64| Some(n << 30);
        assert!(auto_or(TextEncoders::Auto, gib(8)));
        assert!(auto_or(TextEncoders::Auto, gib(12)));
        assert!(auto_or(TextEncoders::Auto, None));
        assert!(!auto_or(TextEncoders::Auto, Some(PAIR_RESIDENT_BYTES)));
        assert!(!auto_or(TextEncoders::Auto, Some(16376 << 20)));
        assert!(!auto_or(TextEncoders::Auto, gib(141)));
        assert!(auto_or(TextEncoders::Host, gib(141)));
        assert!(!auto_or(TextEncoders::Device, gib(8)));
        assert!(!auto_or(TextEncoders::Device, None));
    }
}
