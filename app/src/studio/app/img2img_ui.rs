//! Image to image: the init image (opened from a file or taken from the gallery), its denoising
//! strength and resize mode (the request carries the image at its own size; the engine fits it),
//! and the hires fix.

use latent_engine::image_io::{ResizeMode, load_image};
use latent_engine::pipeline::hires::MAX_SCALE as MAX_HIRES_SCALE;
use latent_engine::pipeline::{HiresUpscaler, MaskedContent};

use super::super::form::InitSource;
use super::*;

impl StudioApp {
    pub(super) fn img2img_ui(&mut self, ui: &mut egui::Ui) {
        let title = match &self.form.init {
            Some(_) => "Image to image (on)",
            None => "Image to image",
        };
        egui::CollapsingHeader::new(title)
            .id_salt("img2img")
            .show(ui, |ui| {
                ui.horizontal(|ui| {
                    if ui
                        .button("Open image…")
                        .on_hover_text("PNG, JPEG or WebP; a gallery image: its Use as init image")
                        .clicked()
                    {
                        self.open_picture(Picture::Init);
                    }
                    if ui
                        .button("Paste")
                        .on_hover_text("the clipboard's image (a copied picture or screenshot)")
                        .clicked()
                    {
                        self.paste_picture();
                    }
                    if self.form.init.is_some() && ui.button("Clear").clicked() {
                        self.form.init = None;
                    }
                });
                let Some(source) = self.form.init.clone() else {
                    ui.weak("none: Generate starts from noise (txt2img)");
                    return;
                };
                let texture = self.init_texture(ui.ctx(), &source);
                ui.horizontal(|ui| {
                    ui.add(egui::Image::new(&texture).fit_to_exact_size(egui::vec2(64.0, 64.0)));
                    ui.vertical(|ui| {
                        ui.label(&source.name);
                        ui.weak(format!("{}×{}", source.image.width, source.image.height));
                        if ui
                            .small_button("Use its size")
                            .on_hover_text(
                                "set the width and height to the image's (multiples of 8)",
                            )
                            .clicked()
                        {
                            self.form.width = (source.image.width / 8).clamp(8, 256) * 8;
                            self.form.height = (source.image.height / 8).clamp(8, 256) * 8;
                        }
                    });
                });
                self.outpaint_ui(ui, &source);
                ui.horizontal(|ui| {
                    if ui
                        .button("Open mask…")
                        .on_hover_text(
                            "inpainting: white is repainted, black kept (blended back after \
                             every step, as diffusers does with an ordinary checkpoint)",
                        )
                        .clicked()
                    {
                        self.open_picture(Picture::Mask);
                    }
                    match &self.form.mask {
                        Some(mask) => {
                            ui.label(format!("mask: {}", mask.name));
                            ui.add(
                                egui::DragValue::new(&mut self.form.mask_blur)
                                    .range(0.0..=64.0)
                                    .prefix("blur "),
                            )
                            .on_hover_text(
                                "A1111's mask blur: the original comes back outside the mask, \
                                 feathered by this many pixels",
                            );
                            egui::ComboBox::from_id_salt("masked-content")
                                .selected_text(self.form.masked_content.a1111_name())
                                .show_ui(ui, |ui| {
                                    for m in MaskedContent::ALL {
                                        let label = m.a1111_name();
                                        ui.selectable_value(
                                            &mut self.form.masked_content,
                                            m,
                                            label,
                                        );
                                    }
                                })
                                .response
                                .on_hover_text("what the masked area starts from");
                            use latent_engine::pipeline::InpaintArea;
                            let mut only =
                                matches!(self.form.inpaint_area, InpaintArea::OnlyMasked { .. });
                            ui.checkbox(&mut only, "Only masked").on_hover_text(
                                "redraw only the mask's box (plus padding) at the generation \
                                 size and paste it back: small areas get the full resolution",
                            );
                            let mut padding = match self.form.inpaint_area {
                                InpaintArea::OnlyMasked { padding } => padding,
                                InpaintArea::WholePicture => InpaintArea::DEFAULT_PADDING,
                            };
                            if only {
                                ui.add(
                                    egui::DragValue::new(&mut padding)
                                        .range(0..=256)
                                        .prefix("padding "),
                                );
                            }
                            self.form.inpaint_area = match only {
                                true => InpaintArea::OnlyMasked { padding },
                                false => InpaintArea::WholePicture,
                            };
                            if ui.small_button("Clear mask").clicked() {
                                self.form.mask = None;
                                self.painter.changed();
                            }
                        }
                        None => {
                            ui.weak("no mask: the whole image");
                        }
                    }
                });
                ui.collapsing("Paint the mask", |ui| self.mask_ui(ui, &source, &texture));
                egui::Grid::new("img2img-params")
                    .num_columns(2)
                    .show(ui, |ui| {
                        let label = ui.label("Denoising");
                        ui.add(
                            egui::Slider::new(&mut self.form.strength, 0.01..=1.0).step_by(0.01),
                        )
                        .on_hover_text(
                            "how much is redrawn: of the steps, the last steps × strength run \
                             (A1111's denoising strength)",
                        )
                        .labelled_by(label.id);
                        ui.end_row();
                        let label = ui.label("Resize");
                        egui::ComboBox::from_id_salt("resize-mode")
                            .selected_text(self.form.resize_mode.a1111_name())
                            .show_ui(ui, |ui| {
                                for m in ResizeMode::ALL {
                                    ui.selectable_value(
                                        &mut self.form.resize_mode,
                                        m,
                                        m.a1111_name(),
                                    );
                                }
                            })
                            .response
                            .on_hover_text("how an image of another size is fitted (Lanczos)")
                            .labelled_by(label.id);
                        ui.end_row();
                    });
            });
    }

