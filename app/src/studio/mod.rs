//! The desktop studio (eframe, wgpu renderer). The engine runs on its own thread
//! ([`worker`]); the window only talks to it through channels.

mod app;
pub mod demo;
mod form;
mod models;
mod settings;
mod worker;

pub use app::{StudioApp, write_png_with_parameters};
pub use form::Form;
pub use settings::Settings;

use anyhow::Result;
use eframe::egui;

/// Opens the studio window and runs until it is closed.
pub fn run() -> Result<()> {
    let settings_path = Settings::default_path();
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_title("Latent Studio")
            .with_inner_size([1280.0, 820.0])
            .with_min_inner_size([720.0, 480.0])
            .with_drag_and_drop(true),
        renderer: eframe::Renderer::Wgpu,
        ..Default::default()
    };
    eframe::run_native(
        "Latent Studio",
        options,
        Box::new(move |cc| Ok(Box::new(StudioApp::new(&cc.egui_ctx, settings_path)?))),
    )
    .map_err(|e| anyhow::anyhow!("the window could not open: {e}"))
}
