//! Opening the studio (its settings, engine and model list) and restarting a stuck engine on the
//! CPU backend.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::bounded;
use eframe::egui;
use latent_engine::device::DeviceChoice;
use latent_engine::preview::PreviewSettings;
use latent_engine::tokenizer::ClipTokenizer;

use super::super::form::Form;
use super::super::models::scan_models;
use super::super::saver::SettingsSaver;
use super::super::settings::Settings;
use super::super::worker::{EngineHandle, SharedDevice};
use super::{Activity, DIALOG_SLOTS, StudioApp, engine_config};

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
        let preview = PreviewSettings::new(settings.preview_method, settings.preview_interval);
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
            activity: Activity::Idle,
            last_event: Instant::now(),
            wake,
            reports: super::state::Reports {
                window_shares_device,
                ..Default::default()
            },
            jobs: Default::default(),
            model: None,
            tokenizer: ClipTokenizer::new().ok(),
            view: Default::default(),
            painter: Default::default(),
            status: "Choose a checkpoint, or try the demo model.".into(),
            error: None,
            notices,
            show_settings: false,
            dialogs: bounded(DIALOG_SLOTS),
            actions: Default::default(),
        };
        let slot = app.reports.adapters.clone();
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
        if let Some(refiner) = app.settings.refiner.clone().filter(|p| p.exists()) {
            app.choose_refiner(Some(refiner));
        }
        Ok(app)
    }

    /// Leaves a stuck engine behind (its thread cannot be interrupted inside a driver call; it is
    /// detached and ends with the process) and starts a new one on the CPU backend, reloading the
    /// current model. The device setting becomes `cpu`, so the next start does not hang either.
    pub fn restart_engine_on_cpu(&mut self) {
        self.settings.device = DeviceChoice::Cpu;
        self.saver.save(&self.settings);
        if self.restart_engine() {
            self.notices.push(
                "the engine was restarted on the CPU backend; the stuck device is left alone \
                 until the studio closes"
                    .into(),
            );
            self.status = "engine restarted on the CPU".into();
        }
    }

    /// Starts a new engine with the current settings in place of one that ended (its thread is
    /// gone), reloading the current model. Finished images stay in the gallery.
    pub fn restart_ended_engine(&mut self) {
        if self.restart_engine() {
            self.error = None;
            self.status = "engine restarted".into();
        }
    }

    /// Whether the engine thread is gone and only [`Self::restart_ended_engine`] helps.
    pub fn engine_ended(&self) -> bool {
        self.activity.ended()
    }

    /// A new engine in place of the current one (abandoned: a stuck one cannot be joined),
    /// reloading the current model; false, with the error shown, when it cannot start.
    fn restart_engine(&mut self) -> bool {
        let engine = match EngineHandle::spawn(
            engine_config(&self.settings),
            self.engine.preview.clone(),
            self.wake.clone(),
            None,
        ) {
            Ok(e) => e,
            Err(e) => {
                self.error = Some(format!("the engine could not restart: {e:#}"));
                return false;
            }
        };
        std::mem::replace(&mut self.engine, engine).abandon();
        self.activity = Activity::Idle;
        // The stuck job is abandoned with its engine; the queue goes on with the new one.
        self.jobs.running = false;
        (
            self.reports.engine_device,
            self.reports.window_shares_device,
        ) = (None, false);
        self.last_event = Instant::now();
        if let Some(loaded) = self.model.take() {
            self.load_model(loaded.path);
        }
        if let Some((path, _)) = self.reports.refiner.take() {
            self.choose_refiner(Some(path));
        }
        true
    }
}
