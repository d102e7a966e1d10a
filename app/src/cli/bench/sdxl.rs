//! SDXL at its native size on random full-size weights (f16): the UNet step at 128² latents
//! (batch 2, CFG) with its added conditioning, as `bench/torch_anchor.py`'s `sdxl` part runs it,
//! and a whole 1024² txt2img (both encoders, the steps, the decode), as its `sdxl_e2e` part does,
//! with the memory pool's reserved bytes between runs and each phase's wall-clock time (issue 15
//! asks for at most 8 GiB, decode included; `bench/gpu_issue13.sh` samples the process's true
//! peak from outside, time-stamped, and the phases place it).

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::Result;
use burn::tensor::{Device, Distribution, Tensor};
use latent_engine::checkpoint::ModelConfig;
use latent_engine::pipeline::{
    DecodeOptions, Quiet, SizeConditioning, Txt2ImgRequest, decode, txt2img,
};
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::unet::Context;
use latent_engine::vae_tiling::{TilingConfig, TilingMode};
use latent_engine::{Precision, StableDiffusion};

use super::args::BenchArgs;
use super::{bench_request, sync, time_ms};

/// With `--pipeline-only`, the txt2img alone: its process peak is then the run's own.
pub(super) fn sdxl_bench(
    device: &Device,
    tokenizer: &ClipTokenizer,
    args: &BenchArgs,
) -> Result<()> {
    let (runs, steps, size) = (args.runs, args.steps, args.sdxl_size);
    let precision = Precision::F16;
    let dtype = precision.dtype();
    // With `--pipeline-only`, the refiner is built first (a parked one on the device alone
    // before it moves to host memory, as a checkpoint's parked refiner never is there), so that
    // the process's peak is the runs'.
    let sdxl = ModelConfig::sdxl();
    let place = args.text_encoders;
    let early_refiner = match args.refiner && args.pipeline_only {
        true => Some(super::refiner::random_refiner(device, precision, place)?),
        false => None,
    };
    let t = Instant::now();
    let model = StableDiffusion::random_with(&sdxl, device, precision, args.text_encoders)?;
    sync(device)?;
    println!(
        "[SDXL] build full-size SDXL (random weights, f16, text encoders {}): {:.0} ms",
        if model.parked() {
            "parked in host memory"
        } else {
            "on the device"
        },
        t.elapsed().as_secs_f64() * 1e3
    );
    memory(device, "the weights loaded");
    if args.pipeline_only {
        txt2img_runs(device, tokenizer, &model, [steps, runs, size])?;
        if let Some(refiner) = &early_refiner {
            if args.swaps > 0 {
                super::refiner::swap_cycles(device, &model, refiner, args.swaps, size)?;
            }
            let shape = [steps, runs, size];
            super::refiner::refiner_runs(device, tokenizer, &model, refiner, false, shape)?;
        }
        return Ok(());
    }
    let normal = Distribution::Normal(0.0, 1.0);
    let latent = size / model.config.vae.downscale();
    let decodes = [
        ("tiled (64-latent tiles)", TilingMode::Always),
        ("whole", TilingMode::Never),
    ];
    let decodes: Vec<_> = match args.sdxl_decode.as_deref() {
        Some("tiled") => decodes[..1].to_vec(),
        Some(_) => decodes[1..].to_vec(),
        None => decodes.to_vec(),
    };
    if args.sdxl_decode.is_some() {
        return decode_runs(device, &model, &decodes, latent, runs);
    }
    let context = model.config.unet.cross_attention_dim;
    let x = Tensor::<4>::random([2, 4, latent, latent], normal, (device, dtype));
    let ctx = Tensor::<3>::random([2, 77, context], normal, (device, dtype));
    let pooled_width = model
        .text_encoder_2
        .as_ref()
        .and_then(|te| te.config().projection_dim)
        .ok_or_else(|| anyhow::anyhow!("the SDXL model has no projected second text encoder"))?;
    let pooled = Tensor::<2>::random([2, pooled_width], normal, (device, dtype));
    let ids = SizeConditioning::of_image(size, size).time_ids();
    let added = model.unet()?.added_conditioning(&pooled, &[ids; 2])?;
    let base_unet = model.unet()?;
    let unet = time_ms(device, 2, runs, || {
        let _ = base_unet.forward_added(x.clone(), &[500.0], &ctx, &added);
    })?;
    println!("[SDXL] UNet step, batch 2 (CFG), {latent}x{latent} latents: median {unet:.2} ms");
    memory(device, "after the UNet steps");
    // As txt2img runs its steps after the first few: replayed from a recorded graph.
    if let Err(e) =
        super::unet::graph_bench(&model, device, "SDXL", runs, &x, &ctx, Some(&added), unet)
    {
        println!("[SDXL] UNet step from a captured graph: failed: {e:#}");
    }
    memory(device, "after the replayed steps");
    if args.planes_ab {
        use latent_engine::kernels::attention::{set_planes_hold_refs, set_planes_kv_pad};
        // The planes kernel's staged key/value rows padded or packed, and its rows' references
        // held in registers between round trips; each step replayed from a graph recorded under
        // it, as txt2img runs it (launch by launch, SDXL's step moves ±5 ms with the host).
        let rules = [(true, true), (true, false), (false, false)];
        let names = [
            "default (key/value rows padded 16 bytes, 64 query rows over 32 keys, references held)",
            "padded, references loaded every tile",
            "key/value rows packed, references loaded every tile (the kernel before)",
        ];
        let set = |(pad, hold): (bool, bool)| {
            set_planes_kv_pad(pad);
            set_planes_hold_refs(hold);
        };
        // Every rule must give the same step exactly (none moves what the sums read).
        let reset = || set(rules[0]);
        let rules_ab = RulesAb {
            precision,
            label: "planes rule",
            names: &names,
        };
        rules_ab.replayed(
            &model,
            device,
            runs,
            (&x, &ctx, &added),
            |i| set(rules[i]),
            reset,
        )?;
    }
    if args.gemm_ab {
        gemm_ab(&model, device, runs, &x, &ctx, &added)?;
    }
    for set in super::norm::RuleSet::asked(args.norm_ab, args.context_ab, args.conv_tiles_ab) {
        super::norm::norm_ab(
            precision,
            "SDXL",
            set,
            &mut || super::unet::replayed_output(&model, device, &x, &ctx, Some(&added)),
            &mut || super::unet::step_ms_added(&model, device, runs, &x, &ctx, Some(&added)),
        )?;
    }
    if args.rows_ab {
        let base_unet = model.unet()?;
        super::unet::rows_ab(precision, None, |_| {
            time_ms(device, 1, runs, || {
                let _ = base_unet.forward_added(x.clone(), &[500.0], &ctx, &added);
            })
        })?;
    }
    if args.conv_ab {
        let base_unet = model.unet()?;
        rules_ab(device, runs, || {
            base_unet.forward_added(x.clone(), &[500.0], &ctx, &added)
        })?;
    }
    if let Some(steps) = args.kernel_profile {
        let base_unet = model.unet()?;
        let kv = latent_engine::unet::graph::generation_kv(&base_unet, &ctx);
        super::profile::kernel_profile_of(device, "SDXL", steps, || {
            let context = Context::projected(&ctx, &kv);
            let _ = base_unet.forward_context(x.clone(), &[500.0], context, Some(&added));
        })?;
    }
    drop((x, ctx, pooled, added));
    // The decode alone, tiled first (the pool's pages only grow): how much of the
    // txt2img's peak the whole-image decode is.
    decode_runs(device, &model, &decodes, latent, runs)?;
    if !args.no_pipeline {
        txt2img_runs(device, tokenizer, &model, [steps, runs, size])?;
    }
    if args.refiner {
        let refiner = super::refiner::random_refiner(device, precision, args.text_encoders)?;
        super::refiner::refiner_runs(
            device,
            tokenizer,
            &model,
            &refiner,
            true,
            [steps, runs, size],
        )?;
    }
    Ok(())
}

