//! SDXL's refiner for the worker: chosen (its file checked at once, a header read), loaded at the
//! first generation that uses it, and released with the model it serves.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, anyhow};
use latent_engine::Refiner;
use latent_engine::checkpoint::Checkpoint;

use super::{Event, Worker};

/// The refiner the artist chose: its checkpoint (opened, not loaded), and the weights once a
/// generation needed them.
pub(super) struct ChosenRefiner {
    checkpoint: Arc<Checkpoint>,
    loaded: Option<Arc<Refiner>>,
}

impl Worker {
    /// Chooses the refiner at `path` (`None`: none), telling the window its name, or why it is
    /// not one (the previous choice then stays).
    pub(super) fn choose_refiner(&mut self, path: Option<PathBuf>) -> Result<()> {
        let Some(path) = path else {
            self.refiner = None;
            self.emit(Event::Refiner(None));
            return Ok(());
        };
        if self
            .refiner
            .as_ref()
            .is_some_and(|r| r.checkpoint.path == path)
        {
            self.emit(Event::Refiner(Some((path, self.refiner_name()))));
            return Ok(());
        }
        let checkpoint = Checkpoint::open_refiner(&path)
            .with_context(|| format!("choosing the refiner {}", path.display()))?;
        self.refiner = Some(ChosenRefiner {
            checkpoint: Arc::new(checkpoint),
            loaded: None,
        });
        self.emit(Event::Refiner(Some((path, self.refiner_name()))));
        Ok(())
    }

    /// The chosen refiner's name as A1111's parameters text records it: `name [short hash]`.
    fn refiner_name(&self) -> String {
        let Some(r) = &self.refiner else {
            return String::new();
        };
        let name = r.checkpoint.display_name();
        match self.cache.short_hash(&r.checkpoint) {
            Some(hash) => format!("{name} [{hash}]"),
            None => name,
        }
    }

    /// The chosen refiner, loaded on the engine's device (once; again after a device change or a
    /// release), and its name for the parameters text.
    pub(super) fn refiner_for_run(&mut self) -> Result<(Arc<Refiner>, String)> {
        let device = self.device()?;
        let precision = self.precision(&device);
        let name = self.refiner_name();
        let chosen = self.refiner.as_mut().ok_or_else(|| {
            anyhow!("the refiner is on, but none is chosen: pick one in the model panel")
        })?;
        let place = self.config.text_encoders;
        if let Some(r) = &chosen.loaded
            && r.device == device
            && r.precision == precision
            && r.parks_as(place)
        {
            return Ok((r.clone(), name));
        }
        chosen.loaded = None;
        let checkpoint = chosen.checkpoint.clone();
        self.emit(Event::Status(format!("loading the refiner {name}…")));
        let t = Instant::now();
        // As a model loads: Cancel stops it within a tensor, the status counts the bytes.
        let events = self.events.clone();
        let (mut so_far, mut shown) = (0u64, Instant::now());
        let label = name.clone();
        let progress = move |bytes: u64| {
            so_far += bytes;
            if shown.elapsed() >= std::time::Duration::from_millis(100) {
                shown = Instant::now();
                events.send(Event::Status(format!(
                    "loading the refiner {label}… {}",
                    super::human_bytes(so_far)
                )));
            }
        };
        let refiner = latent_engine::checkpoint::controlled(self.cancel.clone(), progress, || {
            Refiner::load_with(&checkpoint, &device, precision, place)
        })
        .with_context(|| format!("loading the refiner {name}"))?;
        let refiner = Arc::new(refiner);
        tracing::info!("refiner loaded in {:.2} s", t.elapsed().as_secs_f64());
        if let Some(chosen) = &mut self.refiner {
            chosen.loaded = Some(refiner.clone());
        }
        Ok((refiner, name))
    }

    /// Drops the loaded refiner's weights (the choice stays: it loads again when next needed).
    pub(super) fn release_refiner(&mut self) {
        if let Some(r) = &mut self.refiner {
            r.loaded = None;
        }
    }
}
