//! The engine worker: one named thread that owns the device and every model, driven by commands
//! from the GUI and answering with events. Nothing here blocks the UI: the UI only sends commands
//! (bounded channel, never full in practice), reads events, and reads preview frames from the
//! engine's [`FrameStore`].

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};

use super::events::{EVENT_QUEUE, EventSender};
use crate::run::{Destination, SaveEach};
use latent_engine::checkpoint::Checkpoint;
use latent_engine::device::DeviceChoice;
use latent_engine::image_io::RgbImage;
use latent_engine::model_cache::{CacheSettings, ModelCache};
use latent_engine::parameters::Parameters;
use latent_engine::pipeline::{Txt2ImgRequest, txt2img_refined};
use latent_engine::preview::{FrameStore, PreviewSettings, Previewer};
use latent_engine::taesd::TaesdDecoder;
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::{Precision, StableDiffusion, TextEncoders};

// The protocol, the window's handle and the device live beside this file; they reach the
// worker's fields as child modules.
mod device;
mod forward;
mod handle;
mod load;
mod protocol;
mod refiner;

use forward::Forward;

pub use device::{SharedDevice, open_for_window};
pub use handle::EngineHandle;
pub use protocol::*;

struct Loaded {
    model: Arc<StableDiffusion>,
    checkpoint: Arc<Checkpoint>,
}

struct Worker {
    config: EngineConfig,
    events: EventSender,
    pending_config: Arc<std::sync::Mutex<Option<EngineConfig>>>,
    cancel: Arc<AtomicBool>,
    preview: Arc<PreviewSettings>,
    frames: Arc<FrameStore>,
    device: Option<burn::tensor::Device>,
    /// Opened before the window, which renders with it.
    shared: Option<SharedDevice>,
    cache: ModelCache,
    /// The model in use; with the cache off it is released after each generation.
    model: Option<Loaded>,
    /// The model the artist chose, reloaded when it was released.
    selected: Option<PathBuf>,
    /// SDXL's refiner, where one is chosen (loaded at the first generation that uses it).
    refiner: Option<refiner::ChosenRefiner>,
    taesd: Option<(PathBuf, TaesdDecoder)>,
    tokenizer: Option<ClipTokenizer>,
    /// The embeddings folder's skipped files, each told once.
    embedding_notes: std::collections::HashSet<String>,
    /// The LoRA folder; opened LoRAs stay parsed and hashed between generations.
    loras: latent_engine::lora::LoraLibrary,
}

impl Worker {
    fn emit(&self, event: Event) {
        self.events.send(event);
    }

    /// New settings: a device or precision change reloads the model.
    fn configure(&mut self, config: EngineConfig) -> Result<()> {
        let reload =
            config.device != self.config.device || config.precision != self.config.precision;
        if config.taesd != self.config.taesd
            || config.models_dir != self.config.models_dir
            || reload
        {
            self.taesd = None;
        }
        if config.cache != self.config.cache {
            self.cache.configure(config.cache.clone());
            if !config.cache.enabled {
                self.model = None;
            }
        }
        if config.text_encoders != self.config.text_encoders && !reload {
            // A model whose encoders would move is loaded again with them where asked, when
            // next needed (a resident copy with them elsewhere would hold the device memory
            // parking frees); one that holds them there already stays (SD 1.x: auto = device).
            if self
                .model
                .as_ref()
                .is_some_and(|m| !m.model.parks_as(config.text_encoders))
            {
                self.model = None;
            }
            self.cache.release_other_parking(config.text_encoders);
        }
        let new_loras = config.loras != self.config.loras;
        let new_embeddings = config.embeddings != self.config.embeddings;
        self.config = config;
        if new_embeddings && self.embeddings().is_none() {
            self.emit(Event::Embeddings(None));
        }
        if new_loras {
            self.loras.set_dir(self.config.loras.clone());
            self.report_loras();
        }
        let r = if reload {
            // A new device or dtype: everything is reloaded.
            self.device = None;
            self.model = None;
            self.release_refiner();
            self.cache.release_all();
            match self.selected.clone() {
                Some(path) => {
                    let r = self.load_model(&path);
                    self.emit(Event::Idle);
                    r
                }
                None => Ok(()),
            }
        } else {
            Ok(())
        };
        self.report_cache();
        r
    }

