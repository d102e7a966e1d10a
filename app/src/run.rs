//! What the command line and the studio share about running a request: the random seed, the
//! request's setup once the model is loaded, and the observer that saves each image the moment it
//! is finished (a later failure, a cancel or a stuck device never costs the finished ones), each
//! front end reporting progress its own way.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, anyhow};
use latent_engine::image_io::{encode_png, next_numbered_path, save_atomic};
use latent_engine::parameters::Parameters;
use latent_engine::pipeline::{Generated, Notice, Observer, StepState, Txt2ImgRequest};

/// A seed for "random": splitmix64 of the clock, spread evenly over 32 bits like A1111's.
pub fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut z = nanos.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) % (1u64 << 32)
}

/// A request's setup once its model is loaded, the same for both front ends: checked against the
/// model, the prompt's `<lora:…>` tags opened from `loras` (each file once while unchanged; the
/// pipeline merges them into the networks the run uses), the embeddings library attached. Returns
/// the tags it does not apply (left out of the prompt), for the caller to report its way.
pub fn prepare_request(
    model: &latent_engine::StableDiffusion,
    request: &mut Txt2ImgRequest,
    loras: &latent_engine::lora::LoraLibrary,
    embeddings: Option<std::sync::Arc<latent_engine::prompt::Embeddings>>,
) -> latent_engine::Result<Vec<String>> {
    latent_engine::pipeline::check_request(model, request)?;
    let (set, ignored) = loras.resolve(&request.prompt)?;
    request.loras = set;
    request.embeddings = embeddings;
    Ok(ignored)
}

/// Where finished images go.
#[derive(Debug, Clone)]
pub enum Destination {
    /// One named file (`--out`); replaced only with `overwrite`.
    File { path: PathBuf, overwrite: bool },
    /// `NNNNN-<seed>.png` in a folder, the next free number, never overwriting.
    Numbered(PathBuf),
}

/// Saves `png` as `NNNNN-<seed>.png` in `dir` (created if missing) under the next free number:
/// a race with another writer that takes the number first moves on to the next.
pub fn save_numbered(dir: &Path, seed: u64, png: &[u8]) -> Result<PathBuf> {
    for _ in 0..8 {
        let path = next_numbered_path(dir, seed)?;
        match save_atomic(&path, png, false) {
            Ok(()) => return Ok(path),
            Err(_) if path.exists() => continue,
            Err(e) => return Err(e).with_context(|| format!("saving {}", path.display())),
        }
    }
    Err(anyhow!(
        "could not find a free file name in {}",
        dir.display()
    ))
}

/// How a front end hears about a run: the command line prints, the studio sends events.
pub trait RunEvents {
    fn notice(&mut self, notice: &Notice);
    fn step(&mut self, step: &StepState<'_>);
    fn decoding(&mut self, tiles: usize);
    /// The first pass at `width`×`height` since launch: its kernels tune before the first step.
    fn tuning(&mut self, width: usize, height: usize);
    /// `generated` was written to `path` with `parameters` in its text chunk.
    fn saved(&mut self, generated: &Generated, parameters: Parameters, path: PathBuf);
}

/// The run's observer: forwards progress to `events` and saves each image as it finishes, with
/// A1111 parameters. A save that fails cancels the run (through `cancel`) and is kept in
/// [`SaveEach::error`] for the caller to report; the images saved before it stay.
pub struct SaveEach<'a, E> {
    pub events: E,
    request: &'a Txt2ImgRequest,
    model_hash: Option<String>,
    model_name: String,
    destination: Destination,
    cancel: &'a AtomicBool,
    pub saved: Vec<PathBuf>,
    pub error: Option<anyhow::Error>,
}

impl<'a, E: RunEvents> SaveEach<'a, E> {
    pub fn new(
        events: E,
        request: &'a Txt2ImgRequest,
        model_hash: Option<String>,
        model_name: String,
        destination: Destination,
        cancel: &'a AtomicBool,
    ) -> Self {
        Self {
            events,
            request,
            model_hash,
            model_name,
            destination,
            cancel,
            saved: Vec::new(),
            error: None,
        }
    }

