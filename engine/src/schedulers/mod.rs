//! Samplers (Euler, Euler a, DPM++ 2M, DDIM, LCM) and their noise schedules, as host-side plans.
//!
//! Each sampler mirrors a Hugging Face diffusers 0.42 scheduler built from SD 1.5's
//! `scheduler_config.json` ([`SchedulerConfig::sd15`]) with that class's defaults, and agrees
//! with it to float32 rounding (`tests/fixtures/make_scheduler_fixtures.py` records the
//! reference).
//!
//! # Why plans
//!
//! The denoising loop runs on the GPU and must not read tensors back. Every update these samplers
//! make is linear in the current sample `x`, the model output `m` (ε, or v for v-prediction), the
//! previous step's predicted x0 (DPM++ 2M) and fresh noise `n` (Euler a), with coefficients that
//! depend only on the step. So [`plan`] computes all of them up front in float64 from the same
//! float32 tables diffusers uses, and the loop is plain tensor arithmetic:
//!
//! ```text
//! x = noise * plan.init_noise_sigma                 // noise: torch.randn-compatible, seed's generator
//! prev_x0 = 0
//! for i in 0..plan.num_steps():
//!     m  = unet(x * plan.input_scale[i], plan.timesteps[i], text)   // + CFG
//!     x0 = plan.x0[i].sample * x + plan.x0[i].model_output * m      // also the live preview
//!     n  = if plan.draws_noise { generator.randn(x.shape) } else { 0 }
//!     s  = plan.steps[i]
//!     x  = s.sample * x + s.model_output * m + s.prev_x0 * prev_x0 + s.noise * n
//!     prev_x0 = x0
//! image = vae.decode(x)
//! ```
//!
//! # Files
//!
//! `sampler.rs`: the sampler and schedule a user picks. `config.rs`: the model's prediction type
//! and training schedule; `schedule.rs`: the noise tables built from it. One file per sampler
//! (`euler.rs`, `euler_ancestral.rs`, `dpmpp_2m.rs`, `ddim.rs`), each tested against diffusers
//! with the recorded cases of `fixtures.rs` (tests only). This file: the plan and its checks.

mod config;
mod ddim;
mod dpmpp_2m;
mod euler;
mod euler_ancestral;
#[cfg(test)]
mod fixtures;
mod lcm;
mod sampler;
mod schedule;

pub use config::{BetaSchedule, Prediction, SchedulerConfig, TimestepSpacing};
pub use sampler::{SamplerKind, Schedule};

/// One step's update: `next = sample * x + model_output * m + prev_x0 * x0_prev + noise * n`,
/// where `x0_prev` is the previous step's predicted x0 (zero at step 0) and `n` fresh noise.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepCoefficients {
    /// Multiplies the current sample x.
    pub sample: f32,
    /// Multiplies the model output m (after classifier-free guidance).
    pub model_output: f32,
    /// Multiplies the previous step's predicted x0 (DPM++ 2M only).
    pub prev_x0: f32,
    /// Multiplies fresh standard normal noise (Euler a only).
    pub noise: f32,
}

impl StepCoefficients {
    /// The update for one element (the reference the GPU loop implements on tensors).
    pub fn apply(&self, x: f32, model_output: f32, prev_x0: f32, noise: f32) -> f32 {
        self.sample * x
            + self.model_output * model_output
            + self.prev_x0 * prev_x0
            + self.noise * noise
    }
}

/// The predicted denoised sample: `x0 = sample * x + model_output * m`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct X0Coefficients {
    pub sample: f32,
    pub model_output: f32,
}

impl X0Coefficients {
    /// x0 for one element.
    pub fn apply(&self, x: f32, model_output: f32) -> f32 {
        self.sample * x + self.model_output * model_output
    }
}

/// Where img2img starts: `x = sample * x0 + noise * n` for the encoded image's latent `x0` and
/// standard normal noise `n`, the scheduler's `add_noise` at the first step that runs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StartCoefficients {
    pub sample: f32,
    pub noise: f32,
}

/// Everything the denoising loop needs for a run, computed once up front by [`plan`]. All
/// vectors have one entry per step; `x` is always the sample as the loop keeps it (unscaled).
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The timestep the UNet is given at each step (fractional for Euler, integral for DDIM and
    /// DPM++ 2M).
    pub timesteps: Vec<f32>,
    /// Initial latents = standard normal noise × this.
    pub init_noise_sigma: f32,
    /// UNet input = x × this (Euler samplers: 1/sqrt(σ² + 1); others: 1).
    pub input_scale: Vec<f32>,
    /// The update of each step.
    pub steps: Vec<StepCoefficients>,
    /// The predicted x0 at each step, for live previews (and DPM++ 2M's `prev_x0`).
    pub x0: Vec<X0Coefficients>,
    /// img2img: how a clean latent is noised to start at each step (the scheduler's
    /// `add_noise` at that step's timestep).
    pub start: Vec<StartCoefficients>,
    /// Whether each step needs fresh standard normal noise `n` of the latent shape. Euler a
    /// draws it at every step, the last included (where its coefficient is 0), from the same
    /// `torch.Generator` as the initial latents, right after them; drawing the same way keeps
    /// seeds interchangeable with diffusers.
    pub draws_noise: bool,
}

