//! Adapter probes and their remembered verdicts.
//!
//! A driver can crash the process (a segfault in pipeline creation) or hang while opening a device
//! or compiling kernels. The studio therefore tries a new adapter once in a child process (the
//! binary re-invoking itself as `latent-studio probe --adapter N`, which runs [`probe_here`]) and
//! remembers the verdict per adapter name, driver version and backend in a small JSON file, so a
//! bad adapter costs one child, once, and is skipped from then on. The spawning lives in the app.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::adapters::AdapterSummary;
use crate::error::{Error, Result};

/// How a probe ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// The device opened and computed.
    Ok,
    /// The child reported an error (no device, a failed computation).
    Failed,
    /// The child died without reporting (a signal, an abort).
    Crashed,
    /// The child did not finish in time and was killed.
    Hung,
}

impl Outcome {
    pub fn usable(self) -> bool {
        self == Outcome::Ok
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
            Outcome::Crashed => "crashed",
            Outcome::Hung => "hung",
        })
    }
}

/// What a probe found out about one adapter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub outcome: Outcome,
    /// The child's error, exit status or timeout; empty when ok.
    #[serde(default)]
    pub detail: String,
    /// How long the probe took, seconds.
    #[serde(default)]
    pub secs: f64,
    /// Whether the device computes f16 (only meaningful when ok).
    #[serde(default)]
    pub f16: bool,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} in {:.1} s", self.outcome, self.secs)?;
        if !self.detail.is_empty() {
            write!(f, " ({})", self.detail)?;
        }
        Ok(())
    }
}

/// The one JSON line `latent-studio probe` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeReport {
    pub ok: bool,
    pub adapter: String,
    pub driver: String,
    pub f16: bool,
    pub secs: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Opens adapter `index` in this process and runs [`crate::device::warm_up`] on it (a matmul
/// and a convolution: a few real kernels, cheap even on lavapipe). Meant for the probe child: a
/// crash or hang here takes this process down, which is the point.
pub fn probe_here(index: usize) -> ProbeReport {
    use crate::device::{DeviceChoice, Target, open, resolve, warm_up};
    let started = Instant::now();
    let all = crate::adapters::enumerate();
    let choice = DeviceChoice::Gpu(Some(index));
    let (adapter, driver) = match all.iter().find(|a| a.index == index) {
        Some(a) => (a.name.clone(), a.driver.clone()),
        None => (format!("gpu:{index}"), String::new()),
    };
    let outcome = resolve(&choice, &all).and_then(|target| {
        let device = open(&target, &all);
        warm_up(&device)?;
        let f16 =
            matches!(target, Target::Adapter(_)) && device.supports_dtype(burn::tensor::DType::F16);
        Ok(f16)
    });
    let secs = started.elapsed().as_secs_f64();
    match outcome {
        Ok(f16) => ProbeReport {
            ok: true,
            adapter,
            driver,
            f16,
            secs,
            error: None,
        },
        Err(e) => ProbeReport {
            ok: false,
            adapter,
            driver,
            f16: false,
            secs,
            error: Some(e.to_string()),
        },
    }
}

/// The verdict file's key: a new driver version or another backend deserves a new probe.
pub fn key(adapter: &AdapterSummary) -> String {
    format!(
        "{} | {} | {}",
        adapter.name, adapter.driver, adapter.backend
    )
}

/// Remembered verdicts, one per [`key`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VerdictCache {
    pub adapters: BTreeMap<String, Verdict>,
}

