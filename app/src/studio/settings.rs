//! The studio's settings: a plain struct, persisted as JSON next to the user's other config, written
//! atomically (temp file + rename) so a crash mid-write never leaves a half file. A corrupt file
//! falls back to defaults with a notice and is kept aside, never silently lost.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use latent_engine::Precision;
use latent_engine::device::DeviceChoice;
use latent_engine::model_cache::CacheSettings;
use latent_engine::preview::PreviewMethod;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// none, latent2rgb, taesd, full or auto.
    pub preview_method: String,
    pub preview_interval: usize,
    /// Keep models resident between generations and converted weights on disk.
    pub model_cache: bool,
    /// Resident models' budget, GiB (least recently used out first).
    pub cache_memory_gib: f64,
    /// Disk cache size bound, GiB.
    pub disk_cache_gib: f64,
    /// Disk cache folder; else the platform's cache folder.
    pub cache_dir: Option<PathBuf>,
    /// Our GroupNorm+SiLU kernels for the VAE decode (verified against the plain path). On by
    /// default: on an H200 they made the whole 512² f16 decode 18 % faster (BENCHMARKS.md).
    pub vae_compile: bool,
    /// auto, cpu, gpu, gpu:N or part of an adapter name.
    pub device: String,
    /// Seconds to wait for the device to open and compile its first kernels.
    pub device_timeout_secs: f64,
    /// auto, f32 or f16.
    pub precision: String,
    /// Scanned for `.safetensors` checkpoints and diffusers folders.
    pub models_dir: Option<PathBuf>,
    pub outputs_dir: PathBuf,
    /// TAESD decoder file or folder; else `taesd_decoder.safetensors` in the models folder.
    pub taesd: Option<PathBuf>,
    /// Reopened at start.
    pub last_model: Option<PathBuf>,
}

impl Default for Settings {
    fn default() -> Self {
        let outputs = directories::UserDirs::new()
            .and_then(|u| u.picture_dir().map(|p| p.join("Latent Studio")))
            .unwrap_or_else(|| PathBuf::from("outputs"));
        Self {
            preview_method: PreviewMethod::Auto.id().into(),
            preview_interval: 1,
            model_cache: true,
            cache_memory_gib: 6.0,
            disk_cache_gib: 20.0,
            cache_dir: None,
            vae_compile: true,
            device: "auto".into(),
            device_timeout_secs: 60.0,
            precision: "auto".into(),
            models_dir: None,
            outputs_dir: outputs,
            taesd: None,
            last_model: None,
        }
    }
}

impl Settings {
    /// `settings.json` in the platform's config folder (`LATENT_STUDIO_CONFIG` overrides).
    pub fn default_path() -> PathBuf {
        crate::paths::settings_file()
    }

