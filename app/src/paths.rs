//! The application's folders and the files it finds by convention, one rule each for the command
//! line and the studio.

use std::path::{Path, PathBuf};

/// The file name of madebyollin's TAESD decoder, as ComfyUI and A1111 users keep it.
pub const TAESD_FILE: &str = "taesd_decoder.safetensors";
/// The same for SDXL's latents (TAESDXL).
pub const TAESDXL_FILE: &str = "taesdxl_decoder.safetensors";

/// The TAESD decoder file a family's latents need: SDXL's are another space.
pub fn taesd_file(family: latent_engine::checkpoint::Family) -> &'static str {
    match family {
        latent_engine::checkpoint::Family::Sdxl => TAESDXL_FILE,
        _ => TAESD_FILE,
    }
}

/// The platform's folders for "Latent Studio" (`None` where the platform has no home folder).
fn project() -> Option<directories::ProjectDirs> {
    directories::ProjectDirs::from("", "", "Latent Studio")
}

/// `settings.json` in the platform's config folder; `LATENT_STUDIO_CONFIG` names another folder.
pub fn settings_file() -> PathBuf {
    if let Some(dir) = std::env::var_os("LATENT_STUDIO_CONFIG") {
        return PathBuf::from(dir).join("settings.json");
    }
    project()
        .map(|d| d.config_dir().join("settings.json"))
        .unwrap_or_else(|| PathBuf::from("latent-studio-settings.json"))
}

/// `name` in the platform's cache folder, else in the temp folder.
pub fn cache_subdir(name: &str) -> PathBuf {
    project()
        .map(|d| d.cache_dir().join(name))
        .unwrap_or_else(|| std::env::temp_dir().join(format!("latent-studio-{name}")))
}

/// The converted-weights cache; `LATENT_STUDIO_CACHE` names another folder.
pub fn weights_cache() -> PathBuf {
    match std::env::var_os("LATENT_STUDIO_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => cache_subdir("weights"),
    }
}

/// Where kernel tuning is kept across launches (`latent_engine::device::tuning`):
/// `LATENT_STUDIO_TUNING_CACHE` names a folder, or `off` keeps it in memory; else `tuning/` in
/// `LATENT_STUDIO_CACHE` when that is set, else in the platform's cache folder.
pub fn tuning_cache() -> Option<PathBuf> {
    match std::env::var_os("LATENT_STUDIO_TUNING_CACHE") {
        Some(v) if v == "off" => None,
        Some(dir) => Some(PathBuf::from(dir)),
        None => Some(match std::env::var_os("LATENT_STUDIO_CACHE") {
            Some(dir) => PathBuf::from(dir).join("tuning"),
            None => cache_subdir("tuning"),
        }),
    }
}

/// The TAESD decoder to use when none was chosen: the first of `file` ([`taesd_file`]) and
/// `vae_approx/<file>` (ComfyUI's folder) in each of `folders`, in order.
pub fn find_taesd(folders: &[&Path], file: &str) -> Option<PathBuf> {
    folders
        .iter()
        .flat_map(|dir| [dir.join(file), dir.join("vae_approx").join(file)])
        .find(|p| p.is_file())
}

/// The TAESD decoder a model at `model` of `family` previews with when none was chosen: the
/// first found in `library` (the studio's models folder; the command line has none), the
/// model's own folder and the one above it. The command line and the studio share this rule.
pub fn taesd_for(
    model: &Path,
    family: latent_engine::checkpoint::Family,
    library: Option<&Path>,
) -> Option<PathBuf> {
    let mut folders: Vec<&Path> = library.into_iter().collect();
    folders.extend(taesd_folders_for(model));
    find_taesd(&folders, taesd_file(family))
}

/// The folders a model's TAESD is looked for in: the model's own, and the one above it (ComfyUI
/// keeps `models/checkpoints/x.safetensors` beside `models/vae_approx/`).
pub fn taesd_folders_for(model: &Path) -> Vec<&Path> {
    let own = model.parent().filter(|p| !p.as_os_str().is_empty());
    own.into_iter().chain(own.and_then(Path::parent)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taesd_is_found_beside_the_model_or_in_comfyui_vae_approx() {
        use latent_engine::checkpoint::Family;
        let root = std::env::temp_dir().join(format!("latent-paths-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let checkpoints = root.join("models/checkpoints");
        std::fs::create_dir_all(&checkpoints).unwrap();
        let model = checkpoints.join("sd15.safetensors");
        let folders = taesd_folders_for(&model);
        assert_eq!(find_taesd(&folders, TAESD_FILE), None);

        let comfy = root.join("models/vae_approx");
        std::fs::create_dir_all(&comfy).unwrap();
        std::fs::write(comfy.join(TAESD_FILE), b"").unwrap();
        assert_eq!(
            find_taesd(&folders, TAESD_FILE),
            Some(comfy.join(TAESD_FILE))
        );

        // One beside the model comes first.
        std::fs::write(checkpoints.join(TAESD_FILE), b"").unwrap();
        assert_eq!(
            find_taesd(&folders, TAESD_FILE),
            Some(checkpoints.join(TAESD_FILE))
        );
        // The studio's models folder follows the same rule, and comes first.
        assert_eq!(
            find_taesd(&[&root.join("models")], TAESD_FILE),
            Some(comfy.join(TAESD_FILE))
        );
        let library = root.join("library");
        std::fs::create_dir_all(&library).unwrap();
        assert_eq!(
            taesd_for(&model, Family::Sd1, Some(&library)),
            Some(checkpoints.join(TAESD_FILE)),
            "an empty library: beside the model"
        );
        std::fs::write(library.join(TAESD_FILE), b"").unwrap();
        assert_eq!(
            taesd_for(&model, Family::Sd1, Some(&library)),
            Some(library.join(TAESD_FILE))
        );
        assert_eq!(
            taesd_for(&model, Family::Sd1, None),
            Some(checkpoints.join(TAESD_FILE))
        );
        // SDXL's latents take TAESDXL, never SD's decoder.
        assert_eq!(taesd_file(Family::Sdxl), TAESDXL_FILE);
        assert_eq!(taesd_file(Family::Sd2), TAESD_FILE);
        assert_eq!(find_taesd(&folders, TAESDXL_FILE), None);
        std::fs::write(comfy.join(TAESDXL_FILE), b"").unwrap();
        assert_eq!(
            find_taesd(&folders, taesd_file(Family::Sdxl)),
            Some(comfy.join(TAESDXL_FILE))
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_bare_file_name_has_no_folders_to_search() {
        assert!(taesd_folders_for(Path::new("model.safetensors")).is_empty());
    }
}