    /// A file dialog for the init image or the mask, the file decoded on the dialog's thread.
    fn open_picture(&self, role: Picture) {
        self.ask_dialog(move || {
            let path = rfd::FileDialog::new()
                .add_filter("Images", &["png", "jpg", "jpeg", "webp"])
                .pick_file()?;
            let image = load_image(&path).map_err(|e| format!("{e}"));
            Some(DialogResult::Picture { role, path, image })
        });
    }

    /// The clipboard's image as the init image, read off the UI thread (a clipboard owner that
    /// is slow to answer must not stall the window).
    fn paste_picture(&self) {
        self.ask_dialog(|| {
            Some(DialogResult::Picture {
                role: Picture::Init,
                path: PathBuf::from("clipboard"),
                image: clipboard_image(),
            })
        });
    }

    /// An opened init image or mask goes to the form (or its error to the status bar).
    pub(super) fn set_picture(
        &mut self,
        role: Picture,
        path: &Path,
        image: Result<RgbImage, String>,
    ) {
        let image = match image {
            Ok(image) => Arc::new(image),
            Err(e) => {
                self.error = Some(format!("not opened: {e}"));
                return;
            }
        };
        let name = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let source = InitSource { name, image };
        match role {
            Picture::Init => self.set_init(source),
            Picture::Mask => {
                self.form.mask = Some(source);
                self.painter.changed();
            }
        }
        self.status = format!("opened {}", path.display());
    }

    /// A new init image; a mask of another size goes (it was drawn for another picture).
    fn set_init(&mut self, source: InitSource) {
        let size = |s: &InitSource| (s.image.width, s.image.height);
        if self
            .form
            .mask
            .as_ref()
            .is_some_and(|m| size(m) != size(&source))
        {
            self.form.mask = None;
            self.notices
                .push("the mask was for a picture of another size and was cleared".into());
        }
        self.form.init = Some(source);
    }

