//! The disk cache: entries keyed by content hash, dtype and format, checked by size and CRC-32
//! before use, bounded in size (oldest out), and the index of checkpoint hashes.

use super::*;

/// What the disk cache records beside each entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct EntryMeta {
    pub(super) format: String,
    pub(super) version: u32,
    /// Content hash of the checkpoint the weights came from.
    pub(super) source: String,
    pub(super) dtype: String,
    pub(super) encoder: bool,
    pub(super) bytes: u64,
    pub(super) crc32: u32,
}

/// One entry of the disk cache, for the settings window.
#[derive(Debug, Clone)]
pub struct DiskEntry {
    pub name: String,
    pub bytes: u64,
    pub last_used: SystemTime,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct HashIndex {
    pub(super) files: BTreeMap<String, HashRecord>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct HashRecord {
    pub(super) size: u64,
    pub(super) modified_ns: u128,
    sha256: String,
}

/// What tells a file's content changed without reading it: its canonical path, size and
/// modification time (the hash index's key and check).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FileStamp {
    pub(super) key: String,
    pub(super) size: u64,
    pub(super) modified_ns: u128,
}

impl FileStamp {
    pub(super) fn of(path: &Path) -> Result<Self> {
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
        Ok(Self {
            key,
            size: meta.len(),
            modified_ns,
        })
    }
}

/// The on-disk cache of converted weights.
#[derive(Debug, Clone)]
pub struct DiskCache {
    pub(super) dir: PathBuf,
    pub(super) limit: u64,
}

pub(super) fn io<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |e| Error::io(what, path, e)
}

pub(super) fn temp_name(path: &Path) -> PathBuf {
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

pub(super) fn crc32_file(path: &Path) -> std::io::Result<(u64, u32)> {
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

pub(super) fn dtype_tag(dtype: DType) -> &'static str {
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

    pub(super) fn ensure_dir(&self) -> Result<()> {
        fs::create_dir_all(&self.dir).map_err(io("cache folder", &self.dir))
    }

    /// SHA-256 of a file, remembered by path, size and modification time so a checkpoint is hashed
    /// once, not at every launch.
    pub fn file_hash(&self, path: &Path) -> Result<String> {
        let FileStamp {
            key,
            size,
            modified_ns,
        } = FileStamp::of(path)?;
        let index_path = self.dir.join(HASH_INDEX);
        let mut index: HashIndex = fs::read(&index_path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        if let Some(r) = index.files.get(&key)
            && r.size == size
            && r.modified_ns == modified_ns
        {
            return Ok(r.sha256.clone());
        }
        let sha256 = sha256_file(path)?;
        index.files.insert(
            key,
            HashRecord {
                size,
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

    pub(super) fn stem(source: &str, dtype: DType, encoder: bool) -> String {
        let short = &source[..source.len().min(32)];
        let enc = if encoder { "-enc" } else { "" };
        format!(
            "{short}-{}{enc}-c{CACHE_FORMAT}",
            dtype_tag(dtype).to_lowercase()
        )
    }

    pub(super) fn paths(&self, stem: &str) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("{stem}.safetensors")),
            self.dir.join(format!("{stem}.json")),
        )
    }

    /// Deletes an entry's files (whatever is left of them).
    pub(super) fn discard(&self, stem: &str) {
        let (data, meta) = self.paths(stem);
        let _ = fs::remove_file(meta);
        let _ = fs::remove_file(data);
    }

    /// The verified entry for `stem`, or `None`. An entry that fails its checks is deleted.
    pub(super) fn lookup(&self, stem: &str, expect: &EntryMeta) -> Option<Arc<SafetensorsFile>> {
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
    pub(super) fn enforce_limit(&self, keep: &str) {
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

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
