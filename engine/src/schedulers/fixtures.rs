//! The diffusers reference every sampler is checked against: the cases
//! `tests/fixtures/make_scheduler_fixtures.py` recorded, and the loop that replays a sampler's
//! cases from its plans alone.

use serde_json::Value;

use super::{SamplerKind, Schedule, SchedulerConfig, plan};

const FIXTURES: &str = include_str!("../../../tests/fixtures/scheduler_cases.json");

/// Per-step latents and predicted x0 must match diffusers within `ABS_TOL + REL_TOL * scale`,
/// `scale` being the largest magnitude in diffusers' vector. The fake model drives latents
/// to 17-40, where one float32 ulp is 2-4e-6 and rounding compounds over the steps:
/// diffusers' own float32 loop differs from the same code run in float64 by up to 3e-5
/// there, so a purely absolute 1e-5 would test rounding order rather than the plans.
const ABS_TOL: f32 = 1e-5;
const REL_TOL: f32 = 1e-6;

pub(super) fn fixtures() -> Value {
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

pub(super) struct Case {
    pub(super) name: String,
    pub(super) kind: SamplerKind,
    pub(super) schedule: Schedule,
    pub(super) config: SchedulerConfig,
    pub(super) steps: usize,
    pub(super) timesteps: Vec<f32>,
    pub(super) init_noise_sigma: f32,
    pub(super) noise: Vec<f32>,
    pub(super) latents: Vec<Vec<f32>>,
    pub(super) pred_x0: Vec<Vec<f32>>,
    pub(super) step_noise: Option<Vec<Vec<f32>>>,
}

pub(super) fn cases() -> Vec<Case> {
    let fixtures = fixtures();
    fixtures["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            let s = |key: &str| c[key].as_str().expect("string");
            let config = SchedulerConfig {
                prediction: s("prediction").parse().expect("prediction"),
                timestep_spacing: c
                    .get("spacing")
                    .map(|v| serde_json::from_value(v.clone()).expect("timestep_spacing")),
                zero_terminal_snr: c.get("zero_snr").is_some_and(|v| v == true),
                ..SchedulerConfig::sd15()
            };
            let steps = c["steps"].as_u64().expect("steps") as usize;
            Case {
                name: format!(
                    "{} {} {} {steps} steps{}",
                    s("sampler"),
                    s("schedule"),
                    s("prediction"),
                    c.get("spacing")
                        .and_then(|v| v.as_str())
                        .map(|v| format!(", {v} spacing"))
                        .unwrap_or_default()
                ) + if c.get("zero_snr").is_some() {
                    ", zero terminal SNR"
                } else {
                    ""
                },
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

/// Runs each fixture loop of `kind` on plain vectors using only the plan's coefficients, the
/// recorded noise and the same fake model, and compares every step with diffusers.
pub(super) fn reproduce_diffusers_loops(kind: SamplerKind) {
    let mut failures = Vec::new();
    let mut worst = (0.0f32, String::new());
    let mut worst_t = 0.0f32;
    let cases: Vec<Case> = cases().into_iter().filter(|c| c.kind == kind).collect();
    assert!(!cases.is_empty(), "no fixture for {kind}");
    for case in cases {
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
        // Zero terminal SNR starts the σ-based samplers at σ = 4096: diffusers' first step then
        // subtracts numbers of ~10⁴ in float32 (`x + (σ' − σ)·(x − x0)/σ`), a rounding of a few
        // ulps of the start's magnitude that every later step carries. Those cases are held to
        // that, 4 ulps (f32 ε = 2⁻²⁴) of the largest starting latent.
        let carried = match case.config.zero_terminal_snr {
            true => 4.0 * f32::EPSILON / 2.0 * x.iter().fold(0.0f32, |m, v| m.max(v.abs())),
            false => 0.0,
        };
        let mut check = |what: String, ours: &[f32], theirs: &[f32]| {
            let d = max_abs_diff(ours, theirs);
            let scale = theirs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let tol = ABS_TOL + REL_TOL * scale + carried;
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
