//! The fault suite: what artists' files and fingers do to the engine. Every case ends in a clear
//! `Error` or a correct image: no panic, no hang. Runs on burn's CPU backend with the tiny model
//! (tests/fixtures/tiny-sd.safetensors + tiny-sd.json, from make_model_fixtures.py).
//!
//! Already covered elsewhere and not repeated: missing/zero-length/truncated files, pickles,
//! SDXL/SD2/VAE-only/InstructPix2Pix files, missing tensors, wrong dtypes and shapes
//! (bad_checkpoints.rs); cancelling at step 2 and batch seeds (pipeline_parity.rs); bad CLI
//! flags, unwritable and existing outputs (cli.rs).

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use burn::tensor::Device;
use common::{f32_bytes, fixtures, scratch_dir, write_safetensors};
use latent_engine::checkpoint::Checkpoint;
use latent_engine::image_io::RgbImage;
use latent_engine::pipeline::{
    Generated, Notice, Observer, StepState, Txt2ImgRequest, check_request, txt2img,
};
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::{Error, LoadOptions, StableDiffusion};

/// The tests of this file run one at a time: the soak test measures the process's RSS, which
/// other tests' allocations on parallel threads would disturb.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    // A failed test poisons the lock; the others still deserve to run.
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn tiny_model() -> (StableDiffusion, ClipTokenizer) {
    let ckpt = Checkpoint::open(&fixtures().join("tiny-sd.safetensors")).expect("tiny model");
    let model =
        StableDiffusion::load(&ckpt, &Device::flex(), LoadOptions::default()).expect("loads");
    (model, ClipTokenizer::new().expect("tokenizer"))
}

/// A quick request: 64x64 (8x8 latents), 2 steps, CFG 7 (both UNet passes run).
fn quick() -> Txt2ImgRequest {
    Txt2ImgRequest {
        prompt: "a watercolor fox".into(),
        negative_prompt: "blurry".into(),
        seed: 7,
        steps: 2,
        width: 64,
        height: 64,
        ..Default::default()
    }
}

/// Records steps and notices, and sets the cancel flag after step `cancel_after` (if any).
struct Watch<'a> {
    cancel: &'a AtomicBool,
    cancel_after: Option<usize>,
    steps: Vec<usize>,
    notices: Vec<Notice>,
}

impl<'a> Watch<'a> {
    fn new(cancel: &'a AtomicBool, cancel_after: Option<usize>) -> Self {
        Self {
            cancel,
            cancel_after,
            steps: Vec::new(),
            notices: Vec::new(),
        }
    }
}

impl Observer for Watch<'_> {
    fn notice(&mut self, notice: &Notice) {
        self.notices.push(notice.clone());
    }
    fn step(&mut self, s: &StepState<'_>) {
        self.steps.push(s.step);
        if Some(s.step) == self.cancel_after {
            self.cancel.store(true, Ordering::Relaxed);
        }
    }
}

fn run(
    model: &StableDiffusion,
    tok: &ClipTokenizer,
    req: &Txt2ImgRequest,
) -> (Result<Vec<Generated>, Error>, Vec<usize>, Vec<Notice>) {
    let cancel = AtomicBool::new(false);
    let mut watch = Watch::new(&cancel, None);
    let out = txt2img(model, tok, req, &cancel, &mut watch);
    (out, watch.steps, watch.notices)
}

/// A real image: the requested size and not one flat colour (a NaN-to-black or all-grey bug).
fn assert_real_image(image: &RgbImage, req: &Txt2ImgRequest) {
    assert_eq!((image.width, image.height), (req.width, req.height));
    assert_eq!(image.pixels.len(), req.width * req.height * 3);
    let first = &image.pixels[..3];
    assert!(
        image.pixels.chunks_exact(3).any(|p| p != first),
        "a flat image"
    );
}

