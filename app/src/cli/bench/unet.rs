//! The UNet step beyond its plain median: replayed from a captured graph, and under other
//! rules for the planes attention kernel.

use std::time::Instant;

use anyhow::Result;
use burn::tensor::{Device, Tensor};
use latent_engine::unet::UNet2DConditionModel;
use latent_engine::unet::graph::{UNetSteps, WARMUP_RUNS};
use latent_engine::{Precision, StableDiffusion};

use super::{sync, time_ms};

/// One step launch by launch, with SDXL's added conditioning where given (`forward_added`, as
/// its txt2img runs it).
pub(super) fn plain_step(
    unet: &UNet2DConditionModel,
    x: &Tensor<4>,
    ctx: &Tensor<3>,
    added: Option<&Tensor<2>>,
) -> Tensor<4> {
    match added {
        Some(added) => unet.forward_added(x.clone(), &[500.0], ctx, added),
        None => unet.forward(x.clone(), &[500.0], ctx),
    }
}

/// The model's steps past their ordinary warm-up, which records the graph they then replay
/// (unless the capture failed: [`UNetSteps::is_replaying`]).
fn recorded_steps(
    model: &StableDiffusion,
    device: &Device,
    x: &Tensor<4>,
    ctx: &Tensor<3>,
    added: Option<&Tensor<2>>,
) -> Result<UNetSteps> {
    let mut steps = UNetSteps::new(&model.unet()?, ctx.clone());
    if let Some(added) = added {
        steps = steps.with_added(added.clone());
    }
    for _ in 0..=WARMUP_RUNS {
        let _ = steps.forward(x.clone(), 500.0);
        sync(device)?;
    }
    Ok(steps)
}

/// The UNet step replayed from a captured graph (what `txt2img` runs after its first steps):
/// its median, its host time, and its agreement with the step run launch by launch.
/// `added` is SDXL's added conditioning (the step then runs `forward_added`, as its txt2img
/// does) and `label` the line's prefix.
#[allow(clippy::too_many_arguments)]
pub(super) fn graph_bench(
    model: &StableDiffusion,
    device: &Device,
    label: &str,
    runs: usize,
    x: &Tensor<4>,
    ctx: &Tensor<3>,
    added: Option<&Tensor<2>>,
    plain_ms: f64,
) -> Result<()> {
    let mut steps = recorded_steps(model, device, x, ctx, added)?;
    if !steps.is_replaying() {
        println!("[{label}] UNet step from a captured graph: not recorded (see the warning)");
        return Ok(());
    }
    let replayed = time_ms(device, 2, runs, || {
        let _ = steps.forward(x.clone(), 500.0);
    })?;
    let mut enqueue = Vec::new();
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        let _ = steps.forward(x.clone(), 500.0);
        enqueue.push(t.elapsed().as_secs_f64() * 1e3);
        sync(device)?;
    }
    enqueue.sort_by(f64::total_cmp);
    let read = super::read_f32::<4>;
    let want = read(plain_step(&model.unet()?, x, ctx, added))?;
    let got = read(steps.forward(x.clone(), 500.0))?;
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    let diff = want
        .iter()
        .zip(&got)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale;
    println!(
        "[{label}] UNet step replayed from a captured graph: median {replayed:.2} ms \
         ({:+.1}% against {plain_ms:.2} ms launch by launch); host time to enqueue {:.2} ms; \
         max relative difference {diff:.2e}",
        (replayed / plain_ms - 1.0) * 100.0,
        enqueue[enqueue.len() / 2]
    );
    Ok(())
}

