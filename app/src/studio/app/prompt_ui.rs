//! The prompt panel: prompts with their token count, the generation settings, Generate/Cancel.

use super::*;

impl StudioApp {
    pub(super) fn prompt_ui(&mut self, ui: &mut egui::Ui) {
        let label = ui.label("Prompt");
        ui.add(
            egui::TextEdit::multiline(&mut self.form.prompt)
                .desired_rows(4)
                .desired_width(f32::INFINITY)
                .hint_text("what to see"),
        )
        .labelled_by(label.id);
        let (count, chunks, truncated) = self.token_count();
        let colour = if truncated {
            Color32::from_rgb(220, 120, 40)
        } else {
            ui.visuals().weak_text_color()
        };
        let text = match chunks {
            1 => format!("{count}/{MAX_PROMPT_TOKENS}"),
            n => format!("{count}/{} · {n} chunks", n * MAX_PROMPT_TOKENS),
        };
        ui.colored_label(colour, text).on_hover_text(
            "CLIP tokens, read in chunks of 75 as A1111 does (BREAK starts a new chunk); \
             past 32 chunks the rest is not read",
        );
        let label = ui.label("Negative prompt");
        ui.add(
            egui::TextEdit::multiline(&mut self.form.negative)
                .desired_rows(2)
                .desired_width(f32::INFINITY),
        )
        .labelled_by(label.id);
        self.lora_ui(ui);

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
            let label = ui.label("Emphasis");
            egui::ComboBox::from_id_salt("emphasis")
                .selected_text(self.form.emphasis.name())
                .show_ui(ui, |ui| {
                    for e in Emphasis::ALL {
                        ui.selectable_value(&mut self.form.emphasis, e, e.name());
                    }
                })
                .response
                .on_hover_text(
                    "how (word:1.3) weights apply: Original and No norm as A1111, ComfyUI's \
                     rule, Ignore (weights dropped) or None (brackets are text)",
                )
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
            self.sdxl_conditioning_row(ui);
            let label = ui.label("Batch count");
            ui.add(egui::DragValue::new(&mut self.form.batch_count).range(1..=100))
                .labelled_by(label.id);
            ui.end_row();
        });

        ui.add_space(8.0);
        ui.horizontal(|ui| {
            let hint = match self.activity.busy() {
                false => "Ctrl+Enter",
                true => "Ctrl+Enter; while the engine works, queues these settings",
            };
            if ui.button("Generate").on_hover_text(hint).clicked() {
                self.ask(Action::Generate);
            }
            if ui
                .add_enabled(self.activity.busy(), egui::Button::new("Cancel"))
                .on_hover_text("Esc")
                .clicked()
            {
                self.ask(Action::Cancel);
            }
        });
        if let Activity::Working(Some(p)) = &self.activity {
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
        self.queue_ui(ui);
        if self.activity.ended() && ui.button("Restart the engine").clicked() {
            self.ask(Action::RestartEndedEngine);
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
                    self.ask(Action::KeepWaiting);
                }
                if ui.button("Restart on the CPU").clicked() {
                    self.ask(Action::RestartEngineOnCpu);
                }
            });
        }
    }

    /// The prompt's tokens (an embedding's vectors counted as the positions they take), chunks
    /// and whether it is cut, recounted when the prompt, the emphasis mode or the embeddings
    /// library changes.
    fn token_count(&mut self) -> (usize, usize, bool) {
        let library = self
            .reports
            .embeddings
            .as_ref()
            .map_or(0, |e| Arc::as_ptr(e) as usize);
        let key = (self.form.prompt.clone(), self.form.emphasis, library);
        if self.view.token_count.0 != key {
            let counted = self
                .tokenizer
                .as_ref()
                // `<lora:…>` tags are not read by the text encoder.
                .map(|t| {
                    let text = latent_engine::lora::tags::strip(&self.form.prompt);
                    Chunks::with_embeddings(
                        t,
                        &text,
                        self.form.emphasis,
                        self.reports.embeddings.as_deref(),
                    )
                })
                .map_or((0, 1, false), |c| {
                    (c.token_count, c.chunks.len(), c.truncated)
                });
            self.view.token_count = (key, counted);
        }
        self.view.token_count.1
    }

    /// SDXL's size and crop conditioning: off is the image's own size and no crop; on shows the
    /// original size, the crop's top-left corner and the target size the model is told.
    fn sdxl_conditioning_row(&mut self, ui: &mut egui::Ui) {
        ui.label("SDXL conditioning");
        ui.horizontal(|ui| {
            let mut custom = self.form.size_conditioning.is_some();
            // Its own text names it (a `labelled_by` would rename it after the row).
            ui.checkbox(&mut custom, "custom size and crop")
                .on_hover_text(
                    "SDXL only: the size and crop the model is told the image has \
                     (diffusers' original_size, crops_coords_top_left, target_size)",
                );
            let own = latent_engine::pipeline::SizeConditioning::of_image(
                self.form.width,
                self.form.height,
            );
            self.form.size_conditioning = match (custom, self.form.size_conditioning) {
                (false, _) => None,
                (true, Some(c)) => Some(c),
                (true, None) => Some(own),
            };
            if let Some(c) = &mut self.form.size_conditioning {
                let max = latent_engine::pipeline::sdxl::MAX_VALUE;
                let pair = |ui: &mut egui::Ui, name: &str, [y, x]: &mut [usize; 2], least| {
                    let label = ui.label(name);
                    ui.add(egui::DragValue::new(x).range(least..=max).speed(8))
                        .labelled_by(label.id);
                    ui.add(egui::DragValue::new(y).range(least..=max).speed(8))
                        .labelled_by(label.id);
                };
                pair(ui, "original W H", &mut c.original, 1);
                pair(ui, "crop left top", &mut c.crop_top_left, 0);
                pair(ui, "target W H", &mut c.target, 1);
            }
        });
        ui.end_row();
    }
}
