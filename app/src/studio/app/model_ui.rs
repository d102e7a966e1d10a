//! The model panel: what is loaded, and loading another.

use super::*;

impl StudioApp {
    pub(super) fn model_ui(&mut self, ui: &mut egui::Ui) {
        ui.heading("Model");
        let mut preset = None;
        match &self.model {
            Some(loaded) => {
                ui.label(format!("Loaded: {}", loaded.name));
                ui.weak(&loaded.kind);
                if demo::is_demo(&loaded.path) {
                    ui.weak("Demo model: random weights, it paints abstract images only.");
                }
                if let Some((few, p)) = loaded.few_step {
                    let size = p.size.map(|s| format!(", {s}×{s}")).unwrap_or_default();
                    let settings = format!(
                        "{} step{}, CFG {}{}, {}{size}",
                        p.steps,
                        if p.steps == 1 { "" } else { "s" },
                        p.cfg_scale,
                        if p.cfg_scale <= 1.0 { " (off)" } else { "" },
                        p.sampler.a1111_name()
                    );
                    ui.horizontal_wrapped(|ui| {
                        ui.label(format!("A {} model: made for few steps.", few.name()));
                        if ui
                            .button(format!("Use {} settings", few.name()))
                            .on_hover_text(settings)
                            .clicked()
                        {
                            preset = Some(p);
                        }
                    });
                }
            }
            None if !self.activity.loading() => {
                ui.label("No model yet. Open a .safetensors checkpoint or a diffusers folder, set a models folder in Settings, or try the demo model.");
            }
            None => {}
        }
        if let Some(p) = preset {
            self.form.apply_preset(&p);
        }
        if self.model.as_ref().is_some_and(|m| m.refinable) {
            self.refiner_ui(ui);
        }
        if self.activity.loading() {
            ui.horizontal(|ui| {
                ui.spinner();
                ui.label(&self.status);
            });
        }
        ui.horizontal_wrapped(|ui| {
            if ui.button("Open checkpoint…").clicked() {
                self.ask_dialog(|| {
                    rfd::FileDialog::new()
                        .add_filter("safetensors", &["safetensors"])
                        .pick_file()
                        .map(DialogResult::Model)
                });
            }
            if ui.button("Open diffusers folder…").clicked() {
                self.ask_dialog(|| rfd::FileDialog::new().pick_folder().map(DialogResult::Model));
            }
            if ui
                .button("Demo model")
                .on_hover_text("A tiny random-weight model of the real architecture: it makes abstract images, but runs the whole loop.")
                .clicked()
            {
                self.ask(Action::LoadDemo);
            }
        });
        let shown = self.model_name().unwrap_or("choose…").to_string();
        if let Some(p) = self.models_folder_ui(ui, "Models folder", shown) {
            self.ask(Action::LoadModel(p));
        }
    }

    /// The models folder's checkpoints as a list labelled `label` showing `shown`: the one
    /// picked, if any (nothing when the folder lists none).
    fn models_folder_ui(&self, ui: &mut egui::Ui, label: &str, shown: String) -> Option<PathBuf> {
        if self.models.is_empty() {
            return None;
        }
        let mut chosen = None;
        egui::ComboBox::from_label(label)
            .selected_text(shown)
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
        chosen
    }

    /// SDXL's refiner: on or off, which one, and where it takes over.
    fn refiner_ui(&mut self, ui: &mut egui::Ui) {
        let mut choose: Option<Option<PathBuf>> = None;
        ui.separator();
        ui.horizontal_wrapped(|ui| {
            ui.checkbox(&mut self.form.refiner_on, "Refiner")
                .on_hover_text("SDXL's refiner takes over the last steps (A1111's Refiner, diffusers' ensemble of experts).");
            match &self.reports.refiner {
                Some((_, name)) => {
                    ui.label(name);
                    if ui.small_button("Clear").on_hover_text("No refiner").clicked() {
                        choose = Some(None);
                    }
                }
                None => {
                    ui.weak("none chosen");
                }
            }
            if ui.button("Open refiner…").clicked() {
                self.ask_dialog(|| {
                    rfd::FileDialog::new()
                        .add_filter("safetensors", &["safetensors"])
                        .pick_file()
                        .map(DialogResult::Refiner)
                });
            }
        });
        let shown = self.refiner_name().unwrap_or("choose…").to_string();
        if let Some(p) = self.models_folder_ui(ui, "Refiner from the models folder", shown) {
            choose = Some(Some(p));
        }
        if self.form.refiner_on {
            ui.add(
                egui::Slider::new(&mut self.form.refiner_switch_at, 0.5..=1.0)
                    .step_by(0.05)
                    .text("Switch at"),
            )
            .on_hover_text(
                "The fraction of the steps the model runs before the refiner takes over.",
            );
        }
        if let Some(path) = choose {
            self.ask(Action::ChooseRefiner(path));
        }
    }
}
