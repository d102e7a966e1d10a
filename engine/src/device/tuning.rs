//! Kernel tuning kept across launches.
//!
//! burn's and cubecl's kernels autotune per shape on a GPU: the first pass at a size times every
//! candidate (SD 1.5 took minutes on a fresh H100, SDXL's first 1024² txt2img 99 s), and without
//! this the artist would wait again at every launch. cubecl's tuner writes each result through to
//! a persistent store; its database backend (`turso`) is too heavy to build here, so our patch
//! (patches/README.md) keeps those stores in process memory, and this module saves them to one
//! file per adapter and puts them back before the adapter's first kernel runs. cubecl checks each
//! restored result against its current candidate list (a checksum) and tunes again on mismatch,
//! so a file from another build is harmless.
//!
//! With a folder set, cubecl also keeps the SPIR-V it generates for each kernel in such a store
//! (its `compilation.cache` setting; keyed by the kernel and the binary's build id, so another
//! build never reuses it), and the file carries it too: a launch then skips generating SPIR-V
//! for every kernel an earlier one compiled. Each such entry is saved with its build id and only
//! the running build's are restored, so the next save drops another build's (a new version's
//! first launch sheds the old one's megabytes). WGSL is compiled by the driver and not kept.
//!
//! The file also names the pass shapes (model, size, batch, precision) already tuned, so the front
//! ends only announce "tuning kernels" when it will happen. Nothing here can fail a generation: a
//! missing or corrupt file is an empty one (with a warning), and a failed save is logged.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use cubecl_environment::bytes::Bytes;
use cubecl_environment::persistence::{MemoryStorage, Origin, open};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The file layout's version: another one is ignored (and replaced at the next save).
const FORMAT: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
struct TuningFile {
    format: u32,
    /// The adapter, driver and compiler the results were measured on, for whoever opens the file.
    adapter: String,
    /// [`crate::pipeline`]'s pass shapes whose kernels are tuned.
    shapes: BTreeSet<String>,
    entries: Vec<Entry>,
}

/// One entry of one of cubecl's stores, as it holds them (CBOR bytes), in hex.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    namespace: String,
    key: String,
    value: String,
    /// A compiled kernel's build ([`build_id`]); none for a tuning result, which cubecl checks
    /// itself (a checksum of the candidates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    build: Option<String>,
}

/// Whether `namespace` is one of cubecl's measurement stores, valid whatever our build: its
/// tuning results (`autotune/…`, each checked by cubecl against its candidates) and the
/// device's measured memory and compute throughput (`throughput/…`, versioned by cubecl's probes
/// and keyed by the device), not a store of compiled kernels (`vulkan/…/spirv_…`). A throughput
/// point costs about a second and a buffer of 1–2 GiB beside the model the first time a tune
/// asks for it (BENCHMARKS.md, forty-sixth session): kept across builds, a new version's first
/// launch measures none again.
fn is_tuning(namespace: &str) -> bool {
    namespace.starts_with("autotune/") || namespace.starts_with("throughput/")
}

/// The running binary's build, as cubecl keys the kernels it compiles.
fn build_id() -> String {
    format!("{:032x}", cubecl_server::compiler::build_id_hash())
}

#[derive(Debug, Default)]
struct State {
    folder: Option<PathBuf>,
    /// The open adapter's file, once [`restore`] ran.
    file: Option<PathBuf>,
    adapter: String,
    /// What the restore put back (reported as is, whatever was saved since).
    restored: Restored,
    /// Entries and shapes the file holds (restored or last saved).
    saved_entries: usize,
    /// Compiled kernels of other builds the file holds, not restored: the next save drops them.
    stale: usize,
    shapes: BTreeSet<String>,
    saved_shapes: usize,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn with_state<T>(f: impl FnOnce(&mut State) -> T) -> T {
    let mut guard = STATE.lock().unwrap_or_else(|p| p.into_inner());
    f(guard.get_or_insert_with(State::default))
}

/// Where tuning files live; `None` keeps tuning in memory only. Front ends call this before
/// opening a device; the engine's tests leave it unset.
pub fn set_folder(folder: Option<PathBuf>) {
    // `LATENT_STUDIO_KEEP_SPIRV=0` keeps the tuning only (to measure what the SPIR-V saves).
    if folder.is_some() && std::env::var("LATENT_STUDIO_KEEP_SPIRV").as_deref() != Ok("0") {
        keep_generated_spirv();
    }
    with_state(|s| s.folder = folder);
}

/// Turns on cubecl's SPIR-V store (`compilation.cache`), keeping the rest of its configuration
/// as its files and environment give it. Only before cubecl first reads its configuration.
fn keep_generated_spirv() {
    use cubecl_runtime::config::{CubeClRuntimeConfig, RuntimeConfig};
    let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    config.compilation.cache = true;
    if !CubeClRuntimeConfig::try_set(config) {
        tracing::debug!("cubecl's configuration was already read: generated SPIR-V is not kept");
    }
}

/// What a restore found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Restored {
    pub entries: usize,
    pub shapes: usize,
}

