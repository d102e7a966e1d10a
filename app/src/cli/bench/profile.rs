//! Where a UNet step's device time goes, kernel by kernel: every launch of a few steps timed on
//! the device (timestamp queries) without waiting between kernels, summed by kernel and by class.
//! Unlike the op report (each op alone, synced: a ~0.15 ms floor per launch) these are the
//! kernels of the step as it runs, so their sum is comparable with the step's median.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Result;
use burn::cubecl::config::{TypeNameFormatLevel, type_name_format};
use burn::cubecl::logging::{
    Duration, LaunchObservation, LaunchObserver, ProfileDuration, TimingMethod, TimingRequest,
};
use burn::tensor::{Device, Tensor};
use latent_engine::unet::Context;
use latent_engine::{Precision, StableDiffusion};

use super::sync;

/// Launches seen and their measurements, in launch order, tagged with the step they belong to.
#[derive(Default)]
struct Collector {
    step: Mutex<usize>,
    deferred: Mutex<Vec<(usize, Launch, ProfileDuration)>>,
    timed: Mutex<Vec<(usize, Launch, Duration, TimingMethod)>>,
    launched: Mutex<usize>,
}

impl LaunchObserver for Collector {
    fn launched(&self, _kernel: &'static str) {
        if let Ok(mut n) = self.launched.lock() {
            *n += 1;
        }
    }

    fn timing(&self) -> TimingRequest {
        TimingRequest::Deferred
    }

    fn profiled(&self, kernel: &'static str, profile: ProfileDuration) {
        let step = self.step.lock().map(|s| *s).unwrap_or(0);
        if let Ok(mut d) = self.deferred.lock() {
            d.push((step, Launch::now(kernel), profile));
        }
    }

    // Reached instead of `profiled` when cubecl's profiling logger is on (then kernels run one
    // at a time: the report says so).
    fn timed(&self, kernel: &'static str, duration: Duration, method: TimingMethod) {
        let step = self.step.lock().map(|s| *s).unwrap_or(0);
        if let Ok(mut t) = self.timed.lock() {
            t.push((step, Launch::now(kernel), duration, method));
        }
    }
}

/// A launch seen: its kernel and the engine's op that launched it (see `profile::Labelling`;
/// reported on the launching thread).
struct Launch {
    kernel: &'static str,
    op: Option<latent_engine::profile::OpShape>,
}

impl Launch {
    fn now(kernel: &'static str) -> Self {
        Launch {
            kernel,
            op: latent_engine::profile::current_op(),
        }
    }
}

/// The class a kernel's time is reported under, from its name.
fn class_of(name: &str) -> &'static str {
    let n = name.to_ascii_lowercase();
    if n.contains("im2col") {
        "convolution: input unrolled (im2col)"
    } else if n.contains("conv") {
        "convolution"
    } else if n.contains("attention") || n.contains("planes") || n.contains("flash") {
        "attention"
    } else if n.contains("matmul") || n.contains("gemm") || n.contains("linear") {
        "matrix product (linears)"
    } else if n.contains("norm") {
        "normalisation"
    } else if n.contains("fuse") || n.contains("elemwise") || n.contains("elementwise") {
        "fused elementwise (burn)"
    } else if n.contains("reduce") {
        "reduction (burn)"
    } else if n.contains("copy")
        || n.contains("cat")
        || n.contains("slice")
        || n.contains("into_contiguous")
    {
        "copies and layout"
    } else {
        "other"
    }
}

#[derive(Default, Clone, Copy)]
struct Sum {
    launches: usize,
    total: std::time::Duration,
}

/// Each kernel's (short name's) launches and device time over the profiled runs.
struct Profile {
    runs: usize,
    launched: usize,
    device_timed: usize,
    unresolved: usize,
    /// `timed` measurements came read at once (the profiling logger was on): kernels ran one at a
    /// time.
    sequential: bool,
    kernels: BTreeMap<String, Sum>,
    /// The same by kernel and the op that launched it.
    by_op: BTreeMap<(String, String), Sum>,
    /// Per run: first kernel's start to last kernel's end, ms.
    spans: Vec<f64>,
    /// Per run: wall time with a sync, ms.
    walls: Vec<f64>,
    /// Per run: the sum of its kernels' device time, ms.
    kernel_sums: Vec<f64>,
}

