//! The model cache: loaded models kept resident between generations and across model switches up
//! to a memory budget (least recently used first out), and converted weights written to a disk
//! cache keyed by the checkpoint's content hash, dtype and cache format, so the next launch loads
//! the exact bytes it uploaded last time. With the cache off, every request loads from the
//! checkpoint and nothing is written to the cache folder.
//!
//! A disk entry is `<key>.safetensors` (tensors named `unet.…`, `vae.…`, `text_encoder.…`, already
//! in the target dtype) plus `<key>.json`, written last, holding its size and CRC-32. An entry
//! whose sidecar is missing, or whose size or checksum disagree, is deleted and rebuilt, never
//! used.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use burn::tensor::{DType, Device};
use serde::{Deserialize, Serialize};

use crate::checkpoint::{Checkpoint, KeyMap, SafetensorsFile, Weights, sha256_file};
use crate::error::{Error, Result};
use crate::stable_diffusion::{
    CACHE_PREFIX_TE2, CACHE_PREFIXES, LoadOptions, Precision, StableDiffusion, TextEncoders,
};
use crate::weights::Recorder;

// The disk cache (entries, their checks, the hash index) and the writer that fills it live beside
// this file.
mod disk;
mod writer;

pub use disk::{DiskCache, DiskEntry};
use disk::{EntryMeta, FileStamp};
pub use writer::load_through_disk;

/// Bumped whenever what a cache entry holds changes meaning (names, layout, conversions).
pub const CACHE_FORMAT: u32 = 1;
const FORMAT_TAG: &str = "latent-studio-weights";
const HASH_INDEX: &str = "hashes.json";

/// The cache settings, as the studio and `--model-cache` set them.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheSettings {
    pub enabled: bool,
    /// Bytes of weights kept resident across models (the device memory they occupy).
    pub memory_budget: u64,
    /// The disk cache folder; `None` keeps the cache in memory only.
    pub disk_dir: Option<PathBuf>,
    /// Upper bound of the disk cache's size; the least recently used entries go first.
    pub disk_limit: u64,
}

impl CacheSettings {
    /// Cache off: load from the checkpoint every time, write nothing.
    pub fn off() -> Self {
        Self {
            enabled: false,
            memory_budget: 0,
            disk_dir: None,
            disk_limit: 0,
        }
    }

    /// Cache on (`enabled` false keeps the sizes for when it is turned on): resident models up
    /// to `memory_gib` (`None`: no limit) and converted weights in `disk_dir` up to `disk_gib`,
    /// in GiB as the front ends take them (a negative or NaN size is 0).
    pub fn sized(enabled: bool, memory_gib: Option<f64>, disk_dir: PathBuf, disk_gib: f64) -> Self {
        /// GiB to bytes, saturating.
        fn bytes(gib: f64) -> u64 {
            match gib.is_nan() {
                true => 0,
                false => (gib.max(0.0) * (1u64 << 30) as f64) as u64,
            }
        }
        Self {
            enabled,
            memory_budget: memory_gib.map_or(u64::MAX, bytes),
            disk_dir: Some(disk_dir),
            disk_limit: bytes(disk_gib),
        }
    }
}

/// Where a model came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadSource {
    /// Already resident.
    Memory,
    /// The disk cache's converted weights.
    DiskCache,
    /// The checkpoint itself.
    Checkpoint,
}

/// A model held by the cache.
pub struct Resident {
    pub model: Arc<StableDiffusion>,
    pub checkpoint: Arc<Checkpoint>,
    pub path: PathBuf,
    pub precision: Precision,
    device: String,
    pub bytes: u64,
}

/// Resident models (LRU, within a budget) in front of the disk cache.
pub struct ModelCache {
    settings: CacheSettings,
    /// Least recently used first.
    resident: Vec<Resident>,
    /// Checkpoint hashes of this process, by file stamp, for when there is no disk cache to keep
    /// them: a multi-GB checkpoint is read once, not at every generation.
    hashes: std::sync::Mutex<Vec<(FileStamp, String)>>,
}

