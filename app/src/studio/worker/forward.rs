//! The studio's observer of a run: what the engine reports while it generates, as events to
//! the window.

use std::path::PathBuf;
use std::sync::Arc;

use latent_engine::parameters::Parameters;
use latent_engine::pipeline::{Notice, StepState};

use super::{Event, EventSender, Finished};
use crate::run::RunEvents;

/// The studio's side of a run (`crate::run::SaveEach` saves the images): progress, status and
/// each saved image as events to the window.
pub(super) struct Forward<'a> {
    pub(super) events: &'a EventSender,
    pub(super) images: usize,
}

impl RunEvents for Forward<'_> {
    fn notice(&mut self, notice: &Notice) {
        tracing::warn!("{notice}");
        self.events.send(Event::Notice(notice.to_string()));
    }

    fn step(&mut self, s: &StepState<'_>) {
        self.events.send(Event::Progress {
            image: s.image,
            images: self.images,
            step: s.step,
            total: s.total,
            elapsed: s.elapsed,
        });
    }

    fn decoding(&mut self, tiles: usize) {
        let what = if tiles > 1 {
            format!("decoding in {tiles} tiles…")
        } else {
            "decoding…".into()
        };
        self.events.send(Event::Status(what));
    }

    fn tuning(&mut self, width: usize, height: usize) {
        self.events.send(Event::Status(format!(
            "first run at {width}×{height} on this GPU: tuning kernels (kept for next time)…"
        )));
    }

    fn saved(
        &mut self,
        generated: &latent_engine::pipeline::Generated,
        parameters: Parameters,
        path: PathBuf,
    ) {
        self.events.send(Event::Finished(Finished {
            image: Arc::new(generated.image.clone()),
            parameters,
            path,
        }));
    }
}
