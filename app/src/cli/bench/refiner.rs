//! SDXL's refiner on random full-size weights (f16), after `--sdxl`'s base runs: its UNet step at
//! the base's latents (batch 2, CFG, the five added values), and the 1024² txt2img again with the
//! refiner taking over at A1111's default switch, as `bench/torch_anchor.py`'s `sdxl_refiner`
//! part runs both.

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::Result;
use burn::tensor::{Device, Distribution, Tensor};
use latent_engine::checkpoint::ModelConfig;
use latent_engine::pipeline::{RefinerSwitch, Txt2ImgRequest, txt2img_refined};
use latent_engine::stable_diffusion::{AESTHETIC_SCORE, NEGATIVE_AESTHETIC_SCORE};
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::{Precision, Refiner, StableDiffusion, TextEncoders};

use super::sdxl::{Phases, memory};
use super::{bench_request, sync, time_ms};

/// A full-size refiner with random weights, parked in host memory where `place` says (built on
/// the device and moved there: with the base not built yet, the device holds it alone meanwhile).
pub(super) fn random_refiner(
    device: &Device,
    precision: Precision,
    place: TextEncoders,
) -> Result<Refiner> {
    let t = Instant::now();
    let refiner = Refiner::random(&ModelConfig::sdxl_refiner(), device, precision, place)?;
    sync(device)?;
    let where_ = match refiner.parked() {
        true => "parked in host memory: the UNets take turns on the device",
        false => "on the device beside the base",
    };
    println!(
        "[SDXL refiner] build full-size refiner (random weights, f16, {where_}): {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    memory(device, "the refiner's weights loaded");
    Ok(refiner)
}

/// The refiner's UNet step alone (where `time_step`: both UNets on the device then), then the
/// base's 1024² txt2img with the refiner taking over.
pub(super) fn refiner_runs(
    device: &Device,
    tokenizer: &ClipTokenizer,
    model: &StableDiffusion,
    refiner: &Refiner,
    time_step: bool,
    [steps, runs, size]: [usize; 3],
) -> Result<()> {
    if time_step {
        refiner_step(device, model, refiner, [runs, size])?;
    }
    let req = Txt2ImgRequest {
        width: size,
        height: size,
        refiner: Some(RefinerSwitch {
            switch_at: RefinerSwitch::DEFAULT_SWITCH_AT,
            name: "random".into(),
        }),
        ..bench_request(steps)
    };
    let cancel = AtomicBool::new(false);
    // Each phase time-stamped, as the base's runs are (`bench/mem_phases.py` places the peak).
    let run = |phase| {
        txt2img_refined(
            model,
            Some(refiner),
            tokenizer,
            &req,
            &cancel,
            &mut Phases(phase),
        )
    };
    let t = Instant::now();
    run("refined first run")?;
    println!(
        "[SDXL refiner] txt2img {size}x{size}, {steps} Euler steps, CFG 7.5, refiner from 0.8, \
         first run: {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    memory(device, "after the first refined txt2img");
    if runs > 1 {
        let total = time_ms(device, 0, 2, || {
            let _ = run("refined timed run");
        })?;
        println!(
            "[SDXL refiner] txt2img {size}x{size}, {steps} Euler steps, CFG 7.5, refiner from \
             0.8: median {total:.0} ms"
        );
        memory(device, "after the refined txt2img runs");
    }
    Ok(())
}

/// The refiner's UNet step (batch 2, CFG) at the base's latents, the UNet on the device beside
/// the base's (an H200 has the room); a parked refiner's leaves again after.
fn refiner_step(
    device: &Device,
    model: &StableDiffusion,
    refiner: &Refiner,
    [runs, size]: [usize; 2],
) -> Result<()> {
    let (x, ctx, pooled) = step_inputs(device, model, refiner, size);
    let latent = x.dims()[2];
    let side = size as f32;
    let ids = [
        [side, side, 0.0, 0.0, NEGATIVE_AESTHETIC_SCORE],
        [side, side, 0.0, 0.0, AESTHETIC_SCORE],
    ];
    // The step alone, on the device beside the base UNet (an H200 has the room).
    let refiner_unet = refiner.unet()?;
    let added = refiner_unet.added_conditioning(&pooled, &ids)?;
    let unet = time_ms(device, 2, runs, || {
        let _ = refiner_unet.forward_added(x.clone(), &[100.0], &ctx, &added);
    })?;
    println!(
        "[SDXL refiner] UNet step, batch 2 (CFG), {latent}x{latent} latents: median {unet:.2} ms"
    );
    drop((x, ctx, pooled, added, refiner_unet));
    if refiner.parked() {
        refiner.evict_unet()?;
    }
    Ok(())
}

/// `cycles` turns of the two UNets on the device, each leg waited for: the base's UNet leaves,
/// the refiner's comes (then three of its steps, each waited for: whether a UNet just built runs
/// its first steps slower), the refiner's leaves, the base's comes back. The engine logs each
/// leg's parts (upload, build, transfer) at info.
pub(super) fn swap_cycles(
    device: &Device,
    model: &StableDiffusion,
    refiner: &Refiner,
    cycles: usize,
    size: usize,
) -> Result<()> {
    let (x, ctx, pooled) = step_inputs(device, model, refiner, size);
    let side = size as f32;
    let ids = [[side, side, 0.0, 0.0, AESTHETIC_SCORE]; 2];
    let timed = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        sync(device)?;
        let t = Instant::now();
        f()?;
        sync(device)?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    };
    for cycle in 1..=cycles {
        let base_out = timed(&mut || Ok(model.evict_unet()?))?;
        let mut unet = None;
        let refiner_in = timed(&mut || {
            unet = Some(refiner.unet()?);
            Ok(())
        })?;
        let unet = unet.ok_or_else(|| anyhow::anyhow!("no refiner UNet"))?;
        let added = unet.added_conditioning(&pooled, &ids)?;
        let mut steps = Vec::new();
        for _ in 0..3 {
            steps.push(timed(&mut || {
                let _ = unet.forward_added(x.clone(), &[100.0], &ctx, &added);
                Ok(())
            })?);
        }
        drop((unet, added));
        let refiner_out = timed(&mut || Ok(refiner.evict_unet()?))?;
        let base_in = timed(&mut || {
            let _ = model.unet()?;
            Ok(())
        })?;
        println!(
            "[SDXL refiner] turn {cycle}: base out {base_out:.0} ms, refiner in {refiner_in:.0} \
             ms, its steps {:.0} / {:.0} / {:.0} ms, refiner out {refiner_out:.0} ms, base in \
             {base_in:.0} ms",
            steps[0], steps[1], steps[2]
        );
    }
    Ok(())
}

/// Random inputs of the refiner's step at the base's `size`: latents `[2, 4, h, w]`, context and
/// pooled embedding (batch 2: CFG).
fn step_inputs(
    device: &Device,
    model: &StableDiffusion,
    refiner: &Refiner,
    size: usize,
) -> (Tensor<4>, Tensor<3>, Tensor<2>) {
    let normal = Distribution::Normal(0.0, 1.0);
    let dtype = model.precision.dtype();
    let latent = size / model.config.vae.downscale();
    let x = Tensor::<4>::random([2, 4, latent, latent], normal, (device, dtype));
    let context = refiner.config.unet.cross_attention_dim;
    let ctx = Tensor::<3>::random([2, 77, context], normal, (device, dtype));
    let pooled = Tensor::<2>::random([2, 1280], normal, (device, dtype));
    (x, ctx, pooled)
}
