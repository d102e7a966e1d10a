//! Stable Diffusion XL against diffusers on the tiny model (tests/fixtures/make_sdxl_fixtures.py):
//! so far its two text encoders — CLIP ViT-L's penultimate layer and OpenCLIP ViT-bigG's, with
//! bigG's projected end-token state (the pooled conditioning) — and its UNet (transformer depth
//! per level, the added size/crop and pooled conditioning) and VAE (scaling factor 0.13025), from
//! both layouts opened as the studio opens them (`Checkpoint::open`), on CPU and wgpu, in f32
//! and f16; prompts as diffusers' `encode_prompt`; whole seeded txt2img runs.

use crate::common;

use burn::tensor::{DType, Device};
use std::sync::atomic::AtomicBool;

use common::{Expected, PipelineCase, assert_close, devices, fixtures, to_vec};
use latent_engine::checkpoint::{Checkpoint, Family, ModelConfig, SafetensorsFile, ldm};
use latent_engine::clip::{ClipConfig, ClipTextModel};
use latent_engine::model_cache::{CacheSettings, LoadSource, ModelCache};
use latent_engine::pipeline::{Quiet, SizeConditioning, Txt2ImgRequest, txt2img};
use latent_engine::prompt::{self, Chunks, Emphasis};
use latent_engine::schedulers::TimestepSpacing;
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::unet::UNet2DConditionModel;
use latent_engine::vae::AutoencoderKL;
use latent_engine::{LoadOptions, Precision, StableDiffusion, TextEncoders};

/// The two layouts of the tiny model.
const LAYOUTS: [&str; 2] = ["tiny-sdxl", "tiny-sdxl.safetensors"];

/// `tests/fixtures/sdxl_cases.json`: what the fixture script asked diffusers for.
fn cases() -> serde_json::Value {
    serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("sdxl_cases.json")).expect("cases"),
    )
    .expect("parses")
}

/// The tiny model opened as the studio opens it.
fn open(layout: &str) -> Checkpoint {
    Checkpoint::open(&fixtures().join(layout)).unwrap_or_else(|e| panic!("{layout}: {e}"))
}

/// A text encoder: CLIP-L (`second` false) or bigG with its projection.
fn encoder(layout: &str, second: bool, device: &Device, precision: Precision) -> ClipTextModel {
    let ckpt = open(layout);
    let dtype = precision.dtype();
    let (w, config) = if second {
        let w = ckpt
            .text_encoder_2_weights(device, dtype)
            .expect("a second encoder");
        (w, ckpt.config.text_encoder_2.clone().expect("its config"))
    } else {
        let w = ckpt
            .text_encoder_weights(device, dtype)
            .expect("a first encoder");
        (w, ckpt.config.text_encoder.clone())
    };
    let model = ClipTextModel::load(&w, &config).unwrap_or_else(|e| panic!("{layout}: {e}"));
    // The single file's second encoder leaves nothing of its own unread but OpenCLIP's logit
    // scale.
    if second && layout.ends_with(".safetensors") {
        let unused = w.report(ldm::SDXL_OPENCLIP_PREFIX).unused;
        assert!(
            unused
                .iter()
                .filter(|k| k.starts_with(ldm::SDXL_OPENCLIP_PREFIX))
                .all(|k| k.ends_with("logit_scale")),
            "{unused:?}"
        );
    }
    model
}

/// Both layouts open as SDXL with the same configs: the folder's files, the single file's
/// family preset under its sidecar. The empty-negative rule is the folder's `model_index.json`
/// (true) and ComfyUI's for a single file (false).
#[test]
fn both_layouts_open_as_sdxl_with_the_same_configs() {
    let folder = open(LAYOUTS[0]);
    let single = open(LAYOUTS[1]);
    for c in [&folder, &single] {
        assert_eq!(c.family, Family::Sdxl);
        let te2 = c.config.text_encoder_2.as_ref().expect("a second encoder");
        assert!(te2.with_projection);
        assert_eq!((te2.pad_token, te2.projection_dim), (0, Some(12)));
        assert_eq!(c.config.vae.scaling_factor, 0.13025);
        assert_eq!(c.config.unet.added_conditioning(), Some((8, 60)));
        assert_eq!(
            c.config.scheduler.timestep_spacing,
            Some(TimestepSpacing::Leading)
        );
    }
    assert_eq!(folder.files().len(), 4);
    assert_eq!(single.files().len(), 1);
    assert!(folder.config.force_zeros_for_empty_prompt);
    assert!(!single.config.force_zeros_for_empty_prompt);
    let same_rule = ModelConfig {
        force_zeros_for_empty_prompt: true,
        ..single.config.clone()
    };
    assert_eq!(folder.config, same_rule);
}

