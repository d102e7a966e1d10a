//! The engine's events, drained each frame within a time budget: progress, previews, finished
//! images into the gallery, errors, and the engine's stop.

use super::*;

impl StudioApp {
    pub(super) fn drain_events(&mut self, ctx: &egui::Context) {
        if let Some(message) = self.saver.error() {
            self.error = Some(message);
        }
        let start = Instant::now();
        while start.elapsed() < EVENT_BUDGET {
            let event = match self.engine.events.try_recv() {
                Ok(event) => event,
                Err(crossbeam_channel::TryRecvError::Empty) => break,
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    // The engine thread is gone (a panic outside a command): say so once.
                    if !self.activity.ended() {
                        self.error = Some(
                            "The engine stopped unexpectedly. Finished images are kept; \
                             restart it to generate again."
                                .into(),
                        );
                    }
                    self.activity = Activity::Ended;
                    self.jobs.running = false;
                    break;
                }
            };
            self.last_event = Instant::now();
            match event {
                Event::Status(s) => self.status = s,
                Event::ModelLoaded(loaded) => {
                    self.activity = self.activity.loaded();
                    self.status = format!("{} ready ({})", loaded.name, loaded.kind);
                    // A size left at the last model's native one follows the new model's.
                    let before = self.model.as_ref().map_or(512, |m| m.native);
                    if (self.form.width, self.form.height) == (before, before) {
                        (self.form.width, self.form.height) = (loaded.native, loaded.native);
                    }
                    let path = loaded.path.clone();
                    self.model = Some(loaded);
                    if !demo::is_demo(&path) && self.settings.last_model.as_ref() != Some(&path) {
                        self.settings.last_model = Some(path);
                        self.saver.save(&self.settings);
                    }
                }
                Event::Refiner(chosen) => {
                    let path = chosen.as_ref().map(|(p, _)| p.clone());
                    self.reports.refiner = chosen;
                    if self.settings.refiner != path {
                        self.settings.refiner = path;
                        self.saver.save(&self.settings);
                    }
                }
                Event::Progress {
                    image,
                    images,
                    step,
                    total,
                    elapsed,
                } => {
                    if self.activity.working() {
                        self.activity = Activity::Working(Some(Progress {
                            image,
                            images,
                            step,
                            total,
                            elapsed,
                        }));
                    }
                }
                Event::Finished(finished) => {
                    let texture = ctx.load_texture(
                        finished.path.display().to_string(),
                        color_image(&finished.image),
                        TextureOptions::LINEAR,
                    );
                    self.status = format!("saved {}", finished.path.display());
                    self.view.gallery.push(GalleryItem { finished, texture });
                    self.view.selected = Some(self.view.gallery.len() - 1);
                }
                Event::GenerateDone => self.jobs.running = false,
                Event::Idle => self.activity = Activity::Idle,
                Event::Cancelled => self.status = "cancelled".into(),
                Event::Failed(message) => {
                    self.activity = self.activity.loaded();
                    self.error = Some(message);
                }
                Event::Crashed(message) => {
                    // The crashed command says no more; a restarted engine takes the next job.
                    self.jobs.running = false;
                    self.activity = match self.activity {
                        Activity::Working(_) => Activity::Working(None),
                        _ => Activity::Idle,
                    };
                    self.error = Some(format!(
                        "The engine stopped: {message}. Finished images are kept; it restarted \
                         and reloads the model with the next generation."
                    ));
                }
                Event::Notice(n) => self.notices.push(n),
                Event::Cache(report) => self.reports.cache = report,
                Event::Loras(names) => self.reports.lora_names = names,
                Event::Embeddings(library) => self.reports.embeddings = library,
                Event::DeviceCheck { passed, lines } => {
                    self.reports.device_check = Some((passed, lines))
                }
                Event::DeviceReady { label, shared } => {
                    self.reports.engine_device = Some((label, shared))
                }
            }
        }
        // Dialog answers.
        while let Ok(result) = self.dialogs.1.try_recv() {
            match result {
                DialogResult::Model(p) => self.load_model(p),
                DialogResult::Refiner(p) => self.choose_refiner(Some(p)),
                DialogResult::ModelsDir(p) => {
                    self.models = scan_models(&p);
                    self.settings.models_dir = Some(p);
                    self.settings_changed();
                }
                DialogResult::OutputsDir(p) => {
                    self.settings.outputs_dir = p;
                    self.settings_changed();
                }
                DialogResult::EmbeddingsDir(p) => {
                    self.settings.embeddings_dir = Some(p);
                    self.settings_changed();
                }
                DialogResult::LorasDir(p) => {
                    self.settings.loras_dir = Some(p);
                    self.settings_changed();
                }
                DialogResult::Taesd(p) => {
                    self.settings.taesd = Some(p);
                    self.settings_changed();
                }
                DialogResult::SavedAs(Ok(path)) => {
                    self.status = format!("saved as {}", path.display())
                }
                DialogResult::SavedAs(Err(e)) => self.error = Some(format!("not saved: {e}")),
                DialogResult::Restored { path, parameters } => match parameters {
                    Ok(p) => {
                        let skipped = self.form.apply(&p);
                        self.status = format!("restored parameters from {}", path.display());
                        if !skipped.is_empty() {
                            self.notices
                                .push(format!("not restored: {}", skipped.join(", ")));
                        }
                    }
                    Err(e) => self.error = Some(format!("{}: {e}", path.display())),
                },
                DialogResult::Picture { role, path, image } => self.set_picture(role, &path, image),
                DialogResult::Demo(Ok(path)) => self.load_model(path),
                DialogResult::Demo(Err(e)) => {
                    self.error = Some(format!("the demo model is unavailable: {e}"))
                }
            }
        }
    }
}
