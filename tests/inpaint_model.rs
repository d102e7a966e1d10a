//! Inpainting checkpoints (a 9-channel UNet: latents, mask, masked-picture latents) against
//! diffusers' StableDiffusionInpaintPipeline (tests/fixtures/make_inpaint_model_fixtures.py).
//! The checkpoint is the tiny single file with the fixture's wider `conv_in` swapped in, so it is
//! recognised the way a downloaded `sd-v1-5-inpainting.safetensors` is: by that weight's shape.
//! Masked at strength 0.75 (Euler a) and 1 (DPM++ 2M Karras), and a txt2img conditioned on a
//! blank picture; an SDXL inpainting folder against StableDiffusionXLInpaintPipeline; per-step
//! latents within 1e-4 of their largest value, images within ±1.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use common::{altered_single_file, devices, fixtures, to_vec};
use latent_engine::checkpoint::{Checkpoint, Family, SafetensorsFile};
use latent_engine::image_io::load_image;
use latent_engine::pipeline::{InitImage, Observer, StepState, Txt2ImgRequest, txt2img};
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::{LoadOptions, StableDiffusion};

const CONV_IN: &str = "model.diffusion_model.input_blocks.0.0.weight";

type Case = common::InitCase;

fn expected() -> SafetensorsFile {
    SafetensorsFile::open(&fixtures().join("inpaint-model-expected.safetensors")).unwrap()
}

/// The inpainting single file, written once per test process.
fn checkpoint() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let expected = expected();
        let conv_in = expected.entry("conv_in.weight").unwrap();
        let (shape, bytes) = (conv_in.shape.clone(), expected.bytes(conv_in).to_vec());
        altered_single_file("inpainting-model", |k, d, s, b| {
            Some(match k == CONV_IN {
                true => ("F32".into(), shape.clone(), bytes.clone()),
                false => (d.into(), s.to_vec(), b.to_vec()),
            })
        })
    })
    .clone()
}

#[derive(Default)]
struct Record {
    latents: Vec<Vec<f32>>,
}

impl Observer for Record {
    fn step(&mut self, s: &StepState<'_>) {
        self.latents.push(to_vec(s.latents.clone()));
    }
}

fn request(case: &Case) -> Txt2ImgRequest {
    let image = |name: &str| Arc::new(load_image(&fixtures().join(name)).unwrap());
    Txt2ImgRequest {
        init: case.mask.then(|| InitImage {
            image: image("img2img-init.png"),
            strength: case.strength,
            resize: Default::default(),
            mask: Some(image("img2img-mask.png")),
            mask_blur: None,
            masked_content: Default::default(),
            area: Default::default(),
        }),
        ..case.base.request()
    }
}

#[test]
fn inpainting_checkpoints_match_diffusers_on_every_backend() {
    let ckpt = Checkpoint::open(&checkpoint()).unwrap();
    assert_eq!(ckpt.family, Family::Sd1);
    assert_eq!(ckpt.config.unet.in_channels, 9);
    assert_eq!(ckpt.model_name(), "SD 1.x inpainting");
    let expected = expected();
    let cases: Vec<Case> = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("inpaint_model_cases.json")).unwrap(),
    )
    .unwrap();
    let tokenizer = ClipTokenizer::new().unwrap();
    for (backend, device) in devices() {
        let options = LoadOptions {
            vae_encoder: true,
            ..Default::default()
        };
        let model = StableDiffusion::load(&ckpt, &device, options).unwrap();
        for case in &cases {
            // On wgpu: the masked run at 0.75 (every draw) and the txt2img.
            if !common::runs_on(backend, &case.base.name, &["case0", "case2"]) {
                continue;
            }
            let what = format!("{backend}/{}/{}", case.base.name, case.base.sampler);
            let mut rec = Record::default();
            let out = txt2img(
                &model,
                &tokenizer,
                &request(case),
                &AtomicBool::new(false),
                &mut rec,
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(rec.latents.len(), case.runs, "{what}: steps");
            let want = expected
                .read_f32(&format!("{}.latents", case.base.name))
                .unwrap();
            common::assert_steps_match(&what, &rec.latents, &want, common::relative_1e4);
            let image = &out[0].image.pixels;
            common::assert_image_matches(&what, &expected, &case.base.name, image);
        }
    }
}

/// Loaded without its VAE encoder, an inpainting model says what it needs instead of running.
#[test]
fn an_inpainting_model_without_its_encoder_says_so() {
    let ckpt = Checkpoint::open(&checkpoint()).unwrap();
    let model =
        StableDiffusion::load(&ckpt, &burn::tensor::Device::flex(), Default::default()).unwrap();
    let req = Txt2ImgRequest {
        steps: 2,
        width: 64,
        height: 64,
        ..Default::default()
    };
    let err = txt2img(
        &model,
        &ClipTokenizer::new().unwrap(),
        &req,
        &AtomicBool::new(false),
        &mut Record::default(),
    )
    .map(|_| ())
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("inpainting model") && err.contains("VAE encoder"),
        "{err}"
    );
}