/// Seeded txt2img against diffusers' `StableDiffusionXLPipeline` within ±1 per channel: size and
/// crop conditioning, an encoded negative, the zeroed empty negative and an encoded empty one
/// (the case's `force_zeros_for_empty_prompt`), three samplers on the folder's "leading"
/// schedule. Both layouts on the CPU; on wgpu the folder, the zeroed negative's case.
#[test]
fn txt2img_matches_diffusers() {
    let exp = Expected::open("sdxl-expected.safetensors");
    let cases = cases();
    let tokenizer = ClipTokenizer::new().expect("tokenizer");
    let pair = |v: &serde_json::Value| -> [usize; 2] {
        let a = v.as_array().expect("a pair");
        [
            a[0].as_u64().unwrap() as usize,
            a[1].as_u64().unwrap() as usize,
        ]
    };
    let mut cpu_images = 0;
    for (backend, device) in devices() {
        for layout in LAYOUTS {
            if backend == "wgpu" && layout == LAYOUTS[1] {
                continue;
            }
            let mut model = StableDiffusion::load(&open(layout), &device, LoadOptions::default())
                .unwrap_or_else(|e| panic!("{layout}: {e}"));
            assert!(model.text_encoder_2.is_some());
            for case in cases["pipeline"].as_array().expect("pipeline cases") {
                let c: PipelineCase = serde_json::from_value(case.clone()).expect("a case");
                if !common::runs_on(backend, &c.name, &["case1"]) {
                    continue;
                }
                model.config.force_zeros_for_empty_prompt = case["force_zeros_for_empty_prompt"]
                    .as_bool()
                    .expect("rule");
                let mut req = c.request();
                req.size_conditioning = Some(SizeConditioning {
                    original: pair(&case["original_size"]),
                    crop_top_left: pair(&case["crops_coords_top_left"]),
                    target: pair(&case["target_size"]),
                });
                let out = txt2img(
                    &model,
                    &tokenizer,
                    &req,
                    &AtomicBool::new(false),
                    &mut Quiet,
                )
                .unwrap_or_else(|e| panic!("{backend}/{layout}/{}: {e}", c.name));
                let got = out[0].image.pixels.clone();
                let want = exp.bytes(&format!("{}.image", c.name));
                assert_eq!(got.len(), want.len(), "{}: size", c.name);
                let worst = got.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).max();
                assert!(
                    worst.unwrap_or(0) <= 1,
                    "{backend}/{layout}/{} ({}): pixels differ by up to {worst:?}",
                    c.name,
                    c.sampler
                );
                cpu_images += usize::from(backend == "cpu");
            }
        }
    }
    // Not bit for bit: the folder holds diffusers' fp16 variant, the single file the SGM
    // export's mixed f32/f16/bf16 tensors; each is within ±1 of diffusers above.
    assert_eq!(cpu_images, 6, "three cases from each layout on the CPU");
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

