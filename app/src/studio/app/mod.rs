//! The studio window: prompt panel, live preview, gallery and settings. Holds no GPU object of the
//! engine's: it sends commands, drains events (bounded per frame) and shows the newest complete
//! preview frame.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use eframe::egui;
use egui::{Color32, ColorImage, Key, Modifiers, TextureHandle, TextureOptions};
use latent_engine::adapters::AdapterSummary;
use latent_engine::device::DeviceChoice;
use latent_engine::image_io::{RgbImage, decode_png, encode_png, save_atomic};
use latent_engine::parameters::Parameters;
use latent_engine::pipeline::Txt2ImgRequest;
use latent_engine::preview::{Frame, PreviewMethod};
use latent_engine::prompt::{Chunks, Emphasis};
use latent_engine::schedulers::{SamplerKind, Schedule};
use latent_engine::tokenizer::{ClipTokenizer, MAX_PROMPT_TOKENS};
use latent_engine::{Precision, TextEncoders};

use super::form::{Form, SIZE_PRESETS};
use super::models::scan_models;
use super::saver::SettingsSaver;
use super::settings::Settings;
use super::worker::{
    CacheReport, Command, EngineConfig, EngineHandle, Event, Finished, LoadedModel, human_bytes,
};
use crate::demo;
use action::Action;
use pass_clock::PassClock;
pub use pass_clock::PassTime;

// Drawing (`*_ui`) and event handling live beside this file; they reach the app's fields as
// child modules. What drawing asks for waits in `action` until the frame is drawn.
mod action;
mod engine_events;
mod gallery_ui;
mod img2img_ui;
mod input;
mod lifecycle;
mod lora_ui;
mod mask_ui;
mod model_ui;
mod pass_clock;
mod preview_ui;
mod prompt_ui;
mod queue_ui;
mod settings_ui;
mod state;

/// How long the UI may spend draining engine events in one frame.
const EVENT_BUDGET: Duration = Duration::from_millis(4);
/// Preview methods in the order the selector shows them, with their labels.
const PREVIEW_CHOICES: [(PreviewMethod, &str); 5] = [
    (PreviewMethod::None, "none"),
    (PreviewMethod::Latent2Rgb, "latent2rgb"),
    (PreviewMethod::Taesd, "TAESD"),
    (PreviewMethod::Full, "full VAE"),
    (PreviewMethod::Auto, "auto"),
];

struct GalleryItem {
    finished: Finished,
    texture: TextureHandle,
}

/// Results of file dialogs and file work waiting for the window: it drains them every frame, and a
/// dialog thread that finds them full waits (it has nothing else to do), never the window.
const DIALOG_SLOTS: usize = 16;

/// Results of file dialogs and file work, which run on their own threads so the UI never waits
/// on them.
enum DialogResult {
    Model(PathBuf),
    Refiner(PathBuf),
    ModelsDir(PathBuf),
    OutputsDir(PathBuf),
    Taesd(PathBuf),
    /// A Save-as copy done (the destination) or failed.
    SavedAs(Result<PathBuf, String>),
    /// The parameters read from a dropped PNG.
    Restored {
        path: PathBuf,
        parameters: Result<Parameters, String>,
    },
    /// The demo model's files, unpacked (or found unchanged) where the engine can read them.
    Demo(Result<PathBuf, String>),
    EmbeddingsDir(PathBuf),
    LorasDir(PathBuf),
    /// An init image or mask opened for img2img, decoded on the dialog's thread.
    Picture {
        role: Picture,
        path: PathBuf,
        image: Result<RgbImage, String>,
    },
}

/// What an opened picture is for.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Picture {
    Init,
    Mask,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Progress {
    image: usize,
    images: usize,
    step: usize,
    total: usize,
    elapsed: Duration,
}

/// What the window waits on the engine for: one value, so that no two flags can disagree.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
enum Activity {
    #[default]
    Idle,
    /// A model is loading (sent, and neither loaded, failed nor idle yet).
    Loading,
    /// A generation or a device check runs, with its latest progress.
    Working(Option<Progress>),
    /// The engine thread is gone (its events channel closed): only a restart helps, and its
    /// silence is no stall.
    Ended,
}

impl Activity {
    fn working(self) -> bool {
        matches!(self, Activity::Working(_))
    }

    fn loading(self) -> bool {
        self == Activity::Loading
    }

    fn idle(self) -> bool {
        self == Activity::Idle
    }

    /// Waiting on the engine for a load or some work.
    fn busy(self) -> bool {
        matches!(self, Activity::Loading | Activity::Working(_))
    }

    fn ended(self) -> bool {
        self == Activity::Ended
    }

    /// The load finished (or failed): a generation sent meanwhile keeps running.
    fn loaded(self) -> Self {
        match self {
            Activity::Loading => Activity::Idle,
            other => other,
        }
    }
}

