//! Where a UNet's weights are: built on the device, or evicted to host memory and built again on
//! the device when next asked for. SDXL's base and refiner UNets (4.8 and 4.2 GiB in f16) do not
//! fit an 8 GB card together, so while a parked refiner runs the base's leaves the device, and
//! the refiner's leaves when its steps end (ComfyUI's model management and A1111's
//! `--medvram-sdxl` swap them likewise).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use burn::tensor::{DType, Device};

use crate::error::Result;
use crate::unet::{UNet2DConditionModel, UNetConfig};
use crate::weights::Weights;
use crate::weights::kept::TensorMap;

/// A UNet and the tensors it was built from, on the device or in host memory.
pub(crate) struct UnetHome {
    config: UNetConfig,
    device: Device,
    dtype: DType,
    /// What the model builds its UNet under (`"UNet"`, `"refiner UNet"`): the log's word.
    label: &'static str,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The built UNet and the device tensors it shares its buffers with; `None` while evicted.
    on_device: Option<(UNet2DConditionModel, Arc<TensorMap>)>,
    /// The same tensors in host memory: made by the first eviction (or the load, for a parked
    /// refiner) and kept, so that later evictions copy nothing back.
    on_host: Option<Arc<TensorMap>>,
}

impl UnetHome {
    /// A UNet built on `device` from `kept` (tensors on `device`).
    pub(crate) fn on_device(
        unet: UNet2DConditionModel,
        kept: Arc<TensorMap>,
        config: &UNetConfig,
        device: &Device,
        dtype: DType,
        label: &'static str,
    ) -> Self {
        let state = State {
            on_device: Some((unet, kept)),
            on_host: None,
        };
        Self::with(state, config, device, dtype, label)
    }

    /// A UNet for `device` whose tensors wait in host memory: built there when first asked for.
    pub(crate) fn on_host(
        kept: Arc<TensorMap>,
        config: &UNetConfig,
        device: &Device,
        dtype: DType,
        label: &'static str,
    ) -> Self {
        let state = State {
            on_device: None,
            on_host: Some(kept),
        };
        Self::with(state, config, device, dtype, label)
    }

    fn with(
        state: State,
        config: &UNetConfig,
        device: &Device,
        dtype: DType,
        label: &'static str,
    ) -> Self {
        Self {
            config: config.clone(),
            device: device.clone(),
            dtype,
            label,
            state: Mutex::new(state),
        }
    }

    /// The state; a panic elsewhere while it was held leaves it whole (every change is one
    /// assignment).
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The UNet on the device, built again from the host's tensors if it was evicted.
    pub(crate) fn get(&self) -> Result<UNet2DConditionModel> {
        Ok(self.resident()?.0)
    }

    /// The device tensors the UNet was built from (LoRAs are merged into these), bringing it
    /// back first if it was evicted.
    pub(crate) fn kept(&self) -> Result<Arc<TensorMap>> {
        Ok(self.resident()?.1)
    }

    fn resident(&self) -> Result<(UNet2DConditionModel, Arc<TensorMap>)> {
        let mut state = self.state();
        if let Some((unet, kept)) = &state.on_device {
            return Ok((unet.clone(), kept.clone()));
        }
        let host = state.on_host.clone().ok_or_else(|| {
            crate::error::Error::InvalidInput(format!(
                "the {} has neither device nor host weights",
                self.label
            ))
        })?;
        let start = Instant::now();
        let (device, dtype) = (&self.device, self.dtype);
        let mut uploaded_ms = 0.0;
        let built = crate::device::loaded(device, || -> Result<_> {
            let uploaded = Arc::new(host.to_device(device));
            uploaded_ms = start.elapsed().as_secs_f64() * 1e3;
            let w = Weights::kept(
                self.label,
                uploaded.clone(),
                Arc::new(TensorMap::default()),
                device,
                dtype,
            )
            .keeping();
            let unet = UNet2DConditionModel::load(&w, &self.config)?;
            // A fused layer (q/k/v) built its weight anew and kept its parts as views of it: those
            // replace the uploaded parts, which then go, so the UNet holds each weight once (as
            // at load; 9 % of the tiny SDXL's UNet otherwise held twice).
            let mut kept = TensorMap::clone(&uploaded);
            kept.overlay(w.take_kept());
            Ok((unet, Arc::new(kept)))
        })?;
        let built_ms = start.elapsed().as_secs_f64() * 1e3;
        // Waited for here, so that the time is the transfer's (the next step would wait anyway).
        device
            .sync()
            .map_err(|e| crate::error::Error::Device(format!("bringing the UNet back: {e:?}")))?;
        tracing::info!(
            unet = self.label,
            uploaded_ms,
            built_ms,
            ms = start.elapsed().as_secs_f64() * 1e3,
            "UNet brought to the device"
        );
        state.on_device = Some(built.clone());
        Ok(built)
    }

    /// Lets the UNet leave the device: its tensors are copied to host memory the first time,
    /// then the device's copies are dropped (their memory is free once every other handle on
    /// them is gone: a run's steps, LoRA-merged copies) and the pool's free pages returned. On
    /// the CPU backend nothing moves.
    pub(crate) fn evict(&self) -> Result<()> {
        if crate::device::is_cpu(&self.device) {
            return Ok(());
        }
        let mut state = self.state();
        let Some((_, kept)) = &state.on_device else {
            return Ok(());
        };
        if state.on_host.is_none() {
            let start = Instant::now();
            state.on_host = Some(Arc::new(kept.to_host()));
            tracing::info!(
                unet = self.label,
                ms = start.elapsed().as_secs_f64() * 1e3,
                "UNet copied to host memory (once)"
            );
        }
        let start = Instant::now();
        state.on_device = None;
        drop(state);
        crate::device::release_free(&self.device);
        tracing::info!(
            unet = self.label,
            ms = start.elapsed().as_secs_f64() * 1e3,
            "UNet left the device"
        );
        Ok(())
    }

    /// Whether the UNet is on the device now.
    pub(crate) fn is_on_device(&self) -> bool {
        self.state().on_device.is_some()
    }

    /// The tensors the UNet was built from, wherever they are now.
    pub(crate) fn tensors(&self) -> Option<Arc<TensorMap>> {
        let state = self.state();
        match (&state.on_device, &state.on_host) {
            (Some((_, kept)), _) => Some(kept.clone()),
            (None, host) => host.clone(),
        }
    }
}
