//! The studio window: prompt panel, live preview, gallery and settings. Holds no GPU object of the
//! engine's: it sends commands, drains events (bounded per frame) and shows the newest complete
//! preview frame.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, unbounded};
use eframe::egui;
use egui::{Color32, ColorImage, Key, Modifiers, TextureHandle, TextureOptions};
use latent_engine::adapters::AdapterSummary;
use latent_engine::image_io::{RgbImage, decode_png, encode_png, png_parameters, save_atomic};
use latent_engine::parameters::Parameters;
use latent_engine::preview::{Frame, PreviewMethod, PreviewSettings};
use latent_engine::schedulers::{SamplerKind, Schedule};
use latent_engine::tokenizer::{ClipTokenizer, MAX_PROMPT_TOKENS};

use super::demo;
use super::form::{Form, SIZE_PRESETS};
use super::models::scan_models;
use super::saver::SettingsSaver;
use super::settings::Settings;
use super::worker::{
    CacheReport, Command, EngineConfig, EngineHandle, Event, Finished, SharedDevice, human_bytes,
};

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

/// Results of file dialogs and file work, which run on their own threads so the UI never waits
/// on them.
enum DialogResult {
    Model(PathBuf),
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
}

struct Progress {
    image: usize,
    images: usize,
    step: usize,
    total: usize,
    elapsed: Duration,
}

pub struct StudioApp {
    pub form: Form,
    settings: Settings,
    /// Writes the settings (to the path they were read from) off the UI thread, debounced.
    saver: SettingsSaver,
    engine: EngineHandle,
    tokenizer: Option<ClipTokenizer>,
    token_count: (String, usize),
    model: Option<(String, PathBuf)>,
    models: Vec<PathBuf>,
    busy: bool,
    loading: bool,
    progress: Option<Progress>,
    status: String,
    error: Option<String>,
    notices: Vec<String>,
    preview: Option<(Arc<Frame>, TextureHandle)>,
    gallery: Vec<GalleryItem>,
    selected: Option<usize>,
    pub show_settings: bool,
    dialogs: (Sender<DialogResult>, Receiver<DialogResult>),
    /// Duration of the last UI passes (for the responsiveness test and the status bar).
    frame_times: Vec<Duration>,
    /// The engine's adapter list, filled by a background thread (enumeration can take a moment).
    adapters: Arc<std::sync::Mutex<Option<Vec<AdapterSummary>>>>,
    /// What the model cache holds, as the engine last reported it.
    cache_report: CacheReport,
    /// The last "Verify device" result: all agree, and one line per component.
    device_check: Option<(bool, Vec<String>)>,
    /// The engine's open device: its name, and whether it is the one shared with the window.
    engine_device: Option<(String, bool)>,
    /// The window renders with the device handed to the engine.
    window_shares_device: bool,
    /// When the engine last said anything (or was given work): a busy engine silent for longer
    /// than the device timeout may be stuck in the driver (see [`crate::stall`]).
    last_event: Instant,
    /// Repaints the window; handed to every engine this studio starts.
    wake: Arc<dyn Fn() + Send + Sync>,
}

impl StudioApp {
    /// Opens the studio with settings from `settings_path`; the engine opens its own device.
    pub fn new(ctx: &egui::Context, settings_path: PathBuf) -> anyhow::Result<Self> {
        Self::build(ctx, settings_path, None, false, Vec::new())
    }

    /// Opens the studio in eframe's creation context with the engine's device opened before the
    /// window ([`super::open_window_device`]): the engine computes on it, and the window renders
    /// with it when eframe (or kittest) was given its handles. `notices` are shown at start.
    pub fn with_shared_device(
        cc: &eframe::CreationContext<'_>,
        settings_path: PathBuf,
        shared: Option<SharedDevice>,
        notices: Vec<String>,
    ) -> anyhow::Result<Self> {
        let renders_with_it = match (&shared, &cc.wgpu_render_state) {
            (Some(s), Some(rs)) => rs.device == s.gpu.setup.device,
            _ => false,
        };
        if shared.is_some() && !renders_with_it {
            tracing::warn!("the window did not take the engine's device; each uses its own");
        }
        Self::build(
            &cc.egui_ctx,
            settings_path,
            shared,
            renders_with_it,
            notices,
        )
    }