pub struct StudioApp {
    pub form: Form,
    settings: Settings,
    /// Writes the settings (to the path they were read from) off the UI thread, debounced.
    saver: SettingsSaver,
    engine: EngineHandle,
    /// What the engine is doing for the window.
    activity: Activity,
    /// When the engine last said anything (or was given work): a busy engine silent for longer
    /// than the device timeout may be stuck in the driver (see [`crate::stall`]).
    last_event: Instant,
    /// Repaints the window; handed to every engine this studio starts.
    wake: Arc<dyn Fn() + Send + Sync>,
    /// What the engine reported: the model cache, LoRA names, embeddings, devices, the refiner.
    reports: state::Reports,
    /// Generations waiting for the engine.
    jobs: state::Jobs,
    /// The loaded model, and the models folder's checkpoints.
    model: Option<LoadedModel>,
    models: Vec<PathBuf>,
    tokenizer: Option<ClipTokenizer>,
    /// The preview, the gallery and the other things shown.
    view: state::View,
    /// The inpainting mask's brush and overlay.
    painter: mask_ui::MaskPainter,
    status: String,
    error: Option<String>,
    notices: Vec<String>,
    pub show_settings: bool,
    dialogs: (Sender<DialogResult>, Receiver<DialogResult>),
    /// What the panels asked for while drawing this frame ([`action`]).
    actions: std::cell::RefCell<Vec<Action>>,
}

impl StudioApp {
    /// The last "Verify device" result: whether all components agreed, and the report lines.
    pub fn device_check(&self) -> Option<(bool, &[String])> {
        self.reports
            .device_check
            .as_ref()
            .map(|(passed, lines)| (*passed, lines.as_slice()))
    }

    /// The engine's device once open, and whether the window renders with that same wgpu device.
    pub fn engine_device(&self) -> Option<(&str, bool)> {
        self.reports
            .engine_device
            .as_ref()
            .map(|(label, shared)| (label.as_str(), *shared && self.reports.window_shares_device))
    }

    /// How long a busy engine has been silent, once that is longer than the device timeout.
    pub fn stalled(&self) -> Option<Duration> {
        let silent = self.last_event.elapsed();
        let limit = Duration::from_secs_f64(self.settings.device_timeout_secs.clamp(1.0, 3600.0));
        (self.activity.busy() && silent > limit).then_some(silent)
    }

    /// The prompt panel (for scripted runs such as the documentation screenshot).
    pub fn form_mut(&mut self) -> &mut Form {
        &mut self.form
    }

    /// Durations of the recent UI passes (at most the last 240).
    pub fn frame_times(&self) -> &[PassTime] {
        &self.view.frame_times
    }

    pub fn reset_frame_times(&mut self) {
        self.view.frame_times.clear();
    }

    pub fn is_busy(&self) -> bool {
        self.activity.busy()
    }

    pub fn model_name(&self) -> Option<&str> {
        self.model.as_ref().map(|m| m.name.as_str())
    }

    pub fn gallery_paths(&self) -> Vec<PathBuf> {
        self.view
            .gallery
            .iter()
            .map(|g| g.finished.path.clone())
            .collect()
    }

    /// The LoRA folder's names, as the engine listed them.
    pub fn lora_names(&self) -> &[String] {
        &self.reports.lora_names
    }

