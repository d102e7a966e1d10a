//! Bad checkpoints become clear `engine::Error`s, never panics or silently random weights.

use crate::common;

use burn::tensor::Device;
use common::{altered_single_file, f32_bytes, fixtures, scratch_dir, write_safetensors};
use latent_engine::checkpoint::Checkpoint;
use latent_engine::{Error, LoadOptions, StableDiffusion};

fn open_err(path: &std::path::Path) -> Error {
    match Checkpoint::open(path) {
        Ok(_) => panic!("{} opened", path.display()),
        Err(e) => e,
    }
}

#[test]
fn missing_zero_length_and_truncated_files() {
    let dir = scratch_dir("bad-files");
    assert!(matches!(
        open_err(&dir.join("absent.safetensors")),
        Error::Io { .. }
    ));

    let empty = dir.join("empty.safetensors");
    std::fs::write(&empty, b"").unwrap();
    assert!(open_err(&empty).to_string().contains("empty"));

    let full = std::fs::read(fixtures().join("tiny-sd.safetensors")).unwrap();
    let truncated = dir.join("truncated.safetensors");
    std::fs::write(&truncated, &full[..full.len() / 2]).unwrap();
    let e = open_err(&truncated);
    assert!(matches!(e, Error::InvalidSafetensors { .. }), "{e}");
    assert!(e.to_string().contains("truncated"), "{e}");
}

#[test]
fn pickles_are_refused() {
    let dir = scratch_dir("pickle");
    let ckpt = dir.join("model.ckpt");
    std::fs::write(&ckpt, b"\x80\x02}q\x00.").unwrap();
    let e = open_err(&ckpt);
    assert!(matches!(e, Error::PickleRefused { .. }));
    assert!(e.to_string().contains("arbitrary code"), "{e}");
}

#[test]
fn unsupported_families_are_named() {
    let dir = scratch_dir("families");
    let cases = [
        (
            "sdxl-refiner",
            "conditioner.embedders.0.model.token_embedding.weight",
            vec![4, 4],
            "SDXL refiner",
        ),
        (
            "instruct-pix2pix",
            "cond_stage_model.transformer.text_model.embeddings.token_embedding.weight",
            vec![4, 4],
            "InstructPix2Pix",
        ),
        (
            "vae-only",
            "encoder.conv_in.weight",
            vec![4, 4],
            "not a full checkpoint",
        ),
    ];
    for (name, key, shape, expect) in cases {
        let path = dir.join(format!("{name}.safetensors"));
        let n = shape.iter().product();
        let mut tensors = vec![(key, "F32", shape, f32_bytes(n))];
        if name == "instruct-pix2pix" {
            tensors.push((
                "model.diffusion_model.input_blocks.0.0.weight",
                "F32",
                vec![1, 8, 1, 1],
                f32_bytes(8),
            ));
        }
        let e = open_err(&path_with(&path, &tensors));
        assert!(matches!(e, Error::UnsupportedFamily { .. }), "{name}: {e}");
        assert!(e.to_string().contains(expect), "{name}: {e}");
    }
    // The refiner as a diffusers folder: no first text encoder, named before it is missed.
    let refiner = dir.join("refiner");
    std::fs::create_dir_all(refiner.join("unet")).unwrap();
    std::fs::write(
        refiner.join("model_index.json"),
        r#"{"_class_name": "StableDiffusionXLImg2ImgPipeline", "text_encoder": [null, null]}"#,
    )
    .unwrap();
    std::fs::write(refiner.join("unet/config.json"), "{}").unwrap();
    let e = open_err(&refiner);
    assert!(matches!(e, Error::UnsupportedFamily { .. }), "{e}");
    assert!(e.to_string().contains("SDXL refiner"), "{e}");
    // Inpainting: an SD 1.x or 2.x layout whose UNet takes 9 channels opens as its family's,
    // with an inpainting UNet (tests/inpaint_model.rs runs one).
    for (name, clip_key) in [
        (
            "sd1-inpainting",
            "cond_stage_model.transformer.text_model.embeddings.token_embedding.weight",
        ),
        (
            "sd2-inpainting",
            "cond_stage_model.model.token_embedding.weight",
        ),
    ] {
        let tensors = vec![
            (clip_key, "F32", vec![2, 2], f32_bytes(4)),
            (
                "model.diffusion_model.input_blocks.0.0.weight",
                "F32",
                vec![2, 9, 1, 1],
                f32_bytes(18),
            ),
        ];
        let path = path_with(&dir.join(format!("{name}.safetensors")), &tensors);
        let ckpt = Checkpoint::open(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(ckpt.config.unet.is_inpainting(), "{name}");
        assert!(ckpt.model_name().ends_with(" inpainting"), "{name}");
    }
}

fn path_with(
    path: &std::path::Path,
    tensors: &[(&str, &str, Vec<usize>, Vec<u8>)],
) -> std::path::PathBuf {
    write_safetensors(path, tensors);
    path.to_path_buf()
}

fn load_err(path: &std::path::Path) -> Error {
    let ckpt = Checkpoint::open(path).expect("opens");
    match StableDiffusion::load(&ckpt, &Device::flex(), LoadOptions::default()) {
        Ok(_) => panic!("loaded"),
        Err(e) => e,
    }
}

#[test]
fn a_missing_tensor_is_an_error_naming_it() {
    let victim = "model.diffusion_model.middle_block.1.proj_in.weight";
    let path = altered_single_file("missing", |k, d, s, b| {
        (k != victim).then(|| (d.to_string(), s.to_vec(), b.to_vec()))
    });
    let e = load_err(&path);
    assert!(
        matches!(&e, Error::MissingTensor { name, .. } if name == victim),
        "{e}"
    );
}

#[test]
fn a_wrong_dtype_is_an_error() {
    let victim = "model.diffusion_model.out.2.bias";
    let path = altered_single_file("dtype", |k, d, s, b| {
        let dtype = if k == victim { "I16" } else { d };
        Some((dtype.to_string(), s.to_vec(), b.to_vec()))
    });
    let e = load_err(&path);
    assert!(
        matches!(&e, Error::UnsupportedDtype { name, .. } if name == victim),
        "{e}"
    );
}

#[test]
fn a_wrong_shape_is_an_error() {
    // Without its sidecar config the tiny file is read as full-size SD 1.5: shapes disagree.
    let dir = scratch_dir("no-sidecar");
    let path = dir.join("renamed.safetensors");
    std::fs::copy(fixtures().join("tiny-sd.safetensors"), &path).unwrap();
    let e = load_err(&path);
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
}

#[test]
fn a_diffusers_folder_without_weights_is_an_error() {
    let dir = scratch_dir("empty-folder");
    let e = open_err(&dir);
    assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
}
