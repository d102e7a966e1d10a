//! Euler, mirroring `EulerDiscreteScheduler` (`scheduling_euler_discrete.py`) with its defaults:
//! "linspace" timestep spacing unless the config says otherwise, linear σ interpolation,
//! `final_sigmas_type="zero"`, no churn.

use super::schedule::{NoiseTable, karras_sigmas, spaced_timesteps};
use super::{
    Linear, Plan, Prediction, Schedule, StartCoefficients, StepCoefficients, TimestepSpacing,
};

/// The σ of each step plus the final 0, and the timestep the UNet gets at each step, as
/// `EulerDiscreteScheduler.set_timesteps` computes them (both float32, like its tensors).
/// Euler a runs on the same ones (see `euler_ancestral.rs`).
pub(super) fn sigmas_and_timesteps(
    table: &NoiseTable,
    schedule: Schedule,
    steps: usize,
    spacing: TimestepSpacing,
    offset: usize,
) -> (Vec<f32>, Vec<f32>) {
    // "linspace": `np.linspace(0, T - 1, steps, dtype=np.float32)[::-1]`, fractional timesteps
    // made in float64 and rounded to float32 (with one step that is [0], not [T - 1]); the
    // others are whole numbers.
    let timesteps: Vec<f32> = spaced_timesteps(table.sigmas.len(), steps, spacing, offset)
        .into_iter()
        .map(|t| t as f32)
        .collect();
    // σ at those timesteps, interpolated in float64 from the float32 table.
    let sigmas: Vec<f64> = timesteps
        .iter()
        .map(|&t| table.interp_sigma(f64::from(t)))
        .collect();
    let (sigmas, timesteps) = match schedule {
        Schedule::Normal => (sigmas, timesteps),
        Schedule::Karras => {
            // The Karras range is the interpolated one's: its first and last entries.
            let karras = karras_sigmas(sigmas[steps - 1], sigmas[0], steps);
            // Unlike DPM-Solver, Euler keeps the fractional timestep of each Karras σ.
            let timesteps = karras.iter().map(|&s| table.sigma_to_t(s) as f32).collect();
            (karras, timesteps)
        }
    };
    let sigmas = sigmas.into_iter().map(|s| s as f32).chain([0.0]).collect();
    (sigmas, timesteps)
}

/// `add_noise` of both Euler schedulers: `original + noise * σ`.
pub(super) fn ve_start(sigma: f32) -> StartCoefficients {
    StartCoefficients {
        sample: 1.0,
        noise: sigma,
    }
}

/// `1 / sqrt(σ² + 1)`: `scale_model_input` of both Euler schedulers.
pub(super) fn input_scale(sigma: f64) -> f32 {
    (1.0 / (sigma * sigma + 1.0).sqrt()) as f32
}

/// The Euler update x + d·(x − x0) with x0 = `x0`, as (sample, model) coefficients:
/// `derivative = (sample - pred_original_sample) / sigma; prev = sample + derivative * dt` with
/// d = dt / σ.
pub(super) fn euler_update(x0: Linear, d: f64) -> Linear {
    Linear::new(1.0 + d * (1.0 - x0.sample), -d * x0.model)
}

/// `init_noise_sigma` of both Euler schedulers: the largest σ for "linspace" and "trailing"
/// spacing, sqrt(σ² + 1) of it for "leading" (float32, as its tensor property computes it).
pub(super) fn init_noise_sigma(sigmas: &[f32], spacing: TimestepSpacing) -> f32 {
    let max = sigmas.iter().copied().fold(0.0, f32::max);
    match spacing {
        TimestepSpacing::Leading => (max * max + 1.0).sqrt(),
        _ => max,
    }
}

pub(super) fn plan(
    table: &NoiseTable,
    schedule: Schedule,
    steps: usize,
    prediction: Prediction,
    (spacing, offset): (TimestepSpacing, usize),
) -> Plan {
    let (sigmas, timesteps) = sigmas_and_timesteps(table, schedule, steps, spacing, offset);
    let mut plan = Plan {
        timesteps,
        init_noise_sigma: init_noise_sigma(&sigmas, spacing),
        input_scale: Vec::with_capacity(steps),
        steps: Vec::with_capacity(steps),
        x0: Vec::with_capacity(steps),
        start: Vec::with_capacity(steps),
        draws_noise: false,
    };
    for pair in sigmas.windows(2) {
        plan.start.push(ve_start(pair[0]));
        let (sigma, next) = (f64::from(pair[0]), f64::from(pair[1]));
        let x0 = prediction.ve_x0(sigma);
        let update = euler_update(x0, (next - sigma) / sigma);
        plan.input_scale.push(input_scale(sigma));
        plan.x0.push(x0.to_x0());
        plan.steps.push(StepCoefficients {
            sample: update.sample as f32,
            model_output: update.model as f32,
            prev_x0: 0.0,
            noise: 0.0,
        });
    }
    plan
}

#[cfg(test)]
mod tests {
    use crate::schedulers::SamplerKind;
    use crate::schedulers::fixtures::reproduce_diffusers_loops;

    #[test]
    fn plans_reproduce_diffusers_loops() {
        reproduce_diffusers_loops(SamplerKind::Euler);
    }
}
