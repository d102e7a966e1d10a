use super::*;
use crate::checkpoint::Checkpoint;
use crate::kernels::testing::{read, relative, wgpu};
use crate::{LoadOptions, StableDiffusion};
use burn::tensor::Distribution;

/// On lavapipe the step is recorded after the warm-up runs, and every step, warm-up and
/// replayed, equals the step run launch by launch on the same inputs (new latents and
/// timestep each step, as in sampling; plain steps interleaved, as another model would), and
/// after the recording is released.
#[test]
fn replayed_steps_equal_the_steps_run_launch_by_launch() {
    let device = wgpu();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/tiny-sd.safetensors");
    let ckpt = Checkpoint::open(&path).unwrap();
    let model = StableDiffusion::load(&ckpt, &device, LoadOptions::default()).unwrap();
    let unet = &model.unet().expect("the UNet");
    let d = unet.config().cross_attention_dim;
    let random =
        |shape: [usize; 3]| Tensor::<3>::random(shape, Distribution::Normal(0.0, 1.0), &device);
    let context = random([2, 77, d]);
    // The prompt's keys and values projected once: one entry a cross-attention layer, and a
    // step from them equal to one whose layers project them.
    let kv = unet.project_context(&context);
    assert_eq!(
        kv.len(),
        6,
        "tiny-sd's cross-attention layers (2 down, 1 mid, 3 up)"
    );
    let x = Tensor::<4>::random([2, 4, 8, 8], Distribution::Normal(0.0, 1.0), &device);
    let projected = Context::projected(&context, &kv);
    let from_kv = read(unet.forward_context(x.clone(), &[700.0], projected, None));
    let from_tokens = read(unet.forward(x.clone(), &[700.0], &context));
    assert_eq!(from_kv, from_tokens);
    // Keys and values that do not fit (none, or another batch's) leave each layer to project
    // its own from the tokens: the same step, never a wrong one.
    let none = Context::projected(&context, &[]);
    let one_image = unet.project_context(&random([1, 77, d]));
    let misfit = Context::projected(&context, &one_image);
    for (name, ctx) in [("none", none), ("another batch's", misfit)] {
        let got = read(unet.forward_context(x.clone(), &[700.0], ctx, None));
        assert_eq!(got, from_tokens, "{name}");
    }
    let mut steps = UNetSteps::new(unet, context.clone());
    for i in 0..WARMUP_RUNS + 3 {
        assert_eq!(steps.is_replaying(), i > WARMUP_RUNS, "step {i}");
        let x = Tensor::<4>::random([2, 4, 8, 8], Distribution::Normal(0.0, 1.0), &device);
        let t = 950.0 - 137.0 * i as f32;
        let got = read(steps.forward(x.clone(), t));
        let want = read(unet.forward(x, &[t], &context));
        let diff = relative(&got, &want);
        assert!(diff <= 1e-5, "step {i} (t {t}) differs by {diff:e}");
    }
    assert!(steps.is_replaying());
    // A shape already run records after one ordinary step.
    let mut tuned = UNetSteps::new(unet, context.clone()).tuned();
    for i in 0..=TUNED_WARMUP_RUNS {
        assert_eq!(
            tuned.is_replaying(),
            i > TUNED_WARMUP_RUNS,
            "tuned step {i}"
        );
        let x = Tensor::<4>::random([2, 4, 8, 8], Distribution::Normal(0.0, 1.0), &device);
        let got = read(tuned.forward(x.clone(), 500.0));
        let want = read(unet.forward(x, &[500.0], &context));
        assert!(relative(&got, &want) <= 1e-5, "tuned step {i}");
    }
    assert!(tuned.is_replaying(), "recorded after one ordinary step");
    // Parked and resumed by the next generation: its conditioning copied in, every step
    // replayed from the first; a shape or thread it does not fit records afresh.
    let recording = tuned.park().expect("recorded");
    assert!(!tuned.is_replaying());
    drop(tuned);
    let other = random([2, 77, d]);
    let mut resumed = UNetSteps::resume(unet, other.clone(), None, recording).expect("same shapes");
    for i in 0..2 {
        assert!(resumed.is_replaying(), "resumed step {i}");
        let x = Tensor::<4>::random([2, 4, 8, 8], Distribution::Normal(0.0, 1.0), &device);
        let got = read(resumed.forward(x.clone(), 300.0));
        let want = read(unet.forward(x, &[300.0], &other));
        assert!(relative(&got, &want) <= 1e-5, "resumed step {i}");
    }
    // A resumed recording of another latent size records afresh at the new one.
    let recording = resumed.park().expect("still recorded");
    let mut bigger = UNetSteps::resume(unet, context.clone(), None, recording).expect("fits");
    for i in 0..=WARMUP_RUNS + 1 {
        let x = Tensor::<4>::random([2, 4, 16, 8], Distribution::Normal(0.0, 1.0), &device);
        let got = read(bigger.forward(x.clone(), 500.0));
        let want = read(unet.forward(x, &[500.0], &context));
        assert!(relative(&got, &want) <= 1e-5, "another size, step {i}");
    }
    assert!(bigger.is_replaying(), "recorded again at 16×8");
    let recording = bigger.park().expect("recorded");
    let longer = random([2, 154, d]);
    assert!(UNetSteps::resume(unet, longer, None, recording).is_none());
    let recording = {
        let mut s = UNetSteps::new(unet, context.clone()).tuned();
        for _ in 0..=TUNED_WARMUP_RUNS {
            let x = Tensor::<4>::random([2, 4, 8, 8], Distribution::Normal(0.0, 1.0), &device);
            let _ = s.forward(x, 500.0);
        }
        s.park().expect("recorded")
    };
    let elsewhere = std::thread::scope(|scope| {
        scope
            .spawn(|| UNetSteps::resume(unet, context.clone(), None, recording).is_some())
            .join()
    });
    assert!(!elsewhere.expect("thread"), "another thread's stream");
    // Released (before a decode), the steps go on launch by launch, still equal.
    steps.release();
    assert!(!steps.is_replaying());
    let x = Tensor::<4>::random([2, 4, 8, 8], Distribution::Normal(0.0, 1.0), &device);
    let got = read(steps.forward(x.clone(), 10.0));
    let want = read(unet.forward(x, &[10.0], &context));
    assert!(relative(&got, &want) <= 1e-5);
}

