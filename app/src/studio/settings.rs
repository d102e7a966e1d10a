//! The studio's settings: a plain struct, persisted as JSON next to the user's other config, written
//! atomically (temp file + rename) so a crash mid-write never leaves a half file. A corrupt file
//! falls back to defaults with a notice and is kept aside, never silently lost.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use latent_engine::device::DeviceChoice;
use latent_engine::model_cache::CacheSettings;
use latent_engine::preview::PreviewMethod;
use latent_engine::{Precision, TextEncoders};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// Stored as its id: none, latent2rgb, taesd, full or auto.
    #[serde(with = "as_text")]
    pub preview_method: PreviewMethod,
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
    /// Stored as the command line writes it: auto, cpu, gpu, gpu:N or part of an adapter name.
    #[serde(with = "as_text")]
    pub device: DeviceChoice,
    /// Seconds to wait for the device to open and compile its first kernels.
    pub device_timeout_secs: f64,
    /// `None` for the device's preferred precision; stored as auto, f32 or f16.
    #[serde(with = "as_text")]
    pub precision: Option<Precision>,
    /// Where the text encoders wait between prompts; stored as auto, device or host.
    #[serde(with = "as_text")]
    pub text_encoders: TextEncoders,
    /// Scanned for `.safetensors` checkpoints and diffusers folders.
    pub models_dir: Option<PathBuf>,
    pub outputs_dir: PathBuf,
    /// TAESD decoder file or folder; else `taesd_decoder.safetensors` in the models folder.
    pub taesd: Option<PathBuf>,
    /// Textual-inversion embeddings (`<name>.safetensors`), named in prompts.
    pub embeddings_dir: Option<PathBuf>,
    /// LoRAs (`<name>.safetensors`), merged in by `<lora:name:w>` in prompts.
    pub loras_dir: Option<PathBuf>,
    /// Reopened at start.
    pub last_model: Option<PathBuf>,
    /// SDXL's refiner, chosen again at start.
    pub refiner: Option<PathBuf>,
}

impl Default for Settings {
    fn default() -> Self {
        let outputs = directories::UserDirs::new()
            .and_then(|u| u.picture_dir().map(|p| p.join("Latent Studio")))
            .unwrap_or_else(|| PathBuf::from("outputs"));
        Self {
            preview_method: as_text::Text::fallback(),
            preview_interval: 1,
            model_cache: true,
            cache_memory_gib: 6.0,
            disk_cache_gib: 20.0,
            cache_dir: None,
            vae_compile: true,
            device: as_text::Text::fallback(),
            device_timeout_secs: 60.0,
            precision: as_text::Text::fallback(),
            text_encoders: as_text::Text::fallback(),
            models_dir: None,
            outputs_dir: outputs,
            taesd: None,
            embeddings_dir: None,
            loras_dir: None,
            last_model: None,
            refiner: None,
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
        if self.preview_interval == 0 {
            self.preview_interval = 1;
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
        CacheSettings::sized(
            self.model_cache,
            Some(self.cache_memory_gib),
            self.cache_dir
                .clone()
                .unwrap_or_else(Self::default_cache_dir),
            self.disk_cache_gib,
        )
    }

    /// The TAESD decoder for SD 1.x/2.x as the settings show it: the chosen one, else one in
    /// the models folder (a model's own folder may hold another: [`crate::paths::taesd_for`]).
    pub fn taesd_path(&self) -> Option<PathBuf> {
        if let Some(p) = &self.taesd {
            return Some(p.clone());
        }
        crate::paths::find_taesd(&[self.models_dir.as_deref()?], crate::paths::TAESD_FILE)
    }
}

/// A setting stored as the text the command line takes for it (older settings files wrote these
/// fields as strings, and still read). Text this version does not know, or a value that is not
/// text, reads as the setting's default ([`as_text::Text::fallback`], which
/// [`Settings::default`] uses too): a hand-edited or newer file still loads, the rest of it
/// intact.
mod as_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub trait Text: Sized {
        fn to_text(&self) -> String;
        fn from_text(text: &str) -> Option<Self>;
        /// The setting's default (not necessarily the type's).
        fn fallback() -> Self;
    }

    pub fn serialize<T: Text, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&value.to_text())
    }

    pub fn deserialize<'de, T: Text, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        Ok(value
            .as_str()
            .and_then(T::from_text)
            .unwrap_or_else(T::fallback))
    }
}