    /// Tells the window the LoRA folder's names.
    fn report_loras(&self) {
        self.emit(Event::Loras(self.loras.names()));
    }

    fn run(&mut self, commands: Receiver<Command>) {
        for command in commands {
            if let Command::Shutdown = command {
                return;
            }
            // A panic (a bug, or a driver's) ends this command, not the engine: the window
            // hears why, keeps every finished image (saved as each finished), and the next
            // command starts from a clean state.
            let outcome =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.handle(command)));
            match outcome {
                Ok(Ok(())) => {}
                Ok(Err(e)) => self.emit(Event::Failed(format!("{e:#}"))),
                Err(panic) => {
                    let message = panic_message(panic.as_ref());
                    if crate::test_seam::ends_engine(&message) {
                        return;
                    }
                    self.recover(message)
                }
            }
        }
    }

    /// After a panic: nothing the command held is trusted. The model, previews and device are
    /// released (the chosen model reloads at the next Generate) and the window is told.
    fn recover(&mut self, message: String) {
        tracing::error!("the engine panicked: {message}");
        self.model = None;
        self.release_refiner();
        self.taesd = None;
        self.device = None;
        self.cache.release_all();
        self.emit(Event::Crashed(message));
        self.emit(Event::Idle);
    }

    fn handle(&mut self, command: Command) -> Result<()> {
        match command {
            Command::Shutdown => Ok(()),
            // The handle sends `ApplyConfig`; the variant itself is handled alike.
            Command::Configure(config) => self.configure(config),
            Command::ApplyConfig => {
                let pending = self
                    .pending_config
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                match pending {
                    Some(config) => self.configure(config),
                    None => Ok(()),
                }
            }
            Command::VerifyDevice => {
                let r = self.verify_device();
                self.emit(Event::Idle);
                r
            }
            Command::ClearDiskCache => {
                let r = match self.cache.disk_cache() {
                    Some(disk) => disk.clear().map(|freed| {
                        self.emit(Event::Status(format!(
                            "disk cache cleared ({})",
                            human_bytes(freed)
                        )))
                    }),
                    None => Ok(()),
                };
                self.report_cache();
                r.map_err(Into::into)
            }
            Command::LoadModel(path) => {
                let r = match self.load_model(&path) {
                    Err(e) if is_cancelled(&e) => {
                        self.emit(Event::Status("loading cancelled".into()));
                        self.emit(Event::Cancelled);
                        Ok(())
                    }
                    r => r,
                };
                self.emit(Event::Idle);
                r
            }
            Command::ChooseRefiner(path) => {
                let r = self.choose_refiner(path);
                self.emit(Event::Idle);
                r
            }
            Command::Generate(request) => {
                let r = self.generate(&request);
                if !self.config.cache.enabled {
                    // Cache off: nothing stays resident between generations.
                    self.model = None;
                    self.release_refiner();
                    self.taesd = None;
                }
                self.report_cache();
                self.emit(Event::GenerateDone);
                self.emit(Event::Idle);
                r
            }
        }
    }

    fn report_cache(&self) {
        let disk = self
            .cache
            .disk_cache()
            .map(|d| d.entries().into_iter().map(|e| (e.name, e.bytes)).collect())
            .unwrap_or_default();
        self.emit(Event::Cache(CacheReport {
            resident: self.cache.resident(),
            disk,
        }));
    }

    fn generate(&mut self, request: &Txt2ImgRequest) -> Result<()> {
        if self.model.is_none() {
            match self.selected.clone() {
                Some(path) => self.load_model(&path)?,
                None => {
                    return Err(anyhow!(
                        "no model is loaded: choose a checkpoint or the demo model"
                    ));
                }
            }
        }
        let device = self.device()?;
        let precision = self.precision(&device);
        self.ensure_taesd(&device, precision);
        if self.tokenizer.is_none() {
            self.tokenizer = Some(ClipTokenizer::new()?);
        }
        // Read at each start, so files added to the folder count from the next Generate.
        let embeddings = self.embeddings();
        let Some(loaded) = &self.model else {
            return Err(anyhow!("no model is loaded"));
        };
        let mut request = request.clone();
        // SDXL's size and crop conditioning (restored from an SDXL image, say) means nothing to
        // other families: they generate as they always do.
        if loaded.model.text_encoder_2.is_none() {
            request.size_conditioning = None;
            request.refiner = None;
        }
        let ignored =
            crate::run::prepare_request(&loaded.model, &mut request, &self.loras, embeddings)?;
        for tag in ignored {
            self.emit(Event::Notice(format!(
                "{tag} is not a LoRA tag Latent Studio applies; it was left out of the prompt"
            )));
        }
        if !request.loras.0.is_empty() {
            self.emit(Event::Status(format!(
                "merging LoRAs: {}",
                request.loras.a1111_hashes()
            )));
        }
        // The refiner (SDXL), loaded on first use; the parameters text names it.
        let refiner = match &mut request.refiner {
            Some(switch) => {
                let (refiner, name) = match self.refiner_for_run() {
                    // Cancel during the refiner's load ends the run as any cancel does.
                    Err(e) if is_cancelled(&e) => {
                        self.emit(Event::Cancelled);
                        return Ok(());
                    }
                    r => r?,
                };
                switch.name = name;
                Some(refiner)
            }
            None => None,
        };
        let (Some(loaded), Some(tokenizer)) = (&self.model, &self.tokenizer) else {
            return Err(anyhow!("no model is loaded"));
        };
        let request = &request;
        if crate::test_seam::vae_compile_fails() {
            loaded.model.vae_compile.force_failure(true);
        }
        let mut forward = SaveEach::new(
            Forward {
                events: &self.events,
                images: request.batch_count,
            },
            request,
            self.cache.short_hash(&loaded.checkpoint),
            loaded.checkpoint.display_name(),
            Destination::Numbered(self.config.outputs.clone()),
            &self.cancel,
        );
        let mut previewer = Previewer::with(
            &loaded.model,
            self.preview.clone(),
            self.frames.clone(),
            self.taesd.as_ref().map(|(_, t)| t),
            None,
            &mut forward,
        )?;
        let result = txt2img_refined(
            &loaded.model,
            refiner.as_deref(),
            tokenizer,
            request,
            &self.cancel,
            &mut previewer,
        );
        previewer.finish();
        if let Some(e) = forward.error.take() {
            return Err(e);
        }
        match result {
            Ok(images) if images.len() < request.batch_count => {
                // Cancelled mid-batch: the finished images were saved as they came.
                self.emit(Event::Cancelled);
            }
            Ok(_) => {}
            Err(latent_engine::Error::Cancelled) => self.emit(Event::Cancelled),
            Err(e) => return Err(e.into()),
        }
        tracing::debug!(saved = forward.saved.len(), "generation finished");
        Ok(())
    }
}

/// `LATENT_STUDIO_DEVICE_TIMEOUT` seconds, which overrides the setting (tests, support).
fn device_timeout() -> Option<Duration> {
    std::env::var("LATENT_STUDIO_DEVICE_TIMEOUT")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(|s| Duration::from_secs_f64(s.min(1e9)))
}

/// Whether an error is the artist's Cancel (through any context).
fn is_cancelled(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<latent_engine::Error>(),
            Some(latent_engine::Error::Cancelled)
        )
    })
}

/// `1.6 GiB`, `350 MiB`, `12 KiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancel_is_recognised_through_context() {
        let cancelled = Err::<(), _>(latent_engine::Error::Cancelled)
            .context("loading model.safetensors")
            .unwrap_err();
        assert!(is_cancelled(&cancelled));
        let failed = Err::<(), _>(latent_engine::Error::InvalidInput("bad".into()))
            .context("loading model.safetensors")
            .unwrap_err();
        assert!(!is_cancelled(&failed));
    }
}

/// The text of a panic's payload (`panic!` with a literal or a format).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "an unknown panic".into())
}

#[cfg(test)]
mod handle_tests;
