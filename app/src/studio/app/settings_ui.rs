//! The settings window: device, precision, caches, previews, folders.

use super::*;

impl StudioApp {
    pub(super) fn settings_ui(&mut self, ctx: &egui::Context) {
        let mut open = self.show_settings;
        let mut changed = false;
        egui::Window::new("Settings")
            .open(&mut open)
            .resizable(false)
            .show(ctx, |ui| {
                egui::Grid::new("settings").num_columns(2).show(ui, |ui| {
                    let label = ui.label("Preview method");
                    let mut method = self.settings.preview_method;
                    egui::ComboBox::from_id_salt("preview-method")
                        .selected_text(method.id())
                        .show_ui(ui, |ui| {
                            for (m, text) in PREVIEW_CHOICES {
                                ui.selectable_value(&mut method, m, text);
                            }
                        })
                        .response
                        .labelled_by(label.id);
                    if method != self.settings.preview_method {
                        self.ask(Action::SetPreviewMethod(method));
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
                        let r = &self.reports.cache;
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
                        if ui.button("Clear disk cache").clicked() {
                            self.ask(Action::ClearDiskCache);
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
                            DeviceChoice::Auto,
                            "auto (Intel discrete first)".to_string(),
                        ),
                        (DeviceChoice::Cpu, "cpu (burn's CPU backend)".to_string()),
                    ];
                    if let Some(list) = self.reports.adapters.lock().ok().and_then(|l| l.clone()) {
                        choices.extend(list.iter().map(|a| {
                            (
                                DeviceChoice::Gpu(Some(a.index)),
                                format!("gpu:{} {} ({})", a.index, a.name, a.kind),
                            )
                        }));
                    }
                    let selected = choices
                        .iter()
                        .find(|(id, _)| *id == self.settings.device)
                        .map(|(_, text)| text.clone())
                        .unwrap_or_else(|| self.settings.device.to_string());
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
                    ui.label(match &self.reports.engine_device {
                        Some((label, true)) if self.reports.window_shares_device => {
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
                            .add_enabled(!self.activity.working(), egui::Button::new("Verify device"))
                            .on_hover_text(
                                "Runs the demo model here and on the CPU backend and compares them",
                            )
                            .clicked()
                        {
                            self.ask(Action::VerifyDevice);
                        }
                        if let Some((passed, lines)) = &self.reports.device_check {
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
                        .selected_text(precision_text(self.settings.precision))
                        .show_ui(ui, |ui| {
                            for p in [None, Some(Precision::F16), Some(Precision::F32)] {
                                changed |= ui
                                    .selectable_value(
                                        &mut self.settings.precision,
                                        p,
                                        precision_text(p),
                                    )
                                    .changed();
                            }
                        })
                        .response
                        .labelled_by(label.id);
                    ui.end_row();
                    let label = ui.label("Text encoders");
                    egui::ComboBox::from_id_salt("text_encoders")
                        .selected_text(text_encoders_text(self.settings.text_encoders))
                        .show_ui(ui, |ui| {
                            for t in [TextEncoders::Auto, TextEncoders::Device, TextEncoders::Host]
                            {
                                changed |= ui
                                    .selectable_value(
                                        &mut self.settings.text_encoders,
                                        t,
                                        text_encoders_text(t),
                                    )
                                    .changed();
                            }
                        })
                        .response
                        .on_hover_text(
                            "Parked in main memory, the text encoders come to the GPU only to \
                             encode a prompt: SDXL's take 1.6 GB, which lets SDXL fit an 8 GB card. \
                             The SDXL refiner follows this setting (auto parks it on a GPU \
                             under 15 GB or of unknown size): parked, its UNet and SDXL's take \
                             turns on the GPU, which lets the pair fit 8 GB at 5-6 s of uploads \
                             an image",
                        )
                        .labelled_by(label.id);
                    ui.end_row();
                    let shown = |p: &Option<PathBuf>| {
                        p.as_ref()
                            .map(|p| p.display().to_string())
                            .unwrap_or_else(|| "none".into())
                    };
                    let models = shown(&self.settings.models_dir);
                    self.folder_row(ui, "Models folder", models, None, DialogResult::ModelsDir);
                    let outputs = self.settings.outputs_dir.display().to_string();
                    self.folder_row(ui, "Outputs folder", outputs, None, DialogResult::OutputsDir);
                    ui.label("TAESD decoder");
                    ui.horizontal(|ui| {
                        ui.label(
                            self.settings
                                .taesd_path()
                                .map(|p| p.display().to_string())
                                .unwrap_or_else(|| "none (previews use latent2rgb)".into()),
                        );
                        if ui.button("Choose…").clicked() {
                            self.ask_dialog(|| {
                                rfd::FileDialog::new()
                                    .add_filter("safetensors", &["safetensors"])
                                    .pick_file()
                                    .map(DialogResult::Taesd)
                            });
                        }
                    });
                    ui.end_row();
                    let embeddings = shown(&self.settings.embeddings_dir);
                    self.folder_row(
                        ui,
                        "Embeddings folder",
                        embeddings,
                        Some(
                            "textual-inversion embeddings (name.safetensors): a name in the \
                             prompt is replaced by its vectors",
                        ),
                        DialogResult::EmbeddingsDir,
                    );
                    let loras = shown(&self.settings.loras_dir);
                    self.folder_row(
                        ui,
                        "LoRA folder",
                        loras,
                        Some(
                            "LoRAs (name.safetensors, kohya/A1111 or diffusers; subfolders \
                             too): <lora:name:0.8> in the prompt merges one in",
                        ),
                        DialogResult::LorasDir,
                    );
                });
            });
        self.show_settings = open;
        if changed {
            self.ask(Action::SettingsChanged);
        }
    }
}

impl StudioApp {
    /// One grid row: a folder setting, what it is now, and a Choose… button for a new one.
    fn folder_row(
        &self,
        ui: &mut egui::Ui,
        label: &str,
        shown: String,
        hover: Option<&str>,
        result: fn(PathBuf) -> DialogResult,
    ) {
        ui.label(label);
        ui.horizontal(|ui| {
            let current = ui.label(shown);
            if let Some(hover) = hover {
                current.on_hover_text(hover);
            }
            if ui.button("Choose…").clicked() {
                self.ask_dialog(move || rfd::FileDialog::new().pick_folder().map(result));
            }
        });
        ui.end_row();
    }
}

/// Where the text encoders wait, as the settings window names it.
fn text_encoders_text(t: TextEncoders) -> &'static str {
    match t {
        TextEncoders::Auto => "auto (main memory for SDXL)",
        TextEncoders::Device => "on the GPU",
        TextEncoders::Host => "in main memory",
    }
}

/// A precision setting as the settings window and file name it.
fn precision_text(precision: Option<Precision>) -> &'static str {
    match precision {
        None => "auto",
        Some(Precision::F16) => "f16",
        Some(Precision::F32) => "f32",
    }
}
