//! The inpainting mask painted over the init image: a brush (white: repainted) and an eraser, at
//! a radius in the image's pixels, stroke by stroke. The mask is the form's, at the init image's
//! size, so Generate sends exactly what was painted.

use super::super::form::InitSource;
use super::*;

/// How the mask shows over the picture: repainted areas tinted red.
const TINT: [u8; 4] = [255, 40, 40, 110];

/// The painter's settings and the stroke in progress.
pub(super) struct MaskPainter {
    /// Brush radius in image pixels.
    pub radius: f32,
    pub erase: bool,
    /// The last painted point of the stroke, in image pixels (strokes are joined, not dotted).
    last: Option<egui::Pos2>,
    /// Bumped by every stroke: with the mask's address, what the overlay was made from.
    version: u64,
    /// The overlay's texture and the (mask address, version) it shows.
    texture: Option<((usize, u64), TextureHandle)>,
}

impl Default for MaskPainter {
    fn default() -> Self {
        Self {
            radius: 16.0,
            erase: false,
            last: None,
            version: 0,
            texture: None,
        }
    }
}

impl MaskPainter {
    /// The form's mask was replaced or cleared: the overlay is made again.
    pub fn changed(&mut self) {
        self.version += 1;
    }
}

impl StudioApp {
    /// The canvas: the init image with the mask over it; dragging paints or erases.
    pub(super) fn mask_ui(
        &mut self,
        ui: &mut egui::Ui,
        init: &InitSource,
        picture: &TextureHandle,
    ) {
        ui.horizontal(|ui| {
            let label = ui.label("Brush");
            ui.add(egui::Slider::new(&mut self.painter.radius, 1.0..=128.0).suffix(" px"))
                .labelled_by(label.id);
            ui.checkbox(&mut self.painter.erase, "erase");
        });
        let (w, h) = (init.image.width as f32, init.image.height as f32);
        let scale = (ui.available_width().min(320.0) / w).min(320.0 / h);
        let (rect, response) =
            ui.allocate_exact_size(egui::vec2(w * scale, h * scale), egui::Sense::drag());
        response.widget_info(|| egui::WidgetInfo::labeled(egui::Role::Canvas, true, "mask canvas"));
        let uv = egui::Rect::from_min_max(egui::pos2(0.0, 0.0), egui::pos2(1.0, 1.0));
        ui.painter().image(picture.id(), rect, uv, Color32::WHITE);
        if let Some(texture) = self.mask_texture(ui.ctx()) {
            ui.painter().image(texture.id(), rect, uv, Color32::WHITE);
        }
        match response.interact_pointer_pos() {
            Some(pos) if response.is_pointer_button_down_on() => {
                let at = ((pos - rect.min) / scale).to_pos2();
                // A held, unmoved pointer paints nothing new (and re-uploads nothing).
                if self.painter.last != Some(at) {
                    let from = self.painter.last.unwrap_or(at);
                    self.stamp_line(init, from, at);
                    self.painter.last = Some(at);
                }
            }
            _ => self.painter.last = None,
        }
    }

    /// Paints (or erases) discs along `from`→`to`, every half radius.
    fn stamp_line(&mut self, init: &InitSource, from: egui::Pos2, to: egui::Pos2) {
        let (w, h) = (init.image.width, init.image.height);
        let fits = |m: &InitSource| (m.image.width, m.image.height) == (w, h);
        match self.form.mask.take() {
            Some(m) if fits(&m) => self.form.mask = Some(m),
            // An opened mask of another size: fitted to the picture as the engine would fit it.
            Some(m) => {
                let fitted = latent_engine::image_io::resize(&m.image, w, h, self.form.resize_mode);
                self.form.mask = fitted.ok().map(|image| InitSource {
                    name: m.name,
                    image: Arc::new(image),
                });
            }
            None => {}
        }
        if self.form.mask.is_none() {
            self.form.mask = Some(InitSource {
                name: "painted".into(),
                image: Arc::new(RgbImage {
                    width: w,
                    height: h,
                    pixels: vec![0; w * h * 3],
                }),
            });
        }
        let Some(mask) = self.form.mask.as_mut() else {
            return;
        };
        mask.name = "painted".into();
        self.painter.version += 1;
        let pixels = &mut Arc::make_mut(&mut mask.image).pixels;
        let (r, value) = (
            self.painter.radius,
            if self.painter.erase { 0 } else { 255 },
        );
        let steps = ((to - from).length() / (r * 0.5).max(1.0)).ceil().max(1.0) as usize;
        for i in 0..=steps {
            let c = from + (to - from) * (i as f32 / steps as f32);
            let (x0, x1) = (
                (c.x - r).max(0.0) as usize,
                ((c.x + r).ceil() as usize).min(w),
            );
            let (y0, y1) = (
                (c.y - r).max(0.0) as usize,
                ((c.y + r).ceil() as usize).min(h),
            );
            for y in y0..y1 {
                for x in x0..x1 {
                    let d = egui::vec2(x as f32 + 0.5 - c.x, y as f32 + 0.5 - c.y);
                    if d.length_sq() <= r * r {
                        pixels[(y * w + x) * 3..][..3].fill(value);
                    }
                }
            }
        }
    }

    /// The overlay of the form's mask, uploaded again only when the mask changed.
    fn mask_texture(&mut self, ctx: &egui::Context) -> Option<TextureHandle> {
        let mask = self.form.mask.as_ref()?.image.clone();
        let key = (Arc::as_ptr(&mask) as usize, self.painter.version);
        if let Some((shown, texture)) = &self.painter.texture
            && *shown == key
        {
            return Some(texture.clone());
        }
        let shown = super::img2img_ui::display_copy(&mask);
        let rgba: Vec<u8> = shown
            .pixels
            .chunks_exact(3)
            .flat_map(|p| if p[0] >= 128 { TINT } else { [0; 4] })
            .collect();
        let image = ColorImage::from_rgba_unmultiplied([shown.width, shown.height], &rgba);
        let texture = ctx.load_texture("mask-overlay", image, TextureOptions::NEAREST);
        self.painter.texture = Some((key, texture.clone()));
        Some(texture)
    }
}