/// Runs `f` (which enqueues work) `runs` times with every launch timed on the device, a sync
/// after each run, and resolves the measurements afterwards.
fn profile_launches(device: &Device, runs: usize, mut f: impl FnMut()) -> Result<Profile> {
    let runs = runs.max(1);
    let collector = Arc::new(Collector::default());
    let mut walls = Vec::new();
    // Device timestamps come back on the host's clock (cubecl aligns the two).
    let epoch = burn::cubecl::profile::Instant::now();
    {
        let _labels = latent_engine::profile::Labelling::start();
        let _watching = LaunchObservation::new(collector.clone());
        for r in 0..runs {
            if let Ok(mut step) = collector.step.lock() {
                *step = r;
            }
            let t = Instant::now();
            f();
            sync(device)?;
            walls.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    let poisoned = || anyhow::anyhow!("profile collector poisoned");
    let launched = *collector.launched.lock().map_err(|_| poisoned())?;
    let deferred = std::mem::take(&mut *collector.deferred.lock().map_err(|_| poisoned())?);
    let timed = std::mem::take(&mut *collector.timed.lock().map_err(|_| poisoned())?);
    let mut profile = Profile {
        runs,
        launched,
        device_timed: 0,
        unresolved: 0,
        sequential: !timed.is_empty(),
        kernels: BTreeMap::new(),
        by_op: BTreeMap::new(),
        spans: Vec::new(),
        walls,
        kernel_sums: vec![0.0; runs],
    };
    let mut spans = vec![(f64::INFINITY, f64::NEG_INFINITY); runs];
    let mut record = |launch: &Launch, d: std::time::Duration| {
        let short = type_name_format(launch.kernel, TypeNameFormatLevel::Short);
        let op = launch.op.map_or_else(|| "-".to_string(), |o| o.to_string());
        let e = profile.by_op.entry((short.clone(), op)).or_default();
        e.launches += 1;
        e.total += d;
        let e = profile.kernels.entry(short).or_default();
        e.launches += 1;
        e.total += d;
    };
    for (run, launch, measurement) in deferred {
        if matches!(measurement.timing_method(), TimingMethod::Device) {
            profile.device_timed += 1;
        }
        match burn::cubecl::future::block_on(measurement.resolve()) {
            Some(ticks) => {
                let start = ticks.start_duration_since(epoch).as_secs_f64() * 1e3;
                let end = ticks.end_duration_since(epoch).as_secs_f64() * 1e3;
                let span = &mut spans[run.min(runs - 1)];
                span.0 = span.0.min(start);
                span.1 = span.1.max(end);
                profile.kernel_sums[run.min(runs - 1)] += ticks.duration().as_secs_f64() * 1e3;
                record(&launch, ticks.duration());
            }
            None => profile.unresolved += 1,
        }
    }
    for (run, launch, d, method) in timed {
        if matches!(method, TimingMethod::Device) {
            profile.device_timed += 1;
        }
        profile.kernel_sums[run.min(runs - 1)] += d.as_secs_f64() * 1e3;
        record(&launch, d);
    }
    profile.spans = spans
        .iter()
        .filter(|(s, e)| e > s)
        .map(|(s, e)| e - s)
        .collect();
    Ok(profile)
}

/// The device time of the kernels `f` enqueues: the median over `runs` runs (after one untimed
/// run that compiles and tunes) of the sum of each run's kernel durations, ms. Free of the
/// host's per-launch cost that a wall-clock time of one small op carries.
pub(super) fn device_ms(device: &Device, runs: usize, mut f: impl FnMut()) -> Result<f64> {
    // Back-to-back launches before and within each timed run: one launch between syncs left
    // the GPU idle enough that the same shape timed 4× apart from one run to the next (a
    // clock that never rose, by all appearances; BENCHMARKS.md, twenty-second session).
    for _ in 0..WARM_LAUNCHES {
        f();
    }
    sync(device)?;
    let p = profile_launches(device, runs, || {
        for _ in 0..BACK_TO_BACK {
            f();
        }
    })?;
    if p.unresolved > 0 || p.device_timed == 0 {
        anyhow::bail!(
            "{} of {} launches without a device measurement",
            p.unresolved,
            p.launched
        );
    }
    Ok(median(&p.kernel_sums) / BACK_TO_BACK as f64)
}

/// Lines of the profile's breakdown by kernel and op (the costliest).
const BY_OP_LINES: usize = 60;

/// Untimed launches of an op before [`device_ms`] times it.
const WARM_LAUNCHES: usize = 16;
/// Launches of an op in each of [`device_ms`]'s timed runs (their sum over this count).
const BACK_TO_BACK: usize = 8;

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Times every kernel of `steps` launch-by-launch UNet steps as a generation runs them (the
/// prompt's keys and values projected before, `graph::generation_kv`; after two untimed ones)
/// and prints each kernel's and each class's device time per step, their sum, and the steps'
/// wall time with the same instrumentation.
pub(super) fn kernel_profile(
    model: &StableDiffusion,
    device: &Device,
    precision: Precision,
    steps: usize,
    x: &Tensor<4>,
    ctx: &Tensor<3>,
) -> Result<()> {
    let base_unet = model.unet()?;
    let kv = latent_engine::unet::graph::generation_kv(&base_unet, ctx);
    kernel_profile_of(device, &format!("{precision:?}"), steps, || {
        let context = Context::projected(ctx, &kv);
        let _ = base_unet.forward_context(x.clone(), &[500.0], context, None);
    })
}

/// [`kernel_profile`] of any step `f` enqueues, its lines tagged `[tag]`.
pub(super) fn kernel_profile_of(
    device: &Device,
    tag: &str,
    steps: usize,
    mut f: impl FnMut(),
) -> Result<()> {
    for _ in 0..2 {
        f();
        sync(device)?;
    }
    let p = profile_launches(device, steps, f)?;
    let steps = p.runs;
    let per_step = |d: std::time::Duration| d.as_secs_f64() * 1e3 / steps as f64;
    let total: std::time::Duration = p.kernels.values().map(|s| s.total).sum();
    println!(
        "[{tag}] kernel profile of {steps} runs (launch by launch, each launch timed {}): \
         {} launches, {} timed on the device, {} without a measurement",
        if p.sequential {
            "and read at once: kernels ran one at a time"
        } else {
            "with device timestamps, read after the steps"
        },
        p.launched,
        p.device_timed,
        p.unresolved,
    );
    println!(
        "[{tag}]   kernel time per run {:.2} ms; first kernel's start to last kernel's end \
         per run, median {:.2} ms; wall per run with this instrumentation, median {:.2} ms",
        per_step(total),
        median(&p.spans),
        median(&p.walls),
    );
    let mut classes: BTreeMap<&'static str, Sum> = BTreeMap::new();
    for (name, s) in &p.kernels {
        let c = classes.entry(class_of(name)).or_default();
        c.launches += s.launches;
        c.total += s.total;
    }
    let share = |d: std::time::Duration| 100.0 * d.as_secs_f64() / total.as_secs_f64().max(1e-12);
    let mut by_class: Vec<_> = classes.into_iter().collect();
    by_class.sort_by_key(|c| std::cmp::Reverse(c.1.total));
    for (class, s) in by_class {
        println!(
            "[{tag}]   class {class:<40} {:>5} launches/run {:8.3} ms/run {:5.1}%",
            s.launches / steps,
            per_step(s.total),
            share(s.total)
        );
    }
    let mut by_op: Vec<_> = p.by_op.into_iter().collect();
    by_op.sort_by_key(|k| std::cmp::Reverse(k.1.total));
    for ((kernel, op), s) in by_op.into_iter().take(BY_OP_LINES) {
        println!(
            "[{tag}]   op {op:<36} {kernel:<40} {:>4} launches/run {:7.3} ms/run {:5.1}% ({:.1} µs each)",
            s.launches / steps,
            per_step(s.total),
            share(s.total),
            s.total.as_secs_f64() * 1e6 / s.launches.max(1) as f64
        );
    }
    let mut by_kernel: Vec<_> = p.kernels.into_iter().collect();
    by_kernel.sort_by_key(|k| std::cmp::Reverse(k.1.total));
    for (name, s) in by_kernel {
        println!(
            "[{tag}]   kernel {name:<48} {:>5} launches/run {:8.3} ms/run {:5.1}% ({:.1} µs each)",
            s.launches / steps,
            per_step(s.total),
            share(s.total),
            s.total.as_secs_f64() * 1e6 / s.launches.max(1) as f64
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use burn::tensor::{DType, Device, Tensor};

    /// Every launch of a few burn ops on the test adapter is seen and measured, named, and the
    /// measurements land in the runs they belong to.
    #[test]
    fn every_launch_is_measured() {
        let device = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
        let a = Tensor::<2>::ones([64, 64], (&device, DType::F32));
        let b = Tensor::<2>::ones([64, 64], (&device, DType::F32)) * 2.0;
        // Compiled before the profile, so the runs time kernels, not their compilation.
        let _ = ((a.clone() + b.clone()).exp().sum() + 1.0).into_data();
        let p = super::profile_launches(&device, 3, || {
            let _ = (a.clone() + b.clone()).exp().sum() + 1.0;
        })
        .expect("profiles");
        let launches: usize = p.kernels.values().map(|s| s.launches).sum();
        assert!(p.launched >= 3, "{} launches seen", p.launched);
        assert_eq!(
            launches + p.unresolved,
            p.launched,
            "every launch measured once"
        );
        assert_eq!(p.unresolved, 0);
        assert_eq!(p.walls.len(), 3);
        assert!(
            p.kernels.keys().all(|k| !k.is_empty() && !k.contains("::")),
            "{:?}",
            p.kernels.keys()
        );
        assert!(p.spans.len() <= 3);
    }

    #[test]
    fn classes_by_name() {
        assert_eq!(
            super::class_of("Im2col"),
            "convolution: input unrolled (im2col)"
        );
        assert_eq!(super::class_of("Conv2dGemmMma"), "convolution");
        assert_eq!(super::class_of("AttentionPlanes"), "attention");
        assert_eq!(super::class_of("GroupNormSilu"), "normalisation");
    }
}
