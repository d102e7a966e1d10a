//! A loaded Stable Diffusion model assembled from its networks (`crate::models`): text
//! encoders, UNet and VAE on one device in one dtype, and SDXL's refiner.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use burn::tensor::{DType, Device};

use crate::checkpoint::{Checkpoint, Component, LoadReport, ModelConfig, Weights, ldm};
use crate::clip::ClipTextModel;
use crate::error::{Error, Result};
use crate::lora::{self, LoraSet, keys::Net};
use crate::prompt::ConditioningMemo;
use crate::unet::UNet2DConditionModel;
use crate::unet::graph::ParkedSteps;
use crate::vae::AutoencoderKL;
use crate::vae_compile::VaeCompiler;
use crate::weights::Recorder;
use crate::weights::kept::TensorMap;

pub use crate::precision::Precision;

mod encoders;
mod random;
mod refiner;
mod unet_home;
pub use encoders::TextEncoders;
pub use refiner::{AESTHETIC_SCORE, NEGATIVE_AESTHETIC_SCORE, Refiner};
use unet_home::UnetHome;

/// Name prefixes of each component's tensors in a disk-cache file (text encoder, UNet, VAE).
pub const CACHE_PREFIXES: [&str; 3] = ["text_encoder.", "unet.", "vae."];
/// SDXL's second text encoder's prefix in a disk-cache file.
pub const CACHE_PREFIX_TE2: &str = "text_encoder_2.";

/// What to load besides the always-needed parts.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    pub precision: Precision,
    /// img2img and inpainting need the VAE encoder; txt2img does not.
    pub vae_encoder: bool,
    /// Where the text encoders wait between prompts.
    pub text_encoders: TextEncoders,
}

pub struct StableDiffusion {
    pub text_encoder: ClipTextModel,
    /// SDXL's second text encoder (OpenCLIP ViT-bigG with its projection).
    pub text_encoder_2: Option<ClipTextModel>,
    /// The UNet and the tensors it was built from (LoRAs are merged into these): on the device,
    /// or in host memory while a parked refiner runs ([`Self::evict_unet`]).
    unet: UnetHome,
    pub vae: AutoencoderKL,
    pub config: ModelConfig,
    pub device: Device,
    pub precision: Precision,
    /// Per component: how many tensors were read and which stored keys went unused.
    pub reports: Vec<LoadReport>,
    /// VAE compilation's verdicts for this model (whether a decode uses it is the request's
    /// choice: [`crate::pipeline::DecodeOptions`]).
    pub vae_compile: VaeCompiler,
    /// An f32 copy of the decoder, made the first time an f16 decode is not finite.
    vae_f32: OnceLock<AutoencoderKL>,
    /// The tensors the text encoders were built from (LoRAs are merged into these).
    kept: Option<Kept>,
    /// The networks of the last LoRA set asked for, while it is asked for again.
    with_loras: Mutex<Option<(LoraSet, Arc<Networks>)>>,
    /// Whether the text encoders (and their kept tensors) wait in host memory
    /// ([`TextEncoders`]); `text_encoder` and `text_encoder_2` are then the host's copies.
    parked: bool,
    /// Bytes of the parked encoders' weights (0 unless `parked`): host memory, not the device's.
    parked_bytes: u64,
    /// The last request's conditioning (the pipeline's; a repeated prompt encodes nothing).
    pub(crate) conditioning: ConditioningMemo,
    /// The UNet step the last generation recorded, kept for the next one of the same shapes
    /// (the pipeline's).
    pub(crate) parked_steps: ParkedSteps,
}

pub(super) struct Kept {
    text_encoder: Arc<TensorMap>,
    /// SDXL's second text encoder.
    text_encoder_2: Option<Arc<TensorMap>>,
}

/// The networks one request runs: the model's own, or copies with a LoRA set merged in (which
/// share every layer the set leaves alone).
#[derive(Debug, Clone)]
pub struct Networks {
    pub text_encoder: ClipTextModel,
    /// SDXL's second encoder (LoRAs for it are refused, so it is always the model's own).
    pub text_encoder_2: Option<ClipTextModel>,
    pub unet: UNet2DConditionModel,
}

