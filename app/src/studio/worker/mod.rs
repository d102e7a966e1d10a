//! The engine worker: one named thread that owns the device and every model, driven by commands
//! from the GUI and answering with events. Nothing here blocks the UI: the UI only sends commands
//! (bounded channel, never full in practice), reads events, and reads preview frames from the
//! engine's [`FrameStore`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};

use super::events::{EVENT_QUEUE, EventSender};
use crate::run::{Destination, RunEvents, SaveEach};
use latent_engine::checkpoint::Checkpoint;
use latent_engine::device::DeviceChoice;
use latent_engine::image_io::RgbImage;
use latent_engine::model_cache::{CacheSettings, LoadSource, ModelCache};
use latent_engine::parameters::Parameters;
use latent_engine::pipeline::{Notice, StepState, Txt2ImgRequest, txt2img};
use latent_engine::preview::{FrameStore, PreviewMethod, PreviewSettings, Previewer};
use latent_engine::taesd::TaesdDecoder;
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::{LoadOptions, Precision, StableDiffusion};

/// What the engine needs to know from the settings.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    pub device: DeviceChoice,
    /// `None`: the device's preference (f16 where supported).
    pub precision: Option<Precision>,
    pub outputs: PathBuf,
    pub taesd: Option<PathBuf>,
    /// Model cache on: models stay resident (within the budget) and converted weights go to the
    /// disk cache; off: the model is released after each generation and reloaded for the next,
    /// and nothing is written to the cache folder.
    pub cache: CacheSettings,
    /// Decode through the fused VAE kernels (verified, with a one-warning fallback).
    pub vae_compile: bool,
    /// Watchdog for opening the device and compiling its first kernels.
    pub device_timeout: Duration,
}

/// The engine's GPU device, opened before the window so the window renders with the same wgpu
/// device and queue ([`open_for_window`]). The engine uses it while the device setting is the one
/// it was opened for; another setting opens a device of its own.
#[derive(Debug, Clone)]
pub struct SharedDevice {
    /// The device setting it was opened for (may be `auto`).
    pub requested: DeviceChoice,
    pub gpu: latent_engine::device::SharedGpu,
}

impl SharedDevice {
    /// The handles for eframe / egui_kittest (`WgpuSetup::Existing`).
    pub fn wgpu_setup(&self) -> eframe::egui_wgpu::WgpuSetup {
        let s = &self.gpu.setup;
        eframe::egui_wgpu::WgpuSetup::Existing(eframe::egui_wgpu::WgpuSetupExisting {
            instance: s.instance.clone(),
            adapter: s.adapter.clone(),
            device: s.device.clone(),
            queue: s.queue.clone(),
        })
    }
}

/// Opens the device the settings name before the window exists, so that both can share it.
/// `Ok(None)` for the CPU backend. Auto resolves as the engine does (probe verdicts; an adapter
/// seen for the first time is probed in a child process). Creation runs under the watchdog; the
/// first kernels are compiled later, on the engine thread.
pub fn open_for_window(
    config: &EngineConfig,
    note: &mut dyn FnMut(String),
) -> Result<Option<SharedDevice>> {
    if config.device == DeviceChoice::Cpu {
        return Ok(None);
    }
    // The window waits for this: creating a device takes well under a second on a healthy
    // driver, so a stuck one costs at most 20 s before the window opens on its own device.
    let timeout = device_timeout()
        .unwrap_or(config.device_timeout)
        .min(Duration::from_secs(20));
    let probe_exe = crate::probe::probing_enabled(true)
        .then(crate::probe::probe_exe)
        .flatten();
    let choice = crate::probe::resolve_auto(
        &config.device,
        probe_exe.as_deref().map(|exe| (exe, timeout)),
        &crate::probe::verdict_path(),
        &mut |n| match n {
            crate::probe::ResolveNote::Status(s) => tracing::info!("{s}"),
            crate::probe::ResolveNote::Notice(s) => note(s),
        },
    );
    let gpu = latent_engine::device::open_shared(&choice, timeout)
        .with_context(|| format!("opening device {choice}"))?;
    Ok(gpu.map(|gpu| SharedDevice {
        requested: config.device.clone(),
        gpu,
    }))
}

