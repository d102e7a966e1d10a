//! The LoRA list under the prompts. The prompt's `<lora:name:te:unet>` tags are the one place a
//! LoRA choice lives (as in A1111, so a PNG's prompt restores it): the sliders rewrite a tag,
//! Add appends one, Remove deletes it.

use latent_engine::lora::tags::{self, LoraTag};

use super::*;

impl StudioApp {
    pub(super) fn lora_ui(&mut self, ui: &mut egui::Ui) {
        let active = tags::parse(&self.form.prompt).loras;
        let title = match active.len() {
            0 => "LoRA".to_string(),
            n => format!("LoRA ({n})"),
        };
        egui::CollapsingHeader::new(title)
            .id_salt("loras")
            .default_open(!active.is_empty())
            .show(ui, |ui| {
                let mut prompt = None;
                egui::Grid::new("lora_list").num_columns(4).show(ui, |ui| {
                    for tag in &active {
                        ui.label(&tag.name);
                        let (mut te, mut unet) = (tag.te, tag.unet);
                        let te_changed = ui
                            .add(
                                egui::Slider::new(&mut te, -1.0..=2.0)
                                    .step_by(0.05)
                                    .text("TE"),
                            )
                            .on_hover_text("strength on the text encoder")
                            .changed();
                        let unet_changed = ui
                            .add(
                                egui::Slider::new(&mut unet, -1.0..=2.0)
                                    .step_by(0.05)
                                    .text("UNet"),
                            )
                            .on_hover_text("strength on the UNet")
                            .changed();
                        if te_changed || unet_changed {
                            let tag = LoraTag {
                                name: tag.name.clone(),
                                te,
                                unet,
                            };
                            prompt = Some(tags::set(&self.form.prompt, &tag));
                        }
                        if ui.button("Remove").clicked() {
                            prompt = Some(tags::remove(&self.form.prompt, &tag.name));
                        }
                        ui.end_row();
                    }
                });
                let available: Vec<&String> = self
                    .reports
                    .lora_names
                    .iter()
                    .filter(|n| !active.iter().any(|t| &t.name == *n))
                    .collect();
                if self.reports.lora_names.is_empty() {
                    ui.weak("Choose a LoRA folder in Settings, or type <lora:name:0.8>.");
                } else {
                    ui.menu_button("Add LoRA…", |ui| {
                        for name in available {
                            if ui.button(name.as_str()).clicked() {
                                let tag = LoraTag {
                                    name: name.clone(),
                                    te: 1.0,
                                    unet: 1.0,
                                };
                                prompt = Some(tags::set(&self.form.prompt, &tag));
                                ui.close();
                            }
                        }
                    });
                }
                if let Some(p) = prompt {
                    self.form.prompt = p;
                }
            });
    }
}