/// SDXL's step under the rules in force and channels-last on our GEMM
/// ([`super::unet::channels_last_rules`]), interleaved over three rounds, each rule's output
/// compared with the first's.
fn rules_ab(device: &Device, runs: usize, step: impl Fn() -> Tensor<4>) -> Result<()> {
    use latent_engine::kernels::conv::{conv_rules, set_conv_rules};
    use latent_engine::kernels::matmul::{gemm_knobs, set_gemm_knobs};
    let (c, k) = (conv_rules(), gemm_knobs());
    let rules: Vec<_> = super::unet::channels_last_rules(c)
        .into_iter()
        .map(|(rule, name)| (rule, k, name))
        .collect();
    // Each rule's output against the default's: a wrong kernel differs by the output's order,
    // not by f16 rounding.
    let want = super::read_f32(step())?;
    for (conv, knobs, name) in &rules[1..] {
        set_conv_rules(*conv);
        set_gemm_knobs(*knobs);
        let got = super::read_f32(step());
        set_conv_rules(c);
        set_gemm_knobs(k);
        let diff = latent_engine::vae_compile::relative_difference(&got?, &want);
        println!("[SDXL] {name}: max relative difference from the default {diff:.2e}");
    }
    let names: Vec<&str> = rules.iter().map(|r| r.2).collect();
    super::unet::interleaved(Precision::F16, "SDXL kernel rule", &names, 3, |i| {
        set_conv_rules(rules[i].0);
        set_gemm_knobs(rules[i].1);
        let ms = time_ms(device, 1, runs, || {
            let _ = step();
        });
        set_conv_rules(c);
        set_gemm_knobs(k);
        ms
    })
}

