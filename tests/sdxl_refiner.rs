//! SDXL's refiner against diffusers on the tiny refiner (tests/fixtures/make_sdxl_refiner_fixtures.py):
//! both layouts open as the refiner (and only as one), its prompt conditioning (bigG alone, the
//! empty negative encoded), its UNet with the five added values (sizes, crop, aesthetic score), and
//! whole seeded runs of the tiny SDXL base handing over to it (diffusers' `denoising_end` /
//! `denoising_start` with one generator), on CPU and wgpu.

use crate::common;

use burn::tensor::{DType, Device};
use std::sync::atomic::AtomicBool;

use common::{Expected, PipelineCase, assert_close, devices, fixtures, to_vec};
use latent_engine::checkpoint::{Checkpoint, Family, ldm};
use latent_engine::pipeline::{Quiet, RefinerSwitch, txt2img_refined};
use latent_engine::prompt::{self, Chunks, Emphasis};
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::{LoadOptions, Precision, Refiner, StableDiffusion};

/// The two layouts of the tiny refiner.
const LAYOUTS: [&str; 2] = ["tiny-sdxl-refiner", "tiny-sdxl-refiner.safetensors"];

fn cases() -> serde_json::Value {
    let path = fixtures().join("sdxl_refiner_cases.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("cases")).expect("parses")
}

fn open(layout: &str) -> Checkpoint {
    Checkpoint::open_refiner(&fixtures().join(layout)).unwrap_or_else(|e| panic!("{layout}: {e}"))
}

/// Both layouts open as the refiner with the same configs (a folder's `model_index.json` says
/// the refiner encodes an empty negative, as a single file does by ComfyUI's rule); as a model
/// of its own it is refused in words, and a base model is not a refiner.
#[test]
fn both_layouts_open_as_the_refiner_only() {
    let folder = open(LAYOUTS[0]);
    let single = open(LAYOUTS[1]);
    for c in [&folder, &single] {
        assert_eq!(c.family, Family::SdxlRefiner);
        let te2 = c.config.text_encoder_2.as_ref().expect("bigG");
        assert!(te2.with_projection);
        assert_eq!((te2.pad_token, te2.projection_dim), (0, Some(12)));
        assert_eq!(c.config.unet.added_values(12), Some(5));
        assert_eq!(c.config.vae.scaling_factor, 0.13025);
        assert!(!c.config.force_zeros_for_empty_prompt);
        assert!(c.text_encoder_weights(&Device::flex(), DType::F32).is_err());
    }
    assert_eq!(folder.config.unet, single.config.unet);
    assert_eq!(folder.files().len(), 3, "bigG, UNet, VAE");
    assert_eq!(single.files().len(), 1);
    for layout in LAYOUTS {
        let e = Checkpoint::open(&fixtures().join(layout)).expect_err("not a model");
        assert!(e.to_string().contains("refiner"), "{layout}: {e}");
    }
    for base in ["tiny-sdxl", "tiny-sdxl.safetensors", "tiny-sd"] {
        let e = Checkpoint::open_refiner(&fixtures().join(base)).expect_err("not a refiner");
        assert!(e.to_string().contains("not an SDXL refiner"), "{base}: {e}");
        assert!(
            matches!(e, latent_engine::Error::NotARefiner { .. }),
            "{base}"
        );
    }
}

/// The refiner's prompt conditioning (`encode_prompt` of diffusers' refiner pipeline: bigG's
/// penultimate states and its pooled state) and its UNet with the five added values, from both
/// layouts on the CPU (f32, and f16 from the folder) and the folder on wgpu.
#[test]
fn encoder_and_unet_match_diffusers() {
    let exp = Expected::open("sdxl-refiner-expected.safetensors");
    let tokenizer = ClipTokenizer::new().expect("tokenizer");
    let cases = cases();
    for (backend, device) in devices() {
        for (layout, precision) in [
            (LAYOUTS[0], Precision::F32),
            (LAYOUTS[1], Precision::F32),
            (LAYOUTS[0], Precision::F16),
        ] {
            if backend == "wgpu" && (layout == LAYOUTS[1] || precision == Precision::F16) {
                continue;
            }
            let dtype = precision.dtype();
            let what = |part: &str| format!("{backend}/{layout}/{precision:?}/{part}");
            let ckpt = open(layout);
            let refiner = Refiner::load(&ckpt, &device, precision)
                .unwrap_or_else(|e| panic!("{}: {e}", what("load")));
            if layout == LAYOUTS[1] {
                // Nothing of the file's bigG or UNet is left unread but OpenCLIP's logit scale
                // (the VAE is the base model's to read).
                let w = ckpt.text_encoder_2_weights(&device, dtype).expect("bigG");
                let _ = latent_engine::clip::ClipTextModel::load(
                    &w,
                    ckpt.config.text_encoder_2.as_ref().expect("config"),
                );
                let unused = w.report(ldm::SDXL_REFINER_OPENCLIP_PREFIX).unused;
                assert!(
                    unused
                        .iter()
                        .filter(|k| k.starts_with(ldm::SDXL_REFINER_OPENCLIP_PREFIX))
                        .all(|k| k.ends_with("logit_scale")),
                    "{unused:?}"
                );
            }
            let case = &cases["encode"][0];
            let chunks = |text: &str| Chunks::new(&tokenizer, text, Emphasis::Original);
            for (text, key) in [
                (case["prompt"].as_str().expect("prompt"), "prompt"),
                (case["negative"].as_str().expect("negative"), "negative"),
                ("", "empty"),
            ] {
                let c = prompt::encode_sdxl(
                    None,
                    &refiner.text_encoder().expect("the encoder"),
                    &chunks(text),
                    1,
                    Emphasis::Original,
                )
                .expect("encodes");
                // A left-out negative (`enc1`) is the encoded empty string.
                let (embeds, pooled) = match key {
                    "prompt" => ("enc0.prompt_embeds", "enc0.pooled_prompt_embeds"),
                    "negative" => (
                        "enc0.negative_prompt_embeds",
                        "enc0.negative_pooled_prompt_embeds",
                    ),
                    _ => (
                        "enc1.negative_prompt_embeds",
                        "enc1.negative_pooled_prompt_embeds",
                    ),
                };
                assert_close(
                    &what(embeds),
                    &to_vec(c.context),
                    &exp.values(embeds),
                    dtype,
                );
                assert_close(&what(pooled), &to_vec(c.pooled), &exp.values(pooled), dtype);
            }

            let unet = &refiner.unet().expect("the UNet");
            let x = exp.tensor::<4>("unet.x", &device, dtype);
            let ctx = exp.tensor::<3>("unet.context", &device, dtype);
            let pooled = exp.tensor::<2>("unet.text_embeds", &device, dtype);
            let ids: Vec<Vec<f32>> = exp
                .values("unet.time_ids")
                .chunks_exact(5)
                .map(<[f32]>::to_vec)
                .collect();
            let added = unet.added_conditioning(&pooled, &ids).expect("conditions");
            for (key, t) in [
                ("unet.out.t999", 999.0),
                ("unet.out.t500.5", 500.5),
                ("unet.out.t1", 1.0),
            ] {
                if backend == "wgpu" && t != 500.5 {
                    continue;
                }
                let got = to_vec(unet.forward_added(x.clone(), &[t], &ctx, &added));
                assert_close(&what(key), &got, &exp.values(key), dtype);
            }
            // SDXL base's six values are refused by the refiner's UNet.
            let six = vec![vec![64.0f32; 6]; 2];
            assert!(unet.added_conditioning(&pooled, &six).is_err());
        }
    }
}

/// The tiny SDXL base hands over to the refiner at the case's switch: images within ±1 of
/// diffusers' base (`denoising_end`, latents out) then refiner (`denoising_start`), one
/// generator through both, Euler and Euler a. Both refiner layouts on the CPU, the folder's
/// Euler case on wgpu; the recorded parameters name the refiner and its switch.
#[test]
fn base_then_refiner_matches_diffusers() {
    let exp = Expected::open("sdxl-refiner-expected.safetensors");
    let cases = cases();
    let tokenizer = ClipTokenizer::new().expect("tokenizer");
    let mut cpu_images = 0;
    for (backend, device) in devices() {
        let base = StableDiffusion::load(
            &Checkpoint::open(&fixtures().join("tiny-sdxl")).expect("base"),
            &device,
            LoadOptions::default(),
        )
        .expect("loads");
        assert!(base.config.force_zeros_for_empty_prompt);
        for layout in LAYOUTS {
            if backend == "wgpu" && layout == LAYOUTS[1] {
                continue;
            }
            let refiner = Refiner::load(&open(layout), &device, Precision::F32).expect("loads");
            for case in cases["ensemble"].as_array().expect("cases") {
                let c: PipelineCase = serde_json::from_value(case.clone()).expect("a case");
                if !common::runs_on(backend, &c.name, &["case0"]) {
                    continue;
                }
                let mut req = c.request();
                req.refiner = Some(RefinerSwitch {
                    switch_at: case["switch_at"].as_f64().expect("switch"),
                    name: "tiny-sdxl-refiner [0123456789]".into(),
                });
                let out = txt2img_refined(
                    &base,
                    Some(&refiner),
                    &tokenizer,
                    &req,
                    &AtomicBool::new(false),
                    &mut Quiet,
                )
                .unwrap_or_else(|e| panic!("{backend}/{layout}/{}: {e}", c.name));
                let got = &out[0].image.pixels;
                let want = exp.bytes(&format!("{}.image", c.name));
                assert_eq!(got.len(), want.len(), "{}: size", c.name);
                let worst = got.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).max();
                assert!(
                    worst.unwrap_or(0) <= 1,
                    "{backend}/{layout}/{} ({}): pixels differ by up to {worst:?}",
                    c.name,
                    c.sampler
                );
                cpu_images += usize::from(backend == "cpu");
            }
            // A repeated prompt encodes nothing new for the refiner.
            let encodes = refiner.conditioning_encodes();
            assert!(encodes >= 1, "{backend}/{layout}");
        }
        // Without a refiner loaded, a request naming one is refused; so is a bad switch.
        let mut req = latent_engine::pipeline::Txt2ImgRequest {
            prompt: "a kite".into(),
            steps: 2,
            width: 64,
            height: 64,
            refiner: Some(RefinerSwitch {
                switch_at: 0.8,
                name: String::new(),
            }),
            ..Default::default()
        };
        let run = |req: &latent_engine::pipeline::Txt2ImgRequest, refiner: Option<&Refiner>| {
            txt2img_refined(
                &base,
                refiner,
                &tokenizer,
                req,
                &AtomicBool::new(false),
                &mut Quiet,
            )
        };
        let e = run(&req, None).expect_err("no refiner");
        assert!(e.to_string().contains("none is loaded"), "{e}");
        let refiner = Refiner::load(&open(LAYOUTS[0]), &device, Precision::F32).expect("loads");
        if let Some(r) = &mut req.refiner {
            r.switch_at = 1.5;
        }
        let e = run(&req, Some(&refiner)).expect_err("bad switch");
        assert!(e.to_string().contains("(0, 1]"), "{e}");
    }
    assert_eq!(cpu_images, 4, "two cases from each layout on the CPU");
}

