//! The models folder: `.safetensors` checkpoints and diffusers folders, listed by name.

use std::path::{Path, PathBuf};

/// Checkpoints in `dir` (one level deep, plus a `Stable-diffusion/` or `checkpoints/` subfolder as
/// A1111 and ComfyUI keep them), sorted by name. TAESD and VAE-only files are left out.
pub fn scan_models(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    for sub in ["Stable-diffusion", "checkpoints"] {
        let p = dir.join(sub);
        if p.is_dir() {
            dirs.push(p);
        }
    }
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().to_lowercase())
                .unwrap_or_default();
            if path.is_dir() {
                if path.join("model_index.json").is_file() {
                    found.push(path);
                }
            } else if name.ends_with(".safetensors")
                && !name.starts_with("taesd")
                && !name.contains("vae")
            {
                found.push(path);
            }
        }
    }
    found.sort_by_key(|p| p.file_name().map(|n| n.to_ascii_lowercase()));
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_checkpoints_and_diffusers_folders_only() {
        let dir = std::env::temp_dir().join(format!("latent-models-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("Stable-diffusion")).unwrap();
        std::fs::create_dir_all(dir.join("sd15-diffusers")).unwrap();
        std::fs::create_dir_all(dir.join("random-folder")).unwrap();
        std::fs::write(dir.join("sd15-diffusers/model_index.json"), b"{}").unwrap();
        for f in [
            "b.safetensors",
            "taesd_decoder.safetensors",
            "notes.txt",
            "Stable-diffusion/a.safetensors",
            "kl-f8-vae.safetensors",
        ] {
            std::fs::write(dir.join(f), b"").unwrap();
        }
        let names: Vec<String> = scan_models(&dir)
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["a.safetensors", "b.safetensors", "sd15-diffusers"]);
    }
}