impl VerdictCache {
    /// Reads the file; a missing file is an empty cache, a damaged one an empty cache plus a note
    /// (the file is moved aside as `*.corrupt` so the next save does not fail on it and nothing
    /// is silently lost). Verdicts only save time, so no error is worth failing over here.
    pub fn load(path: &Path) -> (Self, Option<String>) {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (Self::default(), None),
            Err(e) => {
                return (
                    Self::default(),
                    Some(format!(
                        "adapter probe verdicts not read ({e}): {}",
                        path.display()
                    )),
                );
            }
        };
        match serde_json::from_str::<Self>(&text) {
            Ok(cache) => (cache, None),
            Err(e) => {
                let aside = path.with_extension("json.corrupt");
                let kept = std::fs::rename(path, &aside).is_ok();
                let note = format!(
                    "adapter probe verdicts were damaged ({e}); adapters will be probed again{}",
                    if kept {
                        format!(" (old file kept as {})", aside.display())
                    } else {
                        String::new()
                    }
                );
                (Self::default(), Some(note))
            }
        }
    }

    pub fn get(&self, adapter: &AdapterSummary) -> Option<&Verdict> {
        self.adapters.get(&key(adapter))
    }

    pub fn insert(&mut self, adapter: &AdapterSummary, verdict: Verdict) {
        self.adapters.insert(key(adapter), verdict);
    }

    /// Writes atomically: a temp file in the same folder, fsynced, then renamed over the old one,
    /// so a crash mid-write (this file exists because of crashes) never leaves half a file.
    pub fn save(&self, path: &Path) -> Result<()> {
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
        if let Some(dir) = dir {
            std::fs::create_dir_all(dir).map_err(|e| Error::io("the probe folder", dir, e))?;
        }
        let json = serde_json::to_string_pretty(self)
            .map_err(|e| Error::InvalidInput(format!("probe verdicts: {e}")))?;
        crate::image_io::save_atomic(path, json.as_bytes(), true)
    }

    /// Records one verdict: re-reads the file first so a verdict another process saved meanwhile
    /// is kept (two studios probing at once lose nothing but a race on the same key).
    pub fn remember(path: &Path, adapter: &AdapterSummary, verdict: Verdict) -> Result<Self> {
        let (mut cache, _) = Self::load(path);
        cache.insert(adapter, verdict);
        cache.save(path)?;
        Ok(cache)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::AdapterKind;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("latent-probe-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn adapter(name: &str, driver: &str) -> AdapterSummary {
        AdapterSummary {
            index: 0,
            name: name.into(),
            vendor: crate::adapters::VENDOR_INTEL,
            kind: AdapterKind::Integrated,
            backend: "Vulkan".into(),
            driver: driver.into(),
            max_buffer_size: 1 << 30,
            max_storage_binding: 1 << 27,
            shader_f16: true,
            device_memory: None,
        }
    }

    #[test]
    fn verdicts_round_trip_per_adapter_and_driver() {
        let dir = scratch("rt");
        let path = dir.join("probes.json");
        let mtl = adapter("Intel(R) Graphics (MTL)", "Mesa 24.0");
        let crashed = Verdict {
            outcome: Outcome::Crashed,
            detail: "signal: 11 (SIGSEGV)".into(),
            secs: 3.5,
            f16: false,
        };
        VerdictCache::remember(&path, &mtl, crashed.clone()).unwrap();
        let arc = adapter("Intel(R) Arc(tm) A770 Graphics", "Mesa 24.0");
        let ok = Verdict {
            outcome: Outcome::Ok,
            detail: String::new(),
            secs: 0.8,
            f16: true,
        };
        VerdictCache::remember(&path, &arc, ok.clone()).unwrap();

        let (back, note) = VerdictCache::load(&path);
        assert_eq!(note, None);
        assert_eq!(back.get(&mtl), Some(&crashed));
        assert_eq!(back.get(&arc), Some(&ok));
        // A driver update is a new adapter as far as verdicts go.
        assert_eq!(
            back.get(&adapter("Intel(R) Graphics (MTL)", "Mesa 24.1")),
            None
        );
        // Only the file itself: no temp file left behind.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .contains("\"crashed\"")
        );
    }

    #[test]
    fn a_damaged_verdict_file_is_set_aside_and_probing_starts_over() {
        let dir = scratch("bad");
        let path = dir.join("probes.json");
        std::fs::write(&path, b"{\"adapters\": {\"x\": {\"outcome\": \"cra").unwrap();
        let (cache, note) = VerdictCache::load(&path);
        assert_eq!(cache, VerdictCache::default());
        assert!(note.unwrap().contains("damaged"));
        assert!(dir.join("probes.json.corrupt").exists());
        // The next verdict is written over a clean slate.
        let a = adapter("llvmpipe", "Mesa");
        let v = Verdict {
            outcome: Outcome::Hung,
            detail: "no answer in 60 s".into(),
            secs: 60.0,
            f16: false,
        };
        VerdictCache::remember(&path, &a, v.clone()).unwrap();
        assert_eq!(VerdictCache::load(&path).0.get(&a), Some(&v));
        // A missing file is simply empty.
        assert_eq!(
            VerdictCache::load(&dir.join("none.json")),
            (VerdictCache::default(), None)
        );
    }

    #[test]
    fn probe_report_is_one_json_line() {
        let r = ProbeReport {
            ok: false,
            adapter: "llvmpipe".into(),
            driver: "Mesa".into(),
            f16: false,
            secs: 0.5,
            error: Some("device error: x".into()),
        };
        let line = serde_json::to_string(&r).unwrap();
        assert!(!line.contains('\n'));
        assert_eq!(serde_json::from_str::<ProbeReport>(&line).unwrap(), r);
    }
}
