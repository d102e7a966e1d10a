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
    let unet = &model.unet;
    let d = unet.config().cross_attention_dim;
    let random =
        |shape: [usize; 3]| Tensor::<3>::random(shape, Distribution::Normal(0.0, 1.0), &device);
    let context = random([2, 77, d]);
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
