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
use latent_engine::checkpoint::Checkpoint;
use latent_engine::device::DeviceChoice;
use latent_engine::image_io::{RgbImage, encode_png, next_numbered_path, save_atomic};
use latent_engine::parameters::Parameters;
use latent_engine::pipeline::{Notice, Observer, StepState, Txt2ImgRequest, txt2img};
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
    /// Model cache on: keep the model resident between generations; off: release it after each
    /// generation and reload it for the next.
    pub keep_model: bool,
}

/// GUI → engine.
#[derive(Debug)]
pub enum Command {
    LoadModel(PathBuf),
    Generate(Box<Txt2ImgRequest>),
    Configure(EngineConfig),
    Shutdown,
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
    Notice(String),
}

/// The GUI's end of the worker.
pub struct EngineHandle {
    tx: Sender<Command>,
    pub events: Receiver<Event>,
    cancel: Arc<AtomicBool>,
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
    ) -> Result<Self> {
        let (tx, commands) = bounded::<Command>(64);
        let (events_tx, events) = bounded::<Event>(1024);
        let cancel = Arc::new(AtomicBool::new(false));
        let frames = FrameStore::new();
        let mut worker = Worker {
            config,
            events: events_tx,
            wake,
            cancel: cancel.clone(),
            preview: preview.clone(),
            frames: frames.clone(),
            device: None,
            model: None,
            released: None,
            taesd: None,
            tokenizer: None,
        };
        let thread = std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || worker.run(commands))
            .context("starting the engine thread")?;
        Ok(Self {
            tx,
            events,
            cancel,
            preview,
            frames,
            thread: Some(thread),
        })
    }

    pub fn send(&self, command: Command) {
        if let Command::Generate(_) = command {
            self.cancel.store(false, Ordering::SeqCst);
        }
        match self.tx.try_send(command) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => tracing::warn!("engine command queue full; dropped"),
            Err(TrySendError::Disconnected(_)) => tracing::error!("engine thread is gone"),
        }
    }

    /// Stops the running generation at the next step.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::SeqCst);
        let _ = self.tx.try_send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Loaded {
    model: StableDiffusion,
    checkpoint: Checkpoint,
    path: PathBuf,
}

struct Worker {
    config: EngineConfig,
    events: Sender<Event>,
    wake: Arc<dyn Fn() + Send + Sync>,
    cancel: Arc<AtomicBool>,
    preview: Arc<PreviewSettings>,
    frames: Arc<FrameStore>,
    device: Option<burn::tensor::Device>,
    model: Option<Loaded>,
    /// The model released by the cache-off setting, reloaded on the next generation.
    released: Option<PathBuf>,
    taesd: Option<(PathBuf, TaesdDecoder)>,
    tokenizer: Option<ClipTokenizer>,
}

/// Forwards pipeline progress to the GUI.
struct Forward<'a> {
    events: &'a Sender<Event>,
    wake: &'a (dyn Fn() + Send + Sync),
    images: usize,
}

impl Observer for Forward<'_> {
    fn notice(&mut self, notice: &Notice) {
        let _ = self.events.try_send(Event::Notice(notice.to_string()));
        (self.wake)();
    }

    fn step(&mut self, s: &StepState<'_>) {
        let _ = self.events.try_send(Event::Progress {
            image: s.image,
            images: self.images,
            step: s.step,
            total: s.total,
            elapsed: s.elapsed,
        });
        (self.wake)();
    }
}

impl Worker {
    fn emit(&self, event: Event) {
        // A full queue means the UI is not draining; dropping progress is better than blocking.
        let _ = self.events.try_send(event);
        (self.wake)();
    }

