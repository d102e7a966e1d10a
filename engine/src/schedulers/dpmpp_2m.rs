//! DPM++ 2M, mirroring `DPMSolverMultistepScheduler` (`scheduling_dpmsolver_multistep.py`) with
//! its defaults: `solver_order=2`, `algorithm_type="dpmsolver++"`, `solver_type="midpoint"`,
//! `lower_order_final=True`, `final_sigmas_type="zero"`, "linspace" spacing.
//!
//! The solver works on the variance-preserving sample x = α·x0 + σ_vp·ε (init_noise_sigma 1, no
//! input scaling), with α = 1/sqrt(σ² + 1), σ_vp = σ·α for the k-diffusion σ, and λ = ln α − ln σ_vp.

use super::schedule::{NoiseTable, karras_sigmas, np_linspace};
use super::{Plan, Prediction, Schedule, StartCoefficients, StepCoefficients, TimestepSpacing};

/// `set_timesteps`' integer timesteps for `spacing` (numpy rounds half to even): "linspace"
/// `linspace(0, T - 1, steps + 1).round()[::-1][:-1]`, "leading" `arange(steps + 1) ·
/// (T // (steps + 1))` reversed without its 0, plus `offset`, "trailing" as the other samplers.
fn timesteps(train: usize, steps: usize, spacing: TimestepSpacing, offset: usize) -> Vec<usize> {
    match spacing {
        TimestepSpacing::Linspace => np_linspace(0.0, (train - 1) as f64, steps + 1)
            .into_iter()
            .skip(1)
            .rev()
            .map(|t| t.round_ties_even() as usize)
            .collect(),
        TimestepSpacing::Leading => (1..=steps)
            .rev()
            .map(|i| i * (train / (steps + 1)) + offset)
            .collect(),
        TimestepSpacing::Trailing => {
            super::schedule::spaced_timesteps(train, steps, spacing, offset)
                .into_iter()
                .map(|t| t.max(0.0) as usize)
                .collect()
        }
    }
}

/// σ → (α, σ_vp): `_sigma_to_alpha_sigma_t`.
fn alpha_sigma(sigma: f64) -> (f64, f64) {
    let alpha = 1.0 / (sigma * sigma + 1.0).sqrt();
    (alpha, sigma * alpha)
}

/// λ = log-SNR / 2. Infinite for the final σ = 0, which the first-order update handles.
fn lambda(sigma: f64) -> f64 {
    let (alpha, sigma_vp) = alpha_sigma(sigma);
    alpha.ln() - sigma_vp.ln()
}

pub(super) fn plan(
    table: &NoiseTable,
    schedule: Schedule,
    steps: usize,
    prediction: Prediction,
    (spacing, offset): (TimestepSpacing, usize),
    begin: usize,
) -> Plan {
    let train = table.sigmas.len();
    let (sigmas, timesteps): (Vec<f64>, Vec<f32>) = match schedule {
        Schedule::Normal => {
            // Integer timesteps, σ straight from the float32 table.
            let ts = timesteps(train, steps, spacing, offset);
            let sigmas = ts.iter().map(|&t| f64::from(table.sigmas[t])).collect();
            (sigmas, ts.into_iter().map(|t| t as f32).collect())
        }
        Schedule::Karras => {
            let sigmas = karras_sigmas(
                f64::from(table.sigmas[0]),
                f64::from(table.sigmas[train - 1]),
                steps,
            );
            // Unlike Euler, the UNet gets each Karras σ's timestep rounded to an integer, while
            // the solver keeps the exact σ.
            let ts = sigmas
                .iter()
                .map(|&s| table.sigma_to_t(s).round_ties_even() as f32)
                .collect();
            (sigmas, ts)
        }
    };
    // The solver reads σ from a float32 tensor, final σ = 0 appended.
    let sigmas: Vec<f64> = sigmas
        .into_iter()
        .map(|s| f64::from(s as f32))
        .chain([0.0])
        .collect();

    let mut plan = Plan {
        timesteps,
        init_noise_sigma: 1.0,
        input_scale: vec![1.0; steps],
        steps: Vec::with_capacity(steps),
        x0: Vec::with_capacity(steps),
        start: Vec::with_capacity(steps),
        draws_noise: false,
    };
    for i in 0..steps {
        let (s0, t) = (sigmas[i], sigmas[i + 1]);
        let (alpha_s0, sigma_s0) = alpha_sigma(s0);
        // `add_noise`: α·x0 + σ_vp·n at this step's σ.
        plan.start.push(StartCoefficients {
            sample: alpha_s0 as f32,
            noise: sigma_s0 as f32,
        });
        let (alpha_t, sigma_t) = alpha_sigma(t);
        let h = lambda(t) - lambda(s0);
        // `convert_model_output`: the solver's model output m0 is the predicted x0.
        let (x0, _) = prediction.vp(alpha_s0, sigma_s0);
        let ratio = sigma_t / sigma_s0;
        // −α_t (e^{−h} − 1)
        let c = -alpha_t * (-h).exp_m1();
        // First order at the first step that runs (no history yet: `begin` for img2img) and at
        // the last one: with `final_sigmas_type="zero"` diffusers' `lower_order_final` rule makes
        // the step to σ = 0 first order for every step count, not only below 15 steps.
        let (m0, m1) = if i <= begin || i == steps - 1 {
            (c, 0.0)
        } else {
            // Midpoint second order: x_t = ratio·x + c·(D0 + D1/2), D0 = m0,
            // D1 = (m0 − m1)/r0, r0 = h_{i−1}/h.
            let r0 = (lambda(s0) - lambda(sigmas[i - 1])) / h;
            let k = 0.5 / r0;
            (c * (1.0 + k), -c * k)
        };
        plan.x0.push(x0.to_x0());
        plan.steps.push(StepCoefficients {
            sample: (ratio + m0 * x0.sample) as f32,
            model_output: (m0 * x0.model) as f32,
            prev_x0: m1 as f32,
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
        reproduce_diffusers_loops(SamplerKind::DpmPp2M);
    }
}
