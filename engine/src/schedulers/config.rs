//! The model's side of a plan: what its UNet predicts and its training noise schedule (the
//! fields of a diffusers `scheduler_config.json`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{Linear, SchedulerError, schedule};

/// What the UNet predicts (diffusers' `prediction_type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Prediction {
    /// The added noise ε (SD 1.x, SD 2 base 512).
    #[default]
    Epsilon,
    /// The velocity v = α·ε − σ·x0 (SD 2 768-v models).
    VPrediction,
}

impl Prediction {
    /// The diffusers `prediction_type` string.
    pub fn id(self) -> &'static str {
        match self {
            Prediction::Epsilon => "epsilon",
            Prediction::VPrediction => "v_prediction",
        }
    }

    /// x0 and ε, each as `(sample, model_output)` coefficients, for a variance-preserving sample
    /// x = α·x0 + σ·ε: `convert_model_output` in `scheduling_dpmsolver_multistep.py` and the
    /// `pred_original_sample`/`pred_epsilon` pair in `scheduling_ddim.py`.
    pub(super) fn vp(self, alpha: f64, sigma: f64) -> (Linear, Linear) {
        match self {
            Prediction::Epsilon => (
                Linear::new(1.0 / alpha, -sigma / alpha),
                Linear::new(0.0, 1.0),
            ),
            Prediction::VPrediction => (Linear::new(alpha, -sigma), Linear::new(sigma, alpha)),
        }
    }

    /// x0 as `(sample, model_output)` coefficients for the k-diffusion sample x = x0 + σ·ε the
    /// Euler samplers step (the UNet sees x / sqrt(σ² + 1)): `step` in
    /// `scheduling_euler_discrete.py`.
    pub(super) fn ve_x0(self, sigma: f64) -> Linear {
        match self {
            Prediction::Epsilon => Linear::new(1.0, -sigma),
            Prediction::VPrediction => {
                let s2 = sigma * sigma + 1.0;
                Linear::new(1.0 / s2, -sigma / s2.sqrt())
            }
        }
    }
}

impl fmt::Display for Prediction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

impl Serialize for Prediction {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.id())
    }
}

impl<'de> Deserialize<'de> for Prediction {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl FromStr for Prediction {
    type Err = SchedulerError;

    /// Parses a diffusers `prediction_type`; `sample` and `flow_prediction` are refused.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "epsilon" => Ok(Prediction::Epsilon),
            "v_prediction" => Ok(Prediction::VPrediction),
            _ => Err(SchedulerError::UnsupportedPrediction(s.to_owned())),
        }
    }
}

/// How β grows over the training timesteps (diffusers' `beta_schedule`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BetaSchedule {
    /// β evenly spaced from `beta_start` to `beta_end`.
    Linear,
    /// sqrt(β) evenly spaced (Stable Diffusion).
    #[default]
    ScaledLinear,
}

/// How a scheduler spaces the timesteps of its steps (diffusers' `timestep_spacing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimestepSpacing {
    /// Evenly from T − 1 down to 0 (Euler, Euler a and DPM++ 2M by default).
    Linspace,
    /// `arange(steps) · (T / steps)` plus `steps_offset`, descending (DDIM by default).
    Leading,
    /// Evenly down from T, ending above 0 (SD-Turbo and zero-terminal-SNR models).
    Trailing,
}

impl TimestepSpacing {
    /// The `timestep_spacing` string.
    pub fn id(self) -> &'static str {
        match self {
            TimestepSpacing::Linspace => "linspace",
            TimestepSpacing::Leading => "leading",
            TimestepSpacing::Trailing => "trailing",
        }
    }
}

/// The model's training noise schedule: the fields of a diffusers `scheduler_config.json`
/// these samplers read, under diffusers' names (a folder's file, or a sidecar's `scheduler`).
/// `clip_sample` is taken as false and `trained_betas` as absent, as in every Stable Diffusion
/// config (clipping x0 would make the update non-linear); the checkpoint loader refuses files
/// that say otherwise.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SchedulerConfig {
    /// T: the number of training timesteps; they are `0..T`.
    pub num_train_timesteps: usize,
    /// β of timestep 0.
    pub beta_start: f64,
    /// β of timestep T - 1.
    pub beta_end: f64,
    pub beta_schedule: BetaSchedule,
    /// Added to DDIM's "leading" timesteps.
    pub steps_offset: usize,
    /// DDIM: the ᾱ after the last step is 1 if true, else ᾱ of timestep 0.
    pub set_alpha_to_one: bool,
    /// What the UNet predicts (diffusers' `prediction_type`, a model property).
    #[serde(rename = "prediction_type")]
    pub prediction: Prediction,
    /// The spacing the config asks for; `None` leaves each sampler its class's default (as
    /// diffusers' `from_config` does for a config without the key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestep_spacing: Option<TimestepSpacing>,
    /// diffusers' `rescale_betas_zero_snr` (Lin et al., "Common Diffusion Noise Schedules and
    /// Sample Steps are Flawed"): the betas rescaled so that the last timestep is pure noise
    /// (ᾱ = 0). Models trained so predict velocity; the σ-based samplers take ᾱ_T = 2⁻²⁴ there,
    /// as diffusers' do, to keep σ finite.
    #[serde(
        rename = "rescale_betas_zero_snr",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub zero_terminal_snr: bool,
}