impl as_text::Text for PreviewMethod {
    fn to_text(&self) -> String {
        self.id().into()
    }
    fn from_text(text: &str) -> Option<Self> {
        text.parse().ok()
    }
    fn fallback() -> Self {
        PreviewMethod::Auto
    }
}

impl as_text::Text for TextEncoders {
    fn to_text(&self) -> String {
        self.to_string()
    }
    fn from_text(text: &str) -> Option<Self> {
        text.parse().ok()
    }
    fn fallback() -> Self {
        TextEncoders::Auto
    }
}

impl as_text::Text for DeviceChoice {
    fn to_text(&self) -> String {
        self.to_string()
    }
    fn from_text(text: &str) -> Option<Self> {
        text.parse().ok()
    }
    fn fallback() -> Self {
        DeviceChoice::Auto
    }
}

impl as_text::Text for Option<Precision> {
    fn to_text(&self) -> String {
        match self {
            None => "auto",
            Some(Precision::F32) => "f32",
            Some(Precision::F16) => "f16",
        }
        .into()
    }
    fn from_text(text: &str) -> Option<Self> {
        match text {
            "auto" => Some(None),
            other => other.parse().ok().map(Some),
        }
    }
    fn fallback() -> Self {
        None
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
        let mut s = Settings {
            preview_method: PreviewMethod::Full,
            preview_interval: 3,
            device: DeviceChoice::Cpu,
            precision: Some(Precision::F16),
            ..Default::default()
        };
        s.save(&path).unwrap();
        s.model_cache = false;
        s.save(&path).unwrap();
        let (back, note) = Settings::load(&path);
        assert_eq!((back, note), (s, None));
        // No temp files left behind.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    }

    /// A settings file as the last release wrote it (every choice a string) reads into the
    /// typed fields, and is written back in the same words.
    #[test]
    fn reads_and_writes_the_old_string_form() {
        let dir = scratch("old");
        let path = dir.join("settings.json");
        std::fs::write(
            &path,
            br#"{"preview_method": "taesd", "device": "gpu:1", "precision": "f32", "preview_interval": 2}"#,
        )
        .unwrap();
        let (s, note) = Settings::load(&path);
        assert!(note.is_none());
        assert_eq!(
            (s.preview_method, &s.device, s.precision),
            (
                PreviewMethod::Taesd,
                &DeviceChoice::Gpu(Some(1)),
                Some(Precision::F32)
            )
        );
        s.save(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        for pair in [
            r#""preview_method": "taesd""#,
            r#""device": "gpu:1""#,
            r#""precision": "f32""#,
        ] {
            assert!(text.contains(pair), "{pair} in {text}");
        }
        // A file from before the text-encoder setting reads as auto; the words round-trip.
        assert_eq!(s.text_encoders, TextEncoders::Auto);
        let auto = Settings::default();
        auto.save(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(r#""precision": "auto""#), "{text}");
        assert!(text.contains(r#""text_encoders": "auto""#), "{text}");
        let host = Settings {
            text_encoders: TextEncoders::Host,
            ..Settings::default()
        };
        host.save(&path).unwrap();
        assert_eq!(Settings::load(&path).0.text_encoders, TextEncoders::Host);
        // A word it does not know reads as the default, with the rest of the file kept.
        std::fs::write(&path, br#"{"text_encoders": "gpu", "precision": "f16"}"#).unwrap();
        let (odd, note) = Settings::load(&path);
        assert!(note.is_none());
        assert_eq!(
            (odd.text_encoders, odd.precision),
            (TextEncoders::Auto, Some(Precision::F16))
        );
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
            (s.preview_method, s.preview_interval, s.device),
            (PreviewMethod::Auto, 1, DeviceChoice::Auto)
        );

        // A value of the wrong kind falls back alone; the rest of the file is kept.
        std::fs::write(
            &path,
            br#"{"preview_method": 3, "precision": "f16", "preview_interval": 4}"#,
        )
        .unwrap();
        let (s, note) = Settings::load(&path);
        assert!(note.is_none());
        assert_eq!(
            (s.preview_method, s.precision, s.preview_interval),
            (PreviewMethod::Auto, Some(Precision::F16), 4)
        );

        let (s, note) = Settings::load(&dir.join("missing.json"));
        assert_eq!((s, note), (Settings::default(), None));
    }
}