fn invalid_input(e: Error, needle: &str) -> String {
    let text = e.to_string();
    assert!(matches!(e, Error::InvalidInput(_)), "{text}");
    assert!(
        text.to_lowercase().contains(&needle.to_lowercase()),
        "`{text}` does not mention {needle}"
    );
    text
}

// ---------------------------------------------------------------------------------------------
// Files

/// The tiny checkpoint with its header rewritten by `edit` and its length prefix by `len`.
fn lying_copy(
    name: &str,
    edit: impl Fn(&mut serde_json::Map<String, serde_json::Value>),
    len: impl Fn(u64) -> u64,
) -> PathBuf {
    let bytes = std::fs::read(fixtures().join("tiny-sd.safetensors")).expect("fixture");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).expect("fixture header");
    edit(&mut header);
    let text = serde_json::Value::Object(header).to_string();
    let mut out = len(text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(&bytes[8 + n..]);
    let dir = scratch_dir("lying");
    let path = dir.join(format!("{name}.safetensors"));
    std::fs::write(&path, out).expect("write");
    std::fs::copy(fixtures().join("tiny-sd.json"), path.with_extension("json")).expect("sidecar");
    path
}

/// The first tensor in file order, whose offsets start at 0.
fn first_tensor(h: &serde_json::Map<String, serde_json::Value>) -> String {
    h.iter()
        .find(|(k, v)| *k != "__metadata__" && v["data_offsets"][0] == 0)
        .map(|(k, _)| k.clone())
        .expect("a tensor at offset 0")
}

#[test]
fn header_lying_checkpoints_are_clear_errors() {
    let _serial = serial();
    let keep = |_: &mut serde_json::Map<String, serde_json::Value>| {};
    let cases: Vec<(&str, PathBuf)> = vec![
        ("length+1", lying_copy("length-plus-one", keep, |n| n + 1)),
        ("length-1", lying_copy("length-minus-one", keep, |n| n - 1)),
        ("length-huge", lying_copy("length-huge", keep, |_| 1 << 62)),
        (
            "offset",
            lying_copy(
                "offset",
                |h| {
                    let k = first_tensor(h);
                    let end = h[&k]["data_offsets"][1].as_u64().expect("end");
                    h[&k]["data_offsets"][1] = (end + 4).into();
                },
                |n| n,
            ),
        ),
        (
            "past-end",
            lying_copy(
                "past-end",
                |h| {
                    let k = first_tensor(h);
                    h[&k]["data_offsets"] = serde_json::json!([0, 1u64 << 40]);
                },
                |n| n,
            ),
        ),
        (
            "shape",
            lying_copy(
                "shape",
                |h| {
                    let k = first_tensor(h);
                    h[&k]["shape"] = serde_json::json!([1u64 << 31, 1u64 << 31, 1u64 << 31]);
                },
                |n| n,
            ),
        ),
        (
            "dtype",
            lying_copy(
                "dtype",
                |h| {
                    let k = first_tensor(h);
                    h[&k]["dtype"] = "F16".into();
                },
                |n| n,
            ),
        ),
    ];
    for (what, path) in cases {
        let e = Checkpoint::open(&path).expect_err(what);
        eprintln!("{what}: {e}");
        assert!(matches!(e, Error::InvalidSafetensors { .. }), "{what}: {e}");
        let name = path.file_name().expect("name").to_string_lossy();
        assert!(e.to_string().contains(&*name), "{what}: {e}");
    }
    // The unedited copy does open: the errors above come from the lies, not from the copying.
    let honest = lying_copy("honest", keep, |n| n);
    Checkpoint::open(&honest).expect("an honest copy opens");
}

