//! Few-step models (SD-Turbo, SDXL-Turbo, LCM): recognised from what a checkpoint says about
//! itself, with the settings their authors publish, which the studio offers as a preset.
//!
//! Nothing in the weights marks a distilled model, so recognition reads what there is: a
//! diffusers folder's scheduler class (`LCMScheduler`), else the file or folder name ("turbo",
//! "lcm" as a word of it, as the models are published: `sd_xl_turbo_1.0_fp16.safetensors`,
//! `LCM_Dreamshaper_v7`). A sidecar's `"few_step"` (`"turbo"`, `"lcm"` or `"none"`) overrides
//! both.

use std::path::Path;

use crate::schedulers::{SamplerKind, Schedule};

use super::family::Family;

/// A few-step distillation the studio has settings for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FewStep {
    /// Adversarial diffusion distillation (SD-Turbo, SDXL-Turbo): 1–4 steps, no CFG, trailing
    /// timesteps.
    Turbo,
    /// Latent consistency models: the LCM sampler, 2–8 steps, CFG 1–2.
    Lcm,
}

/// What the studio sets for a few-step model: diffusers' model cards and ComfyUI's example
/// workflows for them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Preset {
    pub steps: usize,
    /// 1: no classifier-free guidance (one UNet pass a step).
    pub cfg_scale: f32,
    pub sampler: SamplerKind,
    pub schedule: Schedule,
    /// The side it was distilled at, where that is not the family's native size (SDXL-Turbo:
    /// 512).
    pub size: Option<usize>,
}

impl FewStep {
    pub fn name(self) -> &'static str {
        match self {
            FewStep::Turbo => "Turbo",
            FewStep::Lcm => "LCM",
        }
    }

    /// The sidecar's `"few_step"` value.
    fn parse(value: &str) -> Option<Option<Self>> {
        match value.trim().to_ascii_lowercase().as_str() {
            "turbo" => Some(Some(FewStep::Turbo)),
            "lcm" => Some(Some(FewStep::Lcm)),
            "none" => Some(None),
            _ => None,
        }
    }

    /// Turbo: one step of Euler a without guidance (SDXL-Turbo's and SD-Turbo's cards, and
    /// ComfyUI's turbo workflow), at 512² for SDXL-Turbo. LCM: four steps of the LCM sampler
    /// at CFG 1.
    pub fn preset(self, family: Family) -> Preset {
        match self {
            FewStep::Turbo => Preset {
                steps: 1,
                cfg_scale: 1.0,
                sampler: SamplerKind::EulerAncestral,
                schedule: Schedule::Normal,
                size: (family == Family::Sdxl).then_some(512),
            },
            FewStep::Lcm => Preset {
                steps: 4,
                cfg_scale: 1.0,
                sampler: SamplerKind::Lcm,
                schedule: Schedule::Normal,
                size: None,
            },
        }
    }
}

/// The few-step kind of the checkpoint at `path`: the `sidecar`'s `"few_step"` where it says (an
/// unknown value is `Err` with it), else a diffusers `scheduler_class` of `LCMScheduler`, else
/// the name.
pub fn recognise(
    path: &Path,
    scheduler_class: Option<&str>,
    sidecar: &serde_json::Value,
) -> std::result::Result<Option<FewStep>, String> {
    if let Some(value) = sidecar.get("few_step") {
        let text = value.as_str().unwrap_or_default();
        return FewStep::parse(text).ok_or_else(|| {
            format!("`few_step` must be \"turbo\", \"lcm\" or \"none\", not {value}")
        });
    }
    if scheduler_class == Some("LCMScheduler") {
        return Ok(Some(FewStep::Lcm));
    }
    let name = path
        .file_stem()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    // Words of the name: "sdxl-turbo", "sd_xl_turbo_1.0", "LCM_Dreamshaper_v7" match;
    // "turbocharged" or "alcmene" do not.
    let words: Vec<&str> = name
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    Ok(
        if words.contains(&"turbo") || words.contains(&"sdxlturbo") {
            Some(FewStep::Turbo)
        } else if words.contains(&"lcm") {
            Some(FewStep::Lcm)
        } else {
            None
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by_name(name: &str) -> Option<FewStep> {
        recognise(Path::new(name), None, &serde_json::json!({})).expect("no sidecar")
    }

    #[test]
    fn published_names_are_recognised_and_others_are_not() {
        assert_eq!(
            by_name("/m/sd_xl_turbo_1.0_fp16.safetensors"),
            Some(FewStep::Turbo)
        );
        assert_eq!(by_name("/m/sd-turbo"), Some(FewStep::Turbo));
        assert_eq!(by_name("/m/SDXL-Turbo"), Some(FewStep::Turbo));
        assert_eq!(by_name("/m/LCM_Dreamshaper_v7"), Some(FewStep::Lcm));
        assert_eq!(
            by_name("/m/dreamshaper-lcm.safetensors"),
            Some(FewStep::Lcm)
        );
        assert_eq!(by_name("/m/turbocharged_v2.safetensors"), None);
        assert_eq!(by_name("/m/alcmene.safetensors"), None);
        assert_eq!(by_name("/m/v1-5-pruned-emaonly.safetensors"), None);
    }

    #[test]
    fn the_scheduler_class_and_the_sidecar_decide_before_the_name() {
        let none = serde_json::json!({});
        let lcm = recognise(Path::new("/m/plain"), Some("LCMScheduler"), &none);
        assert_eq!(lcm, Ok(Some(FewStep::Lcm)));
        let said = serde_json::json!({ "few_step": "none" });
        assert_eq!(recognise(Path::new("/m/sd-turbo"), None, &said), Ok(None));
        let said = serde_json::json!({ "few_step": "Turbo" });
        assert_eq!(
            recognise(Path::new("/m/plain"), Some("LCMScheduler"), &said),
            Ok(Some(FewStep::Turbo))
        );
        let bad = serde_json::json!({ "few_step": "fast" });
        let err = recognise(Path::new("/m/plain"), None, &bad).unwrap_err();
        assert!(err.contains("few_step") && err.contains("fast"), "{err}");
    }

    #[test]
    fn presets_follow_the_model_cards() {
        let turbo = FewStep::Turbo.preset(Family::Sdxl);
        assert_eq!((turbo.steps, turbo.cfg_scale), (1, 1.0));
        assert_eq!(turbo.sampler, SamplerKind::EulerAncestral);
        assert_eq!(turbo.size, Some(512), "SDXL-Turbo is distilled at 512²");
        assert_eq!(FewStep::Turbo.preset(Family::Sd2).size, None);
        let lcm = FewStep::Lcm.preset(Family::Sd1);
        assert_eq!((lcm.steps, lcm.sampler), (4, SamplerKind::Lcm));
    }
}