    fn save(&self, generated: &Generated) -> Result<(Parameters, PathBuf)> {
        let mut parameters = Parameters::for_request(
            self.request,
            generated.seed,
            self.model_hash.clone(),
            Some(self.model_name.clone()),
        );
        if !generated.ti_hashes.is_empty() {
            let hashes: Vec<String> = generated
                .ti_hashes
                .iter()
                .map(|(name, hash)| format!("{name}: {hash}"))
                .collect();
            parameters
                .extra
                .push(("TI hashes".to_string(), hashes.join(", ")));
        }
        let png = encode_png(&generated.image, Some(&parameters.to_a1111()))?;
        let path = match &self.destination {
            Destination::File { path, overwrite } => {
                save_atomic(path, &png, *overwrite)?;
                path.clone()
            }
            Destination::Numbered(dir) => save_numbered(dir, generated.seed, &png)?,
        };
        Ok((parameters, path))
    }
}

impl<E: RunEvents> Observer for SaveEach<'_, E> {
    fn notice(&mut self, notice: &Notice) {
        self.events.notice(notice);
    }

    fn step(&mut self, s: &StepState<'_>) {
        self.events.step(s);
        crate::test_seam::stall_here(s.image, s.step);
    }

    fn decoding(&mut self, tiles: usize) {
        self.events.decoding(tiles);
    }

    fn tuning(&mut self, width: usize, height: usize) {
        self.events.tuning(width, height);
    }

    fn image(&mut self, generated: &Generated) {
        if self.error.is_some() {
            return;
        }
        match self.save(generated) {
            Ok((parameters, path)) => {
                self.saved.push(path.clone());
                self.events.saved(generated, parameters, path);
            }
            Err(e) => {
                self.error = Some(e);
                self.cancel.store(true, Ordering::SeqCst);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use latent_engine::image_io::{RgbImage, decode_png};

    #[derive(Default)]
    struct Heard(Vec<PathBuf>);

    impl RunEvents for &mut Heard {
        fn notice(&mut self, _: &Notice) {}
        fn step(&mut self, _: &StepState<'_>) {}
        fn decoding(&mut self, _: usize) {}
        fn tuning(&mut self, _: usize, _: usize) {}
        fn saved(&mut self, _: &Generated, parameters: Parameters, path: PathBuf) {
            assert_eq!(parameters.prompt, "a fox");
            let ti = (
                "TI hashes".to_string(),
                "tinystyle: 0123456789ab".to_string(),
            );
            assert!(parameters.extra.contains(&ti), "{:?}", parameters.extra);
            self.0.push(path);
        }
    }

    fn generated(seed: u64) -> Generated {
        Generated {
            image: RgbImage {
                width: 2,
                height: 1,
                pixels: vec![1, 2, 3, 4, 5, 6],
            },
            seed,
            ti_hashes: vec![("tinystyle".into(), "0123456789ab".into())],
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("latent-run-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn images_are_saved_numbered_with_parameters_as_they_finish() {
        let dir = scratch("numbered");
        let request = Txt2ImgRequest {
            prompt: "a fox".into(),
            ..Default::default()
        };
        let cancel = AtomicBool::new(false);
        let mut heard = Heard::default();
        let mut run = SaveEach::new(
            &mut heard,
            &request,
            None,
            "tiny".into(),
            Destination::Numbered(dir.clone()),
            &cancel,
        );
        run.image(&generated(7));
        run.image(&generated(8));
        assert!(run.error.is_none());
        let saved = run.saved.clone();
        assert_eq!(heard.0, saved);
        let names: Vec<_> = saved
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["00001-7.png", "00002-8.png"]);
        let (image, text) = decode_png(&std::fs::read(&saved[1]).unwrap()).unwrap();
        assert_eq!(image.pixels, generated(8).image.pixels);
        let p = Parameters::parse_a1111(&text.unwrap()).unwrap();
        assert_eq!((p.seed, p.model.as_deref()), (8, Some("tiny")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_failed_save_cancels_and_keeps_the_earlier_images() {
        let dir = scratch("exists");
        std::fs::create_dir_all(&dir).unwrap();
        let taken = dir.join("taken.png");
        std::fs::write(&taken, b"the artist's file").unwrap();
        let request = Txt2ImgRequest::default();
        let cancel = AtomicBool::new(false);
        let mut heard = Heard::default();
        let mut run = SaveEach::new(
            &mut heard,
            &request,
            None,
            "tiny".into(),
            Destination::File {
                path: taken.clone(),
                overwrite: false,
            },
            &cancel,
        );
        run.image(&generated(1));
        assert!(run.error.is_some() && run.saved.is_empty());
        assert!(cancel.load(Ordering::SeqCst), "a failed save stops the run");
        assert_eq!(std::fs::read(&taken).unwrap(), b"the artist's file");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
