//! The preview panel: the preview method and the latest frame.

use super::*;

impl StudioApp {
    pub(super) fn preview_ui(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            ui.label("Preview:");
            let current = self.engine.preview.method();
            for (method, label) in PREVIEW_CHOICES {
                if ui.selectable_label(current == method, label).clicked() {
                    self.ask(Action::SetPreviewMethod(method));
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
        let texture = match (
            self.activity.working(),
            self.view.selected,
            &self.view.preview,
        ) {
            (false, Some(i), _) => self.view.gallery.get(i).map(|g| g.texture.clone()),
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
        if let Some(frame) = self.view.preview.as_ref().map(|(f, _)| f.clone())
            && self.activity.working()
        {
            ui.weak(format!(
                "preview step {}/{} ({})",
                frame.step,
                frame.total,
                frame.method.map(|m| m.id()).unwrap_or("-")
            ));
        }
    }

    /// Uploads the latest preview frame, once per new frame.
    pub(super) fn update_preview(&mut self, ctx: &egui::Context) {
        let frame = self.engine.frames.latest();
        if frame.width == 0 || frame.rgba.len() != frame.width * frame.height * 4 {
            return;
        }
        if let Some((shown, texture)) = &mut self.view.preview {
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
            self.view.preview = Some((frame, texture));
        }
    }
}