#[test]
fn other_families_are_named() {
    let _serial = serial();
    let dir = scratch_dir("families-more");
    let one = |key: &str, shape: Vec<usize>| {
        let n = shape.iter().product();
        vec![(key.to_string(), shape, f32_bytes(n))]
    };
    let clip = "cond_stage_model.transformer.text_model.embeddings.token_embedding.weight";
    let mut pix2pix = one(
        "model.diffusion_model.input_blocks.0.0.weight",
        vec![2, 8, 1, 1],
    );
    pix2pix.extend(one(clip, vec![2, 2]));
    let cases = [
        (
            "sd3",
            one(
                "model.diffusion_model.joint_blocks.0.x_block.attn.qkv.weight",
                vec![2, 2],
            ),
            "Stable Diffusion 3",
        ),
        (
            "flux",
            one("double_blocks.0.img_attn.qkv.weight", vec![2, 2]),
            "Flux",
        ),
        ("pix2pix", pix2pix, "InstructPix2Pix"),
        (
            "lora",
            one(
                "lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight",
                vec![2, 2],
            ),
            "not a full checkpoint",
        ),
    ];
    for (name, tensors, expect) in cases {
        let path = dir.join(format!("{name}.safetensors"));
        let refs: Vec<(&str, &str, Vec<usize>, Vec<u8>)> = tensors
            .iter()
            .map(|(k, s, b)| (k.as_str(), "F32", s.clone(), b.clone()))
            .collect();
        write_safetensors(&path, &refs);
        let e = Checkpoint::open(&path).expect_err(name);
        assert!(matches!(e, Error::UnsupportedFamily { .. }), "{name}: {e}");
        assert!(e.to_string().contains(expect), "{name}: {e}");
    }
}

/// Copies tests/fixtures/tiny-sd (a diffusers folder) so a test can break it.
fn diffusers_copy(name: &str) -> PathBuf {
    let dir = scratch_dir("diffusers").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    copy_tree(&fixtures().join("tiny-sd"), &dir);
    dir
}

/// `from` and everything under it, copied to `to`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy");
        }
    }
}

#[test]
fn broken_diffusers_folders_are_clear_errors() {
    let _serial = serial();
    // A missing component: the VAE folder was not downloaded.
    let no_vae = diffusers_copy("no-vae");
    std::fs::remove_dir_all(no_vae.join("vae")).expect("rm vae");
    let e = Checkpoint::open(&no_vae)
        .and_then(|c| StableDiffusion::load(&c, &Device::flex(), LoadOptions::default()))
        .err()
        .expect("a folder without a VAE loads");
    assert!(e.to_string().contains("vae"), "{e}");

    // Weights missing but the config present (an interrupted download).
    let no_weights = diffusers_copy("no-unet-weights");
    for f in std::fs::read_dir(no_weights.join("unet")).expect("unet") {
        let f = f.expect("entry").path();
        if f.extension().is_some_and(|e| e == "safetensors") {
            std::fs::remove_file(f).expect("rm");
        }
    }
    let e = Checkpoint::open(&no_weights)
        .and_then(|c| StableDiffusion::load(&c, &Device::flex(), LoadOptions::default()))
        .err()
        .expect("a UNet without weights loads");
    assert!(e.to_string().contains("unet"), "{e}");

    // Another family's folder: SDXL by its pipeline class.
    let xl = diffusers_copy("sdxl");
    let index = xl.join("model_index.json");
    let text = std::fs::read_to_string(&index).expect("index");
    std::fs::write(
        &index,
        text.replace("StableDiffusionPipeline", "StableDiffusionXLPipeline"),
    )
    .expect("write");
    // An SDXL folder without its second text encoder is a broken one, named by what it lacks.
    let e = Checkpoint::open(&xl).expect_err("an SDXL folder without text_encoder_2 opens");
    assert!(e.to_string().contains("text_encoder_2"), "{e}");
    // An SDXL folder whose second encoder has its config but no weights names what is missing.
    let whole = Checkpoint::open(&fixtures().join("tiny-sdxl")).expect("the SDXL folder opens");
    let half = scratch_dir("diffusers").join("sdxl-no-te2-weights");
    let _ = std::fs::remove_dir_all(&half);
    copy_tree(&fixtures().join("tiny-sdxl"), &half);
    for f in std::fs::read_dir(half.join("text_encoder_2")).expect("text_encoder_2") {
        let f = f.expect("entry").path();
        if f.extension().is_some_and(|e| e == "safetensors") {
            std::fs::remove_file(f).expect("rm");
        }
    }
    let e = Checkpoint::open(&half).expect_err("an SDXL folder without te2 weights opens");
    assert!(e.to_string().contains("text_encoder_2"), "{e}");
    StableDiffusion::load(&whole, &Device::flex(), LoadOptions::default())
        .expect("the whole SDXL folder loads");

    // The untouched copy loads: the failures above are the breakage, not the copying.
    let ok = diffusers_copy("intact");
    let c = Checkpoint::open(&ok).expect("intact copy opens");
    StableDiffusion::load(&c, &Device::flex(), LoadOptions::default()).expect("intact copy loads");
}