/// The same step, same process (kernels already tuned), under other rules for the planes
/// attention kernel (whole tiles' probabilities in registers where the device offers them, two
/// fragments of query rows a plane), the rules interleaved over three rounds so that drift over
/// the run falls on each alike.
pub(super) fn planes_ab(
    model: &StableDiffusion,
    device: &Device,
    precision: Precision,
    runs: usize,
    x: &Tensor<4>,
    ctx: &Tensor<3>,
) -> Result<()> {
    use latent_engine::kernels::attention::{
        set_planes_hold_refs, set_planes_kv_pad, set_planes_tile,
    };
    // (staged key/value rows padded, tiling over many keys, references held between round trips)
    let rules = [
        (
            true,
            None,
            true,
            "default (key/value rows padded 16 bytes, 64 query rows over 32 keys, references held)",
        ),
        (true, None, false, "padded, references loaded every tile"),
        (
            false,
            None,
            false,
            "key/value rows packed, 64 query rows over 32 keys",
        ),
        (
            false,
            Some((32, 32)),
            false,
            "packed, 32 query rows over 32 keys (the kernel before)",
        ),
    ];
    let set = |(pad, tile, hold): (bool, Option<(usize, usize)>, bool)| {
        set_planes_kv_pad(pad);
        set_planes_tile(tile);
        set_planes_hold_refs(hold);
    };
    let default = (true, None, true);
    // Each rule's output against the default's: the padding and the held references move
    // nothing the sums read, so those rules must give the same step exactly; other tilings
    // differ by f16 rounding.
    let want = super::read_f32(model.unet()?.forward(x.clone(), &[500.0], ctx))?;
    for &(pad, tile, hold, name) in rules.iter().skip(1) {
        set((pad, tile, hold));
        let got = super::read_f32(model.unet()?.forward(x.clone(), &[500.0], ctx));
        set(default);
        let diff = latent_engine::vae_compile::relative_difference(&got?, &want);
        println!(
            "[{precision:?}] planes rule {name}: max relative difference from the default {diff:.2e}"
        );
    }
    let names: Vec<&str> = rules.iter().map(|r| r.3).collect();
    interleaved(precision, "planes rule", &names, 3, |i| {
        let (pad, tile, hold, _) = rules[i];
        set((pad, tile, hold));
        let ms = step_ms(model, device, runs, x, ctx);
        set(default);
        ms
    })
}

/// A step timed by `step` (`step(i)` under rule `i`) with our GEMM's step-invariant offsets
/// formed once before the reduction (the default) or at every step, interleaved over three
/// rounds; `check`, where given, reads the step's output to compare the second rule's with the
/// first's. (The planes attention's tile offsets formed once too lost on SD 1.5's replayed
/// step, 29.39 ms against 28.66 on an H200: forty-second session.)
pub(super) fn rows_ab(
    precision: Precision,
    check: Option<&dyn Fn() -> Result<Vec<f32>>>,
    mut step: impl FnMut(usize) -> Result<f64>,
) -> Result<()> {
    use latent_engine::kernels::matmul::{GemmKnobs, gemm_knobs, set_gemm_knobs};
    let knobs = gemm_knobs();
    let rules = [
        (true, "offsets formed once (default)"),
        (false, "offsets formed at every step"),
    ];
    let set = |i: usize| {
        set_gemm_knobs(GemmKnobs {
            hoist_rows: rules[i].0,
            ..knobs
        })
    };
    if let Some(read) = check {
        set(0);
        let first = read();
        set(1);
        let second = read();
        set_gemm_knobs(knobs);
        println!(
            "[{precision:?}] UNet step, GEMM rows: {}: max relative difference from the first rule {:.2e}",
            rules[1].1,
            latent_engine::vae_compile::relative_difference(&second?, &first?)
        );
    }
    let names: Vec<&str> = rules.iter().map(|r| r.1).collect();
    interleaved(precision, "GEMM rows", &names, 3, |i| {
        set(i);
        let ms = step(i);
        set_gemm_knobs(knobs);
        ms
    })
}

/// The median of `runs` steps (after two untimed ones) under the rules in force, replayed from a
/// graph recorded under them (launch by launch where the step does not replay).
pub(super) fn step_ms(
    model: &StableDiffusion,
    device: &Device,
    runs: usize,
    x: &Tensor<4>,
    ctx: &Tensor<3>,
) -> Result<f64> {
    step_ms_added(model, device, runs, x, ctx, None)
}

/// [`step_ms`] with SDXL's added conditioning where given (the step then runs `forward_added`).
pub(super) fn step_ms_added(
    model: &StableDiffusion,
    device: &Device,
    runs: usize,
    x: &Tensor<4>,
    ctx: &Tensor<3>,
    added: Option<&Tensor<2>>,
) -> Result<f64> {
    // Replayed from a graph captured under the rule being timed: launch by launch the step is
    // bound by the host's enqueueing (BENCHMARKS.md), which would hide the kernels' difference.
    let mut steps = recorded_steps(model, device, x, ctx, added)?;
    if !steps.is_replaying() {
        let base_unet = model.unet()?;
        return time_ms(device, 2, runs, || {
            let _ = plain_step(&base_unet, x, ctx, added);
        });
    }
    time_ms(device, 2, runs, || {
        let _ = steps.forward(x.clone(), 500.0);
    })
}