impl SchedulerConfig {
    /// Stable Diffusion 1.x, from runwayml/stable-diffusion-v1-5 `scheduler/scheduler_config.json`:
    /// `{"beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
    /// "num_train_timesteps": 1000, "steps_offset": 1, "clip_sample": false,
    /// "set_alpha_to_one": false, "skip_prk_steps": true, "trained_betas": null}`.
    pub fn sd15() -> Self {
        Self {
            num_train_timesteps: 1000,
            beta_start: 0.00085,
            beta_end: 0.012,
            beta_schedule: BetaSchedule::ScaledLinear,
            steps_offset: 1,
            set_alpha_to_one: false,
            prediction: Prediction::Epsilon,
            timestep_spacing: None,
            zero_terminal_snr: false,
        }
    }

    /// Stable Diffusion 2.x: SD 1.5's schedule; `v` for the 768-v models (2.0-v, 2.1), which
    /// predict velocity, else epsilon (the 512 base models).
    pub fn sd2(v: bool) -> Self {
        Self {
            prediction: if v {
                Prediction::VPrediction
            } else {
                Prediction::Epsilon
            },
            ..Self::sd15()
        }
    }

    /// Stable Diffusion XL base 1.0 (`EulerDiscreteScheduler`): SD 1.5's schedule with
    /// `"timestep_spacing": "leading"` stated.
    pub fn sdxl() -> Self {
        Self {
            timestep_spacing: Some(TimestepSpacing::Leading),
            ..Self::sd15()
        }
    }

    /// ᾱ for each training timestep, float32 exactly as diffusers computes it.
    pub fn alphas_cumprod(&self) -> Vec<f32> {
        schedule::alphas_cumprod(self)
    }

    pub(super) fn validate(&self) -> Result<(), SchedulerError> {
        let betas_ok = self.beta_start > 0.0
            && self.beta_end > 0.0
            && self.beta_start < 1.0
            && self.beta_end < 1.0;
        // The tables are built at this length: bounded so that a config cannot ask for gigabytes.
        if !(2..=100_000).contains(&self.num_train_timesteps) {
            return Err(SchedulerError::InvalidConfig(format!(
                "num_train_timesteps must be between 2 and 100000, got {}",
                self.num_train_timesteps
            )));
        }
        // Every Stable Diffusion config says 0 or 1; a larger offset would push "leading"
        // timesteps past the training schedule (diffusers then indexes past its tables).
        if self.steps_offset > 1 {
            return Err(SchedulerError::InvalidConfig(format!(
                "steps_offset must be 0 or 1, got {}",
                self.steps_offset
            )));
        }
        if !betas_ok {
            return Err(SchedulerError::InvalidConfig(format!(
                "beta_start and beta_end must lie in (0, 1), got {} and {}",
                self.beta_start, self.beta_end
            )));
        }
        Ok(())
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self::sd15()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedulers::fixtures::fixtures;
    use crate::schedulers::{SamplerKind, Schedule, plan};

    #[test]
    fn sd15_preset_is_the_fixture_config() {
        let fixtures = fixtures();
        let json = &fixtures["config"];
        let sd15 = SchedulerConfig::sd15();
        assert_eq!(json["beta_start"].as_f64(), Some(sd15.beta_start));
        assert_eq!(json["beta_end"].as_f64(), Some(sd15.beta_end));
        assert_eq!(json["beta_schedule"].as_str(), Some("scaled_linear"));
        assert_eq!(sd15.beta_schedule, BetaSchedule::ScaledLinear);
        assert_eq!(
            json["num_train_timesteps"].as_u64(),
            Some(sd15.num_train_timesteps as u64)
        );
        assert_eq!(
            json["steps_offset"].as_u64(),
            Some(sd15.steps_offset as u64)
        );
        assert_eq!(
            json["set_alpha_to_one"].as_bool(),
            Some(sd15.set_alpha_to_one)
        );
        assert_eq!(json["clip_sample"].as_bool(), Some(false));
        assert!(json["trained_betas"].is_null());
    }

    #[test]
    fn invalid_configs_are_errors() {
        let bad = [
            SchedulerConfig {
                num_train_timesteps: 1,
                ..SchedulerConfig::sd15()
            },
            SchedulerConfig {
                beta_start: 0.0,
                ..SchedulerConfig::sd15()
            },
            SchedulerConfig {
                beta_end: 1.0,
                ..SchedulerConfig::sd15()
            },
            SchedulerConfig {
                beta_end: f64::NAN,
                ..SchedulerConfig::sd15()
            },
            SchedulerConfig {
                num_train_timesteps: 1 << 40,
                ..SchedulerConfig::sd15()
            },
            SchedulerConfig {
                steps_offset: 500,
                timestep_spacing: Some(TimestepSpacing::Leading),
                ..SchedulerConfig::sd15()
            },
        ];
        for config in bad {
            let err = plan(SamplerKind::Euler, Schedule::Normal, 10, &config).unwrap_err();
            assert!(
                matches!(err, SchedulerError::InvalidConfig(_)),
                "{config:?}: {err}"
            );
        }
        // LCM's schedule needs at least 50 training timesteps (every T / 50th one).
        let short = SchedulerConfig {
            num_train_timesteps: 20,
            ..SchedulerConfig::sd15()
        };
        let err = plan(SamplerKind::Lcm, Schedule::Normal, 4, &short).unwrap_err();
        assert!(matches!(err, SchedulerError::InvalidConfig(_)), "{err}");
        assert!(plan(SamplerKind::Euler, Schedule::Normal, 4, &short).is_ok());
    }
}