// ---------------------------------------------------------------------------------------------
// Requests

#[test]
fn bad_sizes_steps_and_cfg_are_refused_before_any_step() {
    let _serial = serial();
    let (model, tok) = tiny_model();
    let huge = usize::MAX - 7; // a multiple of 8 whose latent count overflows any product
    let sizes = [
        (65, 64, "multiple"),
        (64, 12, "multiple"),
        (0, 64, "multiple"),
        (0, 0, "multiple"),
        (16384, 64, "limit"),
        (huge, 8, "limit"),
        (8, huge, "limit"),
    ];
    let steps = [(0, "at least 1"), (10_000, "too many"), (1001, "too many")];
    let cfgs = [
        (f32::NAN, "CFG"),
        (f32::INFINITY, "CFG"),
        (f32::NEG_INFINITY, "CFG"),
        (-0.5, "CFG"),
    ];
    let mut reqs: Vec<(Txt2ImgRequest, &str)> = Vec::new();
    for (width, height, needle) in sizes {
        reqs.push((
            Txt2ImgRequest {
                width,
                height,
                ..quick()
            },
            needle,
        ));
    }
    for (steps, needle) in steps {
        reqs.push((Txt2ImgRequest { steps, ..quick() }, needle));
    }
    for (cfg_scale, needle) in cfgs {
        reqs.push((
            Txt2ImgRequest {
                cfg_scale,
                ..quick()
            },
            needle,
        ));
    }
    for (req, needle) in reqs {
        let what = format!(
            "{}x{}, {} steps, CFG {}",
            req.width, req.height, req.steps, req.cfg_scale
        );
        let early = check_request(&model, &req).expect_err(&what);
        let early = invalid_input(early, needle);
        let (out, steps, _) = run(&model, &tok, &req);
        let late = out.err().unwrap_or_else(|| panic!("{what} ran"));
        assert_eq!(late.to_string(), early, "{what}");
        assert!(steps.is_empty(), "{what}: ran {} steps", steps.len());
    }
    // The largest step count every sampler takes is accepted (not run: check only).
    let most = Txt2ImgRequest {
        steps: 999,
        ..quick()
    };
    check_request(&model, &most).expect("999 steps");
}

#[test]
fn empty_and_overlong_prompts_make_images() {
    let _serial = serial();
    let (model, tok) = tiny_model();
    let empty = Txt2ImgRequest {
        prompt: String::new(),
        negative_prompt: String::new(),
        ..quick()
    };
    let (out, steps, notices) = run(&model, &tok, &empty);
    let out = out.expect("an empty prompt makes an image");
    assert_real_image(&out[0].image, &empty);
    assert_eq!(steps, vec![1, 2]);
    assert!(notices.is_empty(), "{notices:?}");

    // 10,000 characters (about 3,300 tokens): the first 32 chunks of 75 are read, the rest is
    // dropped with a notice.
    let long: String = "a fox in snow, ".repeat(667).chars().take(10_000).collect();
    assert_eq!(long.chars().count(), 10_000);
    let req = Txt2ImgRequest {
        prompt: long.clone(),
        negative_prompt: long,
        ..quick()
    };
    let t = Instant::now();
    let (out, _, notices) = run(&model, &tok, &req);
    let out = out.expect("a 10,000-character prompt makes an image");
    eprintln!("10,000-character prompt: {:?}", t.elapsed());
    assert_real_image(&out[0].image, &req);
    let truncated: Vec<&str> = notices
        .iter()
        .filter_map(|n| match n {
            Notice::PromptTruncated { which, tokens, .. } if *tokens > 2000 => Some(*which),
            _ => None,
        })
        .collect();
    assert_eq!(truncated, vec!["prompt", "negative prompt"], "{notices:?}");
    // Only the first 2,400 tokens count: the same start with a different tail is the same image.
    let mut other = req.clone();
    other.prompt = format!(
        "{}{}",
        &req.prompt[..8000],
        "a castle at night, ".repeat(400)
    );
    other.negative_prompt = other.prompt.clone();
    let (same, _, _) = run(&model, &tok, &other);
    assert_eq!(same.expect("image")[0].image, out[0].image);
}