impl ModelCache {
    pub fn new(settings: CacheSettings) -> Self {
        Self {
            settings,
            resident: Vec::new(),
            hashes: Default::default(),
        }
    }

    pub fn settings(&self) -> &CacheSettings {
        &self.settings
    }

    /// Applies new settings: off releases every resident model, a smaller budget evicts.
    pub fn configure(&mut self, settings: CacheSettings) {
        self.settings = settings;
        if !self.settings.enabled {
            self.resident.clear();
        } else {
            self.evict_to(self.settings.memory_budget, true);
        }
    }

    fn disk(&self) -> Option<DiskCache> {
        match (&self.settings.disk_dir, self.settings.enabled) {
            (Some(dir), true) => Some(DiskCache::new(dir, self.settings.disk_limit)),
            _ => None,
        }
    }

    /// The disk cache, when the cache is on and has a folder.
    pub fn disk_cache(&self) -> Option<DiskCache> {
        self.disk()
    }

    /// Evicts least recently used models until at most `budget` bytes stay resident; with
    /// `spare_newest` the most recently used one stays even if it alone exceeds the budget.
    fn evict_to(&mut self, budget: u64, spare_newest: bool) {
        let floor = usize::from(spare_newest);
        while self.resident_bytes() > budget && self.resident.len() > floor {
            let gone = self.resident.remove(0);
            tracing::info!(model = %gone.path.display(), bytes = gone.bytes, "model cache: evicting");
        }
    }

    pub fn resident_bytes(&self) -> u64 {
        self.resident.iter().map(|r| r.bytes).sum()
    }

    /// `(name, bytes)` of every resident model, least recently used first.
    pub fn resident(&self) -> Vec<(String, u64)> {
        self.resident
            .iter()
            .map(|r| (r.checkpoint.display_name(), r.bytes))
            .collect()
    }

    /// Drops every resident model.
    pub fn release_all(&mut self) {
        self.resident.clear();
    }

    /// Releases the resident models whose encoders `text_encoders` would put elsewhere (the
    /// device memory parking frees); the others stay and serve requests with that setting.
    pub fn release_other_parking(&mut self, text_encoders: TextEncoders) {
        self.resident.retain(|r| r.model.parks_as(text_encoders));
    }

    /// The model at `path` on `device`: resident, from the disk cache, or loaded from the
    /// checkpoint. With the cache off nothing is kept: the caller's `Arc` is the only owner.
    pub fn get(
        &mut self,
        path: &Path,
        device: &Device,
        options: LoadOptions,
    ) -> Result<(Arc<StableDiffusion>, Arc<Checkpoint>, LoadSource)> {
        let device_key = format!("{device:?}");
        if let Some(i) = self.resident.iter().position(|r| {
            r.path == path
                && r.precision == options.precision
                && r.model.parks_as(options.text_encoders)
                && r.device == device_key
        }) {
            let r = self.resident.remove(i);
            let out = (r.model.clone(), r.checkpoint.clone(), LoadSource::Memory);
            self.resident.push(r);
            self.keep_steps_of(&out.0);
            return Ok(out);
        }
        let checkpoint = Arc::new(Checkpoint::open(path)?);
        if self.settings.enabled {
            // Make room first: the old models and the new one may not fit together.
            let wanted = checkpoint.stored_bytes();
            let budget = self.settings.memory_budget.saturating_sub(wanted);
            self.evict_to(budget, false);
        } else {
            self.resident.clear();
        }
        let (model, source) = match self.disk() {
            Some(disk) => load_through_disk(&disk, &checkpoint, device, options)?,
            None => (
                StableDiffusion::load(&checkpoint, device, options)?,
                LoadSource::Checkpoint,
            ),
        };
        let model = Arc::new(model);
        if self.settings.enabled {
            self.resident.push(Resident {
                model: model.clone(),
                checkpoint: checkpoint.clone(),
                path: path.to_path_buf(),
                precision: options.precision,
                device: device_key,
                // The budget is device memory: parked encoders wait in host memory.
                bytes: model.device_weight_bytes(),
            });
            self.evict_to(self.settings.memory_budget, true);
        }
        self.keep_steps_of(&model);
        Ok((model, checkpoint, source))
    }