/// The VAE decode of one `latent`² latent in each of `modes` (a first, then up to three timed),
/// with the pool's reserved bytes after each.
fn decode_runs(
    device: &Device,
    model: &StableDiffusion,
    modes: &[(&str, TilingMode)],
    latent: usize,
    runs: usize,
) -> Result<()> {
    let normal = Distribution::Normal(0.0, 1.0);
    let size = latent * model.config.vae.downscale();
    let dtype = model.precision.dtype();
    let z = Tensor::<4>::random([1, 4, latent, latent], normal, (device, dtype));
    for &(name, mode) in modes {
        let options = DecodeOptions {
            tiling: TilingConfig::with_mode(mode),
            compile: true,
        };
        decode(model, z.clone(), &options, &mut Quiet)?;
        memory(device, &format!("after the first {name} decode"));
        let ms = time_ms(device, 0, runs.min(3), || {
            let _ = decode(model, z.clone(), &options, &mut Quiet);
        })?;
        println!("[SDXL] VAE decode {size}x{size}, {name}: median {ms:.1} ms");
        memory(device, &format!("after the {name} decode"));
    }
    Ok(())
}

/// A first `size`² txt2img (its errors surface), two timed (unless `runs` is 1), and the pool.
fn txt2img_runs(
    device: &Device,
    tokenizer: &ClipTokenizer,
    model: &StableDiffusion,
    [steps, runs, size]: [usize; 3],
) -> Result<()> {
    {
        let req = Txt2ImgRequest {
            width: size,
            height: size,
            ..bench_request(steps)
        };
        let cancel = AtomicBool::new(false);
        // The first run's errors surface (the timed runs' results are dropped).
        let t = Instant::now();
        txt2img(model, tokenizer, &req, &cancel, &mut Phases("first run"))?;
        println!(
            "[SDXL] txt2img {size}x{size}, {steps} Euler steps, CFG 7.5, first run: {:.0} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
        memory(device, "after the first txt2img");
        // `--runs 1`: the first run only (a slow adapter's memory measurement).
        if runs > 1 {
            let total = time_ms(device, 0, 2, || {
                let _ = txt2img(model, tokenizer, &req, &cancel, &mut Phases("timed run"));
            })?;
            println!(
                "[SDXL] txt2img {size}x{size}, {steps} Euler steps, CFG 7.5: median {total:.0} ms"
            );
            memory(device, "after the txt2img runs");
        }
    }
    Ok(())
}

/// Prints the wall-clock time (UTC, to the millisecond) at each phase of a txt2img, so that a
/// device-memory trace sampled beside the process (nvidia-smi's `timestamp`) can be read phase by
/// phase: the encoders and first step, the last step, the decode.
pub(super) struct Phases(pub(super) &'static str);

impl Phases {
    fn mark(&self, what: &str) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let ms = now.as_millis() % 86_400_000;
        let (h, m, sec, milli) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
        println!(
            "[SDXL] {} {what} at {h:02}:{m:02}:{sec:02}.{milli:03} UTC",
            self.0
        );
    }
}

impl latent_engine::pipeline::Observer for Phases {
    fn step(&mut self, state: &latent_engine::pipeline::StepState<'_>) {
        if state.step == 1 || state.step == state.total {
            self.mark(&format!("step {}/{}", state.step, state.total));
        }
    }
    fn decoding(&mut self, tiles: usize) {
        self.mark(&format!("decode ({tiles} tiles)"));
    }
    fn image(&mut self, _generated: &latent_engine::pipeline::Generated) {
        self.mark("image done");
    }
}

/// The memory pool's bytes in use and reserved at `when`: pages of its pools are kept a while,
/// but buffers of their own (large tensors) are released when dropped, so this is no high-water
/// mark; the process's peak is what nvidia-smi samples beside it.
pub(super) fn memory(device: &Device, when: &str) {
    if let Some(usage) = device.memory_pool_usage() {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        println!(
            "[SDXL] device memory {when}: {:.2} GiB in use, {:.2} GiB reserved",
            gib(usage.bytes_in_use),
            gib(usage.bytes_reserved)
        );
    }
}

/// SDXL's step under the GEMM's compilations ([`super::linear::knob_sets`]; for this model's
/// minutes `LATENT_STUDIO_BENCH_KNOBS=fence` keeps the default and the fenced ones).
fn gemm_ab(
    model: &StableDiffusion,
    device: &Device,
    runs: usize,
    x: &Tensor<4>,
    ctx: &Tensor<3>,
    added: &Tensor<2>,
) -> Result<()> {
    use latent_engine::kernels::matmul::{gemm_knobs, set_gemm_knobs};
    let knobs0 = gemm_knobs();
    let sets = super::linear::knob_sets();
    let names: Vec<String> = sets.iter().map(super::linear::knob_label).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let rules_ab = RulesAb {
        precision: Precision::F16,
        label: "GEMM",
        names: &names,
    };
    rules_ab.replayed(
        model,
        device,
        runs,
        (x, ctx, added),
        |i| set_gemm_knobs(sets[i]),
        || set_gemm_knobs(knobs0),
    )
}

/// An A/B of SDXL's step under named rules, the first the default.
struct RulesAb<'a> {
    precision: Precision,
    label: &'a str,
    names: &'a [&'a str],
}

