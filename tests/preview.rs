//! Previews never change the image, switch method mid-run, and publish only complete frames.

use crate::common;

use std::sync::atomic::AtomicBool;

use burn::tensor::Device;
use common::fixtures;
use latent_engine::checkpoint::Checkpoint;
use latent_engine::pipeline::{Notice, Observer, Quiet, StepState, Txt2ImgRequest, txt2img};
use latent_engine::preview::{FrameStore, PreviewMethod, PreviewSettings, Previewer};
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::{LoadOptions, StableDiffusion};

fn request() -> Txt2ImgRequest {
    Txt2ImgRequest {
        prompt: "a watercolor fox in the snow".into(),
        negative_prompt: "blurry".into(),
        seed: 7,
        steps: 5,
        cfg_scale: 6.0,
        sampler: "euler_a".parse().unwrap(),
        width: 64,
        height: 64,
        ..Default::default()
    }
}

#[test]
fn final_image_is_identical_with_every_preview_method() {
    let ckpt = Checkpoint::open(&fixtures().join("tiny-sd")).unwrap();
    let model = StableDiffusion::load(&ckpt, &Device::flex(), LoadOptions::default()).unwrap();
    let tokenizer = ClipTokenizer::new().unwrap();
    let cancel = AtomicBool::new(false);
    let plain = txt2img(&model, &tokenizer, &request(), &cancel, &mut Quiet).unwrap();
    for method in [
        PreviewMethod::None,
        PreviewMethod::Latent2Rgb,
        PreviewMethod::Taesd,
        PreviewMethod::Full,
        PreviewMethod::Auto,
    ] {
        let store = FrameStore::new();
        let settings = PreviewSettings::new(method, 1);
        let mut quiet = Quiet;
        let mut previewer = Previewer::new(&model, settings, store.clone(), &mut quiet).unwrap();
        let out = txt2img(&model, &tokenizer, &request(), &cancel, &mut previewer).unwrap();
        previewer.finish();
        assert_eq!(out[0].image, plain[0].image, "{method:?} changed the image");
        let frame = store.latest();
        if method == PreviewMethod::None {
            assert_eq!(frame.step, 0, "no preview expected");
        } else {
            assert_eq!(frame.step, 5, "{method:?}: last preview");
            let (w, h) = if method == PreviewMethod::Full {
                (64, 64)
            } else {
                (8, 8)
            };
            assert_eq!(
                (frame.width, frame.height, frame.rgba.len()),
                (w, h, w * h * 4),
                "{method:?}"
            );
        }
    }
}

#[test]
fn method_and_interval_change_mid_run() {
    let ckpt = Checkpoint::open(&fixtures().join("tiny-sd")).unwrap();
    let model = StableDiffusion::load(&ckpt, &Device::flex(), LoadOptions::default()).unwrap();
    let tokenizer = ClipTokenizer::new().unwrap();
    let store = FrameStore::new();
    let settings = PreviewSettings::new(PreviewMethod::Latent2Rgb, 1);

    /// Switches to the full VAE after step 2, and records notices and steps.
    struct Switch {
        settings: std::sync::Arc<PreviewSettings>,
        steps: Vec<usize>,
        notices: Vec<Notice>,
    }
    impl Observer for Switch {
        fn notice(&mut self, n: &Notice) {
            self.notices.push(n.clone());
        }
        fn step(&mut self, s: &StepState<'_>) {
            self.steps.push(s.step);
            if s.step == 2 {
                self.settings.set_method(PreviewMethod::Full);
                self.settings.set_interval(2);
            }
        }
    }
    let mut switch = Switch {
        settings: settings.clone(),
        steps: Vec::new(),
        notices: Vec::new(),
    };
    let mut previewer = Previewer::new(&model, settings, store.clone(), &mut switch).unwrap();
    txt2img(
        &model,
        &tokenizer,
        &request(),
        &AtomicBool::new(false),
        &mut previewer,
    )
    .unwrap();
    previewer.finish();
    let frame = store.latest();
    assert_eq!(frame.method, Some(PreviewMethod::Full));
    assert_eq!((frame.width, frame.step), (64, 5));
    assert_eq!(switch.steps, [1, 2, 3, 4, 5], "no step lost");
}

