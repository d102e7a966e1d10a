//! What a user picks: the sampler and the spacing of its steps, with the names settings, the
//! command line and A1111's PNG parameters use, and the step counts and schedules each accepts.

use std::fmt;
use std::str::FromStr;

use super::{SchedulerConfig, SchedulerError, ddim};

/// Which sampler (diffusers scheduler class) denoises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SamplerKind {
    /// `EulerDiscreteScheduler`.
    Euler,
    /// `EulerAncestralDiscreteScheduler`: draws fresh noise every step.
    EulerAncestral,
    /// `DPMSolverMultistepScheduler` (solver_order 2, `dpmsolver++`).
    DpmPp2M,
    /// `DDIMScheduler` with eta 0.
    Ddim,
    /// `LCMScheduler`: few-step sampling for LCM-LoRAs and LCM fine-tunes; draws fresh noise
    /// every step but the last.
    Lcm,
}

impl SamplerKind {
    /// Every sampler, in the order a UI lists them.
    pub const ALL: [SamplerKind; 5] = [
        SamplerKind::Euler,
        SamplerKind::EulerAncestral,
        SamplerKind::DpmPp2M,
        SamplerKind::Ddim,
        SamplerKind::Lcm,
    ];

    /// The identifier used in settings and on the command line (`euler_a`, ...).
    pub fn id(self) -> &'static str {
        match self {
            SamplerKind::Euler => "euler",
            SamplerKind::EulerAncestral => "euler_a",
            SamplerKind::DpmPp2M => "dpmpp_2m",
            SamplerKind::Ddim => "ddim",
            SamplerKind::Lcm => "lcm",
        }
    }

    /// The name A1111 shows (and writes into PNG parameters): `Euler a`, `DPM++ 2M`, ...
    pub fn a1111_name(self) -> &'static str {
        match self {
            SamplerKind::Euler => "Euler",
            SamplerKind::EulerAncestral => "Euler a",
            SamplerKind::DpmPp2M => "DPM++ 2M",
            SamplerKind::Ddim => "DDIM",
            SamplerKind::Lcm => "LCM",
        }
    }

    /// Whether [`plan`] accepts this sampler with `schedule` (DDIM and LCM have no Karras
    /// schedule).
    pub fn supports(self, schedule: Schedule) -> bool {
        !(matches!(self, SamplerKind::Ddim | SamplerKind::Lcm) && schedule == Schedule::Karras)
    }

    /// The most steps [`plan`] accepts for this sampler and schedule: the number of training
    /// timesteps, less where diffusers breaks before that.
    pub fn max_steps(self, schedule: Schedule, config: &SchedulerConfig) -> usize {
        match (self, schedule) {
            (SamplerKind::Ddim, _) => ddim::max_steps(config),
            // Its steps are a subset of the 50 distillation steps.
            (SamplerKind::Lcm, _) => super::lcm::ORIGINAL_STEPS.min(config.num_train_timesteps),
            // At T steps the rounded "linspace" timesteps repeat one; the solver then divides by
            // a zero log-SNR step and diffusers returns NaN.
            (SamplerKind::DpmPp2M, Schedule::Normal) => config.num_train_timesteps - 1,
            _ => config.num_train_timesteps,
        }
    }
}

impl SamplerKind {
    /// The spacing its diffusers class uses when a config does not say (`timestep_spacing`).
    pub fn default_spacing(self) -> super::TimestepSpacing {
        match self {
            SamplerKind::Ddim | SamplerKind::Lcm => super::TimestepSpacing::Leading,
            _ => super::TimestepSpacing::Linspace,
        }
    }
}

impl fmt::Display for SamplerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

impl FromStr for SamplerKind {
    type Err = SchedulerError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.id() == s)
            .ok_or_else(|| SchedulerError::UnknownSampler(s.to_owned()))
    }
}

/// How the noise levels of the steps are spaced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Schedule {
    /// The scheduler's default spacing (diffusers' `timestep_spacing` default of each class).
    #[default]
    Normal,
    /// Karras et al. sigmas (`use_karras_sigmas=True`): more steps at low noise. Not for DDIM;
    /// for Euler a, which has no such option in diffusers, k-diffusion's Karras sigmas (as in
    /// A1111 and ComfyUI), see `euler_ancestral.rs`.
    Karras,
}

impl Schedule {
    /// Every schedule, in the order a UI lists them.
    pub const ALL: [Schedule; 2] = [Schedule::Normal, Schedule::Karras];

    /// The identifier used in settings and on the command line.
    pub fn id(self) -> &'static str {
        match self {
            Schedule::Normal => "normal",
            Schedule::Karras => "karras",
        }
    }

    /// Display name, as A1111's "Schedule type" spells Karras.
    pub fn a1111_name(self) -> &'static str {
        match self {
            Schedule::Normal => "Normal",
            Schedule::Karras => "Karras",
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

impl FromStr for Schedule {
    type Err = SchedulerError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.id() == s)
            .ok_or_else(|| SchedulerError::UnknownSchedule(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedulers::Prediction;

    #[test]
    fn unsupported_predictions_and_unknown_names_are_errors() {
        for name in ["sample", "flow_prediction", "eps", ""] {
            assert_eq!(
                name.parse::<Prediction>(),
                Err(SchedulerError::UnsupportedPrediction(name.to_owned()))
            );
        }
        assert_eq!(
            "Euler a".parse::<SamplerKind>(),
            Err(SchedulerError::UnknownSampler("Euler a".to_owned()))
        );
        assert_eq!(
            "exponential".parse::<Schedule>(),
            Err(SchedulerError::UnknownSchedule("exponential".to_owned()))
        );
    }

    #[test]
    fn names_round_trip() {
        for kind in SamplerKind::ALL {
            assert_eq!(kind.to_string().parse::<SamplerKind>(), Ok(kind));
        }
        for schedule in Schedule::ALL {
            assert_eq!(schedule.to_string().parse::<Schedule>(), Ok(schedule));
        }
        for prediction in [Prediction::Epsilon, Prediction::VPrediction] {
            assert_eq!(prediction.to_string().parse::<Prediction>(), Ok(prediction));
        }
        let a1111: Vec<_> = SamplerKind::ALL.iter().map(|k| k.a1111_name()).collect();
        assert_eq!(a1111, ["Euler", "Euler a", "DPM++ 2M", "DDIM", "LCM"]);
        let ids: Vec<_> = SamplerKind::ALL.iter().map(|k| k.id()).collect();
        assert_eq!(ids, ["euler", "euler_a", "dpmpp_2m", "ddim", "lcm"]);
        assert_eq!(Schedule::Karras.a1111_name(), "Karras");
        assert_eq!(Schedule::Normal.a1111_name(), "Normal");
    }
}
