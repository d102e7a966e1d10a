//! The TAESD preview decoder against diffusers' `AutoencoderTiny` decoder on a tiny random-weight
//! model (tests/fixtures/make_taesd_fixtures.py), from madebyollin's and diffusers' layouts, on
//! burn's CPU (flex) and wgpu backends.

use crate::common;

use std::path::{Path, PathBuf};

use burn::tensor::{DType, Device, Tensor, TensorData};
use common::{assert_close, devices, errors, fixtures, scratch_dir, to_vec, write_safetensors};
use latent_engine::Error;
use latent_engine::checkpoint::SafetensorsFile;
use latent_engine::taesd::{TaesdConfig, TaesdDecoder, TaesdLayout};

/// The three ways a TAESD decoder arrives: madebyollin's file (config from its `.json` sidecar),
/// a diffusers folder, and that folder's weights file alone (config from the `config.json` beside).
fn sources() -> Vec<(&'static str, PathBuf)> {
    vec![
        (
            "madebyollin",
            fixtures().join("tiny-taesd_decoder.safetensors"),
        ),
        ("diffusers-folder", fixtures().join("tiny-taesd")),
        (
            "diffusers-file",
            fixtures().join("tiny-taesd/diffusion_pytorch_model.safetensors"),
        ),
    ]
}

const CASES: [&str; 2] = ["wide", "batch"];

struct Expected(SafetensorsFile);

impl Expected {
    fn load() -> Self {
        Self(
            SafetensorsFile::open(&fixtures().join("tiny-taesd-expected.safetensors"))
                .expect("expected tensors"),
        )
    }

