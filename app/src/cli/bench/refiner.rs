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
use latent_engine::{Refiner, StableDiffusion, TextEncoders};

use super::sdxl::{Phases, memory};
use super::{bench_request, sync, time_ms};

pub(super) fn refiner_runs(
    device: &Device,
    tokenizer: &ClipTokenizer,
    model: &StableDiffusion,
    [steps, runs, size]: [usize; 3],
) -> Result<()> {
    let t = Instant::now();
    // Parked as the base parks its encoders (the memory-saving mode), as the studio does.
    let place = match model.parked() {
        true => TextEncoders::Host,
        false => TextEncoders::Device,
    };
    let refiner = Refiner::random(&ModelConfig::sdxl_refiner(), device, model.precision, place)?;
    sync(device)?;
    let where_ = match refiner.parked() {
        true => "parked in host memory: the UNets take turns on the device",
        false => "on the device beside the base",
    };
    println!(
        "[SDXL refiner] build full-size refiner (random weights, f16, {where_}): {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    memory(device, "the refiner's weights loaded too");

    let normal = Distribution::Normal(0.0, 1.0);
    let dtype = model.precision.dtype();
    let latent = size / model.config.vae.downscale();
    let x = Tensor::<4>::random([2, 4, latent, latent], normal, (device, dtype));
    let context = refiner.config.unet.cross_attention_dim;
    let ctx = Tensor::<3>::random([2, 77, context], normal, (device, dtype));
    let pooled = Tensor::<2>::random([2, 1280], normal, (device, dtype));
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
            Some(&refiner),
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
