//! Hires fix on the tiny model (CPU backend): the second pass runs A1111's window of a longer
//! schedule at the larger size; with the Lanczos upscaler it equals txt2img followed by the same
//! img2img run by hand, and the PNG text restores it.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use burn::tensor::Device;
use common::fixtures;
use latent_engine::checkpoint::Checkpoint;
use latent_engine::image_io::ResizeMode;
use latent_engine::parameters::Parameters;
use latent_engine::pipeline::{
    Generated, HiresFix, HiresUpscaler, InitImage, Observer, StepState, Txt2ImgRequest, txt2img,
};
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::{LoadOptions, StableDiffusion};

#[derive(Default)]
struct Steps(Vec<(usize, usize, [usize; 4])>);

impl Observer for Steps {
    fn step(&mut self, s: &StepState<'_>) {
        let d = s.latents.dims();
        self.0.push((s.step, s.total, d));
    }
}

/// The tiny model of `fixture` on the CPU backend, with its VAE encoder (Lanczos hires).
fn load_with_encoder(fixture: &str) -> StableDiffusion {
    let ckpt = Checkpoint::open(&fixtures().join(fixture)).unwrap();
    let options = LoadOptions {
        vae_encoder: true,
        ..Default::default()
    };
    StableDiffusion::load(&ckpt, &Device::flex(), options).unwrap()
}

/// img2img of `init` at `width` × `height` over `steps` at strength 0.5: the second pass of a
/// Lanczos hires fix, run by hand.
fn by_hand(
    base: &Txt2ImgRequest,
    init: Arc<latent_engine::image_io::RgbImage>,
    [width, height]: [usize; 2],
    steps: usize,
) -> Txt2ImgRequest {
    Txt2ImgRequest {
        width,
        height,
        steps,
        init: Some(InitImage {
            image: init,
            strength: 0.5,
            resize: ResizeMode::JustResize,
            mask: None,
            mask_blur: None,
            masked_content: Default::default(),
            area: Default::default(),
        }),
        ..base.clone()
    }
}

/// `req` on `model`, its steps unobserved.
fn quietly(
    model: &StableDiffusion,
    tokenizer: &ClipTokenizer,
    req: &Txt2ImgRequest,
) -> latent_engine::error::Result<Vec<Generated>> {
    txt2img(
        model,
        tokenizer,
        req,
        &AtomicBool::new(false),
        &mut Steps::default(),
    )
}

fn base() -> Txt2ImgRequest {
    Txt2ImgRequest {
        prompt: "a watercolor fox in the snow".into(),
        negative_prompt: "blurry".into(),
        seed: 5,
        steps: 3,
        width: 48,
        height: 32,
        ..Default::default()
    }
}

#[test]
fn hires_fix_runs_a_second_pass_at_the_larger_size() {
    let model = load_with_encoder("tiny-sd");
    let tokenizer = ClipTokenizer::new().unwrap();
    let run = |req: &Txt2ImgRequest, obs: &mut dyn Observer| -> Generated {
        txt2img(&model, &tokenizer, req, &AtomicBool::new(false), obs)
            .unwrap()
            .remove(0)
    };

    // Latent upscale ×1.5: 3 steps at 48×32, then 2 at 72×48 (a window of a 4-step schedule).
    let latent = HiresFix {
        scale: 1.5,
        steps: 2,
        strength: 0.5,
        upscaler: HiresUpscaler::Latent,
    };
    let req = Txt2ImgRequest {
        hires: Some(latent),
        ..base()
    };
    let mut steps = Steps::default();
    let out = run(&req, &mut steps);
    assert_eq!((out.image.width, out.image.height), (72, 48));
    let seen: Vec<_> = steps
        .0
        .iter()
        .map(|&(s, t, d)| (s, t, d[2], d[3]))
        .collect();
    assert_eq!(
        seen,
        [
            (1, 5, 4, 6),
            (2, 5, 4, 6),
            (3, 5, 4, 6),
            (4, 5, 6, 9),
            (5, 5, 6, 9)
        ]
    );

    // Lanczos: the first image, resized and encoded, then img2img over a 4-step schedule from
    // its step 2 (strength 2 ÷ 4) with the seed's generator again: the same run by hand.
    let lanczos = HiresFix {
        upscaler: HiresUpscaler::Lanczos,
        ..latent
    };
    let hires = run(
        &Txt2ImgRequest {
            hires: Some(lanczos),
            ..base()
        },
        &mut Steps::default(),
    );
    let first = run(&base(), &mut Steps::default());
    let by_hand = run(
        &by_hand(&base(), Arc::new(first.image), [72, 48], 4),
        &mut Steps::default(),
    );
    assert_eq!(hires.image, by_hand.image);
    assert_ne!(hires.image, out.image, "the upscalers differ");

    // The PNG text carries it as A1111 writes it, and gives it back.
    let text = Parameters::for_request(&req, 5, None, None).to_a1111();
    assert!(
        text.contains(
            "Size: 48x32, Denoising strength: 0.5, Hires upscale: 1.5, Hires steps: 2, Hires upscaler: Latent"
        ),
        "{text}"
    );
    let back = Parameters::parse_a1111(&text).unwrap();
    assert_eq!(back.hires().map(Result::ok), Some(Some(latent)));
    let plain =
        Parameters::parse_a1111(&Parameters::for_request(&base(), 5, None, None).to_a1111());
    assert!(plain.unwrap().hires().is_none());
}