/// Restores the file of the adapter `identity` names (name, backend, driver, compiler) into
/// cubecl's stores. Called where a GPU device is opened, before its first kernel: a tuner reads
/// its store once, when it is first used. Once per process; later calls return what the first
/// restored.
pub(crate) fn restore(identity: &str) -> Restored {
    with_state(|s| {
        let Some(folder) = s.folder.clone() else {
            return Restored::default();
        };
        if s.file.is_some() {
            return s.restored;
        }
        let path = folder.join(file_name(identity));
        s.file = Some(path.clone());
        s.adapter = identity.to_string();
        let file = match read(&path) {
            Ok(Some(file)) => file,
            Ok(None) => return Restored::default(),
            Err(e) => {
                tracing::warn!("kernel tuning not restored: {e}");
                return Restored::default();
            }
        };
        let (entries, stale) = import(&file.entries, &build_id());
        if stale > 0 {
            tracing::info!("{stale} kernels compiled by another build are dropped from the file");
        }
        s.saved_entries = entries;
        s.stale = stale;
        s.saved_shapes = file.shapes.len();
        s.shapes = file.shapes;
        s.restored = Restored {
            entries,
            shapes: s.saved_shapes,
        };
        tracing::info!(
            "kernel tuning restored from {}: {entries} results, {} pass shapes",
            path.display(),
            s.saved_shapes
        );
        s.restored
    })
}

/// What the open adapter's restore put back (zeros before one, or without a folder).
pub fn restored() -> Restored {
    with_state(|s| s.restored)
}

/// Whether a pass of this shape ran, and so tuned its kernels, in a launch whose tuning was saved.
pub(crate) fn shape_is_tuned(shape: &str) -> bool {
    with_state(|s| s.shapes.contains(shape))
}

/// Notes a pass shape whose kernels this process has tuned (saved by the next [`save`]).
pub(crate) fn shape_tuned(shape: &str) {
    with_state(|s| {
        s.shapes.insert(shape.to_string());
    })
}

/// Writes the open adapter's file when this process tuned something new: `Ok(None)` when there
/// was nothing to write (no folder, no GPU opened, nothing new), else the number of results saved.
pub fn save() -> Result<Option<usize>> {
    with_state(|s| {
        let Some(path) = s.file.clone() else {
            return Ok(None);
        };
        // Counted before anything is encoded: most generations add nothing, and the file's
        // SPIR-V runs to megabytes.
        if count() <= s.saved_entries && s.shapes.len() <= s.saved_shapes && s.stale == 0 {
            return Ok(None);
        }
        let entries = collect(&build_id());
        let file = TuningFile {
            format: FORMAT,
            adapter: s.adapter.clone(),
            shapes: s.shapes.clone(),
            entries,
        };
        let json = serde_json::to_vec(&file)
            .map_err(|e| Error::Device(format!("cannot encode the kernel tuning: {e}")))?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::write("tuning folder", dir, e))?;
        }
        crate::io::atomic::save_atomic(&path, &json, true)?;
        s.saved_entries = file.entries.len();
        s.saved_shapes = file.shapes.len();
        s.stale = 0;
        Ok(Some(s.saved_entries))
    })
}

/// [`save`], with a failure logged rather than returned: the generation that tuned is done.
pub(crate) fn save_quietly() {
    match save() {
        Ok(Some(n)) => tracing::debug!("kernel tuning saved: {n} results"),
        Ok(None) => {}
        Err(e) => tracing::warn!("kernel tuning not saved: {e}"),
    }
}

/// `<adapter>-<hash>.json`: readable, and distinct per adapter, driver, compiler and build.
fn file_name(identity: &str) -> String {
    let versioned = format!("{identity}|engine {}", env!("CARGO_PKG_VERSION"));
    let hash = Sha256::digest(versioned.as_bytes());
    let short: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
    let name: String = identity
        .split('|')
        .next()
        .unwrap_or("gpu")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(48)
        .collect();
    format!("{name}-{short}.json")
}

/// The file at `path`: `None` when there is none or it is of another format.
fn read(path: &Path) -> Result<Option<TuningFile>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("kernel tuning file", path, e)),
    };
    let file: TuningFile = serde_json::from_slice(&bytes).map_err(|e| {
        Error::Device(format!(
            "{} is not a kernel tuning file ({e}); it will be replaced",
            path.display()
        ))
    })?;
    Ok((file.format == FORMAT).then_some(file))
}