#[test]
fn taesd_without_weights_falls_back_with_a_notice() {
    let ckpt = Checkpoint::open(&fixtures().join("tiny-sd")).unwrap();
    let model = StableDiffusion::load(&ckpt, &Device::flex(), LoadOptions::default()).unwrap();
    let tokenizer = ClipTokenizer::new().unwrap();
    #[derive(Default)]
    struct Notices(Vec<Notice>);
    impl Observer for Notices {
        fn notice(&mut self, n: &Notice) {
            self.0.push(n.clone());
        }
    }
    let mut notices = Notices::default();
    let store = FrameStore::new();
    let mut previewer = Previewer::new(
        &model,
        PreviewSettings::new(PreviewMethod::Taesd, 1),
        store.clone(),
        &mut notices,
    )
    .unwrap();
    txt2img(
        &model,
        &tokenizer,
        &request(),
        &AtomicBool::new(false),
        &mut previewer,
    )
    .unwrap();
    previewer.finish();
    assert_eq!(notices.0.len(), 1, "one notice, not one per step");
    assert!(notices.0[0].to_string().contains("latent2rgb"));
    assert_eq!(store.latest().method, Some(PreviewMethod::Latent2Rgb));
}

#[test]
fn taesd_previews_are_decoded_and_leave_the_image_alone() {
    let device = Device::flex();
    let ckpt = Checkpoint::open(&fixtures().join("tiny-sd")).unwrap();
    let model = StableDiffusion::load(&ckpt, &device, LoadOptions::default()).unwrap();
    let taesd = latent_engine::taesd::TaesdDecoder::open(
        &fixtures().join("tiny-taesd_decoder.safetensors"),
        &device,
        burn::tensor::DType::F32,
    )
    .unwrap();
    let tokenizer = ClipTokenizer::new().unwrap();
    let cancel = AtomicBool::new(false);
    let plain = txt2img(&model, &tokenizer, &request(), &cancel, &mut Quiet).unwrap();
    let published = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    for method in [PreviewMethod::Taesd, PreviewMethod::Auto] {
        let store = FrameStore::new();
        let mut quiet = Quiet;
        let sink_now: latent_engine::preview::FrameSink = if method == PreviewMethod::Taesd {
            let seen = published.clone();
            Box::new(move |f: &latent_engine::preview::Frame| {
                seen.lock().unwrap().push((f.step, f.method, f.width));
            })
        } else {
            Box::new(|_: &latent_engine::preview::Frame| {})
        };
        let mut previewer = Previewer::with(
            &model,
            PreviewSettings::new(method, 2),
            store.clone(),
            Some(&taesd),
            Some(sink_now),
            &mut quiet,
        )
        .unwrap();
        let out = txt2img(&model, &tokenizer, &request(), &cancel, &mut previewer).unwrap();
        previewer.finish();
        assert_eq!(out[0].image, plain[0].image, "{method:?} changed the image");
        let frame = store.latest();
        assert_eq!(frame.method, Some(PreviewMethod::Taesd), "{method:?}");
        assert_eq!((frame.width, frame.height, frame.step), (64, 64, 5));
        // Not a flat image: the decoder ran.
        assert!(frame.rgba.chunks(4).any(|p| p != &frame.rgba[..4]));
    }
    let steps: Vec<usize> = published.lock().unwrap().iter().map(|p| p.0).collect();
    assert!(
        steps.windows(2).all(|w| w[0] < w[1]) && steps.last() == Some(&5),
        "{steps:?}"
    );
    assert!(
        steps.iter().all(|s| s % 2 == 0 || *s == 5),
        "interval 2: {steps:?}"
    );
}
