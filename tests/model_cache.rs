//! The model cache and VAE compilation keep their promise: every combination of {cache on, off} ×
//! {VAE compile on, off} generates three images in a row with a model switch in between, cache on
//! and off give bit-identical images, compile on and off agree within 1e-3; a damaged disk-cache
//! entry is rebuilt, never used; the disk cache keeps its size bound; a forced compile failure
//! gives one warning and a correct image.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use burn::tensor::{DType, Device, DeviceKind, Tensor, TensorData};
use common::fixtures;
use latent_engine::model_cache::{CacheSettings, DiskCache, LoadSource, ModelCache};
use latent_engine::nn::Kernels;
use latent_engine::pipeline::{Notice, Observer, Txt2ImgRequest, txt2img};
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::vae_compile::relative_difference;
use latent_engine::{LoadOptions, Precision, StableDiffusion};

const GIB: u64 = 1 << 30;

fn model_a() -> PathBuf {
    fixtures().join("tiny-sd.safetensors")
}

fn model_b() -> PathBuf {
    fixtures().join("tiny-sd")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "latent-studio-cache-test-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn settings(enabled: bool, dir: &Path, budget: u64, limit: u64) -> CacheSettings {
    CacheSettings {
        enabled,
        memory_budget: budget,
        disk_dir: Some(dir.to_path_buf()),
        disk_limit: limit,
    }
}

#[derive(Default)]
struct Notices(Vec<Notice>);

impl Observer for Notices {
    fn notice(&mut self, notice: &Notice) {
        self.0.push(notice.clone());
    }
}

fn request(seed: u64) -> Txt2ImgRequest {
    Txt2ImgRequest {
        prompt: "a lighthouse in a storm".into(),
        negative_prompt: "blurry".into(),
        seed,
        steps: 2,
        // The smallest size the tiny model takes (4×4 latents): this test compares the
        // combinations with each other, and each image is a VAE decode on lavapipe.
        width: 32,
        height: 32,
        ..Default::default()
    }
}

/// One image; `compile`: through VAE compilation (the request's decode option).
fn generate(model: &StableDiffusion, seed: u64, compile: bool, notices: &mut Notices) -> Vec<u8> {
    let tokenizer = ClipTokenizer::new().unwrap();
    let mut request = request(seed);
    request.decode.compile = compile;
    let out = txt2img(
        model,
        &tokenizer,
        &request,
        &AtomicBool::new(false),
        notices,
    )
    .expect("generation succeeds");
    out[0].image.pixels.clone()
}

fn f32_options() -> LoadOptions {
    LoadOptions {
        precision: Precision::F32,
        vae_encoder: false,
        ..LoadOptions::default()
    }
}

fn wgpu() -> Device {
    Device::wgpu(DeviceKind::DefaultDevice)
}

/// A fixed latent decoded by `model` with the given kernels, as f32 values.
fn decode(model: &StableDiffusion, kernels: Kernels) -> Vec<f32> {
    let values: Vec<f32> = (0..4 * 8 * 8)
        .map(|i| ((i * 37 % 29) as f32 / 29.0 - 0.5) * 2.0)
        .collect();
    let z = Tensor::<4>::from_data(TensorData::new(values, [1, 4, 8, 8]), &model.device);
    model
        .vae
        .decode_with(z, kernels)
        .cast(DType::F32)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap()
}

