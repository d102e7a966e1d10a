//! Stable Diffusion XL against diffusers on the tiny model (tests/fixtures/make_sdxl_fixtures.py):
//! so far its two text encoders — CLIP ViT-L's penultimate layer and OpenCLIP ViT-bigG's, with
//! bigG's projected end-token state (the pooled conditioning) — and its UNet (transformer depth
//! per level, the added size/crop and pooled conditioning) and VAE (scaling factor 0.13025), from
//! the diffusers folder, on CPU and wgpu, in f32 and f16.

use crate::common;

use std::sync::Arc;

use burn::tensor::Device;
use common::{Expected, assert_close, devices, fixtures, to_vec};
use latent_engine::Precision;
use latent_engine::checkpoint::{KeyMap, SafetensorsFile, Weights, ldm};
use latent_engine::clip::{ClipConfig, ClipTextModel};
use latent_engine::unet::{UNet2DConditionModel, UNetConfig};
use latent_engine::vae::{AutoencoderKL, VaeConfig};

/// The two layouts of the tiny model.
const LAYOUTS: [&str; 2] = ["tiny-sdxl", "tiny-sdxl.safetensors"];

/// A folder component's config (the single file's sidecar says the same).
fn config<T: serde::de::DeserializeOwned>(sub: &str) -> T {
    let path = fixtures().join("tiny-sdxl").join(sub).join("config.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("config")).expect("parses")
}

/// `sub`'s weights from `layout`: the folder's file, or the single file with its names mapped
/// by `single` (diffusers name -> stored key) and OpenCLIP's fused q/k/v split.
fn weights(
    layout: &str,
    sub: &str,
    single: KeyMap,
    device: &Device,
    precision: Precision,
) -> Weights {
    let (file, map) = if layout.ends_with(".safetensors") {
        let mut file = SafetensorsFile::open(&fixtures().join(layout)).expect("single file");
        ldm::split_openclip_under(&mut file, ldm::SDXL_OPENCLIP_PREFIX).expect("splits");
        (file, single)
    } else {
        let dir = fixtures().join(layout).join(sub);
        let name = std::fs::read_dir(&dir)
            .expect("folder")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .find(|n| n.ends_with(".safetensors"))
            .expect("a weights file");
        let file = SafetensorsFile::open(&dir.join(name)).expect("weights");
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
        (file, map)
    };
    Weights::from_file("SDXL", Arc::new(file), map, device, precision.dtype())
}

/// A text encoder: CLIP-L (`second` false) or bigG with its projection.
fn encoder(layout: &str, second: bool, device: &Device, precision: Precision) -> ClipTextModel {
    let sub = if second {
        "text_encoder_2"
    } else {
        "text_encoder"
    };
    let mut config: ClipConfig = config(sub);
    config.with_projection = second;
    let single: KeyMap = if second {
        Arc::new(|n: &str| ldm::openclip_key_under(ldm::SDXL_OPENCLIP_PREFIX, n))
    } else {
        Arc::new(|n: &str| format!("{}{n}", ldm::SDXL_CLIP_PREFIX))
    };
    let w = weights(layout, sub, single, device, precision);
    ClipTextModel::load(&w, &config).unwrap_or_else(|e| panic!("{layout}/{sub}: {e}"))
}

#[test]
fn text_encoders_match_diffusers() {
    let exp = Expected::open("sdxl-expected.safetensors");
    for (backend, device) in devices() {
        for (layout, precision) in runs() {
            let dtype = precision.dtype();
            let what = |part: &str| format!("{backend}/{layout}/{precision:?}/{part}");
            let l = encoder(layout, false, &device, precision);
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
            let g = encoder(layout, true, &device, precision);
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
    let g = encoder(LAYOUTS[0], true, &device, Precision::F32);
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

fn unet(layout: &str, device: &Device, precision: Precision) -> UNet2DConditionModel {
    let config: UNetConfig = config("unet");
    let keys = config.clone();
    let single: KeyMap = Arc::new(move |n: &str| ldm::unet_key(n, &keys));
    let w = weights(layout, "unet", single, device, precision);
    let unet = UNet2DConditionModel::load(&w, &config).expect("loads");
    let unused = w.report(ldm::UNET_PREFIX).unused;
    assert!(
        unused.iter().all(|k| !k.starts_with(ldm::UNET_PREFIX)),
        "{layout}: {unused:?}"
    );
    unet
}

/// f32 from both layouts, f16 from the folder.
fn runs() -> [(&'static str, Precision); 3] {
    [
        (LAYOUTS[0], Precision::F32),
        (LAYOUTS[1], Precision::F32),
        (LAYOUTS[0], Precision::F16),
    ]
}

/// The six size and crop values of each row of a `[b, 6]` reference.
fn time_ids(values: &[f32]) -> Vec<[f32; 6]> {
    values
        .chunks_exact(6)
        .map(|c| [c[0], c[1], c[2], c[3], c[4], c[5]])
        .collect()
}

#[test]
fn unet_matches_diffusers() {
    let exp = Expected::open("sdxl-expected.safetensors");
    for (backend, device) in devices() {
        for (layout, precision) in runs() {
            // The single file's tensors are the folder's once loaded: its layout is checked on
            // the CPU.
            if backend == "wgpu" && layout == LAYOUTS[1] {
                continue;
            }
            let dtype = precision.dtype();
            let what = |part: &str| format!("{backend}/{layout}/{precision:?}/{part}");
            let unet = unet(layout, &device, precision);
            assert!(unet.takes_added_conditioning());
            let x = exp.tensor::<4>("unet.x", &device, dtype);
            let ctx = exp.tensor::<3>("unet.context", &device, dtype);
            let pooled = exp.tensor::<2>("unet.text_embeds", &device, dtype);
            let ids = time_ids(&exp.values("unet.time_ids"));
            let added = unet.added_conditioning(&pooled, &ids).expect("conditions");
            for (key, t) in [
                ("unet.out.t999", 999.0),
                ("unet.out.t1", 1.0),
                ("unet.out.t500.5", 500.5),
            ] {
                let got = to_vec(unet.forward_added(x.clone(), &[t], &ctx, &added));
                assert_close(&what(key), &got, &exp.values(key), dtype);
            }
            // A map wider than tall (odd sizes at the third level), the first row's conditions.
            let x = exp.tensor::<4>("unet.x_wide", &device, dtype);
            let added = unet
                .added_conditioning(&pooled.clone().narrow(0, 0, 1), &ids[..1])
                .expect("conditions");
            let got = to_vec(unet.forward_added(x, &[250.0], &ctx.clone().narrow(0, 0, 1), &added));
            assert_close(
                &what("unet.out_wide.t250"),
                &got,
                &exp.values("unet.out_wide.t250"),
                dtype,
            );
            // Rows and widths that do not match are refused.
            assert!(unet.added_conditioning(&pooled, &ids[..1]).is_err());
        }
    }
}

/// The decoder with SDXL's scaling factor (read from the folder's config).
#[test]
fn vae_decode_matches_diffusers() {
    let exp = Expected::open("sdxl-expected.safetensors");
    let config: VaeConfig = config("vae");
    assert_eq!(config.scaling_factor, 0.13025);
    for (backend, device) in devices() {
        for (layout, precision) in runs() {
            let dtype = precision.dtype();
            let keys = config.clone();
            let single: KeyMap = Arc::new(move |n: &str| ldm::vae_key(n, &keys));
            let w = weights(layout, "vae", single, &device, precision);
            let vae = AutoencoderKL::load(&w, &config, false).expect("loads");
            let got = to_vec(vae.decode(exp.tensor::<4>("vae.z", &device, dtype)));
            assert_close(
                &format!("{backend}/{layout}/{precision:?}/vae.decoded"),
                &got,
                &exp.values("vae.decoded"),
                dtype,
            );
        }
    }
}
