//! Loading a model for the worker, and what comes with it: the embeddings folder's library and
//! the TAESD decoder previews may want.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use latent_engine::checkpoint::Family;
use latent_engine::model_cache::LoadSource;
use latent_engine::preview::PreviewMethod;
use latent_engine::taesd::TaesdDecoder;
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::{LoadOptions, Precision};

use super::{Event, Loaded, LoadedModel, Worker, human_bytes};

impl Worker {
    pub(super) fn load_model(&mut self, path: &Path) -> Result<()> {
        let device = self.device()?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        self.emit(Event::Status(format!("loading {name}…")));
        let t = Instant::now();
        self.model = None;
        // A failed or cancelled load keeps the previous choice (reloaded when next needed).
        let previous = self.selected.replace(path.to_path_buf());
        let options = LoadOptions {
            precision: self.precision(&device),
            // Always: img2img must not need a reload (SD 1.5's encoder is 34 M parameters).
            vae_encoder: true,
            text_encoders: self.config.text_encoders,
        };
        // Progress in bytes uploaded, at most ten times a second; Cancel stops within a tensor.
        let events = self.events.clone();
        let (mut so_far, mut shown) = (0u64, Instant::now());
        let label = name.clone();
        let progress = move |bytes: u64| {
            so_far += bytes;
            if shown.elapsed() >= Duration::from_millis(100) {
                shown = Instant::now();
                events.send(Event::Status(format!(
                    "loading {label}… {}",
                    human_bytes(so_far)
                )));
            }
        };
        let cache = &mut self.cache;
        let loaded = latent_engine::checkpoint::controlled(self.cancel.clone(), progress, || {
            cache.get(path, &device, options)
        })
        .with_context(|| format!("loading {name}"));
        let (model, checkpoint, source) = match loaded {
            Ok(l) => l,
            Err(e) => {
                self.selected = previous;
                return Err(e);
            }
        };
        let loaded = LoadedModel {
            name: name.clone(),
            path: path.to_path_buf(),
            kind: format!(
                "{}, {}",
                checkpoint.model_name(),
                model.config.scheduler.prediction
            ),
            native: model.config.native_size(),
            refinable: model.text_encoder_2.is_some() && !model.config.unet.is_inpainting(),
            few_step: checkpoint
                .few_step
                .map(|f| (f, f.preset(checkpoint.family))),
        };
        self.model = Some(Loaded { model, checkpoint });
        let from = match source {
            LoadSource::Memory => "from the model cache",
            LoadSource::DiskCache => "from the disk cache",
            LoadSource::Checkpoint => "from the checkpoint",
        };
        self.emit(Event::Status(format!(
            "{name} loaded {from} in {:.1} s",
            t.elapsed().as_secs_f64()
        )));
        self.emit(Event::ModelLoaded(loaded));
        self.report_cache();
        // For the window's token counter: embeddings take as many positions as they have vectors.
        if self.config.embeddings.is_some() {
            self.embeddings();
        }
        Ok(())
    }

    /// The embeddings folder's library for the loaded model's text encoder, also sent to the
    /// window (its token counter counts their vectors); skipped files are told once each.
    pub(super) fn embeddings(&mut self) -> Option<Arc<latent_engine::prompt::Embeddings>> {
        let dir = self.config.embeddings.clone()?;
        let config = &self.model.as_ref()?.model.config;
        let width = config.text_encoder.hidden_size;
        let second = config.text_encoder_2.as_ref().map(|c| c.hidden_size);
        if self.tokenizer.is_none() {
            self.tokenizer = ClipTokenizer::new().ok();
        }
        let tokenizer = self.tokenizer.as_ref()?;
        match latent_engine::prompt::Embeddings::load_dir(&dir, tokenizer, width, second) {
            Ok((library, notes)) => {
                for note in notes {
                    if self.embedding_notes.insert(note.clone()) {
                        self.emit(Event::Notice(note));
                    }
                }
                let library = Arc::new(library);
                self.emit(Event::Embeddings(Some(library.clone())));
                Some(library)
            }
            Err(e) => {
                self.emit(Event::Notice(format!("embeddings not read: {e}")));
                self.emit(Event::Embeddings(None));
                None
            }
        }
    }

    /// The TAESD decoder when previews want it; a missing or broken file is a notice, not an error.
    pub(super) fn ensure_taesd(&mut self, device: &burn::tensor::Device, precision: Precision) {
        if !matches!(
            self.preview.method(),
            PreviewMethod::Taesd | PreviewMethod::Auto
        ) {
            return;
        }
        // SDXL's latents need TAESDXL (the chosen decoder is SD 1.x/2.x's), found by the
        // command line's rule with the models folder first.
        let Some(family) = self.model.as_ref().map(|m| m.checkpoint.family) else {
            return;
        };
        let chosen = self.config.taesd.clone().filter(|_| family != Family::Sdxl);
        let found = || {
            crate::paths::taesd_for(
                self.selected.as_deref()?,
                family,
                self.config.models_dir.as_deref(),
            )
        };
        let Some(path) = chosen.or_else(found) else {
            self.taesd = None;
            return;
        };
        if self.taesd.as_ref().is_some_and(|(p, _)| *p == path) {
            return;
        }
        match TaesdDecoder::open(&path, device, precision.dtype()) {
            Ok(t) => self.taesd = Some((path, t)),
            Err(e) => {
                self.taesd = None;
                self.emit(Event::Notice(format!(
                    "TAESD decoder {} not loaded ({e}); previews use latent2rgb",
                    path.display()
                )));
            }
        }
    }
}