/// Preparing a capture after the pool's pages grew (a larger allocation, as a decode's, leaves
/// the weights' pages outdated) moves nothing into new pages: the patched cubecl-wgpu relocates
/// only into room the pool already holds. Upstream moved the weights into a page of their own
/// first, holding both copies at once (SDXL at 1024²: 9.75 GiB against the run's 6.9,
/// BENCHMARKS.md thirty-third session). The weights keep their values either way.
#[test]
fn preparing_a_capture_never_grows_the_pool() {
    // A device of its own (the first adapter under its own kind, not the tests' shared
    // default): the other tests' allocations would move the pool's figures.
    let all = crate::adapters::enumerate();
    let first = all.first().expect("a wgpu adapter (lavapipe in CI)");
    let device = Device::wgpu(first.device_kind(&all));
    let values: Vec<f32> = (0..(1 << 20)).map(|i| (i % 977) as f32).collect();
    let weights = Tensor::<1>::from_data(
        burn::tensor::TensorData::new(values.clone(), [values.len()]),
        (&device, DType::F32),
    );
    let _ = read(weights.clone().narrow(0, 0, 4));
    // 64 MiB: the pages grow to it, and the weights' 4 MiB page is outdated.
    let larger = Tensor::<1>::ones([16 << 20], (&device, DType::F32));
    let _ = read(larger.clone().narrow(0, 0, 4));
    device.sync().expect("sync");
    let reserved = || {
        device
            .memory_pool_usage()
            .expect("wgpu pool")
            .bytes_reserved
    };
    let before = reserved();
    Dispatch::graph_prepare(device.as_dispatch()).expect("prepare a capture");
    let _ = Dispatch::graph_stop_capture(device.as_dispatch());
    device.sync().expect("sync");
    let after = reserved();
    assert!(
        after <= before,
        "the pool grew from {before} to {after} bytes preparing a capture"
    );
    assert_eq!(read(weights), values, "the weights after the preparation");
    assert_eq!(read(larger.narrow(0, 0, 2)), vec![1.0, 1.0]);
}