/// GUI → engine.
#[derive(Debug)]
pub enum Command {
    LoadModel(PathBuf),
    Generate(Box<Txt2ImgRequest>),
    /// New settings; [`EngineHandle::send`] keeps only the latest until the worker reads it.
    Configure(EngineConfig),
    /// The worker's side of `Configure`: take the latest settings from the pending slot.
    ApplyConfig,
    /// Delete every disk-cache entry.
    ClearDiskCache,
    /// Run the demo model on the device and on the CPU backend and compare (`doctor`).
    VerifyDevice,
    Shutdown,
}

/// What the model cache holds, for the settings window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CacheReport {
    /// Resident models, least recently used first: (name, bytes).
    pub resident: Vec<(String, u64)>,
    /// Disk-cache entries, least recently used first: (name, bytes).
    pub disk: Vec<(String, u64)>,
}

/// A finished, saved image.
#[derive(Debug, Clone)]
pub struct Finished {
    pub image: Arc<RgbImage>,
    pub parameters: Parameters,
    pub path: PathBuf,
}

/// Engine → GUI.
#[derive(Debug, Clone)]
pub enum Event {
    Status(String),
    ModelLoaded {
        name: String,
        path: PathBuf,
    },
    Progress {
        image: usize,
        images: usize,
        step: usize,
        total: usize,
        elapsed: Duration,
    },
    Finished(Finished),
    /// The whole request is done (all images, or cancelled, or failed).
    Idle,
    Cancelled,
    Failed(String),
    /// A command panicked; the engine recovered (see `Worker::recover`). The panic's message.
    Crashed(String),
    Notice(String),
    Cache(CacheReport),
    /// The engine's device is open and its first kernels compiled.
    DeviceReady {
        label: String,
        /// It is the [`SharedDevice`] the window renders with.
        shared: bool,
    },
    /// The result of [`Command::VerifyDevice`]: one line per component, and whether all agree.
    DeviceCheck {
        passed: bool,
        lines: Vec<String>,
    },
}

/// Why [`EngineHandle::send`] did not queue a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    Full,
    EngineStopped,
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SendError::Full => {
                "the engine has too many commands waiting; try again when it is done"
            }
            SendError::EngineStopped => "the engine has stopped",
        })
    }
}

impl std::error::Error for SendError {}

/// The GUI's end of the worker.
pub struct EngineHandle {
    tx: Sender<Command>,
    pub events: Receiver<Event>,
    cancel: Arc<AtomicBool>,
    /// Set when the window lets go of the engine (see [`EventSender`]).
    closing: Arc<AtomicBool>,
    /// The latest settings not yet read by the worker.
    pending_config: Arc<std::sync::Mutex<Option<EngineConfig>>>,
    pub preview: Arc<PreviewSettings>,
    pub frames: Arc<FrameStore>,
    thread: Option<JoinHandle<()>>,
}

impl EngineHandle {
    /// Starts the worker. `wake` is called after every event (the UI's `request_repaint`).
    pub fn spawn(
        config: EngineConfig,
        preview: Arc<PreviewSettings>,
        wake: Arc<dyn Fn() + Send + Sync>,
        shared: Option<SharedDevice>,
    ) -> Result<Self> {
        let (tx, commands) = bounded::<Command>(64);
        let (events_tx, events) = bounded::<Event>(EVENT_QUEUE);
        let cancel = Arc::new(AtomicBool::new(false));
        let closing = Arc::new(AtomicBool::new(false));
        let pending_config = Arc::new(std::sync::Mutex::new(None));
        let frames = FrameStore::new();
        let mut worker = Worker {
            cache: ModelCache::new(config.cache.clone()),
            config,
            events: EventSender::new(events_tx, wake, closing.clone()),
            pending_config: pending_config.clone(),
            cancel: cancel.clone(),
            preview: preview.clone(),
            frames: frames.clone(),
            device: None,
            shared,
            model: None,
            selected: None,
            taesd: None,
            tokenizer: None,
            tuned: Default::default(),
        };
        let thread = std::thread::Builder::new()
            .name("engine".into())
            // Model loading moves large structs by value; unoptimised builds need the room.
            .stack_size(32 << 20)
            .spawn(move || worker.run(commands))
            .context("starting the engine thread")?;
        Ok(Self {
            tx,
            events,
            cancel,
            closing,
            pending_config,
            preview,
            frames,
            thread: Some(thread),
        })
    }