    /// Reads the settings; a missing file gives defaults, a corrupt one gives defaults plus a
    /// notice (the bad file is renamed to `settings.json.corrupt` so nothing is lost).
    pub fn load(path: &Path) -> (Self, Option<String>) {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (Self::default(), None),
            Err(e) => {
                return (
                    Self::default(),
                    Some(format!("settings not read ({e}); using defaults")),
                );
            }
        };
        match serde_json::from_str::<Self>(&text) {
            Ok(s) => (s.sanitized(), None),
            Err(e) => {
                let aside = path.with_extension("json.corrupt");
                let kept = std::fs::rename(path, &aside).is_ok();
                let note = if kept {
                    format!(
                        "the settings file was damaged ({e}); using defaults (old file kept as {})",
                        aside.display()
                    )
                } else {
                    format!("the settings file was damaged ({e}); using defaults")
                };
                (Self::default(), Some(note))
            }
        }
    }

    /// Writes atomically: a temp file in the same folder, flushed, then renamed over the old one.
    pub fn save(&self, path: &Path) -> Result<()> {
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
        if let Some(dir) = dir {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let json = serde_json::to_string_pretty(self)?;
        latent_engine::image_io::save_atomic(path, json.as_bytes(), true)
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Values out of range replaced by defaults, so a hand-edited file cannot break the studio.
    fn sanitized(mut self) -> Self {
        let d = Self::default();
        if self.preview_method.parse::<PreviewMethod>().is_err() {
            self.preview_method = d.preview_method;
        }
        if self.preview_interval == 0 {
            self.preview_interval = 1;
        }
        if self.device.parse::<DeviceChoice>().is_err() {
            self.device = d.device;
        }
        if self.precision != "auto" && self.precision.parse::<Precision>().is_err() {
            self.precision = d.precision;
        }
        if !(self.cache_memory_gib.is_finite() && self.cache_memory_gib >= 0.0) {
            self.cache_memory_gib = d.cache_memory_gib;
        }
        if !(self.device_timeout_secs.is_finite() && self.device_timeout_secs >= 1.0) {
            self.device_timeout_secs = d.device_timeout_secs;
        }
        if !(self.disk_cache_gib.is_finite() && self.disk_cache_gib >= 0.0) {
            self.disk_cache_gib = d.disk_cache_gib;
        }
        self
    }

    /// The platform's cache folder for converted weights (`LATENT_STUDIO_CACHE` overrides).
    pub fn default_cache_dir() -> PathBuf {
        crate::paths::weights_cache()
    }

    pub fn cache_settings(&self) -> CacheSettings {
        const GIB: f64 = (1u64 << 30) as f64;
        CacheSettings {
            enabled: self.model_cache,
            memory_budget: (self.cache_memory_gib * GIB) as u64,
            disk_dir: Some(
                self.cache_dir
                    .clone()
                    .unwrap_or_else(Self::default_cache_dir),
            ),
            disk_limit: (self.disk_cache_gib * GIB) as u64,
        }
    }

    pub fn preview(&self) -> PreviewMethod {
        self.preview_method.parse().unwrap_or(PreviewMethod::Auto)
    }

    pub fn device_choice(&self) -> DeviceChoice {
        self.device.parse().unwrap_or_default()
    }

    pub fn precision_choice(&self) -> Option<Precision> {
        self.precision.parse().ok()
    }

    /// The TAESD decoder to use: the chosen one, else one found in the models folder
    /// ([`crate::paths::find_taesd`], the command line's rule too).
    pub fn taesd_path(&self) -> Option<PathBuf> {
        if let Some(p) = &self.taesd {
            return Some(p.clone());
        }
        crate::paths::find_taesd(&[self.models_dir.as_deref()?])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("latent-settings-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn round_trips_and_replaces_atomically() {
        let dir = scratch("rt");
        let path = dir.join("settings.json");
        let mut s = Settings::default();
        s.preview_method = "full".into();
        s.preview_interval = 3;
        s.device = "cpu".into();
        s.save(&path).unwrap();
        s.model_cache = false;
        s.save(&path).unwrap();
        let (back, note) = Settings::load(&path);
        assert_eq!((back, note), (s, None));
        // No temp files left behind.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    }

    #[test]
    fn corrupt_or_odd_files_fall_back_with_a_notice() {
        let dir = scratch("bad");
        let path = dir.join("settings.json");
        std::fs::write(&path, b"{\"preview_method\": \"full\", \"device\"").unwrap();
        let (s, note) = Settings::load(&path);
        assert_eq!(s, Settings::default());
        assert!(note.unwrap().contains("damaged"));
        assert!(
            dir.join("settings.json.corrupt").exists(),
            "the bad file is kept aside"
        );

        std::fs::write(
            &path,
            br#"{"preview_method": "vae", "preview_interval": 0, "device": "gpu:x"}"#,
        )
        .unwrap();
        let (s, note) = Settings::load(&path);
        assert!(note.is_none());
        assert_eq!(
            (s.preview(), s.preview_interval, s.device.as_str()),
            (PreviewMethod::Auto, 1, "auto")
        );

        let (s, note) = Settings::load(&dir.join("missing.json"));
        assert_eq!((s, note), (Settings::default(), None));
    }
}
