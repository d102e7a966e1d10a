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

use crate::checkpoint::weights::Recorder;
use crate::checkpoint::{Checkpoint, KeyMap, SafetensorsFile, Weights, sha256_file};
use crate::error::{Error, Result};
use crate::model::{CACHE_PREFIXES, LoadOptions, Precision, StableDiffusion};

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

/// What the disk cache records beside each entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct EntryMeta {
    format: String,
    version: u32,
    /// Content hash of the checkpoint the weights came from.
    source: String,
    dtype: String,
    encoder: bool,
    bytes: u64,
    crc32: u32,
}

/// One entry of the disk cache, for the settings window.
#[derive(Debug, Clone)]
pub struct DiskEntry {
    pub name: String,
    pub bytes: u64,
    pub last_used: SystemTime,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct HashIndex {
    files: BTreeMap<String, HashRecord>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct HashRecord {
    size: u64,
    modified_ns: u128,
    sha256: String,
}

/// The on-disk cache of converted weights.
#[derive(Debug, Clone)]
pub struct DiskCache {
    dir: PathBuf,
    limit: u64,
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |e| Error::io(what, path, e)
}

fn temp_name(path: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(
        ".tmp-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    path.with_file_name(name)
}

fn crc32_file(path: &Path) -> std::io::Result<(u64, u32)> {
    let mut f = File::open(path)?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        total += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok((total, hasher.finalize()))
}

fn dtype_tag(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        _ => "F32",
    }
}

impl DiskCache {
    pub fn new(dir: impl Into<PathBuf>, limit: u64) -> Self {
        Self {
            dir: dir.into(),
            limit,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn ensure_dir(&self) -> Result<()> {
        fs::create_dir_all(&self.dir).map_err(io("cache folder", &self.dir))
    }

    /// SHA-256 of a file, remembered by path, size and modification time so a checkpoint is hashed
    /// once, not at every launch.
    pub fn file_hash(&self, path: &Path) -> Result<String> {
        let meta = fs::metadata(path).map_err(io("checkpoint", path))?;
        let modified_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let key = fs::canonicalize(path)
            .unwrap_or_else(|_| path.to_path_buf())
            .to_string_lossy()
            .into_owned();
        let index_path = self.dir.join(HASH_INDEX);
        let mut index: HashIndex = fs::read(&index_path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        if let Some(r) = index.files.get(&key) {
            if r.size == meta.len() && r.modified_ns == modified_ns {
                return Ok(r.sha256.clone());
            }
        }
        let sha256 = sha256_file(path)?;
        index.files.insert(
            key,
            HashRecord {
                size: meta.len(),
                modified_ns,
                sha256: sha256.clone(),
            },
        );
        self.ensure_dir()?;
        if let Ok(bytes) = serde_json::to_vec_pretty(&index) {
            // The index only saves time: failing to write it costs a re-hash, nothing else.
            if let Err(e) = crate::image_io::save_atomic(&index_path, &bytes, true) {
                tracing::warn!("cannot update the hash index: {e}");
            }
        }
        Ok(sha256)
    }

    /// The content hash of a checkpoint: its weight files' SHA-256 combined.
    pub fn checkpoint_hash(&self, checkpoint: &Checkpoint) -> Result<String> {
        use sha2::{Digest, Sha256};
        let files = checkpoint.files();
        if let [single] = files[..] {
            return self.file_hash(single);
        }
        let mut h = Sha256::new();
        for f in files {
            h.update(self.file_hash(f)?.as_bytes());
        }
        Ok(hex(&h.finalize()))
    }

    fn stem(source: &str, dtype: DType, encoder: bool) -> String {
        let short = &source[..source.len().min(32)];
        let enc = if encoder { "-enc" } else { "" };
        format!(
            "{short}-{}{enc}-c{CACHE_FORMAT}",
            dtype_tag(dtype).to_lowercase()
        )
    }

    fn paths(&self, stem: &str) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("{stem}.safetensors")),
            self.dir.join(format!("{stem}.json")),
        )
    }

    /// Deletes an entry's files (whatever is left of them).
    fn discard(&self, stem: &str) {
        let (data, meta) = self.paths(stem);
        let _ = fs::remove_file(meta);
        let _ = fs::remove_file(data);
    }

    /// The verified entry for `stem`, or `None`. An entry that fails its checks is deleted.
    fn lookup(&self, stem: &str, expect: &EntryMeta) -> Option<Arc<SafetensorsFile>> {
        let (data, meta_path) = self.paths(stem);
        if !meta_path.exists() {
            if data.exists() {
                tracing::warn!("disk cache: {stem} has no sidecar (interrupted write); rebuilding");
                self.discard(stem);
            }
            return None;
        }
        let check = || -> std::result::Result<SafetensorsFile, String> {
            let meta: EntryMeta = fs::read(&meta_path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))?;
            let same_kind = meta.format == expect.format
                && meta.version == expect.version
                && meta.source == expect.source
                && meta.dtype == expect.dtype
                && meta.encoder == expect.encoder;
            if !same_kind {
                return Err("it was written for another checkpoint or format".into());
            }
            let (bytes, crc) = crc32_file(&data).map_err(|e| e.to_string())?;
            if bytes != meta.bytes {
                return Err(format!("{bytes} bytes, expected {}", meta.bytes));
            }
            if crc != meta.crc32 {
                return Err(format!("checksum {crc:08x}, expected {:08x}", meta.crc32));
            }
            SafetensorsFile::open(&data).map_err(|e| e.to_string())
        };
        match check() {
            Ok(file) => {
                // Last use orders eviction.
                if let Ok(f) = File::options().write(true).open(&meta_path) {
                    let _ = f.set_modified(SystemTime::now());
                }
                Some(Arc::new(file))
            }
            Err(reason) => {
                tracing::warn!("disk cache entry {stem} failed its check ({reason}); rebuilding");
                self.discard(stem);
                None
            }
        }
    }

    /// Every complete entry, least recently used first.
    pub fn entries(&self) -> Vec<DiskEntry> {
        let Ok(dir) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out: Vec<DiskEntry> = dir
            .flatten()
            .filter_map(|e| {
                let path = e.path();
                if path.extension()? != "json" || path.file_name()? == HASH_INDEX {
                    return None;
                }
                let stem = path.file_stem()?.to_string_lossy().into_owned();
                let data = self.paths(&stem).0;
                let bytes = fs::metadata(&data).ok()?.len();
                let last_used = fs::metadata(&path).and_then(|m| m.modified()).ok()?;
                Some(DiskEntry {
                    name: stem,
                    bytes,
                    last_used,
                })
            })
            .collect();
        out.sort_by_key(|e| e.last_used);
        out
    }

    pub fn total_bytes(&self) -> u64 {
        self.entries().iter().map(|e| e.bytes).sum()
    }

    /// Deletes every entry, the hash index and leftovers of interrupted writes; returns the bytes
    /// freed.
    pub fn clear(&self) -> Result<u64> {
        let Ok(dir) = fs::read_dir(&self.dir) else {
            return Ok(0);
        };
        let mut freed = 0;
        for e in dir.flatten() {
            let path = e.path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            let ours =
                name.ends_with(".safetensors") || name.ends_with(".json") || name.contains(".tmp-");
            if ours && path.is_file() {
                freed += e.metadata().map(|m| m.len()).unwrap_or(0);
                fs::remove_file(&path).map_err(io("cache file", &path))?;
            }
        }
        Ok(freed)
    }

    /// Deletes least recently used entries until the cache fits its limit, sparing `keep`.
    fn enforce_limit(&self, keep: &str) {
        let entries = self.entries();
        let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
        for e in entries {
            if total <= self.limit {
                break;
            }
            if e.name != keep {
                tracing::info!(entry = %e.name, bytes = e.bytes, "disk cache: evicting");
                self.discard(&e.name);
                total = total.saturating_sub(e.bytes);
            }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Streams the tensors of one load into a new cache entry.
struct EntryWriter {
    data_path: PathBuf,
    data: Option<BufWriter<File>>,
    tensors: BTreeMap<String, (String, Vec<usize>, u64, u64)>,
    offset: u64,
    error: Option<String>,
}

impl EntryWriter {
    fn new(cache: &DiskCache, stem: &str) -> Result<Self> {
        cache.ensure_dir()?;
        let data_path = temp_name(&cache.dir.join(format!("{stem}.data")));
        let file = File::create(&data_path).map_err(io("cache file", &data_path))?;
        Ok(Self {
            data_path,
            data: Some(BufWriter::new(file)),
            tensors: BTreeMap::new(),
            offset: 0,
            error: None,
        })
    }

    fn push(&mut self, name: &str, shape: &[usize], dtype: DType, bytes: &[u8]) {
        if self.error.is_some() {
            return;
        }
        let Some(data) = self.data.as_mut() else {
            return;
        };
        if let Err(e) = data.write_all(bytes) {
            self.error = Some(e.to_string());
            return;
        }
        let start = self.offset;
        self.offset += bytes.len() as u64;
        self.tensors.insert(
            name.to_string(),
            (
                dtype_tag(dtype).to_string(),
                shape.to_vec(),
                start,
                self.offset,
            ),
        );
    }

    /// Assembles `<stem>.safetensors` (header, then the data), then its sidecar.
    fn finish(mut self, cache: &DiskCache, stem: &str, mut meta: EntryMeta) -> Result<u64> {
        let (final_path, meta_path) = cache.paths(stem);
        let result = (|| -> std::result::Result<u64, String> {
            if let Some(e) = self.error.take() {
                return Err(e);
            }
            let data = self.data.take().ok_or("no data")?;
            data.into_inner()
                .map_err(|e| e.to_string())?
                .sync_all()
                .map_err(|e| e.to_string())?;
            let mut header = serde_json::Map::new();
            header.insert(
                "__metadata__".into(),
                serde_json::json!({ "format": FORMAT_TAG }),
            );
            for (name, (dtype, shape, start, end)) in &self.tensors {
                header.insert(
                    name.clone(),
                    serde_json::json!({ "dtype": dtype, "shape": shape, "data_offsets": [start, end] }),
                );
            }
            let mut header = serde_json::to_vec(&header).map_err(|e| e.to_string())?;
            while header.len() % 8 != 0 {
                header.push(b' ');
            }
            let total = 8 + header.len() as u64 + self.offset;
            if total > cache.limit {
                return Err(format!(
                    "the entry ({total} bytes) is larger than the cache limit ({} bytes)",
                    cache.limit
                ));
            }
            let tmp = temp_name(&final_path);
            let written = (|| -> std::io::Result<u32> {
                let mut out = BufWriter::new(File::create(&tmp)?);
                let mut crc = crc32fast::Hasher::new();
                let len = (header.len() as u64).to_le_bytes();
                for part in [&len[..], &header[..]] {
                    crc.update(part);
                    out.write_all(part)?;
                }
                let mut src = File::open(&self.data_path)?;
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let n = src.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    crc.update(&buf[..n]);
                    out.write_all(&buf[..n])?;
                }
                let file = out.into_inner().map_err(|e| e.into_error())?;
                file.sync_all()?;
                fs::rename(&tmp, &final_path)?;
                Ok(crc.finalize())
            })();
            let crc = written.map_err(|e| {
                let _ = fs::remove_file(&tmp);
                e.to_string()
            })?;
            meta.bytes = total;
            meta.crc32 = crc;
            let json = serde_json::to_vec_pretty(&meta).map_err(|e| e.to_string())?;
            crate::image_io::save_atomic(&meta_path, &json, true).map_err(|e| e.to_string())?;
            Ok(total)
        })();
        let _ = fs::remove_file(&self.data_path);
        match result {
            Ok(total) => {
                cache.enforce_limit(stem);
                Ok(total)
            }
            Err(reason) => {
                cache.discard(stem);
                Err(Error::write(
                    "disk cache entry",
                    final_path,
                    std::io::Error::other(reason),
                ))
            }
        }
    }
}

impl Drop for EntryWriter {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.data_path);
    }
}

/// Loads a model through the disk cache: its verified entry when there is one, otherwise the
/// checkpoint, writing a new entry on the way. A cache problem is logged and never fails a load
/// the checkpoint alone would have served.
pub fn load_through_disk(
    cache: &DiskCache,
    checkpoint: &Checkpoint,
    device: &Device,
    options: LoadOptions,
) -> Result<(StableDiffusion, LoadSource)> {
    let dtype = options.precision.dtype();
    let source = match cache.checkpoint_hash(checkpoint) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!("disk cache skipped: {e}");
            return Ok((
                StableDiffusion::load(checkpoint, device, options)?,
                LoadSource::Checkpoint,
            ));
        }
    };
    let stem = DiskCache::stem(&source, dtype, options.vae_encoder);
    let expect = EntryMeta {
        format: FORMAT_TAG.into(),
        version: CACHE_FORMAT,
        source,
        dtype: dtype_tag(dtype).into(),
        encoder: options.vae_encoder,
        bytes: 0,
        crc32: 0,
    };
    if let Some(file) = cache.lookup(&stem, &expect) {
        let t = Instant::now();
        let weights = CACHE_PREFIXES.map(|prefix| {
            let map: KeyMap = Arc::new(move |n: &str| format!("{prefix}{n}"));
            Weights::from_file("cached weights", file.clone(), map, device, dtype)
        });
        match StableDiffusion::from_weights(
            weights,
            CACHE_PREFIXES,
            &checkpoint.config,
            device,
            options,
        ) {
            Ok(model) => {
                tracing::info!(entry = %stem, secs = t.elapsed().as_secs_f64(), "loaded from the disk cache");
                return Ok((model, LoadSource::DiskCache));
            }
            Err(e) => {
                tracing::warn!("disk cache entry {stem} unusable ({e}); rebuilding");
                cache.discard(&stem);
            }
        }
    }
    let writer = match EntryWriter::new(cache, &stem) {
        Ok(w) => Some(Rc::new(RefCell::new(w))),
        Err(e) => {
            tracing::warn!("disk cache not written: {e}");
            None
        }
    };
    let model = match &writer {
        Some(w) => {
            let w = w.clone();
            let recorder: Recorder = Rc::new(RefCell::new(
                move |name: &str, shape: &[usize], dtype: DType, bytes: &[u8]| {
                    w.borrow_mut().push(name, shape, dtype, bytes)
                },
            ));
            StableDiffusion::load_recorded(checkpoint, device, options, recorder)?
        }
        None => StableDiffusion::load(checkpoint, device, options)?,
    };
    if let Some(w) = writer.and_then(|w| Rc::try_unwrap(w).ok()) {
        match w.into_inner().finish(cache, &stem, expect) {
            Ok(bytes) => tracing::info!(entry = %stem, bytes, "disk cache entry written"),
            Err(e) => tracing::warn!("disk cache entry not kept: {e}"),
        }
    }
    Ok((model, LoadSource::Checkpoint))
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
}

impl ModelCache {
    pub fn new(settings: CacheSettings) -> Self {
        Self {
            settings,
            resident: Vec::new(),
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
            r.path == path && r.precision == options.precision && r.device == device_key
        }) {
            let r = self.resident.remove(i);
            let out = (r.model.clone(), r.checkpoint.clone(), LoadSource::Memory);
            self.resident.push(r);
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
                bytes: model.weight_bytes(),
            });
            self.evict_to(self.settings.memory_budget, true);
        }
        Ok((model, checkpoint, source))
    }

    /// A1111's short hash of a checkpoint, from the disk cache's hash index when the cache is on.
    pub fn short_hash(&self, checkpoint: &Checkpoint) -> Option<String> {
        match self.disk() {
            Some(disk) => disk
                .file_hash(checkpoint.unet_file())
                .ok()
                .map(|h| h[..10].to_string()),
            None => checkpoint.short_hash().ok(),
        }
    }
}