    fn build(
        ctx: &egui::Context,
        settings_path: PathBuf,
        shared: Option<SharedDevice>,
        window_shares_device: bool,
        mut notices: Vec<String>,
    ) -> anyhow::Result<Self> {
        let (settings, notice) = Settings::load(&settings_path);
        notices.extend(notice);
        let preview = PreviewSettings::new(settings.preview(), settings.preview_interval);
        let repaint = ctx.clone();
        let wake: Arc<dyn Fn() + Send + Sync> = Arc::new(move || repaint.request_repaint());
        let engine = EngineHandle::spawn(engine_config(&settings), preview, wake.clone(), shared)?;
        let mut app = Self {
            form: Form::default(),
            models: settings
                .models_dir
                .as_deref()
                .map(scan_models)
                .unwrap_or_default(),
            settings,
            saver: SettingsSaver::new(settings_path),
            engine,
            tokenizer: ClipTokenizer::new().ok(),
            token_count: (String::new(), 0),
            model: None,
            busy: false,
            loading: false,
            progress: None,
            status: "Choose a checkpoint, or try the demo model.".into(),
            error: None,
            notices,
            engine_device: None,
            window_shares_device,
            last_event: Instant::now(),
            wake,
            preview: None,
            gallery: Vec::new(),
            selected: None,
            show_settings: false,
            dialogs: unbounded(),
            frame_times: Vec::new(),
            adapters: Arc::new(std::sync::Mutex::new(None)),
            cache_report: CacheReport::default(),
            device_check: None,
        };
        let slot = app.adapters.clone();
        let _ = std::thread::Builder::new()
            .name("adapters".into())
            .spawn(move || {
                let list = latent_engine::adapters::enumerate();
                if let Ok(mut s) = slot.lock() {
                    *s = Some(list);
                }
            });
        if let Some(last) = app.settings.last_model.clone().filter(|p| p.exists()) {
            app.load_model(last);
        }
        Ok(app)
    }

    /// The last "Verify device" result: whether all components agreed, and the report lines.
    pub fn device_check(&self) -> Option<(bool, &[String])> {
        self.device_check
            .as_ref()
            .map(|(passed, lines)| (*passed, lines.as_slice()))
    }

    /// The engine's device once open, and whether the window renders with that same wgpu device.
    pub fn engine_device(&self) -> Option<(&str, bool)> {
        self.engine_device
            .as_ref()
            .map(|(label, shared)| (label.as_str(), *shared && self.window_shares_device))
    }

    /// How long a busy engine has been silent, once that is longer than the device timeout.
    pub fn stalled(&self) -> Option<Duration> {
        let silent = self.last_event.elapsed();
        let limit = Duration::from_secs_f64(self.settings.device_timeout_secs.clamp(1.0, 3600.0));
        ((self.busy || self.loading) && silent > limit).then_some(silent)
    }

    /// Leaves a stuck engine behind (its thread cannot be interrupted inside a driver call; it is
    /// detached and ends with the process) and starts a new one on the CPU backend, reloading the
    /// current model. The device setting becomes `cpu`, so the next start does not hang either.
    pub fn restart_engine_on_cpu(&mut self) {
        self.settings.device = "cpu".into();
        self.saver.save(&self.settings);
        let engine = match EngineHandle::spawn(
            engine_config(&self.settings),
            self.engine.preview.clone(),
            self.wake.clone(),
            None,
        ) {
            Ok(e) => e,
            Err(e) => {
                self.error = Some(format!("the engine could not restart: {e:#}"));
                return;
            }
        };
        std::mem::replace(&mut self.engine, engine).abandon();
        (self.busy, self.loading, self.progress) = (false, false, None);
        (self.engine_device, self.window_shares_device) = (None, false);
        self.last_event = Instant::now();
        self.notices.push(
            "the engine was restarted on the CPU backend; the stuck device is left alone until \
             the studio closes"
                .into(),
        );
        self.status = "engine restarted on the CPU".into();
        if let Some((_, path)) = self.model.take() {
            self.load_model(path);
        }
    }

    /// The prompt panel (for scripted runs such as the documentation screenshot).
    pub fn form_mut(&mut self) -> &mut Form {
        &mut self.form
    }

    /// Durations of the recent UI passes (at most the last 240).
    pub fn frame_times(&self) -> &[Duration] {
        &self.frame_times
    }

    pub fn reset_frame_times(&mut self) {
        self.frame_times.clear();
    }

    pub fn is_busy(&self) -> bool {
        self.busy || self.loading
    }

    pub fn model_name(&self) -> Option<&str> {
        self.model.as_ref().map(|(n, _)| n.as_str())
    }

    pub fn gallery_paths(&self) -> Vec<PathBuf> {
        self.gallery
            .iter()
            .map(|g| g.finished.path.clone())
            .collect()
    }

