//! Euler a, mirroring `EulerAncestralDiscreteScheduler` (`scheduling_euler_ancestral_discrete.py`)
//! with its defaults ("linspace" spacing).
//!
//! diffusers' class has no Karras option (`from_config(..., use_karras_sigmas=True)` silently
//! keeps the normal sigmas).
//! "Euler a" + "Karras" here is what A1111 and ComfyUI mean by it, k-diffusion's
//! `sample_euler_ancestral` on Karras sigmas: this class's step on the σs and timesteps
//! `EulerDiscreteScheduler(use_karras_sigmas=True)` computes, which is how the fixtures check it.

use super::euler::{euler_update, init_noise_sigma, input_scale, sigmas_and_timesteps, ve_start};
use super::schedule::NoiseTable;
use super::{Plan, Prediction, Schedule, StepCoefficients, TimestepSpacing};

pub(super) fn plan(
    table: &NoiseTable,
    schedule: Schedule,
    steps: usize,
    prediction: Prediction,
    (spacing, offset): (TimestepSpacing, usize),
) -> Plan {
    // For "normal" these equal the class's own `set_timesteps`: the same spaced timesteps and
    // `np.interp` σs.
    let (sigmas, timesteps) = sigmas_and_timesteps(table, schedule, steps, spacing, offset);
    let mut plan = Plan {
        timesteps,
        init_noise_sigma: init_noise_sigma(&sigmas, spacing),
        input_scale: Vec::with_capacity(steps),
        steps: Vec::with_capacity(steps),
        x0: Vec::with_capacity(steps),
        start: Vec::with_capacity(steps),
        draws_noise: true,
    };
    for pair in sigmas.windows(2) {
        plan.start.push(ve_start(pair[0]));
        let (from, to) = (f64::from(pair[0]), f64::from(pair[1]));
        // Split the move to σ_to into a deterministic part down to σ_down and fresh noise of
        // σ_up, with σ_down² + σ_up² = σ_to². (The max guards against a rounding -0.)
        let up = (to * to * (from * from - to * to) / (from * from)).sqrt();
        let down = (to * to - up * up).max(0.0).sqrt();
        let x0 = prediction.ve_x0(from);
        let update = euler_update(x0, (down - from) / from);
        plan.input_scale.push(input_scale(from));
        plan.x0.push(x0.to_x0());
        plan.steps.push(StepCoefficients {
            sample: update.sample as f32,
            model_output: update.model as f32,
            prev_x0: 0.0,
            noise: up as f32,
        });
    }
    plan
}

#[cfg(test)]
mod tests {
    use crate::schedulers::SamplerKind;
    use crate::schedulers::fixtures::reproduce_diffusers_loops;
    use crate::schedulers::fixtures::{cases, fixtures};

    #[test]
    fn plans_reproduce_diffusers_loops() {
        reproduce_diffusers_loops(SamplerKind::EulerAncestral);
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
}