    /// Releases the recorded UNet steps and VAE decodes the other resident models keep between
    /// generations (the pool pages each holds): only the model in use keeps them.
    fn keep_steps_of(&self, model: &Arc<StableDiffusion>) {
        for r in &self.resident {
            if !Arc::ptr_eq(&r.model, model) {
                r.model.release_parked_steps();
            }
        }
    }

    /// A1111's short model hash: the first 10 hex digits of the SHA-256 of the weights file (the
    /// UNet file for diffusers folders), from the disk cache's hash index when the cache is on,
    /// else remembered for this process ([`Self::remembered_hash`]).
    pub fn short_hash(&self, checkpoint: &Checkpoint) -> Option<String> {
        let path = checkpoint.unet_file();
        let hash = match self.disk() {
            Some(disk) => disk.file_hash(path),
            None => self.remembered_hash(path),
        };
        hash.ok().map(|mut h| {
            h.truncate(10);
            h
        })
    }

    /// SHA-256 of `path`, read once per content (stamp) in this process.
    fn remembered_hash(&self, path: &Path) -> Result<String> {
        let stamp = FileStamp::of(path)?;
        let mut hashes = self.hashes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, hash)) = hashes.iter().find(|(s, _)| *s == stamp) {
            return Ok(hash.clone());
        }
        let hash = sha256_file(path)?;
        // A rewritten file's old hash goes; the list stays one entry per file.
        hashes.retain(|(s, _)| s.key != stamp.key);
        hashes.push((stamp, hash.clone()));
        Ok(hash)
    }

    /// How many files' hashes this process remembers (tests).
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.hashes.lock().map_or(0, |h| h.len())
    }
}

#[cfg(test)]
mod tests {
    use super::{CacheSettings, ModelCache};

    /// Sizes in GiB become bytes; no memory limit is the largest; a bad size is none.
    #[test]
    fn sizes_are_read_in_gib() {
        let dir = std::path::PathBuf::from("cache");
        let s = CacheSettings::sized(true, Some(1.5), dir.clone(), 20.0);
        assert_eq!((s.memory_budget, s.disk_limit), (3 << 29, 20 << 30));
        assert_eq!(s.disk_dir.as_deref(), Some(dir.as_path()));
        let s = CacheSettings::sized(false, None, dir.clone(), f64::NAN);
        assert_eq!(
            (s.enabled, s.memory_budget, s.disk_limit),
            (false, u64::MAX, 0)
        );
        assert_eq!(
            CacheSettings::sized(true, Some(-3.0), dir, 1e30).memory_budget,
            0
        );
    }

    /// Without a disk cache the hash is read once per file content, and again after a rewrite.
    #[test]
    fn hashes_are_remembered_until_the_file_changes() {
        let dir = std::env::temp_dir().join(format!("latent-hash-memo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("model.safetensors");
        std::fs::write(&file, b"first").expect("write");
        let cache = ModelCache::new(CacheSettings::off());
        let first = cache.remembered_hash(&file).expect("hash");
        assert_eq!(first, crate::checkpoint::sha256_file(&file).expect("hash"));
        assert_eq!(cache.remembered_hash(&file).expect("hash"), first);
        assert_eq!(cache.remembered(), 1);
        std::fs::write(&file, b"second, longer").expect("write");
        let second = cache.remembered_hash(&file).expect("hash");
        assert_ne!(second, first, "a rewritten file is hashed again");
        assert_eq!(cache.remembered(), 1, "its old hash is forgotten");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
