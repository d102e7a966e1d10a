//! The desktop studio (eframe, wgpu renderer). The engine runs on its own thread
//! ([`worker`]); the window only talks to it through channels.

mod app;
mod events;
mod form;
mod models;
mod saver;
mod settings;
mod worker;

pub use app::{StudioApp, write_png_with_parameters};
pub use form::Form;
pub use settings::Settings;
pub use worker::SharedDevice;

use anyhow::Result;
use eframe::egui;

/// Opens the device the settings name before the window, so that the window renders with the
/// engine's wgpu device and queue (`WgpuSetup::Existing`) instead of opening a second one. Not
/// fatal: on failure both open their own devices and the returned notice says why.
pub fn open_window_device(settings: &Settings) -> (Option<SharedDevice>, Vec<String>) {
    let mut notices = Vec::new();
    let config = app::engine_config(settings);
    match worker::open_for_window(&config, &mut |n| notices.push(n)) {
        Ok(shared) => {
            if let Some(s) = &shared {
                tracing::info!(
                    "the window renders with the engine's device: {}",
                    s.gpu.label
                );
            }
            (shared, notices)
        }
        Err(e) => {
            tracing::warn!("{e:#}");
            notices.push(format!(
                "the window could not share the engine's device ({e:#}); each opens its own"
            ));
            (None, notices)
        }
    }
}

/// Opens the studio window and runs until it is closed.
pub fn run() -> Result<()> {
    let settings_path = Settings::default_path();
    let (settings, _) = Settings::load(&settings_path);
    let (shared, notices) = open_window_device(&settings);
    let mut options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_title("Latent Studio")
            .with_inner_size([1280.0, 820.0])
            .with_min_inner_size([720.0, 480.0])
            .with_drag_and_drop(true),
        renderer: eframe::Renderer::Wgpu,
        ..Default::default()
    };
    if let Some(s) = &shared {
        options.wgpu_options.wgpu_setup = s.wgpu_setup();
    }
    eframe::run_native(
        "Latent Studio",
        options,
        Box::new(move |cc| {
            Ok(Box::new(StudioApp::with_shared_device(
                cc,
                settings_path,
                shared,
                notices,
            )?))
        }),
    )
    .map_err(|e| anyhow::anyhow!("the window could not open: {e}"))
}

/// Opens the real window with settings of its own (in a temporary folder, the engine on the CPU
/// backend), loads the built-in demo model, generates one image, saves a screenshot of the whole
/// window to `out` and closes. This is how `docs/screenshot.png` is made (under Xvfb).
pub fn screenshot(out: std::path::PathBuf, prompt: String, timeout_secs: u64) -> Result<()> {
    use std::sync::{Arc, Mutex};
    let dir = std::env::temp_dir().join(format!("latent-studio-screenshot-{}", std::process::id()));
    let settings = Settings {
        device: latent_engine::device::DeviceChoice::Cpu,
        precision: Some(latent_engine::Precision::F32),
        preview_method: latent_engine::preview::PreviewMethod::Latent2Rgb,
        outputs_dir: dir.join("outputs"),
        cache_dir: Some(dir.join("cache")),
        ..Settings::default()
    };
    let settings_path = dir.join("settings.json");
    settings.save(&settings_path)?;
    let result: Arc<Mutex<Option<Result<()>>>> = Arc::new(Mutex::new(None));
    let slot = result.clone();
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_title("Latent Studio")
            .with_inner_size([1280.0, 820.0]),
        renderer: eframe::Renderer::Wgpu,
        ..Default::default()
    };
    let run = eframe::run_native(
        "Latent Studio",
        options,
        Box::new(move |cc| {
            Ok(Box::new(ScreenshotApp {
                inner: StudioApp::new(&cc.egui_ctx, settings_path)?,
                stage: Stage::Start,
                out,
                prompt,
                result: slot,
                started: std::time::Instant::now(),
                timeout: std::time::Duration::from_secs(timeout_secs),
            }))
        }),
    );
    let _ = std::fs::remove_dir_all(&dir);
    run.map_err(|e| anyhow::anyhow!("the window could not open: {e}"))?;
    let outcome = result
        .lock()
        .map_err(|_| anyhow::anyhow!("screenshot state poisoned"))?
        .take();
    outcome.unwrap_or_else(|| Err(anyhow::anyhow!("the window closed before the screenshot")))
}