    pub fn last_error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    pub fn preview_frame(&self) -> Option<Arc<Frame>> {
        self.preview.as_ref().map(|(f, _)| f.clone())
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
        self.loading = true;
        self.error = None;
        self.status = status;
        self.last_event = Instant::now();
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

    pub fn generate(&mut self) {
        if self.busy {
            return;
        }
        if self.model.is_none() {
            self.error = Some("No model is loaded: open a checkpoint or the demo model.".into());
            return;
        }
        if !self.form.seed_locked {
            self.form.seed = crate::run::random_seed();
        }
        // Busy only once the engine has the request: a refused one must not look running.
        if let Err(e) = self
            .engine
            .send(Command::Generate(Box::new(self.form.request())))
        {
            self.error = Some(format!("not generated: {e}"));
            return;
        }
        self.busy = true;
        self.error = None;
        self.progress = None;
        self.last_event = Instant::now();
    }

    /// Stops the running generation at the next step, or a model load at the next tensor.
    pub fn cancel(&mut self) {
        if self.busy || self.loading {
            self.engine.cancel();
            self.status = "cancelling…".into();
        }
    }

    /// Changes the preview method; a running generation picks it up at its next preview step.
    pub fn set_preview_method(&mut self, method: PreviewMethod) {
        self.engine.preview.set_method(method);
        if self.settings.preview() != method {
            self.settings.preview_method = method.id().into();
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

    fn drain_events(&mut self, ctx: &egui::Context) {
        if let Some(message) = self.saver.error() {
            self.error = Some(message);
        }
        let start = Instant::now();
        while start.elapsed() < EVENT_BUDGET {
            let event = match self.engine.events.try_recv() {
                Ok(event) => event,
                Err(crossbeam_channel::TryRecvError::Empty) => break,
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    // The engine thread is gone (a panic outside a command): say so once.
                    if self.busy || self.loading || self.error.is_none() {
                        self.error = Some(
                            "The engine stopped unexpectedly. Finished images are kept; \
                             restart the studio to generate again."
                                .into(),
                        );
                    }
                    self.busy = false;
                    self.loading = false;
                    self.progress = None;
                    break;
                }
            };
            self.last_event = Instant::now();
            match event {
                Event::Status(s) => self.status = s,
                Event::ModelLoaded { name, path } => {
                    self.loading = false;
                    self.status = format!("{name} ready");
                    self.model = Some((name, path.clone()));
                    if !demo::is_demo(&path) && self.settings.last_model.as_ref() != Some(&path) {
                        self.settings.last_model = Some(path);
                        self.saver.save(&self.settings);
                    }
                }
                Event::Progress {
                    image,
                    images,
                    step,
                    total,
                    elapsed,
                } => {
                    self.progress = Some(Progress {
                        image,
                        images,
                        step,
                        total,
                        elapsed,
                    })
                }
                Event::Finished(finished) => {
                    let texture = ctx.load_texture(
                        finished.path.display().to_string(),
                        color_image(&finished.image),
                        TextureOptions::LINEAR,
                    );
                    self.status = format!("saved {}", finished.path.display());
                    self.gallery.push(GalleryItem { finished, texture });
                    self.selected = Some(self.gallery.len() - 1);
                }
                Event::Idle => {
                    self.busy = false;
                    self.loading = false;
                    self.progress = None;
                }
                Event::Cancelled => self.status = "cancelled".into(),
                Event::Failed(message) => {
                    self.loading = false;
                    self.error = Some(message);
                }
                Event::Crashed(message) => {
                    self.loading = false;
                    self.progress = None;
                    self.error = Some(format!(
                        "The engine stopped: {message}. Finished images are kept; it restarted \
                         and reloads the model with the next generation."
                    ));
                }
                Event::Notice(n) => self.notices.push(n),
                Event::Cache(report) => self.cache_report = report,
                Event::DeviceCheck { passed, lines } => self.device_check = Some((passed, lines)),
                Event::DeviceReady { label, shared } => self.engine_device = Some((label, shared)),
            }
        }
        // Dialog answers.
        while let Ok(result) = self.dialogs.1.try_recv() {
            match result {
                DialogResult::Model(p) => self.load_model(p),
                DialogResult::ModelsDir(p) => {
                    self.models = scan_models(&p);
                    self.settings.models_dir = Some(p);
                    self.settings_changed();
                }
                DialogResult::OutputsDir(p) => {
                    self.settings.outputs_dir = p;
                    self.settings_changed();
                }
                DialogResult::Taesd(p) => {
                    self.settings.taesd = Some(p);
                    self.settings_changed();
                }
                DialogResult::SavedAs(Ok(path)) => {
                    self.status = format!("saved as {}", path.display())
                }
                DialogResult::SavedAs(Err(e)) => self.error = Some(format!("not saved: {e}")),
                DialogResult::Restored { path, parameters } => match parameters {
                    Ok(p) => {
                        let skipped = self.form.apply(&p);
                        self.status = format!("restored parameters from {}", path.display());
                        if !skipped.is_empty() {
                            self.notices
                                .push(format!("not restored: {}", skipped.join(", ")));
                        }
                    }
                    Err(e) => self.error = Some(format!("{}: {e}", path.display())),
                },
                DialogResult::Demo(Ok(path)) => self.load_model(path),
                DialogResult::Demo(Err(e)) => {
                    self.error = Some(format!("the demo model is unavailable: {e}"))
                }
            }
        }
    }

    fn update_preview(&mut self, ctx: &egui::Context) {
        let frame = self.engine.frames.latest();
        if frame.width == 0 || frame.rgba.len() != frame.width * frame.height * 4 {
            return;
        }
        if let Some((shown, texture)) = &mut self.preview {
            if Arc::ptr_eq(shown, &frame) {
                return;
            }
            texture.set(
                ColorImage::from_rgba_unmultiplied([frame.width, frame.height], &frame.rgba),
                TextureOptions::LINEAR,
            );
            *shown = frame;
        } else {
            let texture = ctx.load_texture(
                "preview",
                ColorImage::from_rgba_unmultiplied([frame.width, frame.height], &frame.rgba),
                TextureOptions::LINEAR,
            );
            self.preview = Some((frame, texture));
        }
    }

    /// A dropped PNG with parameters restores the prompt panel. The file is read on its own
    /// thread, its chunks only up to the pixels (see `png_parameters`).
    fn handle_drops(&mut self, ctx: &egui::Context) {
        let dropped = ctx.input(|i| i.raw.dropped_files.clone());
        for file in dropped {
            let path = file.path().to_path_buf();
            // Without a readable path (the web), the bytes come from the file object.
            let bytes = (!path.is_file()).then(|| file.bytes());
            self.pick(move || {
                let text = match bytes {
                    None => png_parameters(&path).map_err(|e| format!("{e}")),
                    Some(bytes) => bytes.and_then(|b| {
                        decode_png(&b)
                            .map(|(_, text)| text)
                            .map_err(|e| format!("{e}"))
                    }),
                };
                let parameters = text.and_then(|t| {
                    let t = t.ok_or("it has no generation parameters")?;
                    Parameters::parse_a1111(&t).map_err(|e| format!("{e}"))
                });
                Some(DialogResult::Restored { path, parameters })
            });
        }
    }

    fn shortcuts(&mut self, ctx: &egui::Context) {
        if ctx.input_mut(|i| i.consume_key(Modifiers::COMMAND, Key::Enter)) {
            self.generate();
        }
        if ctx.input_mut(|i| i.consume_key(Modifiers::NONE, Key::Escape)) {
            self.cancel();
        }
    }

    /// Runs `make` (a file dialog, file work) on its own thread; its result arrives with the
    /// next frame's events.
    fn pick(&self, make: impl FnOnce() -> Option<DialogResult> + Send + 'static) {
        let (tx, wake) = (self.dialogs.0.clone(), self.wake.clone());
        // rfd blocks until the dialog closes: keep it off the UI thread.
        let _ = std::thread::Builder::new()
            .name("file-dialog".into())
            .spawn(move || {
                if let Some(r) = make() {
                    let _ = tx.send(r);
                    wake();
                }
            });
    }

    fn model_panel(&mut self, ui: &mut egui::Ui) {
        ui.heading("Model");
        match &self.model {
            Some((name, path)) => {
                ui.label(format!("Loaded: {name}"));
                if demo::is_demo(path) {
                    ui.weak("Demo model: random weights, it paints abstract images only.");
                }
            }
            None if !self.loading => {
                ui.label("No model yet. Open a .safetensors checkpoint or a diffusers folder, set a models folder in Settings, or try the demo model.");
            }
            None => {}
        }
        if self.loading {
            ui.horizontal(|ui| {
                ui.spinner();
                ui.label(&self.status);
            });
        }
        ui.horizontal_wrapped(|ui| {
            if ui.button("Open checkpoint…").clicked() {
                self.pick(|| {
                    rfd::FileDialog::new()
                        .add_filter("safetensors", &["safetensors"])
                        .pick_file()
                        .map(DialogResult::Model)
                });
            }
            if ui.button("Open diffusers folder…").clicked() {
                self.pick(|| rfd::FileDialog::new().pick_folder().map(DialogResult::Model));
            }
            if ui
                .button("Demo model")
                .on_hover_text("A tiny random-weight model of the real architecture: it makes abstract images, but runs the whole loop.")
                .clicked()
            {
                self.load_demo();
            }
        });
        if !self.models.is_empty() {
            let mut chosen = None;
            egui::ComboBox::from_label("Models folder")
                .selected_text(self.model_name().unwrap_or("choose…").to_string())
                .show_ui(ui, |ui| {
                    for path in &self.models {
                        let name = path
                            .file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_default();
                        if ui.selectable_label(false, name).clicked() {
                            chosen = Some(path.clone());
                        }
                    }
                });
            if let Some(p) = chosen {
                self.load_model(p);
            }
        }
    }

    fn prompt_panel(&mut self, ui: &mut egui::Ui) {
        let label = ui.label("Prompt");
        ui.add(
            egui::TextEdit::multiline(&mut self.form.prompt)
                .desired_rows(4)
                .desired_width(f32::INFINITY)
                .hint_text("what to see"),
        )
        .labelled_by(label.id);
        let count = self.token_count();
        let colour = if count > MAX_PROMPT_TOKENS {
            Color32::from_rgb(220, 120, 40)
        } else {
            ui.visuals().weak_text_color()
        };
        ui.colored_label(colour, format!("{count}/{MAX_PROMPT_TOKENS}"))
            .on_hover_text("CLIP tokens; beyond 75 the prompt is truncated");
        let label = ui.label("Negative prompt");
        ui.add(
            egui::TextEdit::multiline(&mut self.form.negative)
                .desired_rows(2)
                .desired_width(f32::INFINITY),
        )
        .labelled_by(label.id);

        egui::Grid::new("params").num_columns(2).show(ui, |ui| {
            let label = ui.label("Seed");
            ui.horizontal(|ui| {
                ui.add(egui::DragValue::new(&mut self.form.seed))
                    .labelled_by(label.id);
                if ui
                    .button("Random")
                    .on_hover_text("draw a random seed")
                    .clicked()
                {
                    self.form.seed = crate::run::random_seed();
                }
                ui.checkbox(&mut self.form.seed_locked, "lock")
                    .on_hover_text("keep this seed; unlocked, every Generate draws a new one");
            });
            ui.end_row();
            let label = ui.label("Steps");
            ui.add(egui::Slider::new(&mut self.form.steps, 1..=150))
                .labelled_by(label.id);
            ui.end_row();
            let label = ui.label("CFG");
            ui.add(egui::Slider::new(&mut self.form.cfg, 1.0..=30.0).step_by(0.5))
                .labelled_by(label.id);
            ui.end_row();
            let label = ui.label("Sampler");
            egui::ComboBox::from_id_salt("sampler")
                .selected_text(self.form.sampler.a1111_name())
                .show_ui(ui, |ui| {
                    for s in SamplerKind::ALL {
                        ui.selectable_value(&mut self.form.sampler, s, s.a1111_name());
                    }
                })
                .response
                .labelled_by(label.id);
            ui.end_row();
            let label = ui.label("Schedule");
            egui::ComboBox::from_id_salt("schedule")
                .selected_text(self.form.schedule.a1111_name())
                .show_ui(ui, |ui| {
                    for s in Schedule::ALL {
                        ui.selectable_value(&mut self.form.schedule, s, s.a1111_name());
                    }
                })
                .response
                .labelled_by(label.id);
            ui.end_row();
            ui.label("Size");
            ui.horizontal(|ui| {
                let label = ui.label("W");
                ui.add(
                    egui::DragValue::new(&mut self.form.width)
                        .range(64..=2048)
                        .speed(8),
                )
                .labelled_by(label.id);
                let label = ui.label("H");
                ui.add(
                    egui::DragValue::new(&mut self.form.height)
                        .range(64..=2048)
                        .speed(8),
                )
                .labelled_by(label.id);
                egui::ComboBox::from_label("presets")
                    .selected_text(format!("{}×{}", self.form.width, self.form.height))
                    .show_ui(ui, |ui| {
                        for &(w, h) in SIZE_PRESETS {
                            if ui.selectable_label(false, format!("{w}×{h}")).clicked() {
                                (self.form.width, self.form.height) = (w, h);
                            }
                        }
                    });
            });
            // Sizes snap to multiples of 8 (the VAE's factor).
            self.form.width = (self.form.width / 8).max(8) * 8;
            self.form.height = (self.form.height / 8).max(8) * 8;
            ui.end_row();
            let label = ui.label("Batch count");
            ui.add(egui::DragValue::new(&mut self.form.batch_count).range(1..=100))
                .labelled_by(label.id);
            ui.end_row();
        });

        ui.add_space(8.0);
        ui.horizontal(|ui| {
            let generate =
                ui.add_enabled(!self.busy && !self.loading, egui::Button::new("Generate"));
            if generate.on_hover_text("Ctrl+Enter").clicked() {
                self.generate();
            }
            if ui
                .add_enabled(self.busy || self.loading, egui::Button::new("Cancel"))
                .on_hover_text("Esc")
                .clicked()
            {
                self.cancel();
            }
        });
        if let Some(p) = &self.progress {
            let done = p.step as f32 / p.total.max(1) as f32;
            let secs = p.elapsed.as_secs_f64().max(1e-6);
            let rate = p.step as f64 / secs;
            let eta = (p.total - p.step.min(p.total)) as f64 / rate.max(1e-6);
            ui.add(egui::ProgressBar::new(done).text(format!(
                "image {}/{} · step {}/{} · {rate:.2} it/s · ETA {eta:.0} s",
                p.image + 1,
                p.images,
                p.step,
                p.total
            )));
        }
        if let Some(silent) = self.stalled() {
            ui.colored_label(
                ui.visuals().warn_fg_color,
                format!(
                    "No progress for {:.0} s: the device may be stuck compiling kernels or hung.",
                    silent.as_secs_f64()
                ),
            );
            ui.horizontal(|ui| {
                if ui.button("Keep waiting").clicked() {
                    self.last_event = Instant::now();
                }
                if ui.button("Restart on the CPU").clicked() {
                    self.restart_engine_on_cpu();
                }
            });
        }
    }

    fn token_count(&mut self) -> usize {
        if self.token_count.0 != self.form.prompt {
            let n = self
                .tokenizer
                .as_ref()
                .map(|t| t.encode(&self.form.prompt).len())
                .unwrap_or(0);
            self.token_count = (self.form.prompt.clone(), n);
        }
        self.token_count.1
    }

    fn preview_panel(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            ui.label("Preview:");
            let current = self.engine.preview.method();
            for (method, label) in PREVIEW_CHOICES {
                if ui.selectable_label(current == method, label).clicked() {
                    self.set_preview_method(method);
                }
            }
        });
        let available = ui.available_size();
        let target = egui::vec2(self.form.width as f32, self.form.height as f32);
        let scale = (available.x / target.x)
            .min(available.y / target.y)
            .min(1.5);
        let size = target * scale.max(0.05);
        // The final image while idle (or the selected one), else the newest preview frame.
        let texture = match (self.busy, self.selected, &self.preview) {
            (false, Some(i), _) => self.gallery.get(i).map(|g| g.texture.clone()),
            (true, _, Some((_, t))) => Some(t.clone()),
            (_, None, Some((_, t))) => Some(t.clone()),
            _ => None,
        };
        match texture {
            Some(t) => {
                ui.add(egui::Image::new(&t).fit_to_exact_size(size));
            }
            None => {
                ui.allocate_ui(size, |ui| {
                    ui.centered_and_justified(|ui| {
                        ui.weak("The image appears here as it forms.");
                    });
                });
            }
        }
        if let Some(frame) = self.preview.as_ref().map(|(f, _)| f.clone()) {
            if self.busy {
                ui.weak(format!(
                    "preview step {}/{} ({})",
                    frame.step,
                    frame.total,
                    frame.method.map(|m| m.id()).unwrap_or("-")
                ));
            }
        }
    }

