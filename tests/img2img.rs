//! img2img against diffusers' StableDiffusionImg2ImgPipeline on the tiny model
//! (tests/fixtures/make_img2img_fixtures.py): four samplers at strengths that run 3–4 of 5–8
//! steps, from the 64×64 `img2img-init.png`, and inpainting with `img2img-mask.png` against
//! StableDiffusionInpaintPipeline (Euler a at 0.75, DPM++ 2M from pure noise at strength 1);
//! per-step latents within 1e-3, images within ±1.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use burn::tensor::Device;
use common::{devices, fixtures, to_vec};
use latent_engine::checkpoint::{Checkpoint, SafetensorsFile};
use latent_engine::image_io::{ResizeMode, RgbImage, load_image};
use latent_engine::parameters::Parameters;
use latent_engine::pipeline::{
    InitImage, MaskedContent, Observer, StepState, Txt2ImgRequest, txt2img,
};
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::{LoadOptions, StableDiffusion};

/// `mask`: inpainting with `img2img-mask.png` (StableDiffusionInpaintPipeline).
type Case = common::InitCase;

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(fixtures().join("img2img_cases.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[derive(Default)]
struct Record {
    latents: Vec<Vec<f32>>,
    total: usize,
}

impl Observer for Record {
    fn step(&mut self, s: &StepState<'_>) {
        self.latents.push(to_vec(s.latents.clone()));
        self.total = s.total;
    }
}

fn init() -> InitImage {
    InitImage {
        image: Arc::new(load_image(&fixtures().join("img2img-init.png")).unwrap()),
        strength: 0.75,
        resize: Default::default(),
        mask: None,
        mask_blur: None,
        masked_content: Default::default(),
        area: Default::default(),
    }
}

fn request(c: &Case) -> Txt2ImgRequest {
    Txt2ImgRequest {
        init: Some(InitImage {
            strength: c.strength,
            mask: c
                .mask
                .then(|| Arc::new(load_image(&fixtures().join("img2img-mask.png")).unwrap())),
            ..init()
        }),
        ..c.base.request()
    }
}

fn with_encoder(device: &Device) -> StableDiffusion {
    let ckpt = Checkpoint::open(&fixtures().join("tiny-sd")).unwrap();
    let options = LoadOptions {
        vae_encoder: true,
        ..Default::default()
    };
    StableDiffusion::load(&ckpt, device, options).unwrap()
}

#[test]
fn img2img_matches_diffusers_on_every_backend() {
    let expected = SafetensorsFile::open(&fixtures().join("img2img-expected.safetensors")).unwrap();
    let tokenizer = ClipTokenizer::new().unwrap();
    for (backend, device) in devices() {
        let model = with_encoder(&device);
        for case in cases() {
            // On wgpu: euler at 0.6 and the masked DPM++ 2M at strength 1 (the samplers' own
            // arithmetic is the CPU's cases; CI's time is short).
            if !common::runs_on(backend, &case.name, &["case0", "case5"]) {
                continue;
            }
            let what = format!(
                "{backend}/{}/{} strength {}",
                case.name, case.sampler, case.strength
            );
            let mut rec = Record::default();
            let out = txt2img(
                &model,
                &tokenizer,
                &request(&case),
                &AtomicBool::new(false),
                &mut rec,
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            // ⌊steps × strength⌋ steps run, and progress counts those.
            assert_eq!(
                (rec.latents.len(), rec.total),
                (case.runs, case.runs),
                "{what}: steps"
            );
            let want = expected
                .read_f32(&format!("{}.latents", case.name))
                .unwrap();
            common::assert_steps_match(&what, &rec.latents, &want, |_| 1e-3);
            common::assert_image_matches(&what, &expected, &case.name, &out[0].image.pixels);
        }
    }
}

#[test]
fn img2img_refuses_what_it_cannot_run_with_clear_errors() {
    let device = Device::flex();
    let tokenizer = ClipTokenizer::new().unwrap();
    let case = cases().remove(0);
    let run = |model: &StableDiffusion, req: &Txt2ImgRequest| {
        txt2img(
            model,
            &tokenizer,
            req,
            &AtomicBool::new(false),
            &mut Record::default(),
        )
        .map(|_| ())
        .unwrap_err()
        .to_string()
    };
    // A model loaded for txt2img has no encoder: said so, nothing run.
    let ckpt = Checkpoint::open(&fixtures().join("tiny-sd")).unwrap();
    let plain = StableDiffusion::load(&ckpt, &device, LoadOptions::default()).unwrap();
    let err = run(&plain, &request(&case));
    assert!(err.contains("VAE encoder"), "{err}");

    let model = with_encoder(&device);
    let strength = |s: f64, steps: usize| {
        let mut req = request(&case);
        req.steps = steps;
        req.init.as_mut().unwrap().strength = s;
        run(&model, &req)
    };
    for bad in [0.0, -0.5, 1.5, f64::NAN] {
        let err = strength(bad, 10);
        assert!(err.contains("denoising strength must be"), "{bad}: {err}");
    }
    // 4 steps × 0.2 runs no step: the message says why and what to change.
    let err = strength(0.2, 4);
    assert!(err.contains("runs no step"), "{err}");

    let mut req = request(&case);
    req.init.as_mut().unwrap().image = Arc::new(RgbImage {
        width: 0,
        height: 0,
        pixels: Vec::new(),
    });
    let err = run(&model, &req);
    assert!(err.contains("init image (0x0) has no pixels"), "{err}");

    // An image of another size is fitted to the request's (here cropped to 48×32).
    let mut req = request(&case);
    (req.width, req.height, req.steps) = (48, 32, 2);
    req.init.as_mut().unwrap().resize = ResizeMode::CropAndResize;
    let out = txt2img(
        &model,
        &tokenizer,
        &req,
        &AtomicBool::new(false),
        &mut Record::default(),
    )
    .unwrap();
    assert_eq!((out[0].image.width, out[0].image.height), (48, 32));
}

#[test]
fn img2img_parameters_record_the_strength() {
    let case = cases().remove(0);
    let req = request(&case);
    let text = Parameters::for_request(&req, case.seed, None, None).to_a1111();
    assert!(text.contains("Denoising strength: 0.6"), "{text}");
    let back = Parameters::parse_a1111(&text).unwrap();
    assert_eq!(back.denoising_strength(), Some(0.6));
    let txt2img = Txt2ImgRequest { init: None, ..req };
    let text = Parameters::for_request(&txt2img, 1, None, None).to_a1111();
    assert!(!text.contains("Denoising"), "{text}");
}

/// A1111's overlay: with a mask blur the original picture comes back outside the mask (far from
/// it, exactly), the generated one inside it; the PNG records the blur.
#[test]
fn inpainting_puts_the_original_back_outside_the_mask() {
    let device = Device::flex();
    let model = with_encoder(&device);
    let tokenizer = ClipTokenizer::new().unwrap();
    let case = cases()
        .into_iter()
        .find(|c| c.mask)
        .expect("an inpainting case");
    let run = |blur: Option<f32>| {
        let mut req = request(&case);
        req.init.as_mut().unwrap().mask_blur = blur;
        let out = txt2img(
            &model,
            &tokenizer,
            &req,
            &AtomicBool::new(false),
            &mut Record::default(),
        );
        (out.unwrap().remove(0).image, req)
    };
    let (plain, _) = run(None);
    let (pasted, req) = run(Some(4.0));
    let original = load_image(&fixtures().join("img2img-init.png")).unwrap();
    let px = |img: &RgbImage, x: usize, y: usize| img.pixels[(y * 64 + x) * 3..][..3].to_vec();
    // The mask: a square x 8..32, y 16..40, and the rows from 56 down.
    for (x, y) in [(60, 2), (48, 10), (2, 2), (50, 45)] {
        // ±1: a Gaussian's tail still gives the generated pixel a weight of ~1e-3 there.
        let near = px(&pasted, x, y)
            .iter()
            .zip(px(&original, x, y))
            .all(|(a, b)| a.abs_diff(b) <= 1);
        assert!(near, "kept at ({x}, {y})");
        assert_ne!(
            px(&plain, x, y),
            px(&original, x, y),
            "diffusers' output differs at ({x}, {y})"
        );
    }
    // Deep inside the square (12 px from its edges) the generated pixel, to ±1.
    for (x, y) in [(20, 28), (19, 27)] {
        let near = px(&pasted, x, y)
            .iter()
            .zip(px(&plain, x, y))
            .all(|(a, b)| a.abs_diff(b) <= 1);
        assert!(near, "generated at ({x}, {y})");
    }
    let text = Parameters::for_request(&req, case.seed, None, None).to_a1111();
    assert!(text.contains("Mask blur: 4"), "{text}");
}

/// A1111's masked content: latent noise or nothing changes where the masked area starts, and so
/// the run inside the mask; outside it the blend brings back the same picture every step, so the
/// final latents there are the original's in every mode.
#[test]
fn masked_content_changes_only_the_masked_area() {
    let device = Device::flex();
    let model = with_encoder(&device);
    let tokenizer = ClipTokenizer::new().unwrap();
    let case = cases()
        .into_iter()
        .find(|c| c.mask && c.strength < 1.0)
        .expect("a case");
    let last = |content: MaskedContent| {
        let mut req = request(&case);
        req.init.as_mut().unwrap().masked_content = content;
        let mut rec = Record::default();
        txt2img(&model, &tokenizer, &req, &AtomicBool::new(false), &mut rec).unwrap();
        rec.latents.pop().unwrap()
    };
    let original = last(MaskedContent::Original);
    // Latent index of (x, y) in channel 0 of the 8×8 latent: the mask's square covers x 1..4,
    // y 2..5; the rows from 7 down are masked too.
    let at = |x: usize, y: usize| y * 8 + x;
    for content in [MaskedContent::LatentNoise, MaskedContent::LatentNothing] {
        let other = last(content);
        assert_eq!(
            other[at(6, 1)],
            original[at(6, 1)],
            "{content:?}: kept area"
        );
        assert_ne!(
            other[at(2, 3)],
            original[at(2, 3)],
            "{content:?}: masked area"
        );
    }
    // Fill encodes the picture with its masked area painted over, so the start differs there
    // (and, through the VAE's reach, a little around it, as in A1111).
    let fill = last(MaskedContent::Fill);
    assert_ne!(fill[at(2, 3)], original[at(2, 3)], "fill: masked area");
    assert!("latent nothing".parse::<MaskedContent>().is_ok());
    assert!("fill".parse::<MaskedContent>().is_ok());
    assert!("blur".parse::<MaskedContent>().is_err());
}

/// A1111's "Only masked": a 16×16 mask on the 64×64 picture, padding 4, generated at 48×48. The
/// result keeps the picture's size and is exactly the whole-picture inpainting of the padded box
/// (scaled to 48×48) pasted back over the picture inside the mask; outside it the picture is
/// untouched. An empty mask is refused.
#[test]
fn only_masked_inpaints_the_padded_box_at_full_size_and_pastes_it_back() {
    use latent_engine::pipeline::InpaintArea;
    use latent_engine::pipeline::inpaint_area::{crop, uncrop};
    let device = Device::flex();
    let model = with_encoder(&device);
    let tokenizer = ClipTokenizer::new().unwrap();
    let picture = load_image(&fixtures().join("img2img-init.png")).unwrap();
    let mut mask = RgbImage {
        width: 64,
        height: 64,
        pixels: vec![0; 64 * 64 * 3],
    };
    for y in 16..32 {
        for x in 8..24 {
            mask.pixels[(y * 64 + x) * 3..][..3].fill(255);
        }
    }
    let run = |init: InitImage| {
        let req = Txt2ImgRequest {
            prompt: "a red apple".into(),
            seed: 5,
            steps: 4,
            width: 48,
            height: 48,
            init: Some(init),
            ..Default::default()
        };
        let out = txt2img(
            &model,
            &tokenizer,
            &req,
            &AtomicBool::new(false),
            &mut Record::default(),
        );
        (out.map(|mut o| o.remove(0).image), req)
    };
    let only = InitImage {
        strength: 0.8,
        mask: Some(Arc::new(mask.clone())),
        area: InpaintArea::OnlyMasked { padding: 4 },
        ..init()
    };
    let (got, req) = run(only.clone());
    let got = got.unwrap();
    assert_eq!((got.width, got.height), (64, 64));
    // The box: x 4..28, y 12..36 (square, as 48×48 is).
    let region = [4, 12, 28, 36];
    let fit = |img: &RgbImage| {
        latent_engine::image_io::resize(
            &crop(img, region).unwrap(),
            48,
            48,
            ResizeMode::ResizeAndFill,
        )
        .unwrap()
    };
    let whole = InitImage {
        image: Arc::new(fit(&picture)),
        mask: Some(Arc::new(fit(&mask))),
        ..only.clone()
    };
    let whole = InitImage {
        area: InpaintArea::WholePicture,
        ..whole
    };
    let (by_hand, _) = run(whole);
    let pasted = uncrop(&by_hand.unwrap(), &picture, region).unwrap();
    for (i, ((g, p), o)) in got
        .pixels
        .iter()
        .zip(&pasted.pixels)
        .zip(&picture.pixels)
        .enumerate()
    {
        let inside = mask.pixels[i] == 255;
        let want = if inside { p } else { o };
        assert_eq!(
            g,
            want,
            "pixel {} of ({}, {})",
            i % 3,
            (i / 3) % 64,
            i / 3 / 64
        );
    }
    assert!(got.pixels != picture.pixels, "the masked area was redrawn");
    let text = Parameters::for_request(&req, 5, None, None).to_a1111();
    assert!(
        text.contains("Inpaint area: Only masked, Masked area padding: 4"),
        "{text}"
    );
    let empty = InitImage {
        mask: Some(Arc::new(RgbImage {
            pixels: vec![0; 64 * 64 * 3],
            ..mask.clone()
        })),
        ..only
    };
    let err = run(empty).0.unwrap_err().to_string();
    assert!(err.contains("mask is empty"), "{err}");
}

/// A1111's "fill" (tests/fixtures/make_fill_fixture.py runs its recipe with Pillow): ours within
/// two levels of Pillow's on the fixture picture and mask (238 of 12288 values differ, by one or
/// two: Pillow's vectorised compositing rounds its own way); outside the mask the picture as it
/// was.
#[test]
fn fill_paints_the_mask_from_its_surroundings_as_a1111() {
    let image = load_image(&fixtures().join("img2img-init.png")).unwrap();
    let mask = load_image(&fixtures().join("img2img-mask.png")).unwrap();
    let want = load_image(&fixtures().join("img2img-fill.png")).unwrap();
    let got = latent_engine::image_io::fill(&image, &mask);
    let worst = got
        .pixels
        .iter()
        .zip(&want.pixels)
        .map(|(a, b)| a.abs_diff(*b))
        .max()
        .unwrap();
    let off = got
        .pixels
        .iter()
        .zip(&want.pixels)
        .filter(|(a, b)| a != b)
        .count();
    eprintln!(
        "fill: max |ours - Pillow| = {worst}, {off} of {} values differ",
        got.pixels.len()
    );
    assert!(worst <= 2, "fill differs from Pillow's by up to {worst}");
    assert!(off * 20 < got.pixels.len(), "{off} values differ");
    for (i, m) in mask.pixels.chunks_exact(3).enumerate() {
        if m[0] == 0 {
            assert_eq!(
                got.pixels[i * 3..][..3],
                image.pixels[i * 3..][..3],
                "pixel {i}"
            );
        }
    }
}