#[test]
fn cache_and_compile_settings_generate_the_same_images() {
    let device = wgpu();
    let models = [model_a(), model_b(), model_a()];
    // Room for one tiny model only: the switch back to A must come from the disk cache.
    let one_model = {
        let ckpt = latent_engine::checkpoint::Checkpoint::open(&model_a()).unwrap();
        ckpt.stored_bytes() * 3 / 2
    };
    let mut images = std::collections::HashMap::new();
    // Three of the four combinations: cache on/off with compilation off, compilation on/off
    // with the cache on (the fourth adds a minute of lavapipe to CI and no new pairing).
    for (cache_on, compile_on) in [(true, true), (true, false), (false, false)] {
        {
            let dir = scratch(&format!("matrix-{cache_on}-{compile_on}"));
            let mut cache = ModelCache::new(settings(cache_on, &dir, one_model, GIB));
            let mut sources = Vec::new();
            let mut run = Vec::new();
            let mut notices = Notices::default();
            for (i, path) in models.iter().enumerate() {
                let (model, _, source) = cache.get(path, &device, f32_options()).unwrap();
                sources.push(source);
                run.push(generate(&model, 7 + i as u64, compile_on, &mut notices));
                if compile_on {
                    assert_eq!(
                        model.vae_compile.fallback_reason(),
                        None,
                        "the fused path must verify on wgpu"
                    );
                    assert!(model.vae_compile.verified_shapes() > 0);
                }
            }
            assert!(
                !notices
                    .0
                    .iter()
                    .any(|n| matches!(n, Notice::VaeCompileFallback { .. })),
                "no fallback expected: {:?}",
                notices.0
            );
            if cache_on {
                assert_eq!(
                    sources,
                    [
                        LoadSource::Checkpoint,
                        LoadSource::Checkpoint,
                        LoadSource::DiskCache
                    ],
                    "A, then B (evicting A), then A from the disk cache"
                );
                let (_, _, again) = cache.get(&model_a(), &device, f32_options()).unwrap();
                assert_eq!(again, LoadSource::Memory);
                assert_eq!(cache.resident().len(), 1, "the budget holds one model");
                assert_eq!(DiskCache::new(&dir, GIB).entries().len(), 2);
            } else {
                assert_eq!(sources, [LoadSource::Checkpoint; 3]);
                assert!(
                    !dir.exists() || std::fs::read_dir(&dir).unwrap().next().is_none(),
                    "cache off writes nothing to the cache folder"
                );
                assert!(cache.resident().is_empty());
            }
            images.insert((cache_on, compile_on), run);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    assert!(
        images[&(true, false)] == images[&(false, false)],
        "cache on and off must give bit-identical images"
    );
    // Two resident models: only the one in use keeps the UNet step its last generation recorded
    // (the size is tuned by now, so the second of the two steps is recorded).
    let dir = scratch("parked-steps");
    let mut cache = ModelCache::new(settings(true, &dir, 3 * one_model, GIB));
    let (a, _, _) = cache.get(&model_a(), &device, f32_options()).unwrap();
    generate(&a, 7, false, &mut Notices::default());
    assert!(
        a.has_parked_steps(),
        "A's recorded step waits for its next generation"
    );
    let (_b, _, _) = cache.get(&model_b(), &device, f32_options()).unwrap();
    assert_eq!(cache.resident().len(), 2);
    assert!(!a.has_parked_steps(), "switching to B released A's");
    drop(cache);
    let _ = std::fs::remove_dir_all(&dir);
    // Compile on vs off: the decoded values within 1e-3, the 8-bit images within one level.
    let (on, off) = (&images[&(true, true)], &images[&(true, false)]);
    for (a, b) in on.iter().zip(off) {
        let worst = a.iter().zip(b).map(|(x, y)| x.abs_diff(*y)).max().unwrap();
        assert!(worst <= 1, "compile on/off images differ by {worst} levels");
    }
    let mut cache = ModelCache::new(CacheSettings::off());
    let (model, _, _) = cache.get(&model_a(), &device, f32_options()).unwrap();
    let rel = relative_difference(
        &decode(&model, Kernels::Fused),
        &decode(&model, Kernels::Plain),
    );
    assert!(rel <= 1e-3, "compiled decode differs by {rel}");
    compiled_decodes_replay_a_recorded_graph(&model, &images[&(true, true)][0]);
}

/// VAE compilation records a shape at its second compiled decode in a row and replays the next
/// ones, equal to the same kernels launch by launch: direct decodes record, the pipeline's next
/// decode of that shape replays (the image `recorded_first`, seed 7's, decoded launch by launch
/// by another model of these weights), another shape drops the recording and records at its own
/// second decode, and a released recording records again. Shapes whose kernels the test above
/// compiled already.
fn compiled_decodes_replay_a_recorded_graph(model: &StableDiffusion, recorded_first: &[u8]) {
    let vae = &model.vae;
    let latents = |side: usize, salt: usize| {
        let values: Vec<f32> = (0..4 * side * side)
            .map(|i| (((i + salt) * 37 % 29) as f32 / 29.0 - 0.5) * 2.0)
            .collect();
        Tensor::<4>::from_data(TensorData::new(values, [1, 4, side, side]), &model.device)
    };
    let read = |t: Tensor<4>| t.into_data().try_to_vec::<f32>().unwrap();
    let check = |side: usize, salt: usize, replays: usize, recorded: bool| {
        let z = latents(side, salt);
        let got = read(vae.decode_compiled(z.clone()));
        let what = format!("{side}², latents {salt}");
        assert_eq!(got, read(vae.decode_with(z, Kernels::Fused)), "{what}");
        assert_eq!(vae.recording().replays(), replays, "{what}: replays");
        assert_eq!(vae.recording().is_recorded(), recorded, "{what}: recorded");
    };
    check(4, 0, 0, false);
    check(4, 1, 0, true);
    let image = generate(model, 7, true, &mut Notices::default());
    assert_eq!(
        vae.recording().replays(),
        1,
        "the pipeline's decode replays"
    );
    assert!(
        image == recorded_first,
        "a replayed decode gives the same image"
    );
    check(8, 2, 1, false);
    check(8, 3, 1, true);
    check(8, 4, 2, true);
    vae.recording().release();
    assert!(!vae.recording().is_recorded());
    check(8, 5, 2, true);
    check(8, 6, 3, true);
}

/// Flipped bytes, a truncated file and a missing sidecar are each detected; the load falls back to
/// the checkpoint, rewrites the entry, and the next launch uses it again.
#[test]
fn a_damaged_disk_cache_entry_is_rebuilt_not_used() {
    let device = Device::flex();
    let dir = scratch("damage");
    let fresh = || ModelCache::new(settings(true, &dir, GIB, GIB));
    let load = |cache: &mut ModelCache| cache.get(&model_a(), &device, f32_options()).unwrap();
    let (reference, _, source) = load(&mut fresh());
    assert_eq!(source, LoadSource::Checkpoint);
    let reference = decode(&reference, Kernels::Plain);
    let entry = || {
        let entries = DiskCache::new(&dir, GIB).entries();
        assert_eq!(entries.len(), 1, "{entries:?}");
        dir.join(format!("{}.safetensors", entries[0].name))
    };
    let (model, _, source) = load(&mut fresh());
    assert_eq!(source, LoadSource::DiskCache);
    assert_eq!(decode(&model, Kernels::Plain), reference);

    type Damage<'a> = (&'a str, &'a dyn Fn(&Path));
    let damages: [Damage; 3] = [
        ("flipped bytes", &|p: &Path| {
            let mut bytes = std::fs::read(p).unwrap();
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0xff;
            bytes[mid + 1] ^= 0x55;
            std::fs::write(p, bytes).unwrap();
        }),
        ("truncated", &|p: &Path| {
            let len = std::fs::metadata(p).unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .unwrap()
                .set_len(len - 1000)
                .unwrap();
        }),
        ("sidecar missing", &|p: &Path| {
            std::fs::remove_file(p.with_extension("json")).unwrap();
        }),
    ];
    for (what, damage) in damages {
        damage(&entry());
        let (model, _, source) = load(&mut fresh());
        assert_eq!(source, LoadSource::Checkpoint, "{what}: must not be used");
        assert_eq!(decode(&model, Kernels::Plain), reference, "{what}");
        let (model, _, source) = load(&mut fresh());
        assert_eq!(
            source,
            LoadSource::DiskCache,
            "{what}: rebuilt entry is used"
        );
        assert_eq!(decode(&model, Kernels::Plain), reference, "{what}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_disk_cache_keeps_its_size_bound_and_clears() {
    let device = Device::flex();
    let dir = scratch("limit");
    let mut cache = ModelCache::new(settings(true, &dir, GIB, GIB));
    cache.get(&model_a(), &device, f32_options()).unwrap();
    let one_entry = DiskCache::new(&dir, GIB).total_bytes();
    assert!(one_entry > 0);
    // A limit that holds one f32 entry: writing a second entry evicts the older one.
    let mut cache = ModelCache::new(settings(true, &dir, GIB, one_entry + one_entry / 4));
    cache.get(&model_b(), &device, f32_options()).unwrap();
    let disk = DiskCache::new(&dir, one_entry + one_entry / 4);
    assert_eq!(disk.entries().len(), 1);
    assert!(disk.total_bytes() <= one_entry + one_entry / 4);
    // A limit smaller than any entry: nothing is kept, and loading still works.
    let mut tiny = ModelCache::new(settings(true, &dir, GIB, 1000));
    let (_, _, source) = tiny.get(&model_a(), &device, f32_options()).unwrap();
    assert_eq!(source, LoadSource::Checkpoint);
    assert!(disk.clear().unwrap() > 0);
    assert!(disk.entries().is_empty());
    assert!(
        std::fs::read_dir(&dir).unwrap().next().is_none(),
        "clear leaves nothing"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A compile failure (test hook) warns once per model and the images equal the plain path's.
#[test]
fn a_forced_compile_failure_warns_once_and_still_generates() {
    let device = wgpu();
    let mut cache = ModelCache::new(CacheSettings::off());
    let (model, _, _) = cache.get(&model_a(), &device, f32_options()).unwrap();
    let mut plain_notices = Notices::default();
    let plain = generate(&model, 3, false, &mut plain_notices);

    let (model, _, _) = cache.get(&model_a(), &device, f32_options()).unwrap();
    model.vae_compile.force_failure(true);
    let mut notices = Notices::default();
    let first = generate(&model, 3, true, &mut notices);
    let second = generate(&model, 3, true, &mut notices);
    let warnings: Vec<_> = notices
        .0
        .iter()
        .filter(|n| matches!(n, Notice::VaeCompileFallback { .. }))
        .collect();
    assert_eq!(warnings.len(), 1, "{:?}", notices.0);
    assert!(warnings[0].to_string().contains("VAE compilation is off"));
    assert!(model.vae_compile.fallback_reason().is_some());
    assert_eq!(first, plain);
    assert_eq!(second, plain);
}

/// The text-encoder setting keys a resident model by where its encoders are: an SD 1.x model
/// holds them on the device for `auto` and `device` alike, so switching between the two loads
/// nothing and releases nothing; on the CPU backend nothing is ever parked.
#[test]
fn a_text_encoder_setting_that_moves_nothing_keeps_the_resident_model() {
    use latent_engine::TextEncoders;
    let settings = CacheSettings {
        enabled: true,
        memory_budget: GIB,
        disk_dir: None,
        disk_limit: 0,
    };
    let mut cache = ModelCache::new(settings);
    let device = Device::flex();
    let with = |text_encoders| LoadOptions {
        text_encoders,
        ..f32_options()
    };
    let (first, _, source) = cache
        .get(&model_a(), &device, with(TextEncoders::Device))
        .unwrap();
    assert_eq!(source, LoadSource::Checkpoint);
    assert_eq!(cache.resident_bytes(), first.device_weight_bytes());
    let (again, _, source) = cache
        .get(&model_a(), &device, with(TextEncoders::Auto))
        .unwrap();
    assert_eq!(source, LoadSource::Memory);
    assert!(std::sync::Arc::ptr_eq(&first, &again));
    for setting in [TextEncoders::Auto, TextEncoders::Host] {
        assert!(first.parks_as(setting));
        cache.release_other_parking(setting);
        assert_eq!(cache.resident_bytes(), first.device_weight_bytes());
    }
}