// ---------------------------------------------------------------------------------------------
// Cancellation

#[test]
fn cancel_at_every_stage() {
    let _serial = serial();
    let (model, tok) = tiny_model();
    let req = Txt2ImgRequest {
        steps: 4,
        ..quick()
    };
    let (reference, _, _) = run(&model, &tok, &req);
    let reference = reference.expect("uncancelled run");

    // Before step 0: nothing runs.
    let cancel = AtomicBool::new(true);
    let mut watch = Watch::new(&cancel, None);
    let e = txt2img(&model, &tok, &req, &cancel, &mut watch).expect_err("cancelled first");
    assert!(matches!(e, Error::Cancelled), "{e}");
    assert!(watch.steps.is_empty());

    // After each step but the last: the run stops before the next step.
    for k in 1..req.steps {
        let cancel = AtomicBool::new(false);
        let mut watch = Watch::new(&cancel, Some(k));
        let e = txt2img(&model, &tok, &req, &cancel, &mut watch).expect_err("cancelled");
        assert!(matches!(e, Error::Cancelled), "after step {k}: {e}");
        assert_eq!(watch.steps, (1..=k).collect::<Vec<_>>(), "after step {k}");
    }

    // After the last step, before decoding: cancelled, the decode is not spent.
    let cancel = AtomicBool::new(false);
    let mut watch = Watch::new(&cancel, Some(req.steps));
    let e = txt2img(&model, &tok, &req, &cancel, &mut watch).expect_err("cancelled before decode");
    assert!(matches!(e, Error::Cancelled), "{e}");
    assert_eq!(watch.steps, (1..=req.steps).collect::<Vec<_>>());

    // In a batch count, after image 1's last step: image 1 is not decoded, image 2 never starts.
    let batch = Txt2ImgRequest {
        batch_count: 3,
        ..req.clone()
    };
    let cancel = AtomicBool::new(false);
    let mut watch = Watch::new(&cancel, Some(req.steps));
    let e = txt2img(&model, &tok, &batch, &cancel, &mut watch).expect_err("batch cancelled");
    assert!(matches!(e, Error::Cancelled), "{e}");
    assert_eq!(watch.steps, (1..=req.steps).collect::<Vec<_>>());

    // Cancelled during image 2: image 1 is finished and kept (as A1111's Interrupt keeps a
    // batch's finished images), image 2 is dropped, image 3 never starts.
    let cancel = AtomicBool::new(false);
    let mut watch = Watch::new(&cancel, None);
    let mut during_second = CancelDuring {
        inner: &mut watch,
        cancel: &cancel,
        image: 1,
    };
    let kept = txt2img(&model, &tok, &batch, &cancel, &mut during_second).expect("image 1 kept");
    assert_eq!(kept.len(), 1, "only the finished image");
    assert_eq!(kept[0].seed, req.seed);
    assert_eq!(kept[0].image, reference[0].image);
    assert_eq!(
        watch.steps,
        vec![1, 2, 3, 4, 1],
        "image 2 stopped after its first step"
    );

    // Cancelled while image 1 decodes: the decode finishes and image 1 is kept, correct; image 2
    // never starts.
    let cancel = AtomicBool::new(false);
    let mut watch = Watch::new(&cancel, None);
    let mut during_decode = CancelDuringDecode {
        inner: &mut watch,
        cancel: &cancel,
    };
    let kept = txt2img(&model, &tok, &batch, &cancel, &mut during_decode).expect("image 1 kept");
    assert_eq!(kept.len(), 1, "only the image whose decode was running");
    assert_eq!(kept[0].image, reference[0].image);
    assert_eq!(watch.steps, (1..=req.steps).collect::<Vec<_>>());

    // A cancelled run leaves nothing behind: the next one is the reference image.
    let (again, _, _) = run(&model, &tok, &req);
    assert_eq!(again.expect("after cancels")[0].image, reference[0].image);
}

