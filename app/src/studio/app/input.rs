//! Input that is not a widget: dropped files, keyboard shortcuts, and the file work they start
//! off the UI thread.

use latent_engine::image_io::{image_parameters, load_image};

use super::*;

impl StudioApp {
    /// A dropped image with A1111 parameters (a PNG's text, a JPEG's or WebP's EXIF comment)
    /// restores the prompt panel; one without becomes the init image. The file is read on its
    /// own thread.
    pub(super) fn handle_drops(&mut self, ctx: &egui::Context) {
        let dropped = ctx.input(|i| i.raw.dropped_files.clone());
        for file in dropped {
            let path = file.path().to_path_buf();
            // Without a readable path (the web), the bytes come from the file object.
            let bytes = (!path.is_file()).then(|| file.bytes());
            self.pick(move || {
                let text = match bytes {
                    None => match image_parameters(&path) {
                        Ok(None) => {
                            let image = load_image(&path).map_err(|e| format!("{e}"));
                            let role = super::Picture::Init;
                            return Some(DialogResult::Picture { role, path, image });
                        }
                        other => other.map_err(|e| format!("{e}")),
                    },
                    Some(bytes) => bytes.and_then(|b| {
                        decode_png(&b)
                            .map(|(_, text)| text)
                            .map_err(|e| format!("{e}"))
                    }),
                };
                let parameters = text.and_then(|t| {
                    let t = t.ok_or("it has no generation parameters")?;
                    Parameters::parse_a1111(&t).map_err(|e| e.to_string())
                });
                Some(DialogResult::Restored { path, parameters })
            });
        }
    }

    pub(super) fn shortcuts(&mut self, ctx: &egui::Context) {
        if ctx.input_mut(|i| i.consume_key(Modifiers::COMMAND, Key::Enter)) {
            self.generate();
        }
        if ctx.input_mut(|i| i.consume_key(Modifiers::NONE, Key::Escape)) {
            self.cancel();
        }
    }

    /// Runs `make` (a file dialog, file work) on its own thread; its result arrives with the
    /// next frame's events.
    pub(super) fn pick(&self, make: impl FnOnce() -> Option<DialogResult> + Send + 'static) {
        let (tx, wake) = (self.dialogs.0.clone(), self.wake.clone());
        // rfd blocks until the dialog closes: keep it off the UI thread.
        let _ = std::thread::Builder::new()
            .name("file-dialog".into())
            .spawn(move || {
                if let Some(r) = make() {
                    let _ = tx.send(r);
                    wake();
                }
            });
    }
}
