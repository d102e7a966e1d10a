//! Few-step models (Turbo, LCM) recognised from the files people have: a single file's name or
//! its sidecar's `few_step`, a diffusers folder's scheduler class or name; a Turbo file steps
//! trailing timesteps unless its sidecar sets a spacing. Headers only: no weights are loaded.

use crate::common;

use std::path::{Path, PathBuf};

use common::{fixtures, scratch_dir};
use latent_engine::Error;
use latent_engine::checkpoint::{Checkpoint, FewStep};
use latent_engine::schedulers::TimestepSpacing;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

fn opened(path: &Path) -> (Option<FewStep>, Option<TimestepSpacing>) {
    let ckpt = Checkpoint::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (ckpt.few_step, ckpt.config.scheduler.timestep_spacing)
}

#[test]
fn a_turbo_file_is_recognised_and_steps_trailing_unless_its_sidecar_says() {
    let dir = scratch_dir("few-step-file");
    let file: PathBuf = dir.join("tiny_sd_turbo_1.0.safetensors");
    std::fs::copy(fixtures().join("tiny-sd.safetensors"), &file).unwrap();
    assert_eq!(
        opened(&file),
        (Some(FewStep::Turbo), Some(TimestepSpacing::Trailing))
    );
    let sidecar = file.with_extension("json");
    std::fs::write(
        &sidecar,
        r#"{"scheduler": {"timestep_spacing": "leading"}}"#,
    )
    .unwrap();
    assert_eq!(
        opened(&file),
        (Some(FewStep::Turbo), Some(TimestepSpacing::Leading))
    );
    std::fs::write(&sidecar, r#"{"few_step": "none"}"#).unwrap();
    assert_eq!(
        opened(&file),
        (None, None),
        "the sidecar says it is not one"
    );
    std::fs::write(&sidecar, r#"{"few_step": "quick"}"#).unwrap();
    match Checkpoint::open(&file) {
        Err(Error::InvalidConfig { reason, path }) => {
            assert!(
                reason.contains("few_step") && reason.contains("quick"),
                "{reason}"
            );
            assert_eq!(path, sidecar);
        }
        other => panic!(
            "expected an invalid sidecar, got {:?}",
            other.map(|c| c.few_step)
        ),
    }
    // The fixture's own name says nothing.
    assert_eq!(
        opened(&fixtures().join("tiny-sd.safetensors")),
        (None, None)
    );
}

#[test]
fn a_folder_with_an_lcm_scheduler_is_an_lcm_model() {
    let dir = scratch_dir("few-step-folder").join("dreamshaper-distilled");
    copy_dir(&fixtures().join("tiny-sd"), &dir);
    assert_eq!(opened(&dir), (None, None));
    std::fs::create_dir_all(dir.join("scheduler")).unwrap();
    std::fs::write(
        dir.join("scheduler/scheduler_config.json"),
        r#"{"_class_name": "LCMScheduler", "beta_schedule": "scaled_linear",
            "beta_start": 0.00085, "beta_end": 0.012, "num_train_timesteps": 1000,
            "timestep_spacing": "leading", "steps_offset": 1}"#,
    )
    .unwrap();
    assert_eq!(
        opened(&dir),
        (Some(FewStep::Lcm), Some(TimestepSpacing::Leading))
    );
}
