//! Stable Diffusion 2.x against diffusers on the tiny v-prediction model
//! (tests/fixtures/make_sd2_fixtures.py): the OpenCLIP text tower (fused q/k/v in the single
//! file, padding with id 0), the UNet with linear projections and heads per level, and seeded
//! txt2img through StableDiffusionPipeline with the folder's DDIM v-prediction schedule; both
//! layouts, CPU and wgpu. Also how a single file's prediction type is told and overridden.

use crate::common;

use std::path::Path;
use std::sync::atomic::AtomicBool;

use burn::tensor::Device;
use common::{
    Expected, PipelineCase, assert_close, devices, f32_bytes, fixtures, scratch_dir, to_vec,
};
use latent_engine::checkpoint::{Checkpoint, Family, Layout};
use latent_engine::pipeline::{Quiet, txt2img};
use latent_engine::schedulers::Prediction;
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::{LoadOptions, Precision, StableDiffusion};

const LAYOUTS: [&str; 2] = ["tiny-sd2", "tiny-sd2.safetensors"];

fn open(name: &str) -> Checkpoint {
    Checkpoint::open(&fixtures().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn load(name: &str, device: &Device) -> StableDiffusion {
    load_in(name, device, Precision::F32)
}

fn load_in(name: &str, device: &Device, precision: Precision) -> StableDiffusion {
    let options = LoadOptions {
        precision,
        ..Default::default()
    };
    StableDiffusion::load(&open(name), device, options).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn both_layouts_open_as_sd2_with_v_prediction() {
    for name in LAYOUTS {
        let ckpt = open(name);
        assert_eq!(ckpt.family, Family::Sd2, "{name}");
        assert_eq!(
            ckpt.config.scheduler.prediction,
            Prediction::VPrediction,
            "{name}"
        );
        assert_eq!(ckpt.config.text_encoder.pad_token, 0, "{name}");
        assert!(ckpt.config.unet.use_linear_projection, "{name}");
        assert_eq!(ckpt.config.native_size(), 64, "{name}: 8 latents × 8");
    }
    assert_eq!(open(LAYOUTS[1]).layout, Layout::SingleFile);
}

/// f32 from both layouts, f16 (where SD 2.1 needs its attention upcast) from the folder. The
/// single file's tensors are the folder's once loaded: its layout is checked on the CPU.
#[test]
fn text_encoder_and_unet_match_diffusers() {
    let exp = Expected::open("sd2-expected.safetensors");
    let runs = [
        (LAYOUTS[0], Precision::F32),
        (LAYOUTS[1], Precision::F32),
        (LAYOUTS[0], Precision::F16),
    ];
    for (backend, device) in devices() {
        for (name, precision) in runs {
            if backend == "wgpu" && name == LAYOUTS[1] {
                continue;
            }
            let model = load_in(name, &device, precision);
            // The single file's fused q/k/v and extra last layer leave nothing unread but that
            // layer, the projection and the logit scale.
            if name.ends_with(".safetensors") {
                let unused = &model.reports[0].unused;
                assert!(
                    unused.iter().all(|k| k.contains("resblocks.3.")
                        || k.contains("text_projection")
                        || k.contains("logit_scale")),
                    "{unused:?}"
                );
                assert!(!unused.is_empty());
            }
            let ids = exp.ids("clip.ids");
            let what = |part: &str| format!("{backend}/{name}/{precision:?}/{part}");
            for (skip, key) in [(1, "clip.last_hidden_state"), (2, "clip.skip2")] {
                let got = to_vec(model.text_encoder.forward(&ids, skip).unwrap());
                assert_close(&what(key), &got, &exp.values(key), model.precision.dtype());
            }
            let dtype = model.precision.dtype();
            let ctx = exp.tensor::<3>("unet.context", &device, dtype);
            let x = exp.tensor::<4>("unet.x", &device, dtype);
            for (key, t) in [
                ("unet.out.t999", 999.0),
                ("unet.out.t1", 1.0),
                ("unet.out.t500.5", 500.5),
            ] {
                let got = to_vec(
                    model
                        .unet()
                        .expect("the UNet")
                        .forward(x.clone(), &[t], &ctx),
                );
                assert_close(&what(key), &got, &exp.values(key), dtype);
            }
        }
    }
}

/// Every case's image from `model`, checked against diffusers' within ±1.
fn images(model: &StableDiffusion, what: &str) -> Vec<Vec<u8>> {
    let exp = Expected::open("sd2-expected.safetensors");
    let cases = PipelineCase::load("sd2_cases.json");
    let tokenizer = ClipTokenizer::new().unwrap();
    let mut out = Vec::new();
    let backend = what.split('/').next().unwrap_or_default();
    for case in &cases {
        // On wgpu: DDIM (64×80), DPM++ 2M karras (72×56) and LCM.
        if !common::runs_on(backend, &case.name, &["case1", "case2", "case4"]) {
            continue;
        }
        let got = txt2img(
            model,
            &tokenizer,
            &case.request(),
            &AtomicBool::new(false),
            &mut Quiet,
        )
        .unwrap_or_else(|e| panic!("{what}/{}: {e}", case.name));
        let got = got[0].image.pixels.clone();
        let want = exp.bytes(&format!("{}.image", case.name));
        assert_eq!(got.len(), want.len(), "{what}/{}: size", case.name);
        let worst = got.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).max();
        assert!(
            worst.unwrap_or(0) <= 1,
            "{what}/{} ({} {}): pixels differ by up to {worst:?}",
            case.name,
            case.sampler,
            case.schedule
        );
        out.push(got);
    }
    out
}

/// diffusers' own prompt encoding (SD 2's tokenizer pads with `!`), the folder's v-prediction
/// schedule, four samplers; the two layouts give the same images bit for bit.
#[test]
fn txt2img_matches_diffusers() {
    for (backend, device) in devices() {
        let folder = images(&load(LAYOUTS[0], &device), &format!("{backend}/folder"));
        if backend == "cpu" {
            let single = images(&load(LAYOUTS[1], &device), "cpu/single-file");
            assert!(folder == single, "the layouts' images differ");
        }
    }
}

/// A single file's prediction type: ComfyUI's rule (a `v_pred` key, else the spread of the last
/// output block's norm1 bias), and a sidecar's `scheduler.prediction_type` over both.
#[test]
fn single_file_prediction_is_told_from_the_keys_or_the_sidecar() {
    let dir = scratch_dir("sd2-prediction");
    let write = |name: &str, bias: Vec<u8>, v_pred: bool| {
        let mut tensors = vec![
            (
                "cond_stage_model.model.token_embedding.weight",
                "F32",
                vec![2, 2],
                f32_bytes(4),
            ),
            (
                "model.diffusion_model.input_blocks.0.0.weight",
                "F32",
                vec![1, 4, 1, 1],
                f32_bytes(4),
            ),
            (
                "model.diffusion_model.output_blocks.11.1.transformer_blocks.0.norm1.bias",
                "F32",
                vec![4],
                bias,
            ),
        ];
        if v_pred {
            tensors.push(("v_pred", "F32", vec![1], f32_bytes(1)));
        }
        let path = dir.join(name);
        common::write_safetensors(&path, &tensors);
        path
    };
    let flat: Vec<u8> = [0.01f32, 0.02, 0.0, 0.01]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let spread: Vec<u8> = [0.3f32, -0.2, 0.1, -0.25]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let prediction = |path: &Path| {
        let ckpt = Checkpoint::open(path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ckpt.family, Family::Sd2);
        (ckpt.config.scheduler.prediction, ckpt.config.native_size())
    };
    let base = write("base.safetensors", flat.clone(), false);
    assert_eq!(prediction(&base), (Prediction::Epsilon, 512));
    let v = write("v.safetensors", spread, false);
    assert_eq!(prediction(&v), (Prediction::VPrediction, 768));
    let marked = write("marked.safetensors", flat, true);
    assert_eq!(prediction(&marked), (Prediction::VPrediction, 768));
    std::fs::write(
        dir.join("marked.json"),
        r#"{"scheduler": {"prediction_type": "epsilon"}, "unet": {"sample_size": 80}}"#,
    )
    .unwrap();
    assert_eq!(prediction(&marked), (Prediction::Epsilon, 640));
    // A zero-terminal-SNR schedule is honoured; what the samplers cannot honour is refused,
    // not ignored.
    std::fs::write(
        dir.join("marked.json"),
        r#"{"scheduler": {"rescale_betas_zero_snr": true}}"#,
    )
    .unwrap();
    let ckpt = Checkpoint::open(&marked).unwrap();
    assert!(ckpt.config.scheduler.zero_terminal_snr);
    assert_eq!(ckpt.config.scheduler.alphas_cumprod().last(), Some(&0.0));
    std::fs::write(
        dir.join("marked.json"),
        r#"{"scheduler": {"trained_betas": [0.1, 0.2]}}"#,
    )
    .unwrap();
    let e = Checkpoint::open(&marked).unwrap_err().to_string();
    assert!(e.contains("trained_betas"), "{e}");
}
