//! Where a txt2img's time goes beyond its UNet steps: the same generation at several step
//! counts (the difference per step is what a step costs inside the pipeline; the rest is fixed:
//! text encoding, the first steps before the replay, the decode), and how far the host runs
//! ahead of the device (each step's host-side time stamp).

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::Result;
use burn::tensor::Device;
use latent_engine::pipeline::{Observer, StepState, txt2img};
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::{Precision, StableDiffusion};

use super::{bench_request, sync, time_ms};

/// Each step's host time since the generation started.
#[derive(Default)]
struct Stamps(Vec<Duration>);

impl Observer for Stamps {
    fn step(&mut self, state: &StepState<'_>) {
        self.0.push(state.elapsed);
    }
}

/// The txt2img at `steps`, half as many and 3 steps (3 runs each, median), with the fitted
/// per-step and fixed costs, and one run's host stamps against its end.
pub(super) fn anatomy(
    model: &StableDiffusion,
    tokenizer: &ClipTokenizer,
    device: &Device,
    precision: Precision,
    steps: usize,
) -> Result<()> {
    let cancel = AtomicBool::new(false);
    let at = |n: usize| {
        let req = bench_request(n);
        time_ms(device, 1, 3, || {
            let _ = txt2img(
                model,
                tokenizer,
                &req,
                &cancel,
                &mut latent_engine::pipeline::Quiet,
            );
        })
    };
    let half = (steps / 2).max(4);
    let (full, part, few) = (at(steps)?, at(half)?, at(3)?);
    let per_step = (full - part) / (steps - half).max(1) as f64;
    println!(
        "[{precision:?}] txt2img anatomy: {steps} steps {full:.1} ms, {half} steps {part:.1} ms, 3 steps {few:.1} ms: \
         {per_step:.2} ms a replayed step inside the pipeline, {:.1} ms fixed (text encoding, the first steps, decode)",
        full - per_step * steps as f64
    );
    let mut stamps = Stamps::default();
    let req = bench_request(steps);
    let start = Instant::now();
    let _ = txt2img(model, tokenizer, &req, &cancel, &mut stamps);
    sync(device)?;
    let end = start.elapsed().as_secs_f64() * 1e3;
    let ms: Vec<String> = stamps
        .0
        .iter()
        .map(|d| format!("{:.0}", d.as_secs_f64() * 1e3))
        .collect();
    println!(
        "[{precision:?}]   host stamps of each step (ms since start): {}; the generation returned at {end:.0} ms",
        ms.join(" ")
    );
    Ok(())
}