impl RulesAb<'_> {
    /// Each rule's step (`set(i)`, then `reset()`) against the one before any rule is set,
    /// then each replayed from a graph recorded under it, as txt2img runs it (launch by launch,
    /// SDXL's step moves ±5 ms with the host), interleaved over three rounds.
    fn replayed(
        &self,
        model: &StableDiffusion,
        device: &Device,
        runs: usize,
        (x, ctx, added): (&Tensor<4>, &Tensor<3>, &Tensor<2>),
        set: impl Fn(usize),
        reset: impl Fn(),
    ) -> Result<()> {
        let label = self.label;
        let step = || super::read_f32(super::unet::plain_step(&model.unet()?, x, ctx, Some(added)));
        let want = step()?;
        for (i, name) in self.names.iter().enumerate().skip(1) {
            set(i);
            let got = step();
            reset();
            let diff = latent_engine::vae_compile::relative_difference(&got?, &want);
            println!("[SDXL] {label} {name}: max relative difference from the default {diff:.2e}");
        }
        let title = format!("SDXL {label} (replayed)");
        super::unet::interleaved(self.precision, &title, self.names, 3, |i| {
            set(i);
            let ms = super::unet::step_ms_added(model, device, runs, x, ctx, Some(added));
            reset();
            ms
        })
    }
}