impl Plan {
    /// The number of denoising steps (UNet evaluations).
    pub fn num_steps(&self) -> usize {
        self.timesteps.len()
    }

    /// The plan from step `begin` on (diffusers' `set_begin_index`).
    fn starting_at(mut self, begin: usize) -> Self {
        self.timesteps.drain(..begin);
        self.input_scale.drain(..begin);
        self.steps.drain(..begin);
        self.x0.drain(..begin);
        self.start.drain(..begin);
        self
    }
}

/// Why a plan could not be made, or a name not parsed. Messages are shown to users as is.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SchedulerError {
    #[error("the number of steps must be at least 1")]
    ZeroSteps,
    #[error("{} supports at most {max} steps with this model, got {steps}", .sampler.a1111_name())]
    TooManySteps {
        sampler: SamplerKind,
        steps: usize,
        max: usize,
    },
    #[error(
        "{} has no {} schedule; choose the Normal schedule, or a sampler that has it \
         (Euler, Euler a or DPM++ 2M)",
        .sampler.a1111_name(),
        .schedule.a1111_name()
    )]
    UnsupportedSchedule {
        sampler: SamplerKind,
        schedule: Schedule,
    },
    #[error("prediction type `{0}` is not supported yet (epsilon and v_prediction are)")]
    UnsupportedPrediction(String),
    #[error("unknown sampler `{0}` (expected euler, euler_a, dpmpp_2m, ddim or lcm)")]
    UnknownSampler(String),
    #[error("unknown schedule `{0}` (expected normal or karras)")]
    UnknownSchedule(String),
    #[error("invalid scheduler config: {0}")]
    InvalidConfig(String),
    #[error("denoising strength must be a number in (0, 1], got {0}")]
    InvalidStrength(f64),
    #[error(
        "denoising strength {strength} of {steps} steps runs no step (it runs \
         ⌊steps × strength⌋); raise the strength or the steps"
    )]
    NoStepsAtStrength { strength: f64, steps: usize },
}

/// Computes the plan for `steps` steps of `kind` with `schedule`, for the model `config`
/// describes.
pub fn plan(
    kind: SamplerKind,
    schedule: Schedule,
    steps: usize,
    config: &SchedulerConfig,
) -> Result<Plan, SchedulerError> {
    config.validate()?;
    if steps == 0 {
        return Err(SchedulerError::ZeroSteps);
    }
    if !kind.supports(schedule) {
        // diffusers' DDIMScheduler has no `use_karras_sigmas`; it would silently be ignored.
        return Err(SchedulerError::UnsupportedSchedule {
            sampler: kind,
            schedule,
        });
    }
    if kind == SamplerKind::Lcm && config.num_train_timesteps < lcm::ORIGINAL_STEPS {
        // Its schedule is every (T / 50)th timestep: none below 50 training timesteps.
        return Err(SchedulerError::InvalidConfig(format!(
            "LCM needs at least {} training timesteps, the model has {}",
            lcm::ORIGINAL_STEPS,
            config.num_train_timesteps
        )));
    }
    if config.zero_terminal_snr
        && config.prediction == Prediction::Epsilon
        && matches!(kind, SamplerKind::Ddim | SamplerKind::Lcm)
    {
        // ᾱ = 0 at the first step: x0 from a noise prediction divides by √ᾱ (diffusers gives NaN).
        return Err(SchedulerError::InvalidConfig(format!(
            "{} cannot start a zero-terminal-SNR schedule from a noise (epsilon) prediction; \
             such models predict velocity (set prediction_type v_prediction) or use Euler, \
             Euler a or DPM++ 2M",
            kind.a1111_name()
        )));
    }
    let max = kind.max_steps(schedule, config);
    if steps > max {
        return Err(SchedulerError::TooManySteps {
            sampler: kind,
            steps,
            max,
        });
    }
    Ok(plan_from(kind, schedule, steps, config, 0))
}

/// The plan of an img2img run (diffusers' `StableDiffusionImg2ImgPipeline`): of `steps` steps,
/// the last `⌊steps × strength⌋` run, starting from the image's latent noised as
/// [`Plan::start`]`[0]` says. Strength 1 runs every step from a fully noised image.
pub fn img2img_plan(
    kind: SamplerKind,
    schedule: Schedule,
    steps: usize,
    strength: f64,
    config: &SchedulerConfig,
) -> Result<Plan, SchedulerError> {
    let begin = img2img_begin(steps, strength)?;
    plan_window(kind, schedule, steps, begin, config)
}