    /// Outpainting: the extend-canvas row under the init image (pixels, sides, Extend).
    fn outpaint_ui(&mut self, ui: &mut egui::Ui, source: &InitSource) {
        ui.horizontal(|ui| {
            ui.label("Outpaint");
            ui.add(
                egui::DragValue::new(&mut self.view.outpaint.0)
                    .range(8..=1024)
                    .speed(8)
                    .suffix(" px"),
            );
            for (on, side) in self
                .view
                .outpaint
                .1
                .iter_mut()
                .zip(["left", "right", "up", "down"])
            {
                ui.checkbox(on, side);
            }
            let any = self.view.outpaint.1.iter().any(|&on| on);
            let extend = ui
                .add_enabled(any, egui::Button::new("Extend"))
                .on_hover_text(
                    "grow the picture on those sides (edge pixels fill the new bands), mask the \
                     bands and 8 px beside them, and set latent noise at strength 1: Generate \
                     paints them",
                );
            if extend.clicked() {
                self.ask(Action::ExtendInit(source.clone()));
            }
        });
    }

    pub(super) fn extend_init(&mut self, source: &InitSource) {
        let (n, [left, right, up, down]) = self.view.outpaint;
        let pick = |on: bool| if on { n } else { 0 };
        let sides = latent_engine::image_io::Sides {
            left: pick(left),
            right: pick(right),
            top: pick(up),
            bottom: pick(down),
        }
        .to_multiple(source.image.width, source.image.height, 8);
        match latent_engine::image_io::extend_canvas(&source.image, sides, 8) {
            Ok((canvas, mask)) => {
                let (w, h) = (canvas.width, canvas.height);
                self.form.mask = None;
                self.set_init(InitSource {
                    name: format!("{} (extended)", source.name),
                    image: Arc::new(canvas),
                });
                self.form.mask = Some(InitSource {
                    name: "outpainting bands".into(),
                    image: Arc::new(mask),
                });
                self.painter.changed();
                (self.form.width, self.form.height) = (w.min(2048), h.min(2048));
                self.form.masked_content = MaskedContent::LatentNoise;
                self.form.strength = 1.0;
                self.status = format!("extended to {w}×{h}: Generate paints the new bands");
            }
            Err(e) => self.error = Some(format!("not extended: {e}")),
        }
    }

    /// The init image's thumbnail texture, uploaded once per image.
    fn init_texture(&mut self, ctx: &egui::Context, source: &InitSource) -> TextureHandle {
        match &self.view.init_texture {
            Some((image, texture)) if Arc::ptr_eq(image, &source.image) => texture.clone(),
            _ => {
                let shown = display_copy(&source.image);
                let texture =
                    ctx.load_texture("init-image", color_image(&shown), TextureOptions::LINEAR);
                self.view.init_texture = Some((source.image.clone(), texture.clone()));
                texture
            }
        }
    }

    /// A gallery image becomes the init image (shared, not copied).
    pub(super) fn use_as_init(&mut self, item: usize) {
        if let Some(item) = self.view.gallery.get(item) {
            let name = item.finished.path.file_name().map_or_else(
                || "gallery image".into(),
                |n| n.to_string_lossy().into_owned(),
            );
            let image = item.finished.image.clone();
            self.set_init(InitSource { name, image });
            self.status = "init image set: Generate runs image to image".into();
        }
    }
}

/// The largest side a picture is uploaded at for the screen (the thumbnail, the mask canvas):
/// a 16k photo must not become a 16k texture.
pub(super) const DISPLAY_SIDE: usize = 1024;

/// `image`, or a copy scaled down to [`DISPLAY_SIDE`] (nearest neighbour: only for showing).
pub(super) fn display_copy(image: &RgbImage) -> std::borrow::Cow<'_, RgbImage> {
    let side = image.width.max(image.height);
    if side <= DISPLAY_SIDE {
        return std::borrow::Cow::Borrowed(image);
    }
    let (w, h) = (
        (image.width * DISPLAY_SIDE / side).max(1),
        (image.height * DISPLAY_SIDE / side).max(1),
    );
    let mut pixels = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            let (sx, sy) = (x * image.width / w, y * image.height / h);
            pixels.extend_from_slice(&image.pixels[(sy * image.width + sx) * 3..][..3]);
        }
    }
    std::borrow::Cow::Owned(RgbImage {
        width: w,
        height: h,
        pixels,
    })
}