#[test]
fn hires_fix_refuses_an_init_image_and_needs_the_encoder_for_lanczos() {
    let ckpt = Checkpoint::open(&fixtures().join("tiny-sd")).unwrap();
    let model = StableDiffusion::load(&ckpt, &Device::flex(), LoadOptions::default()).unwrap();
    let tokenizer = ClipTokenizer::new().unwrap();
    let err = |req: &Txt2ImgRequest| {
        quietly(&model, &tokenizer, req)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let lanczos = HiresFix {
        scale: 1.5,
        steps: 1,
        upscaler: HiresUpscaler::Lanczos,
        ..Default::default()
    };
    let no_encoder = err(&Txt2ImgRequest {
        hires: Some(lanczos),
        steps: 1,
        ..base()
    });
    assert!(no_encoder.contains("VAE encoder"), "{no_encoder}");
    let image = Arc::new(latent_engine::image_io::RgbImage {
        width: 8,
        height: 8,
        pixels: vec![0; 192],
    });
    let with_hires = Txt2ImgRequest {
        hires: Some(lanczos),
        ..base()
    };
    let both = err(&by_hand(&with_hires, image, [48, 32], 3));
    assert!(both.contains("hires fix is for txt2img"), "{both}");
}

/// SDXL's hires pass conditions on its own size (A1111's `hr_upscale_to_x/y`): with the Lanczos
/// upscaler it equals txt2img followed by img2img at the larger size run by hand, whose size
/// conditioning is that size. Conditioning the second pass on the first's size would differ.
#[test]
fn sdxl_hires_pass_conditions_on_the_larger_size() {
    let model = load_with_encoder("tiny-sdxl");
    let tokenizer = ClipTokenizer::new().unwrap();
    let run =
        |req: &Txt2ImgRequest| -> Generated { quietly(&model, &tokenizer, req).unwrap().remove(0) };
    let base = Txt2ImgRequest {
        width: 64,
        height: 64,
        ..base()
    };
    let fix = HiresFix {
        scale: 1.5,
        steps: 2,
        strength: 0.5,
        upscaler: HiresUpscaler::Lanczos,
    };
    let hires = run(&Txt2ImgRequest {
        hires: Some(fix),
        ..base.clone()
    });
    assert_eq!((hires.image.width, hires.image.height), (96, 96));
    let first = Arc::new(run(&base).image);
    assert_eq!(
        hires.image,
        run(&by_hand(&base, first.clone(), [96, 96], 4)).image
    );
    // The by-hand pass conditioned on the first pass's size is another image.
    let on_first_size = run(&Txt2ImgRequest {
        size_conditioning: Some(latent_engine::pipeline::SizeConditioning::of_image(64, 64)),
        ..by_hand(&base, first, [96, 96], 4)
    });
    assert_ne!(hires.image, on_first_size.image);
}