/// A tiny model folder (`tiny-sdxl`, `tiny-sd2`) as an inpainting folder: its files copied, the
/// UNet's config saying 9 input channels and its `conv_in` (in `unet_weights`) the fixture's.
fn inpainting_folder(name: &str, unet_weights: &str, expected: &SafetensorsFile) -> PathBuf {
    let src = fixtures().join(name);
    let dir = common::scratch_dir(&format!("{name}-inpainting")).join(format!("{name}-inpainting"));
    let subs = std::iter::once(String::new()).chain(
        std::fs::read_dir(&src)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_dir())
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned()),
    );
    for sub in subs {
        std::fs::create_dir_all(dir.join(&sub)).unwrap();
        for entry in std::fs::read_dir(src.join(&sub)).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                std::fs::copy(&path, dir.join(&sub).join(path.file_name().unwrap())).unwrap();
            }
        }
    }
    let config = dir.join("unet/config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    json["in_channels"] = 9.into();
    std::fs::write(&config, json.to_string()).unwrap();
    let weights = dir.join("unet").join(unet_weights);
    let unet = SafetensorsFile::open(&weights).unwrap();
    let conv_in = expected.entry("conv_in.weight").unwrap();
    let tensors: Vec<(String, String, Vec<usize>, Vec<u8>)> = unet
        .entries()
        .iter()
        .map(|(k, e)| match k.as_str() {
            "conv_in.weight" => (
                k.clone(),
                "F32".to_string(),
                conv_in.shape.clone(),
                expected.bytes(conv_in).to_vec(),
            ),
            _ => (
                k.clone(),
                format!("{:?}", e.dtype),
                e.shape.clone(),
                unet.bytes(e).to_vec(),
            ),
        })
        .collect();
    drop(unet);
    let refs: Vec<(&str, &str, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(k, d, s, b)| (k.as_str(), d.as_str(), s.clone(), b.clone()))
        .collect();
    common::write_safetensors(&weights, &refs);
    dir
}

/// One inpainting folder's case against diffusers' pipeline on the CPU: per-step latents within
/// 1e-4 of their largest value, the image within ±1.
fn folder_matches_diffusers(what: &str, folder: &Path, expected: &SafetensorsFile, cases: &str) {
    let ckpt = Checkpoint::open(folder).unwrap();
    assert_eq!(ckpt.model_name(), what);
    let cases: Vec<Case> =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join(cases)).unwrap()).unwrap();
    let options = LoadOptions {
        vae_encoder: true,
        ..Default::default()
    };
    let model = StableDiffusion::load(&ckpt, &burn::tensor::Device::flex(), options).unwrap();
    let case = &cases[0];
    let mut rec = Record::default();
    let out = txt2img(
        &model,
        &ClipTokenizer::new().unwrap(),
        &request(case),
        &AtomicBool::new(false),
        &mut rec,
    )
    .unwrap();
    let want = expected.read_f32("case0.latents").unwrap();
    assert_eq!(rec.latents.len(), case.runs);
    common::assert_steps_match(what, &rec.latents, &want, common::relative_1e4);
    common::assert_image_matches(what, expected, "case0", &out[0].image.pixels);
}

/// An SDXL inpainting folder (diffusers layout, 9-channel UNet) against diffusers'
/// `StableDiffusionXLInpaintPipeline` (tests/fixtures/make_sdxl_inpaint_fixtures.py): Euler a at
/// strength 0.75 with the zeroed empty negative, per-step latents within 1e-4 of their largest
/// value and the image within ±1, on the CPU.
#[test]
fn sdxl_inpainting_checkpoints_match_diffusers() {
    let expected =
        SafetensorsFile::open(&fixtures().join("sdxl-inpaint-expected.safetensors")).unwrap();
    let folder = inpainting_folder(
        "tiny-sdxl",
        "diffusion_pytorch_model.fp16.safetensors",
        &expected,
    );
    folder_matches_diffusers(
        "SDXL inpainting",
        &folder,
        &expected,
        "sdxl_inpaint_cases.json",
    );
}

/// An SD 2.x inpainting folder (OpenCLIP text tower, the folder's v-prediction schedule) against
/// diffusers' `StableDiffusionInpaintPipeline` (tests/fixtures/make_sd2_inpaint_fixtures.py):
/// Euler a at strength 0.75, on the CPU.
#[test]
fn sd2_inpainting_checkpoints_match_diffusers() {
    let expected =
        SafetensorsFile::open(&fixtures().join("sd2-inpaint-expected.safetensors")).unwrap();
    let folder = inpainting_folder("tiny-sd2", "diffusion_pytorch_model.safetensors", &expected);
    folder_matches_diffusers(
        "SD 2.x inpainting",
        &folder,
        &expected,
        "sd2_inpaint_cases.json",
    );
}

/// The hires pass of an inpainting model is conditioned on a blank picture at its own size (both
/// upscalers; a blank of the first pass's size would not fit the larger latents): the run
/// finishes at the larger size.
#[test]
fn an_inpainting_model_runs_the_hires_fix() {
    use latent_engine::pipeline::{HiresFix, HiresUpscaler};
    let ckpt = Checkpoint::open(&checkpoint()).unwrap();
    let options = LoadOptions {
        vae_encoder: true,
        ..Default::default()
    };
    let model = StableDiffusion::load(&ckpt, &burn::tensor::Device::flex(), options).unwrap();
    let tokenizer = ClipTokenizer::new().unwrap();
    let run = |hires: Option<HiresFix>| {
        let req = Txt2ImgRequest {
            prompt: "a fox".into(),
            steps: 3,
            width: 64,
            height: 64,
            hires,
            ..Default::default()
        };
        txt2img(
            &model,
            &tokenizer,
            &req,
            &AtomicBool::new(false),
            &mut Record::default(),
        )
        .unwrap()
        .remove(0)
        .image
    };
    assert_eq!(run(None).width, 64);
    for upscaler in [HiresUpscaler::Latent, HiresUpscaler::Lanczos] {
        let hires = run(Some(HiresFix {
            scale: 1.5,
            steps: 2,
            strength: 0.5,
            upscaler,
        }));
        assert_eq!((hires.width, hires.height), (96, 96), "{upscaler:?}");
    }
}
