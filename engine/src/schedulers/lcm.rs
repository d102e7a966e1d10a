//! LCM, mirroring `LCMScheduler` (`scheduling_lcm.py`) with its defaults: 50 original
//! (distillation) steps, timestep scaling 10, no clipping. For LCM-LoRAs and LCM fine-tunes of
//! SD 1.x/2.x that run through the ordinary pipeline with classifier-free guidance (the
//! guidance-embedding LCM UNets are another architecture).
//!
//! Each step predicts x0, applies the consistency boundary condition
//! `denoised = c_out·x0 + c_skip·x`, and re-noises it to the next timestep with fresh noise from
//! the seed's generator (none after the last step). img2img runs the last steps of the plan, as
//! for the other samplers (A1111's rule), not diffusers' LCM-specific strength schedule.

use super::schedule::NoiseTable;
use super::{Plan, SchedulerConfig, StepCoefficients};

/// `original_inference_steps`: the distillation schedule's length, and so the most steps.
pub(super) const ORIGINAL_STEPS: usize = 50;
/// `timestep_scaling` of the boundary condition.
const TIMESTEP_SCALING: f64 = 10.0;
/// σ_data of the boundary condition.
const SIGMA_DATA: f64 = 0.5;

/// `set_timesteps`: the distillation timesteps `k·i − 1` (k = T // 50), descending, at evenly
/// spaced indices (`floor(linspace(0, 50, steps, endpoint=False))`).
fn timesteps(train: usize, steps: usize) -> Vec<usize> {
    let k = train / ORIGINAL_STEPS;
    let origin: Vec<usize> = (1..=ORIGINAL_STEPS).rev().map(|i| i * k - 1).collect();
    let stride = ORIGINAL_STEPS as f64 / steps as f64;
    (0..steps)
        .map(|i| origin[((i as f64 * stride).floor() as usize).min(ORIGINAL_STEPS - 1)])
        .collect()
}

/// `get_scalings_for_boundary_condition_discrete`: (c_skip, c_out).
fn boundary(t: usize) -> (f64, f64) {
    let scaled = t as f64 * TIMESTEP_SCALING;
    let d2 = SIGMA_DATA * SIGMA_DATA;
    (
        d2 / (scaled * scaled + d2),
        scaled / (scaled * scaled + d2).sqrt(),
    )
}

pub(super) fn plan(table: &NoiseTable, steps: usize, config: &SchedulerConfig) -> Plan {
    let timesteps = timesteps(config.num_train_timesteps, steps);
    let alpha_cumprod = |t: usize| f64::from(table.alphas_cumprod[t]);
    let mut plan = Plan {
        timesteps: timesteps.iter().map(|&t| t as f32).collect(),
        init_noise_sigma: 1.0,
        input_scale: vec![1.0; steps],
        steps: Vec::with_capacity(steps),
        x0: Vec::with_capacity(steps),
        start: Vec::with_capacity(steps),
        draws_noise: true,
    };
    for (i, &t) in timesteps.iter().enumerate() {
        plan.start.push(super::ddim::vp_start(table, t));
        let a_t = alpha_cumprod(t);
        let (x0, _) = config.prediction.vp(a_t.sqrt(), (1.0 - a_t).sqrt());
        let (c_skip, c_out) = boundary(t);
        // The denoised sample, which is also the preview.
        let (d_sample, d_model) = (c_out * x0.sample + c_skip, c_out * x0.model);
        plan.x0.push(super::X0Coefficients {
            sample: d_sample as f32,
            model_output: d_model as f32,
        });
        let step = match timesteps.get(i + 1) {
            // Re-noised to the next timestep: sqrt(ᾱ_prev)·denoised + sqrt(1 − ᾱ_prev)·n.
            Some(&next) => {
                let a_prev = alpha_cumprod(next);
                StepCoefficients {
                    sample: (a_prev.sqrt() * d_sample) as f32,
                    model_output: (a_prev.sqrt() * d_model) as f32,
                    prev_x0: 0.0,
                    noise: (1.0 - a_prev).sqrt() as f32,
                }
            }
            None => StepCoefficients {
                sample: d_sample as f32,
                model_output: d_model as f32,
                prev_x0: 0.0,
                noise: 0.0,
            },
        };
        plan.steps.push(step);
    }
    plan
}

#[cfg(test)]
mod tests {
    use crate::schedulers::SamplerKind;
    use crate::schedulers::fixtures::reproduce_diffusers_loops;

    #[test]
    fn plans_reproduce_diffusers_loops() {
        reproduce_diffusers_loops(SamplerKind::Lcm);
    }

    /// diffusers' 4-step LCM schedule for SD: [999, 759, 499, 259].
    #[test]
    fn four_steps_take_the_known_timesteps() {
        assert_eq!(super::timesteps(1000, 4), [999, 759, 499, 259]);
        assert_eq!(super::timesteps(1000, 1), [999]);
    }
}