/// How many entries cubecl's stores hold in this process.
fn count() -> usize {
    MemoryStorage::namespaces()
        .iter()
        .map(|s| s.entries as usize)
        .sum()
}

/// Every entry of every store cubecl holds in this process, sorted (a stable file); compiled
/// kernels are `build`'s (only the running build's are ever restored).
fn collect(build: &str) -> Vec<Entry> {
    let mut entries = Vec::new();
    for summary in MemoryStorage::namespaces() {
        let storage = open(&summary.namespace);
        let build = (!is_tuning(&summary.namespace)).then(|| build.to_string());
        storage.scan(&mut |key, value| {
            entries.push(Entry {
                namespace: summary.namespace.clone(),
                key: hex(key),
                value: hex(value),
                build: build.clone(),
            })
        });
    }
    entries.sort();
    entries
}

/// Puts `entries` into cubecl's stores as imported: a result this process measures replaces one.
/// Compiled kernels of a build other than `build` are left out (cubecl would never read them).
/// Returns how many were stored (a malformed one is skipped) and how many were another build's.
fn import(entries: &[Entry], build: &str) -> (usize, usize) {
    let mut stored = 0;
    let mut stale = 0;
    for e in entries {
        if !is_tuning(&e.namespace) && e.build.as_deref() != Some(build) {
            stale += 1;
            continue;
        }
        let (Some(key), Some(value)) = (unhex(&e.key), unhex(&e.value)) else {
            continue;
        };
        let storage = open(&e.namespace);
        if let cubecl_environment::persistence::Insertion::Stored =
            storage.insert(&key, Bytes::from_bytes_vec(value), Origin::Imported)
        {
            stored += 1;
        }
    }
    (stored, stale)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_garbage() {
        let bytes = [0u8, 1, 0x7f, 0x80, 0xff];
        assert_eq!(unhex(&hex(&bytes)).as_deref(), Some(&bytes[..]));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex("é1"), None);
    }

    /// Entries go into cubecl's stores and come back out of them: what `save` writes is what
    /// `restore` puts back, in the namespaces cubecl's tuners open. A compiled kernel comes back
    /// with its build; another build's is not restored (and so not written again); tuning
    /// results and throughput points come back whatever build saved them.
    #[test]
    fn entries_survive_a_round_trip_through_the_stores() {
        let entry = |namespace: &str, key: &[u8], build: Option<&str>| Entry {
            namespace: namespace.into(),
            key: hex(key),
            value: hex(b"value"),
            build: build.map(str::to_string),
        };
        let ours = build_id();
        let kept = vec![
            entry("autotune/latent-test/a", b"key-1", None),
            entry("autotune/latent-test/b", b"key-2", None),
            // A measured throughput point, whatever build saved it.
            entry("throughput/latent-test/probe", b"point-1", None),
            entry("vulkan/latent-test/spirv_1_2", b"kernel-1", Some(&ours)),
        ];
        let stale = [
            entry("vulkan/latent-test/spirv_1_2", b"kernel-2", Some("0123")),
            entry("vulkan/latent-test/spirv_1_2", b"kernel-3", None),
        ];
        let all: Vec<Entry> = kept.iter().chain(&stale).cloned().collect();
        assert_eq!(import(&all, &ours), (4, 2));
        let back: Vec<Entry> = collect(&ours)
            .into_iter()
            .filter(|e| e.namespace.contains("latent-test"))
            .collect();
        assert_eq!(back, kept);
        assert_eq!(count(), collect(&ours).len());
        assert!(is_tuning("autotune/0.11.3/x") && !is_tuning("vulkan/0.11.3/spirv_4318_9"));
        assert!(is_tuning("throughput/0.11.3/probe-v3/wgpu-nvidia-h200"));
    }

    #[test]
    fn file_names_are_per_identity_and_readable() {
        let a = file_name("NVIDIA H200|Vulkan|580.159.04|SPIR-V");
        let b = file_name("NVIDIA H200|Vulkan|580.159.04|WGSL");
        assert_ne!(a, b);
        assert!(a.starts_with("NVIDIA-H200-") && a.ends_with(".json"), "{a}");
    }

    #[test]
    fn a_corrupt_or_foreign_file_is_not_restored() {
        let dir = std::env::temp_dir().join(format!("latent-tuning-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.json");
        std::fs::write(&path, b"{not json").unwrap();
        assert!(read(&path).is_err());
        std::fs::write(
            &path,
            br#"{"format":999,"adapter":"x","shapes":[],"entries":[]}"#,
        )
        .unwrap();
        assert!(read(&path).unwrap().is_none());
        assert!(read(&dir.join("absent.json")).unwrap().is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