    pub fn last_error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    pub fn preview_frame(&self) -> Option<Arc<Frame>> {
        self.view.preview.as_ref().map(|(f, _)| f.clone())
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn load_model(&mut self, path: PathBuf) {
        let status = format!("loading {}…", path.display());
        if let Err(e) = self.engine.send(Command::LoadModel(path)) {
            self.error = Some(format!("not loaded: {e}"));
            return;
        }
        if !self.activity.working() {
            self.activity = Activity::Loading;
        }
        self.error = None;
        self.status = status;
        self.last_event = Instant::now();
    }

    /// Chooses SDXL's refiner (`None`: none); the engine checks the file now and loads it at the
    /// first generation with the refiner on.
    pub fn choose_refiner(&mut self, path: Option<PathBuf>) {
        if let Err(e) = self.engine.send(Command::ChooseRefiner(path)) {
            self.error = Some(format!("refiner not chosen: {e}"));
        }
    }

    /// The refiner the engine has chosen, by name (`name [hash]`).
    pub fn refiner_name(&self) -> Option<&str> {
        self.reports.refiner.as_ref().map(|(_, name)| name.as_str())
    }

    /// Unpacks the demo model off the UI thread (it compares megabytes with the copy on disk),
    /// then loads it.
    pub fn load_demo(&mut self) {
        self.status = "unpacking the demo model…".into();
        self.pick(|| {
            Some(DialogResult::Demo(
                demo::demo_model_path().map_err(|e| format!("{e:#}")),
            ))
        });
    }

    /// Generates with the form's settings now, or queues them behind the running work.
    pub fn generate(&mut self) {
        if self.model.is_none() {
            self.error = Some("No model is loaded: open a checkpoint or the demo model.".into());
            return;
        }
        if !self.form.seed_locked {
            self.form.seed = crate::run::random_seed();
        }
        let mut request = self.form.request();
        request.decode.compile = self.settings.vae_compile;
        self.jobs.held = false;
        if !self.activity.idle() || self.jobs.running || !self.jobs.queue.is_empty() {
            self.enqueue(request);
            return;
        }
        self.error = None;
        self.dispatch(request);
    }

    /// Sends `request` to the engine; whether it was accepted.
    fn dispatch(&mut self, request: Txt2ImgRequest) -> bool {
        // Busy only once the engine has the request: a refused one must not look running.
        if let Err(e) = self.engine.send(Command::Generate(Box::new(request))) {
            self.error = Some(format!("not generated: {e}"));
            return false;
        }
        // A queued job's start leaves the last job's error showing.
        self.jobs.running = true;
        self.activity = Activity::Working(None);
        self.last_event = Instant::now();
        true
    }

    /// Stops the running generation at the next step, or a model load at the next tensor.
    pub fn cancel(&mut self) {
        if self.activity.busy() {
            self.engine.cancel();
            self.status = "cancelling…".into();
        }
    }

    /// Changes the preview method; a running generation picks it up at its next preview step.
    pub fn set_preview_method(&mut self, method: PreviewMethod) {
        self.engine.preview.set_method(method);
        if self.settings.preview_method != method {
            self.settings.preview_method = method;
            self.settings_changed();
        }
    }

    fn settings_changed(&mut self) {
        self.engine
            .preview
            .set_interval(self.settings.preview_interval);
        if let Err(e) = self
            .engine
            .send(Command::Configure(engine_config(&self.settings)))
        {
            self.error = Some(format!("settings not applied: {e}"));
        }
        self.saver.save(&self.settings);
    }
}

impl eframe::App for StudioApp {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        let clock = PassClock::start();
        let ctx = ui.ctx().clone();
        self.drain_events(&ctx);
        self.run_queue();
        self.update_preview(&ctx);
        self.handle_drops(&ctx);
        self.shortcuts(&ctx);

        egui::Panel::top("toolbar").show(ui, |ui| {
            ui.horizontal(|ui| {
                ui.strong("Latent Studio");
                ui.separator();
                if ui.button("Settings").clicked() {
                    self.show_settings = !self.show_settings;
                }
            });
        });
        if self.activity.busy() {
            // Without events a stuck engine sends no repaints: look again every second.
            ctx.request_repaint_after(Duration::from_secs(1));
        }
        egui::Panel::bottom("status").show(ui, |ui| {
            ui.horizontal(|ui| {
                if let Some(e) = &self.error {
                    ui.colored_label(Color32::from_rgb(230, 80, 80), format!("Error: {e}"));
                    if ui.small_button("dismiss").clicked() {
                        self.error = None;
                    }
                } else {
                    ui.label(&self.status);
                }
            });
            if let Some(n) = self.notices.last().cloned() {
                ui.horizontal(|ui| {
                    ui.weak(format!("Note: {n}"));
                    if ui.small_button("ok").clicked() {
                        self.notices.pop();
                    }
                });
            }
        });
        egui::Panel::left("prompt-panel")
            .resizable(true)
            .default_size(340.0)
            .show(ui, |ui| {
                egui::ScrollArea::vertical().show(ui, |ui| {
                    self.model_ui(ui);
                    ui.separator();
                    self.prompt_ui(ui);
                    ui.separator();
                    self.img2img_ui(ui);
                    self.hires_ui(ui);
                });
            });
        egui::Panel::bottom("gallery")
            .resizable(true)
            .default_size(140.0)
            .show(ui, |ui| self.gallery_ui(ui));
        egui::CentralPanel::default().show(ui, |ui| self.preview_ui(ui));
        self.settings_ui(&ctx);
        // What the panels asked for, now that nothing is drawing.
        self.apply_actions(&ctx);

        if self.view.frame_times.len() == 240 {
            self.view.frame_times.remove(0);
        }
        self.view.frame_times.push(clock.stop());
    }
}

pub(super) fn engine_config(settings: &Settings) -> EngineConfig {
    EngineConfig {
        device: settings.device.clone(),
        precision: settings.precision,
        text_encoders: settings.text_encoders,
        outputs: settings.outputs_dir.clone(),
        taesd: settings.taesd.clone(),
        models_dir: settings.models_dir.clone(),
        embeddings: settings.embeddings_dir.clone(),
        loras: settings.loras_dir.clone(),
        cache: settings.cache_settings(),
        device_timeout: Duration::from_secs_f64(settings.device_timeout_secs.clamp(1.0, 3600.0)),
    }
}

fn color_image(image: &RgbImage) -> ColorImage {
    ColorImage::from_rgb([image.width, image.height], &image.pixels)
}

/// Writes `image` with parameters (used by tests that drop a PNG onto the window).
pub fn write_png_with_parameters(
    path: &Path,
    image: &RgbImage,
    p: &Parameters,
) -> anyhow::Result<()> {
    let png = encode_png(image, Some(&p.to_a1111()))?;
    save_atomic(path, &png, true)?;
    Ok(())
}
