//! txt2img against diffusers' StableDiffusionPipeline on the tiny model
//! (tests/fixtures/make_pipeline_fixtures.py): every sampler × schedule, square and non-square,
//! CFG 1 and > 1, a >77-token prompt (two chunks, A1111's way); per-step latents within 1e-3, images within ±1 per channel.
//! On wgpu the generations follow one another on one model, as in the studio: the recorded UNet
//! step one leaves parked is resumed, or recorded afresh, by the next.

use crate::common;

use std::sync::atomic::AtomicBool;

use burn::tensor::Device;
use common::{PipelineCase, devices, fixtures, runs_on, to_vec};
use latent_engine::checkpoint::{Checkpoint, SafetensorsFile};
use latent_engine::pipeline::{Notice, Observer, StepState, Txt2ImgRequest, txt2img};
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::{LoadOptions, StableDiffusion};

fn cases() -> Vec<PipelineCase> {
    PipelineCase::load("pipeline_cases.json")
}

#[derive(Default)]
struct Record {
    latents: Vec<Vec<f32>>,
}

impl Observer for Record {
    fn notice(&mut self, _: &Notice) {}
    fn step(&mut self, s: &StepState<'_>) {
        self.latents.push(to_vec(s.latents.clone()));
    }
}

fn run_all(model_path: &std::path::Path, device: &Device, backend: &str) {
    let expected =
        SafetensorsFile::open(&fixtures().join("pipeline-expected.safetensors")).unwrap();
    let ckpt = Checkpoint::open(model_path).unwrap();
    let model = StableDiffusion::load(&ckpt, device, LoadOptions::default()).unwrap();
    let tokenizer = ClipTokenizer::new().unwrap();
    // On wgpu: euler (CFG 1, 96×64), euler a with karras (64×80), DPM++ 2M karras, DDIM.
    let on_wgpu = ["case5", "case6", "case7", "case8"];
    for case in cases() {
        if !runs_on(backend, &case.name, &on_wgpu) {
            continue;
        }
        let mut rec = Record::default();
        let out = txt2img(
            &model,
            &tokenizer,
            &case.request(),
            &AtomicBool::new(false),
            &mut rec,
        )
        .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let what = format!("{backend}/{}/{}+{}", case.name, case.sampler, case.schedule);

        let want = expected
            .read_f32(&format!("{}.latents", case.name))
            .unwrap();
        assert_eq!(rec.latents.len(), case.steps, "{what}: steps");
        common::assert_steps_match(&what, &rec.latents, &want, |_| 1e-3);

        common::assert_image_matches(&what, &expected, &case.name, &out[0].image.pixels);
        // On wgpu each generation parks its recorded step for the next: case6 (case5's shapes)
        // replays case5's from its first step with its own conditioning copied in, case7 (another
        // size) records afresh over it, case8 (two prompt chunks) records its own.
        assert_eq!(model.has_parked_steps(), backend == "wgpu", "{what}");
    }
}

#[test]
fn txt2img_matches_diffusers_on_every_backend() {
    for (backend, device) in devices() {
        run_all(&fixtures().join("tiny-sd"), &device, backend);
    }
}

#[test]
fn txt2img_from_single_file_matches_diffusers() {
    run_all(
        &fixtures().join("tiny-sd.safetensors"),
        &Device::flex(),
        "cpu-single-file",
    );
}

#[test]
fn cancellation_stops_before_the_next_step() {
    let ckpt = Checkpoint::open(&fixtures().join("tiny-sd")).unwrap();
    let model = StableDiffusion::load(&ckpt, &Device::flex(), LoadOptions::default()).unwrap();
    let tokenizer = ClipTokenizer::new().unwrap();
    struct CancelAt<'a>(&'a AtomicBool, usize);
    impl Observer for CancelAt<'_> {
        fn step(&mut self, s: &StepState<'_>) {
            self.1 = s.step;
            if s.step == 2 {
                self.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
    let cancel = AtomicBool::new(false);
    let mut obs = CancelAt(&cancel, 0);
    let req = Txt2ImgRequest {
        prompt: "x".into(),
        steps: 10,
        width: 64,
        height: 64,
        ..Default::default()
    };
    let err = txt2img(&model, &tokenizer, &req, &cancel, &mut obs).unwrap_err();
    assert!(matches!(err, latent_engine::Error::Cancelled));
    assert_eq!(obs.1, 2);
}

/// A batch's images take consecutive seeds; the model keeps the last conditioning for a
/// request with the same prompts and settings.
#[test]
fn batch_count_uses_consecutive_seeds() {
    let ckpt = Checkpoint::open(&fixtures().join("tiny-sd")).unwrap();
    let model = StableDiffusion::load(&ckpt, &Device::flex(), LoadOptions::default()).unwrap();
    let tokenizer = ClipTokenizer::new().unwrap();
    let case = cases().into_iter().next().unwrap(); // case0, seed 42
    let mut req = case.request();
    req.batch_count = 2;
    let cancel = AtomicBool::new(false);
    let both = txt2img(&model, &tokenizer, &req, &cancel, &mut Record::default()).unwrap();
    assert_eq!((both[0].seed, both[1].seed), (42, 43));
    req.batch_count = 1;
    req.seed = 43;
    let single = txt2img(&model, &tokenizer, &req, &cancel, &mut Record::default()).unwrap();
    assert_eq!(
        both[1].image, single[0].image,
        "image 2 of a batch is the seed+1 image"
    );
    assert_ne!(both[0].image, both[1].image);
    // The second request's prompts were the first's: its conditioning was reused (and gave
    // the same image as the batch's own), while any change to them encodes again.
    assert_eq!(model.conditioning_encodes(), 1);
    req.steps = 1;
    let run = |req: &Txt2ImgRequest| {
        txt2img(&model, &tokenizer, req, &cancel, &mut Record::default()).unwrap();
        model.conditioning_encodes()
    };
    let mut other = req.clone();
    other.negative_prompt.push_str(", grainy");
    assert_eq!(run(&other), 2, "another negative prompt");
    other.clip_skip = 2;
    assert_eq!(run(&other), 3, "another clip skip");
    assert_eq!(run(&other), 3, "the same again");
    assert_eq!(run(&req), 4, "only the last conditioning is kept");

    let expected =
        SafetensorsFile::open(&fixtures().join("pipeline-expected.safetensors")).unwrap();
    let want = expected.bytes(expected.entry("case0.image").unwrap());
    let worst = both[0]
        .image
        .pixels
        .iter()
        .zip(want)
        .map(|(a, b)| a.abs_diff(*b))
        .max()
        .unwrap();
    assert!(worst <= 1, "image 1 of a batch is the seed image");
}
