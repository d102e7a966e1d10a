//! Full-size models with random weights, for benchmarks.

use std::sync::{Arc, Mutex, OnceLock};

use burn::tensor::Device;

use super::{Kept, StableDiffusion, TextEncoders, UnetHome, encoders};
use crate::checkpoint::{ModelConfig, Weights};
use crate::clip::ClipTextModel;
use crate::error::Result;
use crate::precision::Precision;
use crate::prompt::ConditioningMemo;
use crate::unet::UNet2DConditionModel;
use crate::vae::AutoencoderKL;
use crate::vae_compile::VaeCompiler;

impl StableDiffusion {
    /// Full-size SD 1.5 with random weights, for benchmarks.
    pub fn random(config: &ModelConfig, device: &Device, precision: Precision) -> Result<Self> {
        Self::random_with(config, device, precision, TextEncoders::Auto)
    }

    /// [`Self::random`] with its text encoders where `text_encoders` says.
    pub fn random_with(
        config: &ModelConfig,
        device: &Device,
        precision: Precision,
        text_encoders: TextEncoders,
    ) -> Result<Self> {
        crate::device::loaded(device, || {
            Self::build_random(config, device, precision, text_encoders)
        })
    }

    fn build_random(
        config: &ModelConfig,
        device: &Device,
        precision: Precision,
        text_encoders: TextEncoders,
    ) -> Result<Self> {
        let dtype = precision.dtype();
        let te_device = text_encoders.device_for(config, device);
        let parked = encoders::parked_on(&te_device, device);
        let te = Weights::random("text encoder", &te_device, dtype).keeping();
        let uw = Weights::random("UNet", device, dtype).keeping();
        let text_encoder = ClipTextModel::load(&te, &config.text_encoder)?;
        // SDXL's second encoder, kept too (SDXL LoRAs change it).
        let te2 = config.text_encoder_2.as_ref().map(|c| {
            (
                Weights::random("text encoder 2", &te_device, dtype).keeping(),
                c,
            )
        });
        let text_encoder_2 = match &te2 {
            Some((w, c)) => Some(ClipTextModel::load(w, c)?),
            None => None,
        };
        let unet = UNet2DConditionModel::load(&uw, &config.unet)?;
        let unet = UnetHome::on_device(
            unet,
            Arc::new(uw.take_kept()),
            &config.unet,
            device,
            dtype,
            "UNet",
        );
        let kept = Kept {
            text_encoder: Arc::new(te.take_kept()),
            text_encoder_2: te2.as_ref().map(|(w, _)| Arc::new(w.take_kept())),
        };
        // Parked encoders as a loaded model holds them (host bytes), so the bench times that.
        let (text_encoder, text_encoder_2, kept) = match parked {
            true => encoders::as_host_bytes(
                (text_encoder, text_encoder_2),
                kept,
                (&te_device, dtype),
                config,
            )?,
            false => (text_encoder, text_encoder_2, kept),
        };
        Ok(Self {
            text_encoder,
            text_encoder_2,
            unet,
            kept: Some(kept),
            with_loras: Mutex::default(),
            vae: AutoencoderKL::load(&Weights::random("VAE", device, dtype), &config.vae, false)?,
            config: config.clone(),
            device: device.clone(),
            precision,
            reports: Vec::new(),
            vae_compile: VaeCompiler::default(),
            vae_f32: OnceLock::new(),
            parked,
            parked_bytes: 0,
            conditioning: ConditioningMemo::default(),
            parked_steps: crate::unet::graph::ParkedSteps::default(),
        })
    }
}