/// The steps from `begin` on of a plan of `total` steps, starting from a clean latent noised as
/// [`Plan::start`]`[0]` says (A1111's hires pass; `begin < total`).
pub fn plan_window(
    kind: SamplerKind,
    schedule: Schedule,
    total: usize,
    begin: usize,
    config: &SchedulerConfig,
) -> Result<Plan, SchedulerError> {
    plan(kind, schedule, total, config)?;
    let begin = begin.min(total - 1);
    Ok(plan_from(kind, schedule, total, config, begin).starting_at(begin))
}

/// The first step img2img runs: `get_timesteps` of diffusers' img2img pipeline,
/// `steps - min(int(steps * strength), steps)`.
pub fn img2img_begin(steps: usize, strength: f64) -> Result<usize, SchedulerError> {
    if !(strength > 0.0 && strength <= 1.0) {
        return Err(SchedulerError::InvalidStrength(strength));
    }
    let run = ((steps as f64 * strength).floor() as usize).min(steps);
    if run == 0 {
        return Err(SchedulerError::NoStepsAtStrength { strength, steps });
    }
    Ok(steps - run)
}

/// The whole plan of a run whose first step is `begin` (a multistep solver restarts its
/// history there); the caller drops the steps before it.
fn plan_from(
    kind: SamplerKind,
    schedule: Schedule,
    steps: usize,
    config: &SchedulerConfig,
    begin: usize,
) -> Plan {
    let table = schedule::NoiseTable::new(config);
    let spacing = (
        config.timestep_spacing.unwrap_or(kind.default_spacing()),
        config.steps_offset,
    );
    let plan = match kind {
        SamplerKind::Euler => euler::plan(&table, schedule, steps, config.prediction, spacing),
        SamplerKind::EulerAncestral => {
            euler_ancestral::plan(&table, schedule, steps, config.prediction, spacing)
        }
        SamplerKind::DpmPp2M => {
            dpmpp_2m::plan(&table, schedule, steps, config.prediction, spacing, begin)
        }
        SamplerKind::Ddim => ddim::plan(&table, steps, config),
        SamplerKind::Lcm => lcm::plan(&table, steps, config),
    };
    debug_assert!(
        plan.timesteps.len() == steps
            && plan.input_scale.len() == steps
            && plan.steps.len() == steps
            && plan.x0.len() == steps
            && plan.start.len() == steps
    );
    plan
}

/// `sample * x + model * m`, in float64 while a plan is computed.
#[derive(Clone, Copy, Debug)]
struct Linear {
    sample: f64,
    model: f64,
}

impl Linear {
    fn new(sample: f64, model: f64) -> Self {
        Self { sample, model }
    }