impl StableDiffusion {
    pub fn load(checkpoint: &Checkpoint, device: &Device, options: LoadOptions) -> Result<Self> {
        Self::load_with(checkpoint, device, options, None)
    }

    /// [`Self::load`], handing every built tensor to `recorder` with the component's name prefix
    /// (`text_encoder.`, `unet.`, `vae.`, `text_encoder_2.`), e.g. to write the disk cache.
    pub fn load_recorded(
        checkpoint: &Checkpoint,
        device: &Device,
        options: LoadOptions,
        recorder: Recorder,
    ) -> Result<Self> {
        Self::load_with(checkpoint, device, options, Some(recorder))
    }

    fn load_with(
        checkpoint: &Checkpoint,
        device: &Device,
        options: LoadOptions,
        recorder: Option<Recorder>,
    ) -> Result<Self> {
        let dtype = options.precision.dtype();
        // Each component's tensors to the recorder under its cache prefix, where there is one.
        let record = |w: Weights, prefix: &'static str| -> Weights {
            let Some(recorder) = &recorder else {
                return w;
            };
            let inner = recorder.clone();
            w.recording(std::rc::Rc::new(std::cell::RefCell::new(
                move |name: &str, shape: &[usize], dtype, bytes: &[u8]| {
                    (inner.borrow_mut())(&format!("{prefix}{name}"), shape, dtype, bytes)
                },
            )))
        };
        let te_device = options.text_encoders.device_for(&checkpoint.config, device);
        let weights = [
            record(
                checkpoint.text_encoder_weights(&te_device, dtype)?,
                CACHE_PREFIXES[0],
            ),
            record(checkpoint.unet_weights(device, dtype), CACHE_PREFIXES[1]),
            record(checkpoint.vae_weights(device, dtype), CACHE_PREFIXES[2]),
        ];
        let second = checkpoint
            .text_encoder_2_weights(&te_device, dtype)
            .map(|w| {
                (
                    record(w, CACHE_PREFIX_TE2),
                    checkpoint.stored_prefix(Component::TextEncoder2),
                )
            });
        let prefixes = [
            checkpoint.stored_prefix(Component::TextEncoder),
            checkpoint.stored_prefix(Component::Unet),
            checkpoint.stored_prefix(Component::Vae),
        ];
        Self::from_weights(
            weights,
            prefixes,
            second,
            &checkpoint.config,
            device,
            options,
        )
    }

    /// Builds the model from per-component weights (text encoder, UNet, VAE, and SDXL's second
    /// encoder); `prefixes` are the stored-key prefixes unused keys are reported under.
    /// The pool's free memory is released after ([`crate::device::loaded`]).
    pub fn from_weights(
        weights: [Weights; 3],
        prefixes: [&str; 3],
        second: Option<(Weights, &str)>,
        config: &ModelConfig,
        device: &Device,
        options: LoadOptions,
    ) -> Result<Self> {
        crate::device::loaded(device, || {
            Self::build(weights, prefixes, second, config, device, options)
        })
    }

    fn build(
        weights: [Weights; 3],
        prefixes: [&str; 3],
        second: Option<(Weights, &str)>,
        config: &ModelConfig,
        device: &Device,
        options: LoadOptions,
    ) -> Result<Self> {
        let c = config;
        let [te, uw, vw] = weights;
        // Encoders built on the host while the rest is on a device are parked there.
        let parked = encoders::parked_on(te.device(), device);
        let (te, uw) = (te.keeping(), uw.keeping());
        let text_encoder = ClipTextModel::load(&te, &c.text_encoder)?;
        // The config says whether there is a second encoder; its weights must then be there.
        let second = second.map(|(w, prefix)| (w.keeping(), prefix));
        let text_encoder_2 = match (&c.text_encoder_2, &second) {
            (Some(config), Some((w, _))) => Some(ClipTextModel::load(w, config)?),
            (None, _) => None,
            (Some(_), None) => {
                return Err(Error::MissingTensor {
                    component: "SDXL model",
                    name: "text_encoder_2 (the second text encoder's weights)".into(),
                });
            }
        };
        let unet = UNet2DConditionModel::load(&uw, &c.unet)?;
        let kept = Kept {
            text_encoder: Arc::new(te.take_kept()),
            text_encoder_2: second
                .as_ref()
                .filter(|_| text_encoder_2.is_some())
                .map(|(w, _)| Arc::new(w.take_kept())),
        };
        let (text_encoder, text_encoder_2, kept) = match parked {
            true => encoders::as_host_bytes(
                (text_encoder, text_encoder_2),
                kept,
                (te.device(), te.dtype()),
                c,
            )?,
            false => (text_encoder, text_encoder_2, kept),
        };
        let dtype = options.precision.dtype();
        let unet = UnetHome::on_device(
            unet,
            Arc::new(uw.take_kept()),
            &c.unet,
            device,
            dtype,
            "UNet",
        );
        let vae = AutoencoderKL::load(&vw, &c.vae, options.vae_encoder)?;
        let mut reports = vec![
            te.report(prefixes[0]),
            uw.report(prefixes[1]),
            vw.report(prefixes[2]),
        ];
        if let (Some(_), Some((w, prefix))) = (&text_encoder_2, &second) {
            reports.push(w.report(prefix));
        }
        // The encoders' reports: the first and, for SDXL, the last.
        let encoder_bytes = reports[0].bytes + reports.get(3).map_or(0, |r| r.bytes);
        let parked_bytes = if parked { encoder_bytes } else { 0 };
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
            text_encoder_2,
            unet,
            vae,
            config: c.clone(),
            device: device.clone(),
            precision: options.precision,
            reports,
            vae_compile: VaeCompiler::default(),
            vae_f32: OnceLock::new(),
            kept: Some(kept),
            with_loras: Mutex::default(),
            parked,
            parked_bytes,
            conditioning: ConditioningMemo::default(),
            parked_steps: ParkedSteps::default(),
        })
    }

    /// The text encoder and UNet a request with `set` runs: the model's own for an empty set,
    /// else copies with the set merged into their weights, built from the kept tensors on the
    /// device (the checkpoint is not read) and kept until another set is asked for.
    ///
    /// A model whose encoders are parked ([`TextEncoders`]) brings them to the device for this
    /// call's networks only (with the set's text-encoder LoRAs merged there): they leave the
    /// device when the caller drops them, e.g. once the prompt is encoded.
    pub fn networks(&self, set: &LoraSet) -> Result<Arc<Networks>> {
        let resident = self.resident_networks(set)?;
        if !self.parked {
            return Ok(resident);
        }
        let (text_encoder, text_encoder_2) = self.encoders_on_device(set)?;
        Ok(Arc::new(Networks {
            text_encoder,
            text_encoder_2,
            unet: resident.unet.clone(),
        }))
    }

    /// The UNet a request with `set` runs ([`Self::networks`]' without the text encoders: a
    /// parked model brings none to the device for it).
    pub fn unet_for(&self, set: &LoraSet) -> Result<UNet2DConditionModel> {
        Ok(self.resident_networks(set)?.unet.clone())
    }

    /// The model's own UNet (no LoRA), on the device: built again from host memory if it was
    /// evicted ([`Self::evict_unet`]).
    pub fn unet(&self) -> Result<UNet2DConditionModel> {
        self.unet.get()
    }

    /// Lets the UNet leave the device until it is next asked for: its tensors are copied to
    /// host memory (the first time only), and the device's copies, the LoRA-merged networks and
    /// the parked recorded step are dropped. The device memory is free once the caller holds no
    /// handle on the UNet either. What a parked refiner's run does at its switch, so that the
    /// two UNets are never on the device together (SDXL's pair in 8 GB). Nothing moves on the
    /// CPU backend.
    pub fn evict_unet(&self) -> Result<()> {
        if crate::device::is_cpu(&self.device) {
            return Ok(());
        }
        *self.with_loras.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.parked_steps.clear();
        self.unet.evict()
    }

    /// Whether the UNet is on the device now (it is, unless evicted and not asked for since).
    pub fn unet_on_device(&self) -> bool {
        self.unet.is_on_device()
    }

    /// Drops the UNet step the last generation recorded and kept for the next one, and the VAE's
    /// recorded decode (their pool pages go back to the pool): what a model that is not in use
    /// keeps for nothing.
    pub fn release_parked_steps(&self) {
        self.parked_steps.clear();
        self.vae.recording().release();
        if let Some(vae) = self.vae_f32.get() {
            vae.recording().release();
        }
    }

    /// Whether a recorded UNet step waits for this model's next generation.
    pub fn has_parked_steps(&self) -> bool {
        self.parked_steps.is_parked()
    }

    /// How many prompt conditionings the pipeline has encoded with this model (a request whose
    /// prompts, LoRAs and settings match the previous one's reuses its conditioning).
    pub fn conditioning_encodes(&self) -> usize {
        self.conditioning.encodes()
    }

    /// Whether the text encoders are parked in host memory ([`TextEncoders`]).
    pub fn parked(&self) -> bool {
        self.parked
    }

    /// Whether this model holds its encoders where `text_encoders` would put them (an SD 1.x
    /// model does for `auto` and `device` alike): a request with that setting can use it.
    pub fn parks_as(&self, text_encoders: TextEncoders) -> bool {
        let te_device = text_encoders.device_for(&self.config, &self.device);
        encoders::parked_on(&te_device, &self.device) == self.parked
    }

    /// [`Self::networks`] as the model holds them (a parked model's encoders on the host).
    fn resident_networks(&self, set: &LoraSet) -> Result<Arc<Networks>> {
        if set.is_empty() {
            return Ok(Arc::new(Networks {
                text_encoder: self.text_encoder.clone(),
                text_encoder_2: self.text_encoder_2.clone(),
                unet: self.unet()?,
            }));
        }
        let mut slot = self.with_loras.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((applied, networks)) = &*slot
            && applied == set
        {
            return Ok(networks.clone());
        }
        // The previous set's layers go before the new ones are made.
        *slot = None;
        let kept = self.kept.as_ref().ok_or_else(|| {
            Error::InvalidInput(
                "this model was not built from weights LoRAs can be merged into".into(),
            )
        })?;
        let start = Instant::now();
        let (device, dtype) = (&self.device, self.precision.dtype());
        // transformers 5 saves the encoder's layers without the `text_model.` level.
        let te_alias = |module: &str| module.strip_prefix("text_model.").map(str::to_string);
        // Parked encoders merge theirs on the device, per request (`encoders_on_device`).
        let te = match self.parked {
            true => TensorMap::default(),
            false => lora::patches(
                Net::TextEncoder,
                &kept.text_encoder,
                set,
                &te_alias,
                device,
                dtype,
            )?,
        };
        // SDXL's second encoder: merged where the set changes it, refused where there is none.
        let te2 = match (&kept.text_encoder_2, &self.text_encoder_2) {
            (Some(_), Some(_)) if self.parked => TensorMap::default(),
            (Some(base), Some(_)) => {
                lora::patches(Net::TextEncoder2, base, set, &te_alias, device, dtype)?
            }
            _ => {
                if let Some(u) = set
                    .0
                    .iter()
                    .find(|u| u.te != 0.0 && u.lora.touches(Net::TextEncoder2))
                {
                    return Err(Error::Lora {
                        name: u.lora.name.clone(),
                        reason: "it is made for SDXL (it changes a second text encoder), and the \
                                 loaded model has one"
                            .into(),
                    });
                }
                Default::default()
            }
        };
        let unet_config = self.config.unet.clone();
        let ldm_name = move |module: &str| {
            let key = ldm::unet_key(&format!("{module}.weight"), &unet_config);
            key.strip_prefix(ldm::UNET_PREFIX)
                .and_then(|k| k.strip_suffix(".weight"))
                .map(str::to_string)
        };
        let kept_unet = self.unet.kept()?;
        let unet = lora::patches(Net::Unet, &kept_unet, set, &ldm_name, device, dtype)?;
        let patched = (te.len(), te2.len(), unet.len());
        let text_encoder = if te.is_empty() {
            self.text_encoder.clone()
        } else {
            let w = Weights::kept(
                "text encoder",
                kept.text_encoder.clone(),
                Arc::new(te),
                device,
                dtype,
            );
            ClipTextModel::load(&w, &self.config.text_encoder)?
        };
        let text_encoder_2 = match (&kept.text_encoder_2, &self.config.text_encoder_2) {
            (Some(base), Some(config)) if !te2.is_empty() => {
                let w = Weights::kept(
                    "second text encoder",
                    base.clone(),
                    Arc::new(te2),
                    device,
                    dtype,
                );
                Some(ClipTextModel::load(&w, config)?)
            }
            _ => self.text_encoder_2.clone(),
        };
        let unet = if unet.is_empty() {
            self.unet()?
        } else {
            let w = Weights::kept("UNet", kept_unet, Arc::new(unet), device, dtype);
            UNet2DConditionModel::load(&w, &self.config.unet)?
        };
        tracing::info!(
            loras = %set.a1111_hashes(),
            text_encoder_layers = patched.0,
            text_encoder_2_layers = patched.1,
            unet_layers = patched.2,
            ms = start.elapsed().as_secs_f64() * 1e3,
            "LoRAs merged"
        );
        let networks = Arc::new(Networks {
            text_encoder,
            text_encoder_2,
            unet,
        });
        *slot = Some((set.clone(), networks.clone()));
        Ok(networks)
    }

    /// Every weight a LoRA can change: `(network, name, shape)` of the text encoder's and UNet's
    /// matrices and convolution kernels (not the embeddings), sorted.
    pub fn lora_targets(&self) -> Vec<(Net, String, Vec<usize>)> {
        let Some(kept) = &self.kept else {
            return Vec::new();
        };
        let shapes = |map: &TensorMap| -> Vec<(String, Vec<usize>)> {
            map.names()
                .map(|n| {
                    (
                        n.to_string(),
                        map.get(n).map(|k| k.shape()).unwrap_or_default(),
                    )
                })
                .collect()
        };
        let second = kept
            .text_encoder_2
            .iter()
            .map(|m| (Net::TextEncoder2, shapes(m)));
        let mut out = Vec::new();
        for (net, named) in [
            (Net::TextEncoder, shapes(&kept.text_encoder)),
            (
                Net::Unet,
                self.unet.tensors().map_or_else(Vec::new, |m| shapes(&m)),
            ),
        ]
        .into_iter()
        .chain(second)
        {
            for (name, shape) in named {
                if name.ends_with(".weight") && shape.len() >= 2 && !name.contains("embedding") {
                    out.push((net, name, shape));
                }
            }
        }
        out.sort();
        out
    }

    /// The decoder in f32: the model's own when it is f32, else a copy cast once and kept (the
    /// retry of an f16 decode that overflowed). Returns whether this call made the copy.
    pub fn vae_f32(&self) -> (&AutoencoderKL, bool) {
        if self.precision == Precision::F32 {
            return (&self.vae, false);
        }
        let mut made = false;
        let vae = self.vae_f32.get_or_init(|| {
            made = true;
            crate::device::persistent(&self.device, || self.vae.decoder_in(DType::F32))
        });
        (vae, made)
    }

    /// Whether the f32 decoder copy exists, i.e. an f16 decode of this model was not finite.
    pub fn vae_upcast(&self) -> bool {
        self.vae_f32.get().is_some()
    }

    /// Bytes of weights this model was built from.
    pub fn weight_bytes(&self) -> u64 {
        self.reports.iter().map(|r| r.bytes).sum()
    }

    /// [`Self::weight_bytes`] held in device memory: all but the parked encoders'.
    pub fn device_weight_bytes(&self) -> u64 {
        self.weight_bytes() - self.parked_bytes
    }
}