/// Cancel during loading: a flag set before the load stops it before any tensor; one set part
/// way (from the progress callback) stops it within a tensor. Through the model cache with a
/// disk cache, a cancelled load leaves no entry or temporary file, and the next load of the same
/// checkpoint works and generates the reference image.
#[test]
fn cancel_during_loading() {
    use latent_engine::checkpoint::controlled;
    use latent_engine::model_cache::{CacheSettings, LoadSource, ModelCache};
    use std::cell::Cell;
    use std::rc::Rc;
    use std::sync::Arc;
    let _serial = serial();
    let path = fixtures().join("tiny-sd.safetensors");
    let ckpt = Checkpoint::open(&path).expect("tiny model");
    let device = Device::flex();

    // Uncancelled: the progress callback hears every uploaded byte.
    let heard = Rc::new(Cell::new(0u64));
    let h = heard.clone();
    let model = controlled(
        Arc::new(AtomicBool::new(false)),
        move |b| h.set(h.get() + b),
        || StableDiffusion::load(&ckpt, &device, LoadOptions::default()),
    )
    .expect("loads");
    let total = heard.get();
    assert_eq!(total, model.weight_bytes(), "progress covers the weights");

    // Cancelled before the load: no tensor is built.
    let heard = Rc::new(Cell::new(0u64));
    let h = heard.clone();
    let e = controlled(
        Arc::new(AtomicBool::new(true)),
        move |b| h.set(h.get() + b),
        || StableDiffusion::load(&ckpt, &device, LoadOptions::default()),
    )
    .err()
    .expect("cancelled");
    assert!(matches!(e, Error::Cancelled), "{e}");
    assert_eq!(heard.get(), 0);

    // Cancelled a third of the way, through the cache with a disk cache: the load stops within
    // a tensor and the cache folder holds nothing.
    let dir = scratch_dir("cancel-loading");
    let mut cache = ModelCache::new(CacheSettings {
        enabled: true,
        memory_budget: 1 << 30,
        disk_dir: Some(dir.clone()),
        disk_limit: 1 << 30,
    });
    let cancel = Arc::new(AtomicBool::new(false));
    let (flag, heard) = (cancel.clone(), Rc::new(Cell::new(0u64)));
    let h = heard.clone();
    let e = controlled(
        cancel.clone(),
        move |b| {
            h.set(h.get() + b);
            if h.get() * 3 >= total {
                flag.store(true, Ordering::Relaxed);
            }
        },
        || cache.get(&path, &device, LoadOptions::default()),
    )
    .err()
    .expect("cancelled part way");
    assert!(matches!(e, Error::Cancelled), "{e}");
    assert!(
        heard.get() * 3 >= total && heard.get() < total,
        "stopped part way: {} of {total} bytes",
        heard.get()
    );
    let left: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.iter()
            .all(|n| !n.to_string_lossy().ends_with(".safetensors")
                && !n.to_string_lossy().contains(".tmp-")),
        "no entry or temporary file after a cancelled load: {left:?}"
    );
    assert!(cache.resident().is_empty());

    // The next load works and makes the reference image.
    let (again, _, source) = controlled(
        Arc::new(AtomicBool::new(false)),
        |_| {},
        || cache.get(&path, &device, LoadOptions::default()),
    )
    .expect("loads after a cancelled load");
    assert_eq!(source, LoadSource::Checkpoint);
    let tok = ClipTokenizer::new().expect("tokenizer");
    let (reference, _, _) = run(&model, &tok, &quick());
    let (after, _, _) = run(&again, &tok, &quick());
    assert_eq!(
        after.expect("image")[0].image,
        reference.expect("reference")[0].image
    );
}