enum Stage {
    Start,
    Loading,
    Generating,
    Settle(u32),
    Capturing,
}

struct ScreenshotApp {
    inner: StudioApp,
    stage: Stage,
    out: std::path::PathBuf,
    prompt: String,
    result: std::sync::Arc<std::sync::Mutex<Option<Result<()>>>>,
    started: std::time::Instant,
    timeout: std::time::Duration,
}

impl ScreenshotApp {
    fn finish(&self, ctx: &egui::Context, outcome: Result<()>) {
        if let Ok(mut r) = self.result.lock() {
            r.get_or_insert(outcome);
        }
        ctx.send_viewport_cmd(egui::ViewportCommand::Close);
    }
}

impl eframe::App for ScreenshotApp {
    fn ui(&mut self, ui: &mut egui::Ui, frame: &mut eframe::Frame) {
        self.inner.ui(ui, frame);
        let ctx = ui.ctx().clone();
        ctx.request_repaint_after(std::time::Duration::from_millis(50));
        if self.started.elapsed() > self.timeout {
            self.finish(
                &ctx,
                Err(anyhow::anyhow!("timed out before the screenshot")),
            );
            return;
        }
        if let Some(e) = self.inner.last_error() {
            let e = e.to_string();
            self.finish(&ctx, Err(anyhow::anyhow!("the studio reported: {e}")));
            return;
        }
        match self.stage {
            Stage::Start => {
                tracing::info!("screenshot: loading the demo model");
                self.inner.load_demo();
                self.stage = Stage::Loading;
            }
            Stage::Loading if self.inner.model_name().is_some() && !self.inner.is_busy() => {
                let form = self.inner.form_mut();
                form.prompt = self.prompt.clone();
                form.negative = "blurry, low quality".into();
                // Small and quick: the demo model makes abstract images at any size.
                (form.width, form.height, form.steps) = (256, 256, 12);
                form.seed = 1234;
                form.seed_locked = true;
                tracing::info!("screenshot: generating");
                self.inner.generate();
                self.stage = Stage::Generating;
            }
            Stage::Generating
                if !self.inner.is_busy() && !self.inner.gallery_paths().is_empty() =>
            {
                tracing::info!("screenshot: finished, settling");
                self.stage = Stage::Settle(10);
            }
            Stage::Settle(0) => {
                let out = self.out.clone();
                let result = self.result.clone();
                let waker = ctx.clone();
                ctx.request_screenshot(move |image| {
                    let rgb = latent_engine::image_io::RgbImage {
                        width: image.width(),
                        height: image.height(),
                        pixels: image
                            .pixels
                            .iter()
                            .flat_map(|c| [c.r(), c.g(), c.b()])
                            .collect(),
                    };
                    let saved = latent_engine::image_io::encode_png(&rgb, None)
                        .and_then(|png| latent_engine::image_io::save_atomic(&out, &png, true))
                        .map_err(anyhow::Error::from);
                    if let Ok(mut r) = result.lock() {
                        r.get_or_insert(saved);
                    }
                    waker.request_repaint();
                });
                self.stage = Stage::Capturing;
            }
            Stage::Settle(n) => self.stage = Stage::Settle(n - 1),
            Stage::Capturing if self.result.lock().map(|r| r.is_some()).unwrap_or(true) => {
                ctx.send_viewport_cmd(egui::ViewportCommand::Close);
            }
            _ => {}
        }
    }
}