/// The step's output replayed from a graph recorded under the rules in force (launch by launch
/// where the capture failed), with SDXL's added conditioning where given.
pub(super) fn replayed_output(
    model: &StableDiffusion,
    device: &Device,
    x: &Tensor<4>,
    ctx: &Tensor<3>,
    added: Option<&Tensor<2>>,
) -> Result<Vec<f32>> {
    let mut steps = recorded_steps(model, device, x, ctx, added)?;
    super::read_f32(steps.forward(x.clone(), 500.0))
}

/// Times rule `i` of `names` with `time(i)`, the rules interleaved over `rounds` rounds so that
/// drift over the run falls on each alike, and prints each rule's median of rounds.
pub(super) fn interleaved(
    precision: Precision,
    what: &str,
    names: &[&str],
    rounds: usize,
    mut time: impl FnMut(usize) -> Result<f64>,
) -> Result<()> {
    let mut times = vec![Vec::new(); names.len()];
    for _ in 0..rounds {
        for (i, t) in times.iter_mut().enumerate() {
            t.push(time(i)?);
        }
    }
    print_rounds(precision, &format!("UNet step, {what}:"), names, &times);
    Ok(())
}

/// Each rule's median of its rounds and the rounds themselves, one line each after `what`.
pub(super) fn print_rounds(precision: Precision, what: &str, names: &[&str], times: &[Vec<f64>]) {
    for (name, t) in names.iter().zip(times) {
        let mut sorted = t.clone();
        sorted.sort_by(f64::total_cmp);
        println!(
            "[{precision:?}] {what} {name}: median of rounds {:.2} ms (rounds {})",
            sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN),
            t.iter()
                .map(|m| format!("{m:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// The same step, same process (kernels already tuned), under other convolution rules
/// ([`ConvRules`]): the rules in force, and channels-last on our GEMM where burn's convolution
/// runs by default (above 160 tiles) or on every layer it takes, interleaved over five rounds,
/// each rule's output compared with the first's. (The sixteenth to twenty-seventh sessions'
/// variants, the split kernel and the GEMM reading channels-first inputs in place, are in
/// BENCHMARKS.md.)
pub(super) fn conv_ab(
    model: &StableDiffusion,
    device: &Device,
    precision: Precision,
    runs: usize,
    x: &Tensor<4>,
    ctx: &Tensor<3>,
) -> Result<()> {
    use latent_engine::kernels::conv::{conv_rules, set_conv_rules};
    let d = conv_rules();
    let rules = channels_last_rules(d);
    let read = || super::read_f32(model.unet()?.forward(x.clone(), &[500.0], ctx));
    let want = read()?;
    for (rule, name) in &rules[1..] {
        set_conv_rules(*rule);
        let got = read();
        set_conv_rules(d);
        let diff = latent_engine::vae_compile::relative_difference(&got?, &want);
        println!(
            "[{precision:?}] UNet step, {name}: max relative difference from the first {diff:.2e}"
        );
    }
    let names: Vec<&str> = rules.iter().map(|r| r.1).collect();
    interleaved(precision, "convolution rule", &names, 5, |i| {
        set_conv_rules(rules[i].0);
        let ms = step_ms(model, device, runs, x, ctx);
        set_conv_rules(d);
        ms
    })
}

/// The rules in force `d`, then (where they differ from it) our GEMM channels-last on every
/// layer, above 160 tiles, and never (the layers on our GEMM over the unrolled input as before
/// the forty-third session; the weights that load packed for channels-last are then relaid out
/// at each call, which that rule did not pay then); with every layer channels-last, the other
/// tiles (the GEMM's rule, or one forced on every layer).
pub(super) fn channels_last_rules(
    d: latent_engine::kernels::conv::ConvRules,
) -> Vec<(latent_engine::kernels::conv::ConvRules, &'static str)> {
    use latent_engine::kernels::conv::ConvRules;
    let with = |tiles| ConvRules {
        channels_last_min_tiles: tiles,
        ..d
    };
    let mut rules = vec![(d, "rules in force")];
    for (tiles, name) in [
        (0, "channels-last on our GEMM for every layer"),
        (161, "channels-last on our GEMM above 160 tiles"),
        (
            usize::MAX,
            "no channels-last (the GEMM over the unrolled input)",
        ),
    ] {
        if d.channels_last_min_tiles != tiles {
            rules.push((with(tiles), name));
        }
    }
    if d.channels_last_min_tiles == 0 {
        for (tile, name) in [
            (None, "channels-last, tiles by the GEMM's rule"),
            (Some((128, 128)), "channels-last, 128 × 128 tiles"),
            (Some((64, 128)), "channels-last, 64 × 128 tiles"),
            (Some((128, 64)), "channels-last, 128 × 64 tiles"),
            (Some((64, 64)), "channels-last, 64 × 64 tiles"),
        ] {
            if d.channels_last_tile != tile {
                rules.push((
                    ConvRules {
                        channels_last_tile: tile,
                        ..d
                    },
                    name,
                ));
            }
        }
    }
    rules
}

/// The same step, same process, with the linear layers on burn's matmul or our
/// cooperative-matrix GEMM, under each of the GEMM's compilations (which the convolutions on it
/// take too), interleaved over three rounds.
pub(super) fn gemm_ab(
    model: &StableDiffusion,
    device: &Device,
    precision: Precision,
    runs: usize,
    x: &Tensor<4>,
    ctx: &Tensor<3>,
) -> Result<()> {
    use latent_engine::kernels::conv::{ConvRules, conv_rules, set_conv_rules};
    use latent_engine::kernels::matmul::{
        self as matmul, gemm_knobs, mma_linears, set_gemm_knobs, set_mma_linears,
    };
    let (knobs0, linears0, conv0) = (gemm_knobs(), mma_linears(), conv_rules());
    let mut rules = Vec::new();
    if super::linear::small_knobs_only() {
        // The split reduction with the 8×8 maps' 3×3 layers on our split kernel (the
        // twenty-fifth session's rules) or on the GEMM over their unrolled input (the default).
        let rules_for = |split_max_tiles| ConvRules {
            split_max_tiles,
            ..conv0
        };
        let knobs_for = |split_k| matmul::GemmKnobs { split_k, ..knobs0 };
        for (split, kernel_at_8, name) in [
            (
                false,
                true,
                "unsplit GEMM, split kernel at 8x8 (until the twenty-sixth session)",
            ),
            (true, true, "split reduction, split kernel at 8x8"),
            (
                true,
                false,
                "split reduction, 8x8 layers on the GEMM (default)",
            ),
            (false, false, "8x8 layers on the GEMM, unsplit"),
        ] {
            let conv = rules_for(if kernel_at_8 { 64 } else { 0 });
            rules.push((knobs_for(split), true, conv, name.to_string()));
        }
    } else {
        rules.push((knobs0, false, conv0, "linears on burn's matmul".to_string()));
        for k in super::linear::knob_sets() {
            rules.push((
                k,
                true,
                conv0,
                format!("GEMM {}, linears on it", super::linear::knob_label(&k)),
            ));
        }
    }
    // Each rule's step against the first's: a wrong kernel differs by the output's order, not
    // by f16 rounding.
    let mut first: Option<Vec<f32>> = None;
    for (k, linears, c, name) in &rules {
        set_gemm_knobs(*k);
        set_mma_linears(*linears);
        set_conv_rules(*c);
        let out = super::read_f32(model.unet()?.forward(x.clone(), &[500.0], ctx))?;
        match &first {
            None => first = Some(out),
            Some(want) => println!(
                "[{precision:?}] UNet step, GEMM rule: {name}: max relative difference from the first rule {:.2e}",
                latent_engine::vae_compile::relative_difference(&out, want)
            ),
        }
    }
    set_gemm_knobs(knobs0);
    set_mma_linears(linears0);
    set_conv_rules(conv0);
    let names: Vec<&str> = rules.iter().map(|r| r.3.as_str()).collect();
    interleaved(precision, "GEMM rule", &names, 3, |i| {
        set_gemm_knobs(rules[i].0);
        set_mma_linears(rules[i].1);
        set_conv_rules(rules[i].2);
        let ms = step_ms(model, device, runs, x, ctx);
        set_gemm_knobs(knobs0);
        set_mma_linears(linears0);
        set_conv_rules(conv0);
        ms
    })
}