/// What a user's file gets wrong is a clear error before any work: a sidecar with an impossible
/// second encoder, a single file whose second encoder is missing.
#[test]
fn bad_sdxl_inputs_are_clear_errors() {
    let dir = std::env::temp_dir().join(format!("latent-sdxl-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch");
    let file = dir.join("xl.safetensors");
    std::fs::copy(fixtures().join(LAYOUTS[1]), &file).expect("copy");
    let sidecar = fixtures().join("tiny-sdxl.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(sidecar).expect("sidecar")).expect("json");
    config["text_encoder_2"]["num_attention_heads"] = 0.into();
    std::fs::write(dir.join("xl.json"), config.to_string()).expect("write");
    let e = Checkpoint::open(&file).expect_err("zero heads");
    assert!(e.to_string().contains("num_attention_heads"), "{e}");

    // The second encoder's tensors gone from a single file: named when the model is built.
    let mut keep = config.clone();
    keep["text_encoder_2"]["num_attention_heads"] = 2.into();
    std::fs::write(dir.join("xl.json"), keep.to_string()).expect("write");
    let f = SafetensorsFile::open(&fixtures().join(LAYOUTS[1])).expect("file");
    let tensors: Vec<(String, String, Vec<usize>, Vec<u8>)> = f
        .entries()
        .iter()
        .filter(|(k, _)| !k.starts_with(ldm::SDXL_OPENCLIP_PREFIX))
        .map(|(k, e)| {
            let bytes = f.bytes(e).to_vec();
            (k.clone(), format!("{:?}", e.dtype), e.shape.clone(), bytes)
        })
        .collect();
    let refs: Vec<(&str, &str, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(k, d, s, b)| (k.as_str(), d.as_str(), s.clone(), b.clone()))
        .collect();
    common::write_safetensors(&file, &refs);
    let e = Checkpoint::open(&file)
        .and_then(|c| StableDiffusion::load(&c, &Device::flex(), LoadOptions::default()))
        .err()
        .expect("no second encoder");
    assert!(e.to_string().contains("text encoder 2"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The disk cache keeps the second encoder, and parking the encoders in host memory changes
/// no pixel: on wgpu, a model built from the checkpoint with its encoders on the device and one
/// loaded back from the disk cache with them parked (SDXL's default) generate the same image.
/// (`txt2img_matches_diffusers` on wgpu runs parked encoders built from the checkpoint.)
#[test]
fn the_disk_cache_keeps_both_encoders() {
    let dir = std::env::temp_dir().join(format!("latent-sdxl-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let settings = CacheSettings {
        enabled: true,
        memory_budget: 1 << 30,
        disk_dir: Some(dir.clone()),
        disk_limit: 1 << 30,
    };
    let tokenizer = ClipTokenizer::new().expect("tokenizer");
    let req = Txt2ImgRequest {
        prompt: "a lighthouse".into(),
        negative_prompt: "fog".into(),
        seed: 3,
        steps: 2,
        width: 32,
        height: 32,
        ..Default::default()
    };
    let mut images = Vec::new();
    let mut sources = Vec::new();
    let device = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
    for encoders in [TextEncoders::Device, TextEncoders::Auto] {
        let mut cache = ModelCache::new(settings.clone());
        let path = fixtures().join(LAYOUTS[1]);
        let options = LoadOptions {
            text_encoders: encoders,
            ..LoadOptions::default()
        };
        let (model, _, source) = cache.get(&path, &device, options).expect("loads");
        assert!(model.text_encoder_2.is_some());
        assert_eq!(model.parked(), encoders == TextEncoders::Auto, "{encoders}");
        // The memory budget counts device bytes: parked encoders are not among them.
        assert_eq!(cache.resident_bytes(), model.device_weight_bytes());
        assert_eq!(
            model.device_weight_bytes() < model.weight_bytes(),
            model.parked(),
            "{encoders}"
        );
        // Releasing for another setting drops the model only where its encoders would move.
        cache.release_other_parking(encoders);
        assert_eq!(cache.resident_bytes(), model.device_weight_bytes());
        let other = match encoders {
            TextEncoders::Device => TextEncoders::Host,
            _ => TextEncoders::Device,
        };
        assert!(!model.parks_as(other));
        cache.release_other_parking(other);
        assert_eq!(cache.resident_bytes(), 0);
        sources.push(source);
        let out = txt2img(
            &model,
            &tokenizer,
            &req,
            &AtomicBool::new(false),
            &mut Quiet,
        )
        .expect("generates");
        images.push(out[0].image.pixels.clone());
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(sources, [LoadSource::Checkpoint, LoadSource::DiskCache]);
    assert!(images[0] == images[1], "the cached model's image differs");
}

/// A prompt through both encoders as diffusers' `encode_prompt` makes it (context side by side,
/// pooled from bigG): the prompt, an explicit negative, the empty string (what an explicit ""
/// and `force_zeros_for_empty_prompt` false give), and the zeroed negative.
#[test]
fn prompts_encode_as_diffusers_encode_prompt() {
    let exp = Expected::open("sdxl-expected.safetensors");
    let cases = cases();
    let tokenizer = ClipTokenizer::new().expect("tokenizer");
    for (backend, device) in devices() {
        let first = encoder(LAYOUTS[0], false, &device, Precision::F32);
        let second = encoder(LAYOUTS[0], true, &device, Precision::F32);
        let encode = |text: &str| {
            let chunks = Chunks::new(&tokenizer, text, Emphasis::Original);
            prompt::encode_sdxl(Some(&first), &second, &chunks, 1, Emphasis::Original)
                .expect("encodes")
        };
        for case in cases["encode"].as_array().expect("encode cases") {
            let name = case["name"].as_str().expect("name");
            let what = |part: &str| format!("{backend}/{name}/{part}");
            let key = |part: &str| format!("{name}.{part}");
            let cond = encode(case["prompt"].as_str().expect("prompt"));
            assert_eq!(cond.context.dims(), [1, 77, 12]);
            let check = |part: &str, got: &prompt::SdxlConditioning, pooled: &str| {
                assert_close(
                    &what(part),
                    &to_vec(got.context.clone()),
                    &exp.values(&key(part)),
                    DType::F32,
                );
                assert_close(
                    &what(pooled),
                    &to_vec(got.pooled.clone()),
                    &exp.values(&key(pooled)),
                    DType::F32,
                );
            };
            check("prompt_embeds", &cond, "pooled_prompt_embeds");
            let negative = match case["negative_embeds"].as_str() {
                Some("zeros") => cond.zeros_like(),
                _ => encode(case["negative"].as_str().unwrap_or_default()),
            };
            check(
                "negative_prompt_embeds",
                &negative,
                "negative_pooled_prompt_embeds",
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
    let ckpt = open(layout);
    let w = ckpt.unet_weights(device, precision.dtype());
    let unet = UNet2DConditionModel::load(&w, &ckpt.config.unet).expect("loads");
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
    for (backend, device) in devices() {
        for (layout, precision) in runs() {
            let dtype = precision.dtype();
            let ckpt = open(layout);
            assert_eq!(ckpt.config.vae.scaling_factor, 0.13025);
            let w = ckpt.vae_weights(&device, dtype);
            let vae = AutoencoderKL::load(&w, &ckpt.config.vae, false).expect("loads");
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

/// A model that parks its text encoders (SDXL's default, the memory-saving mode) returns the
/// pool's free pages to the driver when a run ends (`pipeline::txt2img_refined`), so the next
/// run's steps do not grow the pool beside pages only the decode needed (issue 15's 8 GiB): on
/// a device of its own (the other tests' allocations would move the pool's figures), nothing is
/// left for a release after the run to return.
#[test]
fn a_parked_model_returns_free_pages_after_a_run() {
    let all = latent_engine::adapters::enumerate();
    let first = all.first().expect("a wgpu adapter (lavapipe in CI)");
    let device = Device::wgpu(first.device_kind(&all));
    let model =
        StableDiffusion::load(&open(LAYOUTS[1]), &device, LoadOptions::default()).expect("loads");
    assert!(model.parked(), "SDXL parks its encoders by default");
    let tokenizer = ClipTokenizer::new().expect("tokenizer");
    let req = Txt2ImgRequest {
        prompt: "a lighthouse".into(),
        seed: 5,
        steps: 2,
        width: 64,
        height: 64,
        ..Default::default()
    };
    let reserved = || {
        device.sync().expect("sync");
        device
            .memory_pool_usage()
            .expect("wgpu pool")
            .bytes_reserved
    };
    for run in 0..2 {
        txt2img(
            &model,
            &tokenizer,
            &req,
            &AtomicBool::new(false),
            &mut Quiet,
        )
        .expect("generates");
        let after_run = reserved();
        latent_engine::device::release_free(&device);
        let released = reserved();
        assert_eq!(
            released, after_run,
            "run {run}: {after_run} bytes reserved after the run, {released} after a release"
        );
    }
}