    fn run(&mut self, commands: Receiver<Command>) {
        for command in commands {
            let result = match command {
                Command::Shutdown => return,
                Command::Configure(config) => {
                    if config.device != self.config.device
                        || config.precision != self.config.precision
                    {
                        // A new device or dtype: everything is reloaded on next use.
                        self.device = None;
                        self.taesd = None;
                        if let Some(path) =
                            self.model.take().map(|l| l.path).or(self.released.take())
                        {
                            self.config = config;
                            let r = self.load_model(&path);
                            self.emit(Event::Idle);
                            r
                        } else {
                            self.config = config;
                            Ok(())
                        }
                    } else {
                        if config.taesd != self.config.taesd {
                            self.taesd = None;
                        }
                        self.config = config;
                        Ok(())
                    }
                }
                Command::LoadModel(path) => {
                    let r = self.load_model(&path);
                    self.emit(Event::Idle);
                    r
                }
                Command::Generate(request) => {
                    let r = self.generate(&request);
                    if !self.config.keep_model {
                        if let Some(loaded) = self.model.take() {
                            self.released = Some(loaded.path);
                            self.taesd = None;
                        }
                    }
                    self.emit(Event::Idle);
                    r
                }
            };
            if let Err(e) = result {
                self.emit(Event::Failed(format!("{e:#}")));
            }
        }
    }

    fn device(&mut self) -> Result<burn::tensor::Device> {
        if let Some(d) = &self.device {
            return Ok(d.clone());
        }
        self.emit(Event::Status(format!(
            "opening device {}…",
            self.config.device
        )));
        let device = latent_engine::device::create(self.config.device)
            .with_context(|| format!("opening device {}", self.config.device))?;
        self.device = Some(device.clone());
        Ok(device)
    }

    fn precision(&self, device: &burn::tensor::Device) -> Precision {
        self.config
            .precision
            .unwrap_or_else(|| latent_engine::device::preferred_precision(device))
    }

    fn load_model(&mut self, path: &Path) -> Result<()> {
        let device = self.device()?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        self.emit(Event::Status(format!("loading {name}…")));
        let t = Instant::now();
        // Release the old model first: two full models may not fit.
        self.model = None;
        self.released = None;
        let checkpoint =
            Checkpoint::open(path).with_context(|| format!("opening {}", path.display()))?;
        let options = LoadOptions {
            precision: self.precision(&device),
            vae_encoder: false,
        };
        let model = StableDiffusion::load(&checkpoint, &device, options)
            .with_context(|| format!("loading {name}"))?;
        self.model = Some(Loaded {
            model,
            checkpoint,
            path: path.to_path_buf(),
        });
        self.emit(Event::Status(format!(
            "{name} loaded in {:.1} s",
            t.elapsed().as_secs_f64()
        )));
        self.emit(Event::ModelLoaded {
            name,
            path: path.to_path_buf(),
        });
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
            match self.released.clone() {
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
        let mut forward = Forward {
            events: &self.events,
            wake: self.wake.as_ref(),
            images: request.batch_count,
        };
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
        let images = match result {
            Ok(images) => images,
            Err(latent_engine::Error::Cancelled) => {
                self.emit(Event::Cancelled);
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        let model_hash = loaded.checkpoint.short_hash().ok();
        let model_name = loaded.checkpoint.display_name();
        for generated in images {
            let parameters = Parameters::for_request(
                &request,
                generated.seed,
                model_hash.clone(),
                Some(model_name.clone()),
            );
            let png = encode_png(&generated.image, Some(&parameters.to_a1111()))?;
            std::fs::create_dir_all(&self.config.outputs).with_context(|| {
                format!(
                    "creating the outputs folder {}",
                    self.config.outputs.display()
                )
            })?;
            // Numbered and never overwriting: a race with another writer picks the next number.
            let path = save_numbered(&self.config.outputs, generated.seed, &png)?;
            self.emit(Event::Finished(Finished {
                image: Arc::new(generated.image),
                parameters,
                path,
            }));
        }
        Ok(())
    }
}

/// Saves `png` as the next free `NNNNN-seed.png` in `dir`, never replacing a file.
pub fn save_numbered(dir: &Path, seed: u64, png: &[u8]) -> Result<PathBuf> {
    for _ in 0..8 {
        let path = next_numbered_path(dir, seed)?;
        match save_atomic(&path, png, false) {
            Ok(()) => return Ok(path),
            Err(_) if path.exists() => continue,
            Err(e) => return Err(e).with_context(|| format!("saving {}", path.display())),
        }
    }
    Err(anyhow!(
        "could not find a free file name in {}",
        dir.display()
    ))
}