    fn gallery_panel(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            ui.heading("Gallery");
            if let Some(item) = self.selected.and_then(|i| self.gallery.get(i)) {
                if ui.button("Save as…").clicked() {
                    let source = item.finished.path.clone();
                    let name = source
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_else(|| "image.png".into());
                    // The copy runs on the dialog's thread too.
                    self.pick(move || {
                        let path = rfd::FileDialog::new()
                            .set_file_name(name)
                            .add_filter("PNG", &["png"])
                            .save_file()?;
                        let copied = std::fs::read(&source)
                            .map_err(anyhow::Error::from)
                            .and_then(|bytes| Ok(save_atomic(&path, &bytes, true)?));
                        Some(DialogResult::SavedAs(
                            copied.map(|()| path).map_err(|e| format!("{e:#}")),
                        ))
                    });
                }
                // Built only on click: a full-size copy every frame would cost the UI its budget.
                if ui.button("Copy image").clicked() {
                    ui.ctx().copy_image(color_image(&item.finished.image));
                }
                if ui.button("Copy parameters").clicked() {
                    ui.ctx().copy_text(item.finished.parameters.to_a1111());
                }
            }
        });
        egui::ScrollArea::horizontal().show(ui, |ui| {
            ui.horizontal(|ui| {
                for (i, item) in self.gallery.iter().enumerate() {
                    let thumb =
                        egui::Image::new(&item.texture).fit_to_exact_size(egui::vec2(96.0, 96.0));
                    let r = ui
                        .add(egui::Button::image(thumb).selected(self.selected == Some(i)))
                        .on_hover_text(item.finished.path.display().to_string());
                    if r.clicked() {
                        self.selected = Some(i);
                    }
                }
            });
        });
    }

    fn settings_window(&mut self, ctx: &egui::Context) {
        let mut open = self.show_settings;
        let mut changed = false;
        egui::Window::new("Settings")
            .open(&mut open)
            .resizable(false)
            .show(ctx, |ui| {
                egui::Grid::new("settings").num_columns(2).show(ui, |ui| {
                    let label = ui.label("Preview method");
                    let mut method = self.settings.preview();
                    egui::ComboBox::from_id_salt("preview-method")
                        .selected_text(method.id())
                        .show_ui(ui, |ui| {
                            for (m, text) in PREVIEW_CHOICES {
                                ui.selectable_value(&mut method, m, text);
                            }
                        })
                        .response
                        .labelled_by(label.id);
                    if method != self.settings.preview() {
                        self.engine.preview.set_method(method);
                        self.settings.preview_method = method.id().into();
                        changed = true;
                    }
                    ui.end_row();
                    let label = ui.label("Preview every N steps");
                    changed |= ui
                        .add(
                            egui::DragValue::new(&mut self.settings.preview_interval).range(1..=50),
                        )
                        .labelled_by(label.id)
                        .changed();
                    ui.end_row();
                    ui.label("Model cache");
                    changed |= ui
                        .checkbox(
                            &mut self.settings.model_cache,
                            "keep models loaded and converted weights on disk",
                        )
                        .changed();
                    ui.end_row();
                    let label = ui.label("Cache memory budget (GiB)");
                    changed |= ui
                        .add_enabled(
                            self.settings.model_cache,
                            egui::DragValue::new(&mut self.settings.cache_memory_gib)
                                .range(0.0..=256.0)
                                .speed(0.25),
                        )
                        .labelled_by(label.id)
                        .changed();
                    ui.end_row();
                    let label = ui.label("Disk cache limit (GiB)");
                    changed |= ui
                        .add_enabled(
                            self.settings.model_cache,
                            egui::DragValue::new(&mut self.settings.disk_cache_gib)
                                .range(0.0..=2048.0)
                                .speed(0.5),
                        )
                        .labelled_by(label.id)
                        .changed();
                    ui.end_row();
                    ui.label("Cached now");
                    ui.vertical(|ui| {
                        let r = &self.cache_report;
                        let resident: Vec<String> = r
                            .resident
                            .iter()
                            .map(|(name, bytes)| format!("{name} ({})", human_bytes(*bytes)))
                            .collect();
                        ui.label(if resident.is_empty() {
                            "in memory: nothing".to_string()
                        } else {
                            format!("in memory: {}", resident.join(", "))
                        });
                        let disk: u64 = r.disk.iter().map(|(_, b)| *b).sum();
                        ui.label(format!(
                            "on disk: {} entries, {}",
                            r.disk.len(),
                            human_bytes(disk)
                        ));
                        if ui.button("Clear disk cache").clicked()
                            && let Err(e) = self.engine.send(Command::ClearDiskCache)
                        {
                            self.error = Some(format!("disk cache not cleared: {e}"));
                        }
                    });
                    ui.end_row();
                    ui.label("VAE compilation");
                    changed |= ui
                        .checkbox(
                            &mut self.settings.vae_compile,
                            "fused GPU kernels for the VAE decode",
                        )
                        .on_hover_text(
                            "Checked against the plain path at first use; falls back with one notice if it fails",
                        )
                        .changed();
                    ui.end_row();
                    let label = ui.label("Device");
                    let mut choices = vec![
                        (
                            "auto".to_string(),
                            "auto (Intel discrete first)".to_string(),
                        ),
                        ("cpu".to_string(), "cpu (burn's CPU backend)".to_string()),
                    ];
                    if let Some(list) = self.adapters.lock().ok().and_then(|l| l.clone()) {
                        choices.extend(list.iter().map(|a| {
                            (
                                format!("gpu:{}", a.index),
                                format!("gpu:{} {} ({})", a.index, a.name, a.kind),
                            )
                        }));
                    }
                    let selected = choices
                        .iter()
                        .find(|(id, _)| *id == self.settings.device)
                        .map(|(_, text)| text.clone())
                        .unwrap_or_else(|| self.settings.device.clone());
                    egui::ComboBox::from_id_salt("device")
                        .selected_text(selected)
                        .show_ui(ui, |ui| {
                            for (id, text) in &choices {
                                changed |= ui
                                    .selectable_value(&mut self.settings.device, id.clone(), text)
                                    .changed();
                            }
                        })
                        .response
                        .labelled_by(label.id);
                    ui.end_row();
                    ui.label("Device in use");
                    ui.label(match &self.engine_device {
                        Some((label, true)) if self.window_shares_device => {
                            format!("{label}, shared with this window")
                        }
                        Some((label, _)) => label.clone(),
                        None => "not opened yet".into(),
                    });
                    ui.end_row();
                    let label = ui.label("Device timeout (s)");
                    changed |= ui
                        .add(
                            egui::DragValue::new(&mut self.settings.device_timeout_secs)
                                .range(1.0..=3600.0)
                                .speed(1.0),
                        )
                        .labelled_by(label.id)
                        .on_hover_text(
                            "How long opening the device and compiling its first kernels may take",
                        )
                        .changed();
                    ui.end_row();
                    ui.label("Device check");
                    ui.vertical(|ui| {
                        if ui
                            .add_enabled(!self.busy, egui::Button::new("Verify device"))
                            .on_hover_text(
                                "Runs the demo model here and on the CPU backend and compares them",
                            )
                            .clicked()
                        {
                            self.device_check = None;
                            match self.engine.send(Command::VerifyDevice) {
                                Ok(()) => {
                                    self.busy = true;
                                    self.last_event = Instant::now();
                                }
                                Err(e) => self.error = Some(format!("not verified: {e}")),
                            }
                        }
                        if let Some((passed, lines)) = &self.device_check {
                            let color = if *passed {
                                ui.visuals().text_color()
                            } else {
                                ui.visuals().error_fg_color
                            };
                            for line in lines {
                                ui.colored_label(color, line);
                            }
                        }
                    });
                    ui.end_row();
                    let label = ui.label("Precision");
                    egui::ComboBox::from_id_salt("precision")
                        .selected_text(self.settings.precision.clone())
                        .show_ui(ui, |ui| {
                            for p in ["auto", "f16", "f32"] {
                                changed |= ui
                                    .selectable_value(
                                        &mut self.settings.precision,
                                        p.to_string(),
                                        p,
                                    )
                                    .changed();
                            }
                        })
                        .response
                        .labelled_by(label.id);
                    ui.end_row();
                    ui.label("Models folder");
                    ui.horizontal(|ui| {
                        ui.label(
                            self.settings
                                .models_dir
                                .as_ref()
                                .map(|p| p.display().to_string())
                                .unwrap_or_else(|| "none".into()),
                        );
                        if ui.button("Choose…").clicked() {
                            self.pick(|| {
                                rfd::FileDialog::new()
                                    .pick_folder()
                                    .map(DialogResult::ModelsDir)
                            });
                        }
                    });
                    ui.end_row();
                    ui.label("Outputs folder");
                    ui.horizontal(|ui| {
                        ui.label(self.settings.outputs_dir.display().to_string());
                        if ui.button("Choose…").clicked() {
                            self.pick(|| {
                                rfd::FileDialog::new()
                                    .pick_folder()
                                    .map(DialogResult::OutputsDir)
                            });
                        }
                    });
                    ui.end_row();
                    ui.label("TAESD decoder");
                    ui.horizontal(|ui| {
                        ui.label(
                            self.settings
                                .taesd_path()
                                .map(|p| p.display().to_string())
                                .unwrap_or_else(|| "none (previews use latent2rgb)".into()),
                        );
                        if ui.button("Choose…").clicked() {
                            self.pick(|| {
                                rfd::FileDialog::new()
                                    .add_filter("safetensors", &["safetensors"])
                                    .pick_file()
                                    .map(DialogResult::Taesd)
                            });
                        }
                    });
                    ui.end_row();
                });
            });
        self.show_settings = open;
        if changed {
            self.settings_changed();
        }
    }
}

impl eframe::App for StudioApp {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        let started = Instant::now();
        let ctx = ui.ctx().clone();
        self.drain_events(&ctx);
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
        if self.busy || self.loading {
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
                    self.model_panel(ui);
                    ui.separator();
                    self.prompt_panel(ui);
                });
            });
        egui::Panel::bottom("gallery")
            .resizable(true)
            .default_size(140.0)
            .show(ui, |ui| self.gallery_panel(ui));
        egui::CentralPanel::default().show(ui, |ui| self.preview_panel(ui));
        self.settings_window(&ctx);

        if self.frame_times.len() == 240 {
            self.frame_times.remove(0);
        }
        self.frame_times.push(started.elapsed());
    }
}

pub(super) fn engine_config(settings: &Settings) -> EngineConfig {
    EngineConfig {
        device: settings.device_choice(),
        precision: settings.precision_choice(),
        outputs: settings.outputs_dir.clone(),
        taesd: settings.taesd_path(),
        cache: settings.cache_settings(),
        vae_compile: settings.vae_compile,
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
