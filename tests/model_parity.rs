//! The SD 1.x models against diffusers/transformers on tiny random-weight fixtures
//! (tests/fixtures/make_model_fixtures.py), on burn's CPU (flex) and wgpu backends, f32 and f16,
//! from both file layouts (the single file on the CPU: it loads the folder's tensors).

use crate::common;

use burn::tensor::{DType, Device};
use common::{Expected, assert_close, devices, fixtures, to_vec};
use latent_engine::checkpoint::Checkpoint;
use latent_engine::{LoadOptions, Precision, StableDiffusion};

fn load(layout: &str, device: &Device, precision: Precision) -> StableDiffusion {
    let path = match layout {
        "single-file" => fixtures().join("tiny-sd.safetensors"),
        _ => fixtures().join("tiny-sd"),
    };
    let ckpt = Checkpoint::open(&path).unwrap_or_else(|e| panic!("{layout}: {e}"));
    let options = LoadOptions {
        precision,
        vae_encoder: true,
        ..LoadOptions::default()
    };
    StableDiffusion::load(&ckpt, device, options).unwrap_or_else(|e| panic!("{layout}: {e}"))
}

/// Runs every component on the fixture inputs and returns the outputs by fixture name.
fn outputs(model: &StableDiffusion, exp: &Expected) -> Vec<(&'static str, Vec<f32>)> {
    let device = &model.device;
    let dtype = model.precision.dtype();
    let mut out = Vec::new();
    let ids = exp.ids("clip.ids");
    out.push((
        "clip.last_hidden_state",
        to_vec(model.text_encoder.forward(&ids, 1).unwrap()),
    ));
    out.push((
        "clip.skip2",
        to_vec(model.text_encoder.forward(&ids, 2).unwrap()),
    ));

    let ctx = exp.tensor::<3>("unet.context", device, dtype);
    let x = exp.tensor::<4>("unet.x", device, dtype);
    for (name, t) in [
        ("unet.out.t999", 999.0),
        ("unet.out.t1", 1.0),
        ("unet.out.t500.5", 500.5),
    ] {
        out.push((
            name,
            to_vec(
                model
                    .unet()
                    .expect("the UNet")
                    .forward(x.clone(), &[t], &ctx),
            ),
        ));
    }
    let xw = exp.tensor::<4>("unet.x_wide", device, dtype);
    let ctx1 = ctx.clone().narrow(0, 0, 1);
    out.push((
        "unet.out_wide.t250",
        to_vec(model.unet().expect("the UNet").forward(xw, &[250.0], &ctx1)),
    ));

    out.push((
        "vae.decoded",
        to_vec(model.vae.decode(exp.tensor("vae.z", device, dtype))),
    ));
    out.push((
        "vae.decoded_wide",
        to_vec(model.vae.decode(exp.tensor("vae.z_wide", device, dtype))),
    ));
    let (mean, _) = model
        .vae
        .encode(exp.tensor("vae.image", device, dtype))
        .unwrap();
    out.push(("vae.encoded_mean", to_vec(mean)));
    out
}

fn check(layout: &str, precision: Precision) {
    let exp = Expected::load();
    for (backend, device) in devices() {
        let model = load(layout, &device, precision);
        for (name, got) in outputs(&model, &exp) {
            let what = format!("{backend}/{layout}/{precision:?}/{name}");
            assert_close(&what, &got, &exp.values(name), precision.dtype());
        }
    }
}

#[test]
fn f32_diffusers_folder_matches_diffusers() {
    check("diffusers", Precision::F32);
}

/// On the CPU: the single file loads the folder's tensors (`both_layouts_give_identical_outputs`),
/// so the wgpu kernels are checked from the folder alone.
#[test]
fn f32_single_file_matches_diffusers() {
    let exp = Expected::load();
    let model = load("single-file", &Device::flex(), Precision::F32);
    for (name, got) in outputs(&model, &exp) {
        let what = format!("cpu/single-file/F32/{name}");
        assert_close(&what, &got, &exp.values(name), DType::F32);
    }
}

#[test]
fn f16_matches_diffusers_within_1e_2() {
    check("diffusers", Precision::F16);
}

#[test]
fn both_layouts_give_identical_outputs() {
    let exp = Expected::load();
    let device = Device::flex();
    let a = outputs(&load("diffusers", &device, Precision::F32), &exp);
    let b = outputs(&load("single-file", &device, Precision::F32), &exp);
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        let (abs, _) = common::errors(x, y);
        assert!(abs == 0.0, "{name} differs between layouts by {abs:e}");
    }
}

#[test]
fn load_reports_only_known_extras_as_unused() {
    let model = load("single-file", &Device::flex(), Precision::F32);
    let unused: Vec<&String> = model.reports.iter().flat_map(|r| &r.unused).collect();
    assert_eq!(
        unused,
        ["cond_stage_model.transformer.text_model.embeddings.position_ids"]
    );
}

/// Weighted, long, `BREAK` and empty prompts through the chunker and each emphasis mode against
/// the conditioning A1111's rules give with transformers (tests/fixtures/make_prompt_fixtures.py),
/// in f32 on every backend.
#[test]
fn weighted_and_long_prompts_match_the_reference() {
    use latent_engine::prompt::{Chunks, Emphasis, encode};
    #[derive(serde::Deserialize)]
    struct Case {
        name: String,
        prompt: String,
        clip_skip: usize,
        emphasis: String,
    }
    let cases: Vec<Case> = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("prompt_cases.json")).unwrap(),
    )
    .unwrap();
    let bytes = std::fs::read(fixtures().join("prompt-expected.safetensors")).unwrap();
    let expected = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tokenizer = latent_engine::tokenizer::ClipTokenizer::new().unwrap();
    for (backend, device) in devices() {
        let model = load("diffusers-folder", &device, Precision::F32);
        for case in &cases {
            let emphasis = Emphasis::from_name(&case.emphasis).unwrap();
            let chunks = Chunks::new(&tokenizer, &case.prompt, emphasis);
            let got = encode(&model.text_encoder, &chunks, case.clip_skip, emphasis).unwrap();
            let want = expected.tensor(&case.name).unwrap();
            assert_eq!(got.dims().to_vec(), want.shape().to_vec(), "{}", case.name);
            let want: Vec<f32> = want
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let what = format!("{backend}/prompt/{}", case.name);
            assert_close(&what, &to_vec(got), &want, burn::tensor::DType::F32);
        }
    }
}