    fn to_x0(self) -> X0Coefficients {
        X0Coefficients {
            sample: self.sample as f32,
            model_output: self.model as f32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::cases;
    use super::*;

    #[test]
    fn fixtures_cover_every_supported_pair_and_prediction() {
        let cases = cases();
        for kind in SamplerKind::ALL {
            for schedule in Schedule::ALL.into_iter().filter(|&s| kind.supports(s)) {
                for prediction in [Prediction::Epsilon, Prediction::VPrediction] {
                    assert!(
                        cases.iter().any(|c| c.kind == kind
                            && c.schedule == schedule
                            && c.config.prediction == prediction),
                        "no fixture for {kind} {schedule} {prediction}"
                    );
                }
            }
        }
    }

    #[test]
    fn only_euler_a_and_lcm_draw_noise() {
        for kind in SamplerKind::ALL {
            let plan = plan(kind, Schedule::Normal, 10, &SchedulerConfig::sd15()).unwrap();
            let draws = matches!(kind, SamplerKind::EulerAncestral | SamplerKind::Lcm);
            assert_eq!(plan.draws_noise, draws);
            assert!(plan.draws_noise || plan.steps.iter().all(|s| s.noise == 0.0));
        }
    }

    #[test]
    fn zero_steps_is_an_error() {
        for kind in SamplerKind::ALL {
            let err = plan(kind, Schedule::Normal, 0, &SchedulerConfig::sd15()).unwrap_err();
            assert_eq!(err, SchedulerError::ZeroSteps);
        }
    }

    #[test]
    fn more_steps_than_training_timesteps_is_an_error() {
        let config = SchedulerConfig::sd15();
        let too_many = |kind, steps, max| SchedulerError::TooManySteps {
            sampler: kind,
            steps,
            max,
        };
        for kind in [SamplerKind::Euler, SamplerKind::EulerAncestral] {
            for schedule in Schedule::ALL {
                assert!(plan(kind, schedule, 1000, &config).is_ok());
                assert_eq!(
                    plan(kind, schedule, 1001, &config),
                    Err(too_many(kind, 1001, 1000))
                );
            }
        }
        // DPM++ 2M's rounded linspace timesteps repeat one at 1000 steps (diffusers gives NaN).
        let dpm = SamplerKind::DpmPp2M;
        assert!(plan(dpm, Schedule::Karras, 1000, &config).is_ok());
        assert!(plan(dpm, Schedule::Normal, 999, &config).is_ok());
        assert_eq!(
            plan(dpm, Schedule::Normal, 1000, &config),
            Err(too_many(dpm, 1000, 999))
        );
        // DDIM's leading timesteps plus steps_offset 1 would reach t = 1000 at 1000 steps.
        let ddim = plan(SamplerKind::Ddim, Schedule::Normal, 999, &config).unwrap();
        assert_eq!(ddim.timesteps[0], 999.0);
        let err = plan(SamplerKind::Ddim, Schedule::Normal, 1000, &config).unwrap_err();
        assert_eq!(err, too_many(SamplerKind::Ddim, 1000, 999));
        assert_eq!(
            err.to_string(),
            "DDIM supports at most 999 steps with this model, got 1000"
        );
    }

    /// Every coefficient of every accepted plan is finite, up to the largest step counts.
    #[test]
    fn plans_are_finite() {
        let config = SchedulerConfig::sd15();
        for kind in SamplerKind::ALL {
            for schedule in Schedule::ALL.into_iter().filter(|&s| kind.supports(s)) {
                let max = kind.max_steps(schedule, &config);
                let counts = (1..=40).chain([100, 500, max - 1, max]);
                for steps in counts.filter(|&n| n <= max) {
                    let plan = plan(kind, schedule, steps, &config).unwrap();
                    let steps_finite = plan.steps.iter().all(|s| {
                        [s.sample, s.model_output, s.prev_x0, s.noise]
                            .iter()
                            .all(|c| c.is_finite())
                    });
                    let x0_finite = plan
                        .x0
                        .iter()
                        .all(|c| c.sample.is_finite() && c.model_output.is_finite());
                    let rest_finite = plan
                        .input_scale
                        .iter()
                        .chain(&plan.timesteps)
                        .all(|v| v.is_finite());
                    assert!(
                        steps_finite && x0_finite && rest_finite,
                        "{kind} {schedule} {steps} steps: {plan:?}"
                    );
                }
            }
        }
    }

    /// Zero terminal SNR from a noise prediction: the σ-based samplers run it (diffusers'
    /// 2⁻²⁴), DDIM and LCM would divide by √ᾱ = 0 and say so instead.
    #[test]
    fn zero_terminal_snr_with_epsilon_is_refused_where_it_divides_by_zero() {
        let config = SchedulerConfig {
            zero_terminal_snr: true,
            ..SchedulerConfig::sd15()
        };
        for kind in [SamplerKind::Ddim, SamplerKind::Lcm] {
            let err = plan(kind, Schedule::Normal, 5, &config).unwrap_err();
            assert!(err.to_string().contains("zero-terminal-SNR"), "{err}");
            let v = SchedulerConfig {
                prediction: Prediction::VPrediction,
                ..config.clone()
            };
            assert!(plan(kind, Schedule::Normal, 5, &v).is_ok(), "{kind:?}");
        }
        for kind in [
            SamplerKind::Euler,
            SamplerKind::EulerAncestral,
            SamplerKind::DpmPp2M,
        ] {
            let p = plan(kind, Schedule::Normal, 5, &config).unwrap();
            assert!(p.init_noise_sigma.is_finite(), "{kind:?}");
        }
        // σ at the last training timestep: √((1 − 2⁻²⁴) / 2⁻²⁴) ≈ 4096 (the Euler start).
        let p = plan(SamplerKind::Euler, Schedule::Normal, 5, &config).unwrap();
        assert!(
            (4000.0..4100.0).contains(&p.init_noise_sigma),
            "{}",
            p.init_noise_sigma
        );
    }

    #[test]
    fn ddim_karras_is_a_clear_error() {
        let err = plan(
            SamplerKind::Ddim,
            Schedule::Karras,
            20,
            &SchedulerConfig::sd15(),
        )
        .unwrap_err();
        assert_eq!(
            err,
            SchedulerError::UnsupportedSchedule {
                sampler: SamplerKind::Ddim,
                schedule: Schedule::Karras
            }
        );
        let message = err.to_string();
        assert!(
            message.starts_with("DDIM has no Karras schedule"),
            "{message}"
        );
        assert!(!SamplerKind::Ddim.supports(Schedule::Karras));
    }
}