impl StudioApp {
    /// Hires fix: a second pass at a larger size (txt2img only).
    pub(super) fn hires_ui(&mut self, ui: &mut egui::Ui) {
        let title = match self.form.hires_on && self.form.init.is_none() {
            true => "Hires fix (on)",
            false => "Hires fix",
        };
        egui::CollapsingHeader::new(title)
            .id_salt("hires")
            .show(ui, |ui| {
                if self.form.init.is_some() {
                    ui.weak("off while an init image is set (hires fix is for txt2img)");
                    return;
                }
                ui.checkbox(&mut self.form.hires_on, "second pass at a larger size");
                let (w, h) = self.form.hires.target(self.form.width, self.form.height);
                let hires = &mut self.form.hires;
                egui::Grid::new("hires-params").num_columns(2).show(ui, |ui| {
                    let label = ui.label("Upscale by");
                    ui.add(
                        egui::Slider::new(&mut hires.scale, 1.0..=MAX_HIRES_SCALE)
                            .step_by(0.05)
                            .suffix(format!("  → {w}×{h}")),
                    )
                    .labelled_by(label.id);
                    ui.end_row();
                    let label = ui.label("Hires steps");
                    ui.add(egui::Slider::new(&mut hires.steps, 0..=150))
                        .on_hover_text("0: as many as the first pass")
                        .labelled_by(label.id);
                    ui.end_row();
                    let label = ui.label("Denoising");
                    ui.add(egui::Slider::new(&mut hires.strength, 0.01..=1.0).step_by(0.01))
                        .labelled_by(label.id);
                    ui.end_row();
                    let label = ui.label("Upscaler");
                    egui::ComboBox::from_id_salt("hires-upscaler")
                        .selected_text(hires.upscaler.a1111_name())
                        .show_ui(ui, |ui| {
                            for u in HiresUpscaler::ALL {
                                ui.selectable_value(&mut hires.upscaler, u, u.a1111_name());
                            }
                        })
                        .response
                        .on_hover_text(
                            "Latent: the latent, bilinear; Lanczos: the decoded image, encoded again",
                        )
                        .labelled_by(label.id);
                    ui.end_row();
                });
            });
    }
}

/// The clipboard's image, flattened over white as A1111 flattens a transparent init image.
fn clipboard_image() -> Result<RgbImage, String> {
    let mut clipboard = arboard::Clipboard::new().map_err(|e| format!("no clipboard: {e}"))?;
    let image = clipboard.get_image().map_err(|e| match e {
        arboard::Error::ContentNotAvailable => "the clipboard holds no image".to_string(),
        other => format!("the clipboard's image could not be read: {other}"),
    })?;
    flatten_rgba(image.width, image.height, &image.bytes)
}

/// RGBA bytes over a white background, as RGB.
fn flatten_rgba(width: usize, height: usize, rgba: &[u8]) -> Result<RgbImage, String> {
    if width == 0 || height == 0 || rgba.len() != width * height * 4 {
        return Err(format!(
            "the clipboard's image has {} bytes for {width}x{height} RGBA pixels",
            rgba.len()
        ));
    }
    let pixels = rgba
        .chunks_exact(4)
        .flat_map(|p| {
            let a = u32::from(p[3]);
            // Round to nearest: c·a/255 + 255·(255 − a)/255.
            [0, 1, 2].map(|c| ((u32::from(p[c]) * a + 255 * (255 - a) + 127) / 255) as u8)
        })
        .collect();
    Ok(RgbImage {
        width,
        height,
        pixels,
    })
}

#[cfg(test)]
mod tests {
    use super::flatten_rgba;

    #[test]
    fn a_clipboard_image_is_flattened_over_white() {
        let rgba = [10, 20, 30, 255, 0, 0, 0, 0, 200, 100, 0, 128];
        let image = flatten_rgba(3, 1, &rgba).unwrap();
        assert_eq!(image.pixels, [10, 20, 30, 255, 255, 255, 227, 177, 127]);
        assert!(flatten_rgba(2, 2, &rgba).is_err());
    }
}