/// What each step of a refined run saw: whether the base's and the refiner's UNets were on the
/// device, and the pool's bytes in use after the step.
struct Turns<'a> {
    base: &'a StableDiffusion,
    refiner: &'a Refiner,
    device: &'a Device,
    seen: Vec<(bool, bool, u64)>,
}

impl latent_engine::pipeline::Observer for Turns<'_> {
    fn step(&mut self, _state: &latent_engine::pipeline::StepState<'_>) {
        self.device.sync().expect("device sync");
        let used = self
            .device
            .memory_pool_usage()
            .map_or(0, |u| u.bytes_in_use);
        self.seen.push((
            self.base.unet_on_device(),
            self.refiner.unet_on_device(),
            used,
        ));
    }
}

/// A parked refiner (`host`; `auto` below 15 GiB) and the base model's UNet take turns
/// on the device (what lets SDXL's pair run on an 8 GB card): over a batch of two, every base
/// step runs with the refiner's UNet off the device and every refiner step with the base's off,
/// holding less memory than a refiner kept beside the base by at least the base UNet's weights;
/// the images are those of the resident refiner bit for bit, the base comes back for the second
/// image and for the next run, and neither stays on the device for nothing. On lavapipe, on a
/// device of its own (its pool's bytes in use are this test's).
#[test]
fn the_unets_take_turns_on_the_device() {
    // Its own device: the memory it measures is this test's alone.
    let device = common::private_wgpu();
    let tokenizer = ClipTokenizer::new().expect("tokenizer");
    let base = StableDiffusion::load(
        &Checkpoint::open(&fixtures().join("tiny-sdxl")).expect("base"),
        &device,
        LoadOptions::default(),
    )
    .expect("loads");
    let unet_bytes = base
        .reports
        .iter()
        .find(|r| r.component == "UNet")
        .map(|r| r.bytes)
        .expect("the UNet's report");
    // Evicted, the UNet's weights leave the device; brought back, it holds what the load did,
    // each weight once (a fused layer's parts are views of its weight, as at load).
    let in_use = || {
        let _ = (burn::tensor::Tensor::<1>::ones([16], &device) * 2.0).into_data();
        device.sync().expect("device sync");
        device.memory_pool_usage().map_or(0, |u| u.bytes_in_use)
    };
    let (loaded, targets) = (in_use(), base.lora_targets());
    base.evict_unet().expect("evicts");
    assert!(!base.unet_on_device());
    let evicted = in_use();
    assert!(
        evicted + unet_bytes <= loaded,
        "{loaded} → {evicted} bytes in use"
    );
    assert_eq!(
        base.lora_targets(),
        targets,
        "the LoRA targets, from host memory"
    );
    let _ = base.unet().expect("brought back");
    assert_eq!((in_use(), base.unet_on_device()), (loaded, true));
    let case = &cases()["ensemble"][0];
    let c: PipelineCase = serde_json::from_value(case.clone()).expect("a case");
    let mut req = c.request();
    req.batch_count = 2;
    req.refiner = Some(RefinerSwitch {
        switch_at: case["switch_at"].as_f64().expect("switch"),
        name: "tiny-sdxl-refiner [0123456789]".into(),
    });
    let run = |refiner: &Refiner| {
        let mut turns = Turns {
            base: &base,
            refiner,
            device: &device,
            seen: Vec::new(),
        };
        let cancel = AtomicBool::new(false);
        let out = txt2img_refined(&base, Some(refiner), &tokenizer, &req, &cancel, &mut turns)
            .expect("a refined run");
        (out, turns.seen)
    };
    let load = |place| {
        Refiner::load_with(&open(LAYOUTS[0]), &device, Precision::F32, place).expect("loads")
    };
    let resident = load(latent_engine::TextEncoders::Device);
    let parked = load(latent_engine::TextEncoders::Host);
    assert!(!resident.parked() && parked.parked());
    assert!(
        !parked.unet_on_device(),
        "a parked refiner loads into host memory"
    );

    let (want, beside) = run(&resident);
    drop(resident);
    let (got, turns) = run(&parked);
    assert_eq!(want.len(), 2);
    for (w, g) in want.iter().zip(&got) {
        assert!(
            w.image.pixels == g.image.pixels,
            "seed {}: images differ",
            g.seed
        );
    }
    assert!(beside.iter().all(|&(b, r, _)| b && r), "{beside:?}");
    // Base steps, then refiner steps, for each image.
    let per_image = turns.len() / 2;
    let refined = turns.iter().filter(|t| !t.0).count() / 2;
    assert!(refined >= 1 && refined < per_image, "{turns:?}");
    for (i, &(b, r, used)) in turns.iter().enumerate() {
        let refiner_step = i % per_image >= per_image - refined;
        assert_eq!((b, r), (!refiner_step, refiner_step), "step {i}: {turns:?}");
        if refiner_step {
            assert!(
                used + unet_bytes <= beside[i].2,
                "step {i}: {used} bytes in use, {} with the refiner beside the base, whose UNet \
                 has {unet_bytes}",
                beside[i].2
            );
        }
    }
    // After the run neither UNet waits on the device; the next run brings the base back.
    assert!(!parked.unet_on_device() && !base.unet_on_device());
    req.refiner = None;
    req.batch_count = 1;
    let cancel = AtomicBool::new(false);
    latent_engine::pipeline::txt2img(&base, &tokenizer, &req, &cancel, &mut Quiet)
        .expect("a base run after the refined one");
    assert!(base.unet_on_device());
}
