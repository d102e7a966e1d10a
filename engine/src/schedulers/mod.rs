//! Samplers (Euler, Euler a, DPM++ 2M, DDIM) and their noise schedules, as host-side plans.
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

mod ddim;
mod dpmpp_2m;
mod euler;
mod euler_ancestral;
mod schedule;

use std::fmt;
use std::str::FromStr;

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
}

impl SamplerKind {
    /// Every sampler, in the order a UI lists them.
    pub const ALL: [SamplerKind; 4] = [
        SamplerKind::Euler,
        SamplerKind::EulerAncestral,
        SamplerKind::DpmPp2M,
        SamplerKind::Ddim,
    ];

    /// The identifier used in settings and on the command line (`euler_a`, ...).
    pub fn id(self) -> &'static str {
        match self {
            SamplerKind::Euler => "euler",
            SamplerKind::EulerAncestral => "euler_a",
            SamplerKind::DpmPp2M => "dpmpp_2m",
            SamplerKind::Ddim => "ddim",
        }
    }

    /// The name A1111 shows (and writes into PNG parameters): `Euler a`, `DPM++ 2M`, ...
    pub fn a1111_name(self) -> &'static str {
        match self {
            SamplerKind::Euler => "Euler",
            SamplerKind::EulerAncestral => "Euler a",
            SamplerKind::DpmPp2M => "DPM++ 2M",
            SamplerKind::Ddim => "DDIM",
        }
    }

    /// Whether [`plan`] accepts this sampler with `schedule` (DDIM has no Karras schedule).
    pub fn supports(self, schedule: Schedule) -> bool {
        !(self == SamplerKind::Ddim && schedule == Schedule::Karras)
    }

    /// The most steps [`plan`] accepts for this sampler and schedule: the number of training
    /// timesteps, less where diffusers breaks before that.
    pub fn max_steps(self, schedule: Schedule, config: &SchedulerConfig) -> usize {
        match (self, schedule) {
            (SamplerKind::Ddim, _) => ddim::max_steps(config),
            // At T steps the rounded "linspace" timesteps repeat one; the solver then divides by
            // a zero log-SNR step and diffusers returns NaN.
            (SamplerKind::DpmPp2M, Schedule::Normal) => config.num_train_timesteps - 1,
            _ => config.num_train_timesteps,
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
    fn vp(self, alpha: f64, sigma: f64) -> (Linear, Linear) {
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
    fn ve_x0(self, sigma: f64) -> Linear {
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BetaSchedule {
    /// β evenly spaced from `beta_start` to `beta_end`.
    Linear,
    /// sqrt(β) evenly spaced (Stable Diffusion).
    #[default]
    ScaledLinear,
}

/// The model's training noise schedule: the fields of a diffusers `scheduler_config.json`
/// these samplers read. `clip_sample` is taken as false and `trained_betas` as absent, as in
/// every Stable Diffusion config (clipping x0 would make the update non-linear).
#[derive(Clone, Debug, PartialEq)]
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
    pub prediction: Prediction,
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
        }
    }

    /// ᾱ for each training timestep, float32 exactly as diffusers computes it.
    pub fn alphas_cumprod(&self) -> Vec<f32> {
        schedule::alphas_cumprod(self)
    }

    fn validate(&self) -> Result<(), SchedulerError> {
        let betas_ok = self.beta_start > 0.0
            && self.beta_end > 0.0
            && self.beta_start < 1.0
            && self.beta_end < 1.0;
        if self.num_train_timesteps < 2 {
            return Err(SchedulerError::InvalidConfig(format!(
                "num_train_timesteps must be at least 2, got {}",
                self.num_train_timesteps
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
}

/// Why a plan could not be made, or a name not parsed. Messages are shown to users as is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
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
    #[error("unknown sampler `{0}` (expected euler, euler_a, dpmpp_2m or ddim)")]
    UnknownSampler(String),
    #[error("unknown schedule `{0}` (expected normal or karras)")]
    UnknownSchedule(String),
    #[error("invalid scheduler config: {0}")]
    InvalidConfig(String),
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
    let max = kind.max_steps(schedule, config);
    if steps > max {
        return Err(SchedulerError::TooManySteps {
            sampler: kind,
            steps,
            max,
        });
    }
    let table = schedule::NoiseTable::new(config);
    let plan = match kind {
        SamplerKind::Euler => euler::plan(&table, schedule, steps, config.prediction),
        SamplerKind::EulerAncestral => {
            euler_ancestral::plan(&table, schedule, steps, config.prediction)
        }
        SamplerKind::DpmPp2M => dpmpp_2m::plan(&table, schedule, steps, config.prediction),
        SamplerKind::Ddim => ddim::plan(&table, steps, config),
    };
    debug_assert!(
        plan.timesteps.len() == steps
            && plan.input_scale.len() == steps
            && plan.steps.len() == steps
            && plan.x0.len() == steps
    );
    Ok(plan)
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
    use super::*;
    use serde_json::Value;

    const FIXTURES: &str = include_str!("../../../tests/fixtures/scheduler_cases.json");

    /// Per-step latents and predicted x0 must match diffusers within `ABS_TOL + REL_TOL * scale`,
    /// `scale` being the largest magnitude in diffusers' vector. The fake model drives latents
    /// to 17-40, where one float32 ulp is 2-4e-6 and rounding compounds over the steps:
    /// diffusers' own float32 loop differs from the same code run in float64 by up to 3e-5
    /// there, so a purely absolute 1e-5 would test rounding order rather than the plans.
    const ABS_TOL: f32 = 1e-5;
    const REL_TOL: f32 = 1e-6;

    fn fixtures() -> Value {
        serde_json::from_str(FIXTURES).expect("scheduler_cases.json parses")
    }

    fn f32s(v: &Value) -> Vec<f32> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|x| x.as_f64().expect("number") as f32)
            .collect()
    }

    fn rows(v: &Value) -> Vec<Vec<f32>> {
        v.as_array().expect("array").iter().map(f32s).collect()
    }

    /// The largest |a - b|; infinite if anything is NaN (which `f32::max` would skip).
    fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .map(|d| if d.is_nan() { f32::INFINITY } else { d })
            .fold(0.0, f32::max)
    }

    struct Case {
        name: String,
        kind: SamplerKind,
        schedule: Schedule,
        config: SchedulerConfig,
        steps: usize,
        timesteps: Vec<f32>,
        init_noise_sigma: f32,
        noise: Vec<f32>,
        latents: Vec<Vec<f32>>,
        pred_x0: Vec<Vec<f32>>,
        step_noise: Option<Vec<Vec<f32>>>,
    }

    fn cases() -> Vec<Case> {
        let fixtures = fixtures();
        fixtures["cases"]
            .as_array()
            .expect("cases")
            .iter()
            .map(|c| {
                let s = |key: &str| c[key].as_str().expect("string");
                let config = SchedulerConfig {
                    prediction: s("prediction").parse().expect("prediction"),
                    ..SchedulerConfig::sd15()
                };
                let steps = c["steps"].as_u64().expect("steps") as usize;
                Case {
                    name: format!(
                        "{} {} {} {steps} steps",
                        s("sampler"),
                        s("schedule"),
                        s("prediction")
                    ),
                    kind: s("sampler").parse().expect("sampler"),
                    schedule: s("schedule").parse().expect("schedule"),
                    config,
                    steps,
                    timesteps: f32s(&c["timesteps"]),
                    init_noise_sigma: c["init_noise_sigma"].as_f64().expect("sigma") as f32,
                    noise: f32s(&c["noise"]),
                    latents: rows(&c["latents"]),
                    pred_x0: rows(&c["pred_x0"]),
                    step_noise: c.get("step_noise").map(rows),
                }
            })
            .collect()
    }

    /// The fixture's stand-in for the UNet: `tanh(model_input * 0.5 + t / 1000)` in float32.
    fn fake_model(model_input: f32, t: f32) -> f32 {
        (model_input * 0.5 + t / 1000.0).tanh()
    }

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
    fn alphas_cumprod_match_torch_bit_for_bit() {
        let expected: Vec<u32> = fixtures()["alphas_cumprod_bits"]
            .as_array()
            .expect("bits")
            .iter()
            .map(|b| b.as_u64().expect("u32") as u32)
            .collect();
        let ours: Vec<u32> = SchedulerConfig::sd15()
            .alphas_cumprod()
            .iter()
            .map(|a| a.to_bits())
            .collect();
        assert_eq!(ours, expected);
    }

    /// Runs each fixture's loop on plain vectors using only the plan's coefficients, the
    /// recorded noise and the same fake model, and compares every step with diffusers.
    #[test]
    fn plans_reproduce_diffusers_loops() {
        let mut failures = Vec::new();
        let mut worst = (0.0f32, String::new());
        let mut worst_t = 0.0f32;
        for case in cases() {
            let name = &case.name;
            let plan = plan(case.kind, case.schedule, case.steps, &case.config)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(plan.num_steps(), case.steps, "{name}");
            assert_eq!(plan.draws_noise, case.step_noise.is_some(), "{name}");
            let dt = max_abs_diff(&plan.timesteps, &case.timesteps);
            worst_t = worst_t.max(dt);
            if dt > 1e-4 {
                failures.push(format!(
                    "{name}: timesteps off by {dt}: {:?} vs {:?}",
                    plan.timesteps, case.timesteps
                ));
            }
            let rel = (plan.init_noise_sigma - case.init_noise_sigma).abs() / case.init_noise_sigma;
            if rel > 1e-5 {
                failures.push(format!(
                    "{name}: init_noise_sigma {} vs {}",
                    plan.init_noise_sigma, case.init_noise_sigma
                ));
            }

            let mut x: Vec<f32> = case
                .noise
                .iter()
                .map(|n| n * plan.init_noise_sigma)
                .collect();
            let mut prev_x0 = vec![0.0f32; x.len()];
            let mut check = |what: String, ours: &[f32], theirs: &[f32]| {
                let d = max_abs_diff(ours, theirs);
                let scale = theirs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let tol = ABS_TOL + REL_TOL * scale;
                if d / tol > worst.0 {
                    worst = (d / tol, format!("{what}: off by {d}, scale {scale}"));
                }
                if d > tol {
                    failures.push(format!("{what}: off by {d}, allowed {tol}"));
                }
            };
            check(format!("{name}: initial latents"), &x, &case.latents[0]);
            for i in 0..plan.num_steps() {
                let t = plan.timesteps[i];
                let model: Vec<f32> = x
                    .iter()
                    .map(|&v| fake_model(v * plan.input_scale[i], t))
                    .collect();
                let x0: Vec<f32> = x
                    .iter()
                    .zip(&model)
                    .map(|(&v, &m)| plan.x0[i].apply(v, m))
                    .collect();
                check(format!("{name}: x0 of step {i}"), &x0, &case.pred_x0[i]);
                let zeros = vec![0.0; x.len()];
                let noise = case.step_noise.as_ref().map_or(&zeros, |n| &n[i]);
                x = (0..x.len())
                    .map(|j| plan.steps[i].apply(x[j], model[j], prev_x0[j], noise[j]))
                    .collect();
                check(
                    format!("{name}: latents after step {i}"),
                    &x,
                    &case.latents[i + 1],
                );
                prev_x0 = x0;
            }
        }
        eprintln!("largest timestep difference: {worst_t}");
        eprintln!(
            "worst step used {:.0}% of its tolerance ({})",
            worst.0 * 100.0,
            worst.1
        );
        assert!(
            failures.is_empty(),
            "{} mismatches:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }

    /// Euler a's noise is the seed's generator continued: drawing the initial latents and then
    /// one latent-sized draw per step from one `TorchRng` reproduces what diffusers drew.
    #[test]
    fn euler_a_noise_continues_the_seed_generator() {
        let seed = fixtures()["seed"].as_u64().expect("seed");
        for case in cases()
            .into_iter()
            .filter(|c| c.kind == SamplerKind::EulerAncestral)
        {
            let mut rng = crate::noise::TorchRng::new(seed);
            assert_eq!(rng.randn(case.noise.len()), case.noise, "{}", case.name);
            for (i, expected) in case.step_noise.iter().flatten().enumerate() {
                assert_eq!(
                    &rng.randn(expected.len()),
                    expected,
                    "{} step {i}",
                    case.name
                );
            }
        }
    }

    #[test]
    fn only_euler_a_draws_noise() {
        for kind in SamplerKind::ALL {
            let plan = plan(kind, Schedule::Normal, 10, &SchedulerConfig::sd15()).unwrap();
            assert_eq!(plan.draws_noise, kind == SamplerKind::EulerAncestral);
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
                for steps in (1..=40).chain([100, 500, max - 1, max]) {
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
        ];
        for config in bad {
            let err = plan(SamplerKind::Euler, Schedule::Normal, 10, &config).unwrap_err();
            assert!(
                matches!(err, SchedulerError::InvalidConfig(_)),
                "{config:?}: {err}"
            );
        }
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
        assert_eq!(a1111, ["Euler", "Euler a", "DPM++ 2M", "DDIM"]);
        let ids: Vec<_> = SamplerKind::ALL.iter().map(|k| k.id()).collect();
        assert_eq!(ids, ["euler", "euler_a", "dpmpp_2m", "ddim"]);
        assert_eq!(Schedule::Karras.a1111_name(), "Karras");
        assert_eq!(Schedule::Normal.a1111_name(), "Normal");
    }
}
