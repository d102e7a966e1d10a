//! What the panels ask for while they draw. A `*_ui` function edits only the values its widgets
//! show (the form, the settings being edited) and records everything else here: commands to the
//! engine, file dialogs and file work, queue edits. [`StudioApp::apply_actions`] carries them out
//! once the frame is drawn, so drawing never sends, spawns or reads a file.

use super::super::form::InitSource;
use super::*;

/// One request of a panel, carried out after the frame's drawing.
pub(super) enum Action {
    LoadModel(PathBuf),
    LoadDemo,
    /// SDXL's refiner (`None`: none).
    ChooseRefiner(Option<PathBuf>),
    /// A file dialog, or file work, on a thread of its own; its result comes back as a
    /// [`DialogResult`].
    Dialog(Box<dyn FnOnce() -> Option<DialogResult> + Send + 'static>),
    SetPreviewMethod(PreviewMethod),
    /// The gallery image at this index becomes the init image.
    UseAsInit(usize),
    /// Outpainting: the init image grown by the panel's bands, which become the mask.
    ExtendInit(InitSource),
    Generate,
    Cancel,
    RestartEndedEngine,
    RestartEngineOnCpu,
    /// A stalled engine is given more time.
    KeepWaiting,
    MoveJob {
        from: usize,
        to: usize,
    },
    RemoveJob(usize),
    ClearQueue,
    ClearDiskCache,
    VerifyDevice,
    /// The settings window changed a setting: the engine hears it and the file is saved.
    SettingsChanged,
}

impl StudioApp {
    /// Records `action` for after the frame's drawing.
    pub(super) fn ask(&self, action: Action) {
        self.actions.borrow_mut().push(action);
    }

    /// A file dialog (or file work) for after the frame's drawing: [`Action::Dialog`].
    pub(super) fn ask_dialog(&self, make: impl FnOnce() -> Option<DialogResult> + Send + 'static) {
        self.ask(Action::Dialog(Box::new(make)));
    }

    /// Carries out what the panels asked for this frame, in order, and draws again (the panels
    /// drawn before show the result from the next frame).
    pub(super) fn apply_actions(&mut self, ctx: &egui::Context) {
        let actions = std::mem::take(&mut *self.actions.borrow_mut());
        if !actions.is_empty() {
            ctx.request_repaint();
        }
        for action in actions {
            match action {
                Action::LoadModel(path) => self.load_model(path),
                Action::LoadDemo => self.load_demo(),
                Action::ChooseRefiner(path) => self.choose_refiner(path),
                Action::Dialog(make) => self.pick(make),
                Action::SetPreviewMethod(method) => self.set_preview_method(method),
                Action::UseAsInit(index) => self.use_as_init(index),
                Action::ExtendInit(source) => self.extend_init(&source),
                Action::Generate => self.generate(),
                Action::Cancel => self.cancel(),
                Action::RestartEndedEngine => self.restart_ended_engine(),
                Action::RestartEngineOnCpu => self.restart_engine_on_cpu(),
                Action::KeepWaiting => self.last_event = Instant::now(),
                Action::MoveJob { from, to } => self.move_job(from, to),
                Action::RemoveJob(index) => self.remove_job(index),
                Action::ClearQueue => self.jobs.queue.clear(),
                Action::ClearDiskCache => {
                    if let Err(e) = self.engine.send(Command::ClearDiskCache) {
                        self.error = Some(format!("disk cache not cleared: {e}"));
                    }
                }
                Action::VerifyDevice => {
                    self.reports.device_check = None;
                    match self.engine.send(Command::VerifyDevice) {
                        Ok(()) => {
                            self.activity = Activity::Working(None);
                            self.last_event = Instant::now();
                        }
                        Err(e) => self.error = Some(format!("not verified: {e}")),
                    }
                }
                Action::SettingsChanged => self.settings_changed(),
            }
        }
    }
}