    /// Queues `command`, or says why it was not (nothing is dropped silently: the caller shows
    /// the error and does not mark itself busy). A [`Command::Configure`] replaces one still
    /// waiting: a settings drag sends one per frame while the worker reads none during a
    /// generation, so they coalesce (latest wins) instead of filling the queue.
    pub fn send(&self, command: Command) -> Result<(), SendError> {
        if let Command::Configure(config) = command {
            // Held across the marker's send, so the worker takes the slot only once it is set.
            let mut pending = self
                .pending_config
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if pending.is_none() {
                self.queue(Command::ApplyConfig)?;
            }
            *pending = Some(config);
            return Ok(());
        }
        let resets_cancel = matches!(command, Command::Generate(_) | Command::LoadModel(_));
        self.queue(command)?;
        if resets_cancel {
            self.cancel.store(false, Ordering::SeqCst);
        }
        Ok(())
    }

    fn queue(&self, command: Command) -> Result<(), SendError> {
        self.tx.try_send(command).map_err(|e| match e {
            TrySendError::Full(_) => SendError::Full,
            TrySendError::Disconnected(_) => SendError::EngineStopped,
        })
    }

    /// Gives up on a worker stuck inside a driver call: asks it to stop, and detaches its thread
    /// instead of joining it (joining would hang the UI with it).
    pub fn abandon(mut self) {
        self.cancel.store(true, Ordering::SeqCst);
        self.closing.store(true, Ordering::SeqCst);
        let _ = self.tx.try_send(Command::Shutdown);
        drop(self.thread.take());
    }

    /// Stops the running generation at the next step.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::SeqCst);
        self.closing.store(true, Ordering::SeqCst);
        let _ = self.tx.try_send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            // A worker stuck in a driver call never finishes: closing the window must not hang
            // with it. A healthy one stops at its next step.
            let deadline = Instant::now() + Duration::from_secs(10);
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                tracing::warn!("the engine thread did not stop within 10 s; leaving it behind");
            }
        }
    }
}

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
    taesd: Option<(PathBuf, TaesdDecoder)>,
    tokenizer: Option<ClipTokenizer>,
    /// Sizes and precisions generated at on the current device since launch: the first run at a
    /// new one compiles and autotunes kernels (minutes on a fresh GPU), which the status says.
    tuned: std::collections::HashSet<(usize, usize, Precision)>,
}

/// The studio's side of a run (`crate::run::SaveEach` saves the images): progress, status and
/// each saved image as events to the window.
struct Forward<'a> {
    events: &'a EventSender,
    images: usize,
}

impl RunEvents for Forward<'_> {
    fn notice(&mut self, notice: &Notice) {
        tracing::warn!("{notice}");
        self.events.send(Event::Notice(notice.to_string()));
    }

    fn step(&mut self, s: &StepState<'_>) {
        self.events.send(Event::Progress {
            image: s.image,
            images: self.images,
            step: s.step,
            total: s.total,
            elapsed: s.elapsed,
        });
    }

    fn decoding(&mut self, tiles: usize) {
        let what = if tiles > 1 {
            format!("decoding in {tiles} tiles…")
        } else {
            "decoding…".into()
        };
        self.events.send(Event::Status(what));
    }

    fn saved(
        &mut self,
        generated: &latent_engine::pipeline::Generated,
        parameters: Parameters,
        path: PathBuf,
    ) {
        self.events.send(Event::Finished(Finished {
            image: Arc::new(generated.image.clone()),
            parameters,
            path,
        }));
    }
}

