//! The built-in demo model (`assets/demo/`): a tiny random-weight SD 1.x model, shipped inside the
//! binary and unpacked once into the cache folder so it loads like any checkpoint file.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use latent_engine::image_io::save_atomic;

const WEIGHTS: &[u8] = include_bytes!("../../assets/demo/latent-studio-demo.safetensors");
const SIDECAR: &[u8] = include_bytes!("../../assets/demo/latent-studio-demo.json");
const NAME: &str = "latent-studio-demo";

fn demo_dir() -> PathBuf {
    crate::paths::cache_subdir("demo")
}

/// The demo checkpoint on disk, unpacked (atomically) on first use or when it differs: in the
/// user's cache folder, or the temp folder when that cannot be written.
pub fn demo_model_path() -> Result<PathBuf> {
    unpack(&demo_dir()).or_else(|first| {
        let fallback = std::env::temp_dir().join("latent-studio-demo");
        unpack(&fallback).with_context(|| format!("{first:#}"))
    })
}

fn unpack(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let weights = dir.join(format!("{NAME}.safetensors"));
    let sidecar = dir.join(format!("{NAME}.json"));
    for (path, bytes) in [(&sidecar, SIDECAR), (&weights, WEIGHTS)] {
        let same = std::fs::read(path).is_ok_and(|b| b == bytes);
        if !same {
            save_atomic(path, bytes, true)
                .with_context(|| format!("writing {}", path.display()))?;
        }
    }
    Ok(weights)
}

pub fn is_demo(path: &Path) -> bool {
    path.file_stem().is_some_and(|s| s == NAME)
}
