//! DDIM, mirroring `DDIMScheduler` (`scheduling_ddim.py`) with its defaults and the pipeline's
//! eta 0: "leading" timestep spacing plus `steps_offset` unless the config says otherwise,
//! deterministic update.

use super::schedule::{NoiseTable, spaced_timesteps};
use super::{Plan, SchedulerConfig, StartCoefficients, StepCoefficients, TimestepSpacing};

/// `set_timesteps`' integer timesteps: "leading" `arange(steps) * (T // steps)`, descending,
/// plus `steps_offset` (the default); "linspace" rounded half to even; "trailing".
fn timesteps(config: &SchedulerConfig, steps: usize) -> Vec<usize> {
    let spacing = config.timestep_spacing.unwrap_or(TimestepSpacing::Leading);
    spaced_timesteps(
        config.num_train_timesteps,
        steps,
        spacing,
        config.steps_offset,
    )
    .into_iter()
    .map(|t| t.round_ties_even().max(0.0) as usize)
    .collect()
}

/// The most steps whose first timestep still exists: with SD 1.5's `steps_offset` 1 and
/// "leading" spacing, 1000 steps would start at t = 1000 (diffusers fails with an IndexError
/// there).
pub(super) fn max_steps(config: &SchedulerConfig) -> usize {
    let train = config.num_train_timesteps;
    if config
        .timestep_spacing
        .is_some_and(|s| s != TimestepSpacing::Leading)
    {
        return train;
    }
    (1..=train)
        .rev()
        .find(|&n| (n - 1) * (train / n) + config.steps_offset < train)
        .unwrap_or(0)
}

/// `add_noise` of the variance-preserving schedulers (DDIM, LCM) at timestep `t`:
/// sqrt(ᾱ_t)·x0 + sqrt(1 − ᾱ_t)·n, in float32 like their tensors.
pub(super) fn vp_start(table: &NoiseTable, t: usize) -> StartCoefficients {
    let a = table.alphas_cumprod[t];
    StartCoefficients {
        sample: a.sqrt(),
        noise: (1.0 - a).sqrt(),
    }
}

pub(super) fn plan(table: &NoiseTable, steps: usize, config: &SchedulerConfig) -> Plan {
    let ratio = config.num_train_timesteps / steps;
    let timesteps = timesteps(config, steps);
    let alpha_cumprod = |t: usize| f64::from(table.alphas_cumprod[t]);
    // The ᾱ past the last step (`final_alpha_cumprod`).
    let final_alpha = if config.set_alpha_to_one {
        1.0
    } else {
        alpha_cumprod(0)
    };
    let mut plan = Plan {
        timesteps: timesteps.iter().map(|&t| t as f32).collect(),
        init_noise_sigma: 1.0,
        input_scale: vec![1.0; steps],
        steps: Vec::with_capacity(steps),
        x0: Vec::with_capacity(steps),
        start: Vec::with_capacity(steps),
        draws_noise: false,
    };
    for &t in &timesteps {
        plan.start.push(vp_start(table, t));
        let a_t = alpha_cumprod(t);
        // `prev_timestep = t - T // steps` is negative at the last step, which then lands on
        // `final_alpha_cumprod`: ᾱ_0 for SD 1.5, so DDIM ends at σ ≈ 0.029 rather than 0.
        let a_prev = t.checked_sub(ratio).map_or(final_alpha, alpha_cumprod);
        let (x0, eps) = config.prediction.vp(a_t.sqrt(), (1.0 - a_t).sqrt());
        // eta = 0: x_prev = sqrt(ᾱ_prev)·x0 + sqrt(1 − ᾱ_prev)·ε̂.
        let (c_x0, c_eps) = (a_prev.sqrt(), (1.0 - a_prev).sqrt());
        plan.x0.push(x0.to_x0());
        plan.steps.push(StepCoefficients {
            sample: (c_x0 * x0.sample + c_eps * eps.sample) as f32,
            model_output: (c_x0 * x0.model + c_eps * eps.model) as f32,
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
        reproduce_diffusers_loops(SamplerKind::Ddim);
    }
}