impl Worker {
    fn emit(&self, event: Event) {
        self.events.send(event);
    }

    /// New settings: a device or precision change reloads the model.
    fn configure(&mut self, config: EngineConfig) -> Result<()> {
        let reload =
            config.device != self.config.device || config.precision != self.config.precision;
        if config.taesd != self.config.taesd || reload {
            self.taesd = None;
        }
        if config.cache != self.config.cache {
            self.cache.configure(config.cache.clone());
            if !config.cache.enabled {
                self.model = None;
            }
        }
        self.config = config;
        let r = if reload {
            // A new device or dtype: everything is reloaded.
            self.device = None;
            self.model = None;
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
                Err(panic) => self.recover(panic_message(panic.as_ref())),
            }
        }
    }

    /// After a panic: nothing the command held is trusted. The model, previews and device are
    /// released (the chosen model reloads at the next Generate) and the window is told.
    fn recover(&mut self, message: String) {
        tracing::error!("the engine panicked: {message}");
        self.model = None;
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
            Command::Generate(request) => {
                let r = self.generate(&request);
                if !self.config.cache.enabled {
                    // Cache off: nothing stays resident between generations.
                    self.model = None;
                    self.taesd = None;
                }
                self.report_cache();
                self.emit(Event::Idle);
                r
            }
        }
    }

    fn device(&mut self) -> Result<burn::tensor::Device> {
        if let Some(d) = &self.device {
            return Ok(d.clone());
        }
        // The opening and first kernel compilation run under a watchdog on their own thread; this
        // engine thread waits, the UI does not.
        let timeout = device_timeout().unwrap_or(self.config.device_timeout);
        if let Some(shared) = self
            .shared
            .as_ref()
            .filter(|s| s.requested == self.config.device)
        {
            let (device, label) = (shared.gpu.device.clone(), shared.gpu.label.clone());
            self.emit(Event::Status(format!(
                "{label} (shared with the window): compiling kernels…"
            )));
            latent_engine::device::warm_up_watched(&device, &label, timeout)
                .with_context(|| format!("opening device {label}"))?;
            self.device = Some(device.clone());
            self.emit(Event::DeviceReady {
                label,
                shared: true,
            });
            return Ok(device);
        }
        // Probing is on by default here: a driver crash on first use must cost a child process,
        // not the artist's window.
        let probe_exe = crate::probe::probing_enabled(true)
            .then(crate::probe::probe_exe)
            .flatten();
        let choice = crate::probe::resolve_auto(
            &self.config.device,
            probe_exe.as_deref().map(|exe| (exe, timeout)),
            &crate::probe::verdict_path(),
            &mut |note| match note {
                crate::probe::ResolveNote::Status(s) => self.emit(Event::Status(s)),
                crate::probe::ResolveNote::Notice(s) => self.emit(Event::Notice(s)),
            },
        );
        self.emit(Event::Status(format!(
            "opening device {choice} and compiling kernels…"
        )));
        let device = latent_engine::device::create_watched(&choice, timeout)
            .with_context(|| format!("opening device {choice}"))?;
        self.device = Some(device.clone());
        self.emit(Event::DeviceReady {
            label: choice.to_string(),
            shared: false,
        });
        Ok(device)
    }

    fn precision(&self, device: &burn::tensor::Device) -> Precision {
        self.config
            .precision
            .unwrap_or_else(|| latent_engine::device::preferred_precision(device))
    }

    /// The built-in demo model on the engine's device and on the CPU backend, compared per
    /// component: a device whose numbers disagree is flagged, not trusted.
    fn verify_device(&mut self) -> Result<()> {
        let device = self.device()?;
        let precision = self.precision(&device);
        self.emit(Event::Status(
            "verifying the device against the CPU backend…".into(),
        ));
        let path = super::demo::demo_model_path().context("unpacking the demo model")?;
        let report = latent_engine::selfcheck::self_check(&path, &device, precision)
            .context("running the device check")?;
        let mut lines: Vec<String> = report.components.iter().map(|c| c.to_string()).collect();
        let passed = report.passed();
        lines.push(if passed {
            "all components agree with the CPU backend".into()
        } else {
            "this device disagrees with the CPU backend: try another adapter or the CPU".into()
        });
        self.emit(Event::Status(if passed {
            "device verified".into()
        } else {
            "device check failed".into()
        }));
        self.emit(Event::DeviceCheck { passed, lines });
        Ok(())
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

    fn load_model(&mut self, path: &Path) -> Result<()> {
        let device = self.device()?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        self.emit(Event::Status(format!("loading {name}…")));
        let t = Instant::now();
        self.model = None;
        // A failed or cancelled load keeps the previous choice (reloaded when next needed).
        let previous = self.selected.replace(path.to_path_buf());
        let options = LoadOptions {
            precision: self.precision(&device),
            vae_encoder: false,
        };
        // Progress in bytes uploaded, at most ten times a second; Cancel stops within a tensor.
        let events = self.events.clone();
        let (mut so_far, mut shown) = (0u64, Instant::now());
        let label = name.clone();
        let progress = move |bytes: u64| {
            so_far += bytes;
            if shown.elapsed() >= Duration::from_millis(100) {
                shown = Instant::now();
                events.send(Event::Status(format!(
                    "loading {label}… {}",
                    human_bytes(so_far)
                )));
            }
        };
        let cache = &mut self.cache;
        let loaded = latent_engine::checkpoint::controlled(self.cancel.clone(), progress, || {
            cache.get(path, &device, options)
        })
        .with_context(|| format!("loading {name}"));
        let (model, checkpoint, source) = match loaded {
            Ok(l) => l,
            Err(e) => {
                self.selected = previous;
                return Err(e);
            }
        };
        self.model = Some(Loaded { model, checkpoint });
        let from = match source {
            LoadSource::Memory => "from the model cache",
            LoadSource::DiskCache => "from the disk cache",
            LoadSource::Checkpoint => "from the checkpoint",
        };
        self.emit(Event::Status(format!(
            "{name} loaded {from} in {:.1} s",
            t.elapsed().as_secs_f64()
        )));
        self.emit(Event::ModelLoaded {
            name,
            path: path.to_path_buf(),
        });
        self.report_cache();
        Ok(())
    }

    /// The TAESD decoder when previews want it; a missing or broken file is a notice, not an error.
    fn ensure_taesd(&mut self, device: &burn::tensor::Device, precision: Precision) {
        if !matches!(
            self.preview.method(),
            PreviewMethod::Taesd | PreviewMethod::Auto
        ) {
            return;
        }
        let Some(path) = self.config.taesd.clone() else {
            return;
        };
        if self.taesd.as_ref().is_some_and(|(p, _)| *p == path) {
            return;
        }
        match TaesdDecoder::open(&path, device, precision.dtype()) {
            Ok(t) => self.taesd = Some((path, t)),
            Err(e) => {
                self.taesd = None;
                self.emit(Event::Notice(format!(
                    "TAESD decoder {} not loaded ({e}); previews use latent2rgb",
                    path.display()
                )));
            }
        }
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
        let (Some(loaded), Some(tokenizer)) = (&self.model, &self.tokenizer) else {
            return Err(anyhow!("no model is loaded"));
        };
        latent_engine::pipeline::check_request(&loaded.model, request)?;
        if !latent_engine::device::is_cpu(&device)
            && self
                .tuned
                .insert((request.width, request.height, precision))
        {
            self.emit(Event::Status(format!(
                "first run at {}×{} since launch: compiling and tuning kernels…",
                request.width, request.height
            )));
        }
        loaded
            .model
            .vae_compile
            .set_enabled(self.config.vae_compile);
        if std::env::var_os("LATENT_STUDIO_FAIL_VAE_COMPILE").is_some() {
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
        let result = txt2img(
            &loaded.model,
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