/// Sets the cancel flag when a decode starts.
struct CancelDuringDecode<'a, 'b> {
    inner: &'a mut Watch<'b>,
    cancel: &'a AtomicBool,
}

impl Observer for CancelDuringDecode<'_, '_> {
    fn notice(&mut self, notice: &Notice) {
        self.inner.notice(notice);
    }

    fn step(&mut self, s: &StepState<'_>) {
        self.inner.step(s);
    }

    fn decoding(&mut self, _tiles: usize) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

/// Sets the cancel flag at the first step of batch image `image`.
struct CancelDuring<'a, 'b> {
    inner: &'a mut Watch<'b>,
    cancel: &'a AtomicBool,
    image: usize,
}

impl Observer for CancelDuring<'_, '_> {
    fn notice(&mut self, notice: &Notice) {
        self.inner.notice(notice);
    }

    fn step(&mut self, s: &StepState<'_>) {
        self.inner.step(s);
        if s.image == self.image {
            self.cancel.store(true, Ordering::Relaxed);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Soak

/// Resident set size in bytes (Linux), from /proc/self/statm's second field.
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Set in the process [`hundred_generations_are_identical_and_do_not_grow_memory`] reruns itself in.
const ALONE: &str = "LATENT_STUDIO_TEST_ALONE";

#[test]
fn hundred_generations_are_identical_and_do_not_grow_memory() {
    // RSS is the whole process's, and this binary runs the other modules' tests on parallel
    // threads (a lavapipe model loading beside it read as 5 % growth): the measurement runs in a
    // process of its own, this test binary rerun with only this test.
    if std::env::var_os(ALONE).is_none() {
        let name = "faults::hundred_generations_are_identical_and_do_not_grow_memory";
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([name, "--exact", "--nocapture", "--test-threads", "1"])
            .env(ALONE, "1")
            .output()
            .expect("rerun the test alone");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("{text}");
        assert!(out.status.success(), "alone: {text}");
        assert!(text.contains("1 passed"), "the rerun ran no test: {text}");
        return;
    }
    let _serial = serial();
    let (model, tok) = tiny_model();
    let req = quick();
    let start = Instant::now();
    let mut first: Option<RgbImage> = None;
    let mut rss_at_10 = None;
    for i in 1..=100 {
        let (out, _, _) = run(&model, &tok, &req);
        let image = out
            .unwrap_or_else(|e| panic!("generation {i}: {e}"))
            .remove(0)
            .image;
        match &first {
            None => {
                assert_real_image(&image, &req);
                first = Some(image);
            }
            Some(f) => assert!(image == *f, "generation {i} differs from the first"),
        }
        if i == 10 {
            rss_at_10 = rss_bytes();
        }
    }
    let elapsed = start.elapsed();
    eprintln!("100 generations (64x64, 2 steps, CFG 7): {elapsed:?}");
    if let (Some(at_10), Some(at_100)) = (rss_at_10, rss_bytes()) {
        let growth = at_100 as f64 / at_10 as f64 - 1.0;
        eprintln!(
            "RSS: {} MiB at 10, {} MiB at 100 ({:+.1}%)",
            at_10 >> 20,
            at_100 >> 20,
            growth * 100.0
        );
        assert!(
            growth <= 0.05,
            "RSS grew {:.1}% from generation 10 to 100",
            growth * 100.0
        );
    }
}
