//! The gallery: finished images, selection, Save as.

use super::*;

impl StudioApp {
    pub(super) fn gallery_ui(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            ui.heading("Gallery");
            if let Some(item) = self.view.selected.and_then(|i| self.view.gallery.get(i)) {
                if ui.button("Save as…").clicked() {
                    let source = item.finished.path.clone();
                    let name = source
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_else(|| "image.png".into());
                    // The copy runs on the dialog's thread too.
                    self.ask_dialog(move || {
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
                if ui
                    .button("Use as init image")
                    .on_hover_text("image to image from this picture")
                    .clicked()
                    && let Some(i) = self.view.selected
                {
                    self.ask(Action::UseAsInit(i));
                }
            }
        });
        egui::ScrollArea::horizontal().show(ui, |ui| {
            ui.horizontal(|ui| {
                for (i, item) in self.view.gallery.iter().enumerate() {
                    let thumb =
                        egui::Image::new(&item.texture).fit_to_exact_size(egui::vec2(96.0, 96.0));
                    let r = ui
                        .add(egui::Button::image(thumb).selected(self.view.selected == Some(i)))
                        .on_hover_text(item.finished.path.display().to_string());
                    if r.clicked() {
                        self.view.selected = Some(i);
                    }
                }
            });
        });
    }
}