    fn values(&self, name: &str) -> Vec<f32> {
        self.0
            .read_f32(name)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    fn tensor(&self, name: &str, device: &Device) -> Tensor<4> {
        let shape: [usize; 4] = self
            .0
            .entry(name)
            .expect(name)
            .shape
            .clone()
            .try_into()
            .expect("rank 4");
        Tensor::from_data(
            TensorData::new(self.values(name), shape),
            (device, DType::F32),
        )
    }
}

fn open(path: &Path, device: &Device, dtype: DType) -> TaesdDecoder {
    TaesdDecoder::open(path, device, dtype).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Decoded outputs of every case, by case name.
fn outputs(
    decoder: &TaesdDecoder,
    exp: &Expected,
    device: &Device,
) -> Vec<(&'static str, Vec<f32>)> {
    CASES
        .iter()
        .map(|case| {
            let z = exp.tensor(&format!("taesd.z_{case}"), device);
            let [b, _, h, w] = z.dims();
            let out = decoder.decode(z);
            assert_eq!(out.dims(), [b, 3, h * 8, w * 8], "{case}");
            (*case, to_vec(out))
        })
        .collect()
}

fn check(dtype: DType) {
    let exp = Expected::load();
    for (backend, device) in devices() {
        for (i, (source, path)) in sources().into_iter().enumerate() {
            // Every layout loads the same tensors (`layouts_are_detected_and_give_identical_
            // outputs`): on wgpu, where each decode is seconds of lavapipe, the first suffices.
            if backend == "wgpu" && i > 0 {
                continue;
            }
            let decoder = open(&path, &device, dtype);
            for (case, got) in outputs(&decoder, &exp, &device) {
                let what = format!("{backend}/{source}/{dtype:?}/{case}");
                assert_close(
                    &what,
                    &got,
                    &exp.values(&format!("taesd.decoded_{case}")),
                    dtype,
                );
            }
        }
    }
}

#[test]
fn f32_matches_diffusers_from_every_layout() {
    check(DType::F32);
}

#[test]
fn f16_matches_diffusers_within_1e_2() {
    check(DType::F16);
}

#[test]
fn layouts_are_detected_and_give_identical_outputs() {
    let detect = |p: &Path| {
        let f = SafetensorsFile::open(p).unwrap();
        TaesdLayout::detect(f.entries().keys().map(String::as_str))
    };
    let paths = sources();
    assert_eq!(detect(&paths[0].1), Some(TaesdLayout::Madebyollin));
    assert_eq!(detect(&paths[2].1), Some(TaesdLayout::Diffusers));

    let exp = Expected::load();
    let device = Device::flex();
    let all: Vec<_> = sources()
        .into_iter()
        .map(|(source, path)| {
            let decoder = open(&path, &device, DType::F32);
            assert_eq!(
                decoder.config(),
                &TaesdConfig {
                    latent_channels: 4,
                    block_out_channels: vec![8; 4],
                    num_blocks: vec![2, 1, 1, 2],
                    upsample_factor: 2,
                    out_channels: 3,
                },
                "{source}"
            );
            (source, outputs(&decoder, &exp, &device))
        })
        .collect();
    let (first, reference) = &all[0];
    for (source, outs) in &all[1..] {
        for ((case, x), (_, y)) in reference.iter().zip(outs) {
            let (abs, _) = errors(x, y);
            assert!(abs == 0.0, "{case}: {first} and {source} differ by {abs:e}");
        }
    }
}

/// A copy of madebyollin's fixture under `dir/<name>.safetensors` with `edit` applied to its
/// tensors, and the config sidecar beside it unless `sidecar` is false.
fn edited_copy(
    dir: &Path,
    name: &str,
    sidecar: bool,
    edit: impl Fn(&mut Vec<(String, String, Vec<usize>, Vec<u8>)>),
) -> PathBuf {
    let src = SafetensorsFile::open(&fixtures().join("tiny-taesd_decoder.safetensors")).unwrap();
    let mut tensors: Vec<_> = src
        .entries()
        .iter()
        .map(|(k, e)| {
            (
                k.clone(),
                format!("{:?}", e.dtype),
                e.shape.clone(),
                src.bytes(e).to_vec(),
            )
        })
        .collect();
    edit(&mut tensors);
    let refs: Vec<_> = tensors
        .iter()
        .map(|(k, d, s, b)| (k.as_str(), d.as_str(), s.clone(), b.clone()))
        .collect();
    let path = dir.join(format!("{name}.safetensors"));
    write_safetensors(&path, &refs);
    if sidecar {
        std::fs::copy(
            fixtures().join("tiny-taesd_decoder.json"),
            path.with_extension("json"),
        )
        .unwrap();
    }
    path
}

#[test]
fn missing_tensors_are_reported_by_their_stored_name() {
    let dir = scratch_dir("taesd-missing");
    let device = Device::flex();
    // A block conv's weight, and a required bias (the final conv's).
    for key in ["3.conv.2.weight", "15.bias", "1.weight"] {
        let path = edited_copy(&dir, &format!("no-{key}"), true, |t| {
            t.retain(|(k, ..)| k != key)
        });
        match TaesdDecoder::open(&path, &device, DType::F32) {
            Err(Error::MissingTensor { name, .. }) => assert_eq!(name, key),
            other => panic!("{key}: expected MissingTensor, got {:?}", other.map(|_| ())),
        }
    }
}

#[test]
fn wrong_shapes_are_shape_mismatches() {
    let dir = scratch_dir("taesd-shapes");
    let device = Device::flex();
    // Without its sidecar the tiny file is read as the real 64-channel TAESD.
    let path = edited_copy(&dir, "no-sidecar", false, |_| {});
    match TaesdDecoder::open(&path, &device, DType::F32) {
        Err(Error::ShapeMismatch {
            name,
            expected,
            found,
            ..
        }) => {
            assert_eq!(name, "1.weight");
            assert_eq!(expected, [64, 4, 3, 3]);
            assert_eq!(found, [8, 4, 3, 3]);
        }
        other => panic!("expected ShapeMismatch, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn corrupt_and_foreign_files_are_errors() {
    let dir = scratch_dir("taesd-corrupt");
    let device = Device::flex();
    let open_err = |path: &Path| match TaesdDecoder::open(path, &device, DType::F32) {
        Err(e) => e,
        Ok(_) => panic!("{} opened", path.display()),
    };

    let bytes = std::fs::read(fixtures().join("tiny-taesd_decoder.safetensors")).unwrap();
    let truncated = dir.join("truncated.safetensors");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let e = open_err(&truncated);
    assert!(matches!(e, Error::InvalidSafetensors { .. }), "{e}");

    let garbage = dir.join("garbage.safetensors");
    std::fs::write(&garbage, b"definitely not a safetensors file").unwrap();
    let e = open_err(&garbage);
    assert!(matches!(e, Error::InvalidSafetensors { .. }), "{e}");

    let e = open_err(&dir.join("absent.safetensors"));
    assert!(matches!(e, Error::Io { .. }), "{e}");

    let pickle = dir.join("taesd_decoder.pth");
    std::fs::write(&pickle, b"\x80\x02}q\x00.").unwrap();
    let e = open_err(&pickle);
    assert!(matches!(e, Error::PickleRefused { .. }), "{e}");

    // A full VAE is not a TAESD.
    let vae = dir.join("vae.safetensors");
    write_safetensors(
        &vae,
        &[(
            "decoder.conv_in.weight",
            "F32",
            vec![2],
            common::f32_bytes(2),
        )],
    );
    let e = open_err(&vae);
    assert!(matches!(e, Error::InvalidInput(_)), "{e}");

    // madebyollin's encoder starts with a conv at index 0.
    let encoder = edited_copy(&dir, "taesd_encoder", true, |t| {
        t.push((
            "0.weight".into(),
            "F32".into(),
            vec![2],
            common::f32_bytes(2),
        ))
    });
    let e = open_err(&encoder);
    assert!(
        matches!(&e, Error::InvalidInput(m) if m.contains("encoder")),
        "{e}"
    );

    // A folder without weights.
    let empty = dir.join("empty-folder");
    std::fs::create_dir_all(&empty).unwrap();
    let e = open_err(&empty);
    assert!(matches!(e, Error::InvalidInput(_)), "{e}");
}
