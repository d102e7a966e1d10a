//! The queue: Generate while the engine works adds a job; jobs wait here, in the window, and the
//! next one is sent when the engine says it is idle. Cancel stops the running job only; waiting
//! jobs can be moved, removed or cleared. The engine itself runs one command at a time.

use super::*;

/// A waiting generation, with its seed and settings fixed when it was queued.
pub(super) struct Job {
    pub id: u64,
    pub request: Box<Txt2ImgRequest>,
}

impl Job {
    /// One line for the list: the start of the prompt, size, steps, seed, and the mode.
    fn summary(&self) -> String {
        let r = &self.request;
        let mut prompt: String = r.prompt.chars().take(28).collect();
        if r.prompt.chars().count() > 28 {
            prompt.push('…');
        }
        let mode = match (&r.init, &r.hires) {
            (Some(i), _) if i.mask.is_some() => " · inpaint",
            (Some(_), _) => " · img2img",
            (None, Some(_)) => " · hires",
            _ => "",
        };
        format!(
            "{prompt} · {}×{} · {} steps · seed {}{mode}",
            r.width, r.height, r.steps, r.seed
        )
    }
}

impl StudioApp {
    /// Queues `request` behind the running work.
    pub(super) fn enqueue(&mut self, request: Txt2ImgRequest) {
        self.jobs.next_id += 1;
        self.jobs.queue.push(Job {
            id: self.jobs.next_id,
            request: Box::new(request),
        });
        self.status = format!("queued ({} waiting)", self.jobs.queue.len());
    }

    /// Sends the first waiting job once the last one is done and the engine idle (called after
    /// each frame's events).
    pub(super) fn run_queue(&mut self) {
        let ready = self.activity.idle() && !self.jobs.running && !self.jobs.held;
        if ready && !self.jobs.queue.is_empty() && self.model.is_some() {
            let job = self.jobs.queue.remove(0);
            let request = job.request.clone();
            if !self.dispatch(*request) {
                // Not accepted (the error is shown): the job stays first, and the queue waits
                // for the next Generate instead of retrying every frame.
                self.jobs.queue.insert(0, job);
                self.jobs.held = true;
            }
        }
    }

    /// Jobs waiting behind the running one.
    pub fn queued(&self) -> usize {
        self.jobs.queue.len()
    }

    /// Moves waiting job `from` to position `to` (both in `0..queued()`).
    pub fn move_job(&mut self, from: usize, to: usize) {
        if from < self.jobs.queue.len() && to < self.jobs.queue.len() {
            let job = self.jobs.queue.remove(from);
            self.jobs.queue.insert(to, job);
        }
    }

    /// Removes waiting job `index`.
    pub fn remove_job(&mut self, index: usize) {
        if index < self.jobs.queue.len() {
            self.jobs.queue.remove(index);
        }
    }

    pub(super) fn queue_ui(&mut self, ui: &mut egui::Ui) {
        if self.jobs.queue.is_empty() {
            return;
        }
        ui.horizontal(|ui| {
            ui.label(format!("Queue ({})", self.jobs.queue.len()));
            if ui.small_button("Clear queue").clicked() {
                self.ask(Action::ClearQueue);
            }
        });
        let (mut up, mut remove) = (None, None);
        for (i, job) in self.jobs.queue.iter().enumerate() {
            ui.horizontal(|ui| {
                if ui
                    .add_enabled(i > 0, egui::Button::new("up").small())
                    .on_hover_text("run earlier")
                    .clicked()
                {
                    up = Some(i);
                }
                if ui
                    .small_button("remove")
                    .on_hover_text("remove from the queue")
                    .clicked()
                {
                    remove = Some(i);
                }
                ui.label(job.summary())
                    .on_hover_text(format!("job {}: {}", job.id, job.request.prompt));
            });
        }
        if let Some(i) = up {
            self.ask(Action::MoveJob { from: i, to: i - 1 });
        }
        if let Some(i) = remove {
            self.ask(Action::RemoveJob(i));
        }
    }
}
