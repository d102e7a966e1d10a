//! Stable Diffusion XL against diffusers on the tiny model (tests/fixtures/make_sdxl_fixtures.py):
//! so far its two text encoders — CLIP ViT-L's penultimate layer and OpenCLIP ViT-bigG's, with
//! bigG's projected end-token state (the pooled conditioning) — from the diffusers folder, on CPU
//! and wgpu, in f32 and f16.

use crate::common;

use std::sync::Arc;

use burn::tensor::Device;
use common::{Expected, assert_close, devices, fixtures, to_vec};
use latent_engine::Precision;
use latent_engine::checkpoint::{KeyMap, SafetensorsFile, Weights};
use latent_engine::clip::{ClipConfig, ClipTextModel};

/// One of the folder's text encoders; `projection` for `text_encoder_2`.
fn encoder(sub: &str, projection: bool, device: &Device, precision: Precision) -> ClipTextModel {
    let dir = fixtures().join("tiny-sdxl").join(sub);
    let text = std::fs::read_to_string(dir.join("config.json")).expect("config");
    let mut config: ClipConfig = serde_json::from_str(&text).expect("CLIP config");
    config.with_projection = projection;
    let file = SafetensorsFile::open(&dir.join("model.fp16.safetensors")).expect("weights");
    // transformers 5 saves a `CLIPTextModel` without its `text_model.` prefix, and a
    // `CLIPTextModelWithProjection` with it.
    let flat = file.entries().keys().all(|n| !n.starts_with("text_model."));
    let map: KeyMap = Arc::new(move |n: &str| {
        if flat {
            n.strip_prefix("text_model.").unwrap_or(n).to_string()
        } else {
            n.to_string()
        }
    });
    let w = Weights::from_file(
        "text encoder",
        Arc::new(file),
        map,
        device,
        precision.dtype(),
    );
    ClipTextModel::load(&w, &config).unwrap_or_else(|e| panic!("{sub}: {e}"))
}

#[test]
fn text_encoders_match_diffusers() {
    let exp = Expected::open("sdxl-expected.safetensors");
    for (backend, device) in devices() {
        for precision in [Precision::F32, Precision::F16] {
            let dtype = precision.dtype();
            let what = |part: &str| format!("{backend}/{precision:?}/{part}");
            let l = encoder("text_encoder", false, &device, precision);
            let out = l
                .encode_sdxl(&exp.ids("clip.ids"), 0, &[])
                .expect("encodes");
            assert!(out.pooled.is_none(), "CLIP-L has no projection");
            assert_close(
                &what("clip.penultimate"),
                &to_vec(out.hidden),
                &exp.values("clip.penultimate"),
                dtype,
            );
            let g = encoder("text_encoder_2", true, &device, precision);
            let ids = exp.ids("clip2.ids");
            let out = g.encode_sdxl(&ids, 0, &[]).expect("encodes");
            assert_close(
                &what("clip2.penultimate"),
                &to_vec(out.hidden),
                &exp.values("clip2.penultimate"),
                dtype,
            );
            let pooled = out.pooled.expect("bigG's projection");
            assert_eq!(pooled.dims(), [2, 12]);
            assert_close(
                &what("clip2.text_embeds"),
                &to_vec(pooled),
                &exp.values("clip2.text_embeds"),
                dtype,
            );
            // The last layer's output through the final norm is the plain forward's.
            assert_close(
                &what("clip2.last_hidden_state"),
                &to_vec(g.forward(&ids, 1).expect("encodes")),
                &exp.values("clip2.last_hidden_state"),
                dtype,
            );
        }
    }
}

/// The encoder's depth bounds the skip, and a projection needs its width.
#[test]
fn bad_skips_and_projections_are_refused() {
    let device = devices()[0].1.clone();
    let g = encoder("text_encoder_2", true, &device, Precision::F32);
    let ids = vec![vec![49406, 320, 49407]];
    assert!(
        g.encode_sdxl(&ids, 2, &[]).is_ok(),
        "4 layers: the 2nd from the end"
    );
    assert!(g.encode_sdxl(&ids, 3, &[]).is_err());
    let config = ClipConfig {
        projection_dim: None,
        ..ClipConfig::sdxl_g()
    };
    assert!(config.validate().is_err());
}
