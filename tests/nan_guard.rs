//! The NaN guard: never a silently black image. On the tiny model (tests/fixtures/tiny-sd.*,
//! from make_model_fixtures.py), on burn's CPU backend (the guard does not depend on the backend):
//! - latents the f16 VAE overflows on (|z| ≈ 2·10⁴: 1/0.18215 of that is past f16's 65504) decode
//!   through the automatic f32 retry to the f32 model's image (±2 levels), with one notice;
//! - latents even f32 overflows on, and NaN latents, are clear errors.

use crate::common;

use burn::tensor::{DType, Device, Tensor, TensorData};
use common::fixtures;
use latent_engine::checkpoint::Checkpoint;
use latent_engine::noise::TorchRng;
use latent_engine::pipeline::{DecodeOptions, Notice, Observer, decode};
use latent_engine::{Error, LoadOptions, Precision, StableDiffusion};

fn tiny_model(precision: Precision) -> StableDiffusion {
    let ckpt = Checkpoint::open(&fixtures().join("tiny-sd.safetensors")).expect("tiny model");
    let options = LoadOptions {
        precision,
        ..LoadOptions::default()
    };
    StableDiffusion::load(&ckpt, &Device::flex(), options).expect("loads")
}

fn latents(scale: f32) -> Tensor<4> {
    let values: Vec<f32> = TorchRng::new(5)
        .randn(4 * 8 * 8)
        .into_iter()
        .map(|v| v * scale)
        .collect();
    Tensor::from_data(
        TensorData::new(values, [1, 4, 8, 8]),
        (&Device::flex(), DType::F32),
    )
}

#[derive(Default)]
struct Notices(Vec<Notice>);

impl Observer for Notices {
    fn notice(&mut self, notice: &Notice) {
        self.0.push(notice.clone());
    }
}

#[test]
fn f16_overflow_is_retried_in_f32() {
    let z = latents(2e4);
    let f32_model = tiny_model(Precision::F32);
    let want = decode(
        &f32_model,
        z.clone(),
        &DecodeOptions::default(),
        &mut Notices::default(),
    )
    .expect("f32 decodes");

    let f16_model = tiny_model(Precision::F16);
    // Without the guard this is what would be saved: the f16 decode is not finite.
    let raw = f16_model.vae.decode(z.clone().cast(DType::F16));
    assert!(
        !latent_engine::pipeline::all_finite(&raw).expect("check"),
        "the test needs latents that overflow f16"
    );

    let mut notices = Notices::default();
    let got = decode(
        &f16_model,
        z.clone(),
        &DecodeOptions::default(),
        &mut notices,
    )
    .expect("retried in f32");
    assert_eq!(notices.0, vec![Notice::VaeRetriedInF32]);
    let diff = got
        .pixels
        .iter()
        .zip(&want.pixels)
        .map(|(a, b)| a.abs_diff(*b))
        .max()
        .unwrap_or(0);
    eprintln!("f16 model retried in f32 vs f32 model: max 8-bit difference {diff}");
    assert!(diff <= 2, "differs by {diff}/255");
    // A flat black or grey image would also be "finite": this one has structure.
    let (lo, hi) = got
        .pixels
        .iter()
        .fold((255u8, 0u8), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    assert!(hi - lo > 16, "the image is nearly flat: {lo}..{hi}");

    // The VAE stays in f32: the next decode needs no retry and warns no more.
    assert!(f16_model.vae_upcast());
    let again = decode(&f16_model, z, &DecodeOptions::default(), &mut notices).expect("decodes");
    assert_eq!(again, got);
    assert_eq!(notices.0.len(), 1, "one warning per model");
}

#[test]
fn an_f16_decode_that_is_finite_is_not_retried() {
    let model = tiny_model(Precision::F16);
    let mut notices = Notices::default();
    decode(
        &model,
        latents(1.0),
        &DecodeOptions::default(),
        &mut notices,
    )
    .expect("decodes");
    assert!(notices.0.is_empty(), "{:?}", notices.0);
    assert!(!model.vae_upcast());
}

#[test]
fn overflow_even_in_f32_is_a_clear_error() {
    // 1e37 / 0.18215 is finite in f32, but the decoder's convolutions overflow it.
    for precision in [Precision::F32, Precision::F16] {
        let model = tiny_model(precision);
        let mut notices = Notices::default();
        let e = decode(
            &model,
            latents(1e37),
            &DecodeOptions::default(),
            &mut notices,
        )
        .expect_err("no image");
        assert!(
            matches!(e, Error::NonFiniteImage { precision: "f32" }),
            "{precision:?}: {e}"
        );
        assert!(e.to_string().contains("NaN"), "{e}");
    }
}

#[test]
fn non_finite_latents_are_a_clear_error() {
    let model = tiny_model(Precision::F32);
    for bad in [f32::NAN, f32::INFINITY] {
        let mut values = vec![0.5f32; 4 * 8 * 8];
        values[17] = bad;
        let z = Tensor::from_data(
            TensorData::new(values, [1, 4, 8, 8]),
            (&Device::flex(), DType::F32),
        );
        let e = decode(
            &model,
            z,
            &DecodeOptions::default(),
            &mut Notices::default(),
        )
        .expect_err("no image");
        assert!(matches!(e, Error::NonFiniteLatents), "{e}");
        assert!(e.to_string().contains("lower CFG"), "{e}");
    }
}
