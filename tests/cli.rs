//! `latent-studio generate` end to end: the PNG equals diffusers' image, carries A1111 parameters,
//! never clobbers, and bad input exits non-zero with one line and no file.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use latent_engine::checkpoint::SafetensorsFile;
use latent_engine::image_io::decode_png;
use latent_engine::parameters::Parameters;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("latent-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn studio(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_latent-studio"))
        .args(args)
        .output()
        .expect("run latent-studio")
}

fn model() -> String {
    fixtures().join("tiny-sd.safetensors").display().to_string()
}

/// Largest per-channel difference between `image` and diffusers' case0 image.
fn worst_vs_case0(image: &latent_engine::image_io::RgbImage) -> u8 {
    worst_vs(image, "pipeline-expected.safetensors", "case0.image")
}

/// Largest per-channel difference between `image` and the uint8 image `key` of a fixture file.
fn worst_vs(image: &latent_engine::image_io::RgbImage, file: &str, key: &str) -> u8 {
    let expected = SafetensorsFile::open(&fixtures().join(file)).unwrap();
    let want = expected.bytes(expected.entry(key).unwrap());
    assert_eq!(image.pixels.len(), want.len());
    image
        .pixels
        .iter()
        .zip(want)
        .map(|(a, b)| a.abs_diff(*b))
        .max()
        .unwrap()
}

/// pipeline_cases.json case0: euler/normal, 64x64, seed 42, 6 steps, CFG 7.5.
const CASE0: &[&str] = &[
    "--prompt",
    "a watercolor fox in the snow",
    "--negative",
    "blurry, low quality",
    "--seed",
    "42",
    "--steps",
    "6",
    "--cfg",
    "7.5",
    "--sampler",
    "euler",
    "--schedule",
    "normal",
    "--width",
    "64",
    "--height",
    "64",
    "--precision",
    "f32",
];

/// `generate` writes diffusers' case0 image with A1111 parameters, on the CPU backend and on the
/// GPU. The GPU run (the software adapter in CI, picked by part of its name in another case:
/// "llvmpipe (LLVM 15…)" → `--device LLVMPIPE`) also has VAE compilation forced to fail (test
/// hook): exactly one warning line and the image still right. The GPU run keeps its kernel
/// tuning in a folder; a second GPU process restores it, tunes nothing (the file is not
/// rewritten) and does not announce tuning.
#[test]
fn generate_writes_diffusers_image_with_parameters() {
    let dir = scratch("ok");
    let out = dir.join("fox.png");
    let tuning_dir = dir.join("tuning");
    let tuning_s = tuning_dir.display().to_string();
    let word = software_adapter().map(|soft| {
        soft.name
            .split_whitespace()
            .next()
            .unwrap_or(&soft.name)
            .to_uppercase()
    });
    let gpu = word.as_deref().unwrap_or("auto");
    let forced = [
        (latent_studio::test_seam::FAIL_VAE_COMPILE, "1"),
        ("LATENT_STUDIO_TUNING_CACHE", tuning_s.as_str()),
    ];
    for (device, envs) in [("cpu", &[][..]), (gpu, &forced[..])] {
        let extra = ["--device", device, "--vae-compile", "on"];
        let o = generate_with(&extra, &out, envs);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{device}: {stderr}");
        assert!(
            stderr.contains("step 6/6") && stderr.contains("it/s"),
            "{stderr}"
        );
        // The GPU path warns once; the CPU backend has nothing to compile.
        let on_gpu = device != "cpu" && !latent_engine::adapters::enumerate().is_empty();
        let warnings = stderr
            .lines()
            .filter(|l| l.contains("VAE compilation"))
            .count();
        assert_eq!(warnings, usize::from(on_gpu), "{device}: {stderr}");
        // A fresh process tunes its kernels at the first step of a size: said on a GPU only.
        let tuning = stderr.contains("tuning kernels for 64x64");
        assert_eq!(tuning, on_gpu, "{device}: {stderr}");

        let (image, text) = decode_png(&std::fs::read(&out).unwrap()).unwrap();
        let worst = worst_vs_case0(&image);
        assert!(worst <= 1, "{device}: pixels differ by {worst}");

        let p = Parameters::parse_a1111(&text.expect("parameters chunk")).unwrap();
        assert_eq!(p.prompt, "a watercolor fox in the snow");
        assert_eq!(p.negative_prompt, "blurry, low quality");
        assert_eq!(
            (p.steps, p.seed, p.width, p.height, p.cfg_scale),
            (6, 42, 64, 64, 7.5)
        );
        assert_eq!(
            (p.sampler.as_str(), p.schedule.as_str()),
            ("Euler", "Normal")
        );
        assert_eq!(p.model.as_deref(), Some("tiny-sd"));
        assert_eq!(p.model_hash.as_ref().map(String::len), Some(10));
    }
    if latent_engine::adapters::enumerate().is_empty() {
        return;
    }
    // The tuning the GPU run saved: one file, with results.
    let files: Vec<PathBuf> = std::fs::read_dir(&tuning_dir)
        .expect("a tuning folder")
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let saved = std::fs::read(&files[0]).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&saved).unwrap();
    let results = json["entries"].as_array().map_or(0, Vec::len);
    assert!(results > 0, "no tuning results saved: {json}");
    // A new process restores it all, tunes nothing new and says no tuning is coming.
    let o = generate_with(&["--device", gpu, "--vae-compile", "on"], &out, &forced);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("kernel tuning restored: {results} results")),
        "{stderr}"
    );
    assert!(!stderr.contains("tuning kernels for"), "{stderr}");
    assert_eq!(
        std::fs::read(&files[0]).unwrap(),
        saved,
        "the second run tuned something again"
    );
    assert!(worst_vs_case0(&decode_png(&std::fs::read(&out).unwrap()).unwrap().0) <= 1);
}

/// An inpainting checkpoint (the tiny single file with a 9-channel `conv_in`): `inspect` says so,
/// and `generate` with no picture loads the VAE encoder it needs, conditions on a blank picture,
/// and writes diffusers' image of tests/fixtures/inpaint_model_cases.json case2 within ±1.
#[test]
fn generate_runs_an_inpainting_checkpoint_like_diffusers() {
    let expected =
        SafetensorsFile::open(&fixtures().join("inpaint-model-expected.safetensors")).unwrap();
    let conv_in = expected.entry("conv_in.weight").unwrap();
    let (shape, bytes) = (conv_in.shape.clone(), expected.bytes(conv_in).to_vec());
    let model = common::altered_single_file("cli-inpainting", |k, d, s, b| {
        Some(match k == "model.diffusion_model.input_blocks.0.0.weight" {
            true => ("F32".into(), shape.clone(), bytes.clone()),
            false => (d.into(), s.to_vec(), b.to_vec()),
        })
    });
    let out = scratch("inpainting").join("fox.png");
    let (model, out_s) = (model.display().to_string(), out.display().to_string());
    let o = studio(&["inspect", "--model", &model]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        stdout.contains("unet input channels: 9 (inpainting)"),
        "{stdout}"
    );
    let o = studio(&[
        "generate",
        "--model",
        &model,
        "--out",
        &out_s,
        "--device",
        "cpu",
        "--precision",
        "f32",
        "--prompt",
        "a watercolor fox in the snow",
        "--negative",
        "blurry",
        "--seed",
        "5",
        "--steps",
        "4",
        "--cfg",
        "7.5",
        "--sampler",
        "euler",
        "--width",
        "64",
        "--height",
        "64",
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(stderr.contains("SD 1.x inpainting"), "{stderr}");
    let (image, _) = decode_png(&std::fs::read(&out).unwrap()).unwrap();
    let worst = worst_vs(&image, "inpaint-model-expected.safetensors", "case2.image");
    assert!(worst <= 1, "pixels differ by {worst}");
}

/// An SDXL folder through `generate` on the CPU with size and crop conditioning from its flags:
/// diffusers' `StableDiffusionXLPipeline` image of `tests/fixtures/sdxl_cases.json` case1
/// (original 128x192, crop 16 from the top, target 64x96; Euler a, the zeroed empty negative)
/// within ±1, and parameters that name the model and restore the conditioning.
#[test]
fn generate_runs_sdxl_like_diffusers() {
    let dir = scratch("sdxl");
    let out = dir.join("xl.png");
    let model = fixtures().join("tiny-sdxl").display().to_string();
    let out_s = out.display().to_string();
    let o = studio(&[
        "generate",
        "--model",
        &model,
        "--device",
        "cpu",
        "--out",
        &out_s,
        "--overwrite",
        "--prompt",
        "a red bicycle",
        "--seed",
        "7",
        "--steps",
        "4",
        "--cfg",
        "5",
        "--sampler",
        "euler_a",
        "--schedule",
        "normal",
        "--width",
        "64",
        "--height",
        "96",
        // diffusers' original_size (192, 128), crops_coords_top_left (16, 0), target_size (96, 64).
        "--sdxl-original-size",
        "128x192",
        "--sdxl-crop",
        "0x16",
        "--sdxl-target-size",
        "64x96",
        "--precision",
        "f32",
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(stderr.contains("SDXL"), "the family is reported: {stderr}");
    let (image, text) = decode_png(&std::fs::read(&out).unwrap()).unwrap();
    let worst = worst_vs(&image, "sdxl-expected.safetensors", "case1.image");
    assert!(worst <= 1, "pixels differ by {worst}");
    let p = Parameters::parse_a1111(&text.expect("parameters chunk")).unwrap();
    assert_eq!((p.steps, p.seed, p.width, p.height), (4, 7, 64, 96));
    let conditioning = latent_engine::pipeline::SizeConditioning {
        original: [192, 128],
        crop_top_left: [16, 0],
        target: [96, 64],
    };
    assert_eq!(
        p.size_conditioning().map(Result::ok),
        Some(Some(conditioning))
    );
    assert_eq!(p.model.as_deref(), Some("tiny-sdxl"));
}

/// `--refiner` hands the tiny SDXL's run over to the tiny refiner as diffusers' two pipelines do
/// (tests/fixtures/sdxl_refiner_cases.json case1: Euler a, switch 0.8, within ±1), and the
/// parameters name it as A1111 does; a refiner as the model, or behind an SD 1.x model, is one
/// clear line and no file.
#[test]
fn generate_hands_over_to_the_sdxl_refiner() {
    let dir = scratch("refiner");
    let out = dir.join("refined.png");
    let path = |name: &str| fixtures().join(name).display().to_string();
    let (base, refiner, out_s) = (
        path("tiny-sdxl"),
        path("tiny-sdxl-refiner"),
        out.display().to_string(),
    );
    let run = |model: &str, extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            model,
            "--refiner",
            &refiner,
            "--device",
            "cpu",
            "--out",
            &out_s,
            "--overwrite",
            "--prompt",
            "a red bicycle",
            "--seed",
            "7",
            "--steps",
            "10",
            "--cfg",
            "5",
            "--sampler",
            "euler_a",
            "--schedule",
            "normal",
            "--width",
            "128",
            "--height",
            "64",
            "--precision",
            "f32",
        ];
        args.extend_from_slice(extra);
        studio(&args)
    };
    let o = run(&base, &["--refiner-switch-at", "0.8"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let (image, text) = decode_png(&std::fs::read(&out).unwrap()).unwrap();
    let worst = worst_vs(&image, "sdxl-refiner-expected.safetensors", "case1.image");
    assert!(worst <= 1, "pixels differ by {worst}");
    let text = text.expect("parameters chunk");
    assert!(text.contains("Refiner: tiny-sdxl-refiner ["), "{text}");
    let p = Parameters::parse_a1111(&text).unwrap();
    let switch = p.refiner().expect("a refiner").expect("valid");
    assert_eq!(switch.switch_at, 0.8);

    std::fs::remove_file(&out).unwrap();
    for (model, extra, says) in [
        (refiner.as_str(), &[][..], "pick this one as its refiner"),
        (&path("tiny-sd"), &[][..], "SDXL model"),
        (&base, &["--refiner-switch-at", "0"][..], "(0, 1]"),
    ] {
        let o = run(model, extra);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && stderr.contains(says),
            "{model}: {stderr}"
        );
        assert_eq!(
            stderr
                .trim()
                .lines()
                .filter(|l| l.starts_with("error"))
                .count(),
            1,
            "{stderr}"
        );
        assert!(!out.exists(), "{model}");
    }
}

/// `--embeddings`: a name in the prompt takes its file's vectors, the PNG records A1111's `TI
/// hashes`, and the folder's files for other models are named as skipped.
#[test]
fn embeddings_from_a_folder_are_used_and_recorded() {
    let dir = scratch("embeddings");
    let out = dir.join("ti.png");
    let (model, out_s) = (model(), out.display().to_string());
    let folder = fixtures().join("embeddings").display().to_string();
    let o = studio(&[
        "generate",
        "--model",
        &model,
        "--device",
        "cpu",
        "--out",
        &out_s,
        "--overwrite",
        "--prompt",
        "a fox in tinystyle",
        "--seed",
        "3",
        "--steps",
        "2",
        "--width",
        "64",
        "--height",
        "64",
        "--embeddings",
        &folder,
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning") && stderr.contains("wide"),
        "{stderr}"
    );
    let (_, text) = decode_png(&std::fs::read(&out).unwrap()).unwrap();
    let text = text.expect("parameters chunk");
    assert!(text.contains("TI hashes: \"tinystyle: "), "{text}");
}

#[test]
fn never_overwrites_and_numbers_outputs() {
    let dir = scratch("numbered");
    let existing = dir.join("keep.png");
    std::fs::write(&existing, b"artist's work").unwrap();
    let model = model();
    let out_s = existing.display().to_string();
    let quick = [
        "--prompt", "x", "--steps", "1", "--width", "64", "--height", "64", "--device", "cpu",
        "--seed", "1",
    ];
    let mut args = vec!["generate", "--model", &model, "--out", &out_s];
    args.extend_from_slice(&quick);
    let o = studio(&args);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--overwrite"));
    assert_eq!(std::fs::read(&existing).unwrap(), b"artist's work");

    let outputs = dir.join("outputs").display().to_string();
    for n in 1..=2 {
        let mut args = vec!["generate", "--model", &model, "--outputs", &outputs];
        args.extend_from_slice(&quick);
        let o = studio(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let printed = String::from_utf8_lossy(&o.stdout);
        assert!(
            printed.trim().ends_with(&format!("{n:05}-1.png")),
            "{printed}"
        );
    }
}

#[test]
fn bad_input_exits_nonzero_with_one_line_and_no_file() {
    let dir = scratch("bad");
    let model = model();
    let out = dir.join("never.png");
    let out_s = out.display().to_string();
    let cases: &[(&[&str], &str)] = &[
        (&["--steps", "0"], "steps"),
        (&["--width", "65"], "multiple"),
        (&["--sampler", "plms"], "sampler"),
        (&["--cfg", "NaN"], "CFG"),
        (&["--cfg", "-2"], "CFG"),
        (&["--schedule", "exponential"], "schedule"),
        (&["--sampler", "ddim", "--schedule", "karras"], "karras"),
        (&["--hires-scale", "9"], "between 1 and 4"),
        (
            &["--hires-scale", "2", "--hires-upscaler", "esrgan"],
            "upscaler",
        ),
        (&["--init-image", "/nonexistent/x.png"], "x.png"),
        (&["--mask", "mask.png"], "needs --init-image"),
        (&["--sdxl-original-size", "0x512"], "sdxl-original-size"),
        (&["--sdxl-crop", "8"], "sdxl-crop"),
        (&["--sdxl-crop", "8x8"], "SDXL models only"),
    ];
    for (extra, needle) in cases {
        let mut args = vec![
            "generate", "--model", &model, "--prompt", "x", "--device", "cpu", "--out", &out_s,
        ];
        args.extend_from_slice(extra);
        let o = studio(&args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{extra:?} succeeded");
        assert!(
            stderr.to_lowercase().contains(&needle.to_lowercase()),
            "{extra:?}: {stderr}"
        );
        assert!(!out.exists(), "{extra:?} left a file");
    }
    // An output folder that does not exist, and a checkpoint that is not one.
    let o = studio(&[
        "generate",
        "--model",
        &model,
        "--prompt",
        "x",
        "--out",
        "/nonexistent/dir/x.png",
    ]);
    assert!(!o.status.success());
    assert_eq!(
        String::from_utf8_lossy(&o.stderr).trim().lines().count(),
        1,
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let bogus = dir.join("bogus.safetensors");
    std::fs::write(&bogus, b"not a checkpoint").unwrap();
    let o = studio(&[
        "generate",
        "--model",
        &bogus.display().to_string(),
        "--prompt",
        "x",
        "--device",
        "cpu",
        "--out",
        &out_s,
    ]);
    assert!(!o.status.success());
    assert!(!out.exists());
}

/// Every preview method leaves the image bit-identical to `--preview none`; `--preview-dir` writes
/// the published previews at the method's resolution; a broken `--taesd` file is a warning and a
/// latent2rgb fallback, never a failed generation.
#[test]
fn previews_write_step_files_and_never_change_the_image() {
    let dir = scratch("previews");
    let model = model();
    let taesd = fixtures()
        .join("tiny-taesd_decoder.safetensors")
        .display()
        .to_string();
    let broken = dir.join("broken_taesd.safetensors");
    std::fs::write(&broken, b"not a safetensors file").unwrap();
    let broken = broken.display().to_string();
    let run = |name: &str, extra: &[&str]| -> (Vec<u8>, String, PathBuf) {
        let out = dir.join(format!("{name}.png")).display().to_string();
        let previews = dir.join(format!("{name}-previews"));
        let previews_s = previews.display().to_string();
        let mut args = vec![
            "generate",
            "--model",
            &model,
            "--device",
            "cpu",
            "--out",
            &out,
            "--preview-dir",
            &previews_s,
        ];
        args.extend_from_slice(CASE0);
        args.extend_from_slice(extra);
        let o = studio(&args);
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{name}: {stderr}");
        let (image, _) = decode_png(&std::fs::read(&out).unwrap()).unwrap();
        (image.pixels, stderr, previews)
    };
    let (plain, _, none_dir) = run("none", &["--preview", "none"]);
    assert_eq!(std::fs::read_dir(&none_dir).unwrap().count(), 0);
    for (name, extra, side) in [
        ("latent2rgb", vec!["--preview", "latent2rgb"], 8),
        ("taesd", vec!["--preview", "taesd", "--taesd", &taesd], 64),
        (
            "full",
            vec!["--preview", "full", "--preview-interval", "2"],
            64,
        ),
        ("auto", vec!["--preview", "auto", "--taesd", &taesd], 64),
        ("broken", vec!["--preview", "taesd", "--taesd", &broken], 8),
    ] {
        let (pixels, stderr, previews) = run(name, &extra);
        assert_eq!(pixels, plain, "{name} changed the image");
        // The last step is always previewed; earlier ones may be skipped when the readback lags.
        let last = previews.join("step_006.png");
        let (preview, _) = decode_png(&std::fs::read(&last).unwrap()).unwrap();
        assert_eq!((preview.width, preview.height), (side, side), "{name}");
        if name == "broken" {
            assert!(
                stderr.contains("TAESD decoder") && stderr.contains("latent2rgb"),
                "{stderr}"
            );
        }
    }
}

/// `devices` lists adapters and marks the automatic choice; a `gpu:N` that does not exist is a
/// one-line error naming it, before any model is loaded.
#[test]
fn devices_lists_adapters_and_a_missing_gpu_is_a_clear_error() {
    let o = studio(&["devices"]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        stdout.contains("no GPU adapter found")
            || (stdout.contains("gpu:0") && stdout.contains("* gpu:")),
        "{stdout}"
    );
    let model = model();
    let o = studio(&[
        "generate", "--model", &model, "--prompt", "x", "--device", "gpu:99",
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(stderr.contains("no adapter gpu:99"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

fn generate_with(extra: &[&str], out: &Path, envs: &[(&str, &str)]) -> Output {
    let model = model();
    let out_s = out.display().to_string();
    let mut args = vec![
        "generate",
        "--model",
        &model,
        "--out",
        &out_s,
        "--overwrite",
    ];
    args.extend_from_slice(CASE0);
    args.extend_from_slice(extra);
    Command::new(env!("CARGO_BIN_EXE_latent-studio"))
        .args(&args)
        // Kernel tuning stays in memory unless a case names a folder (after this, so it wins).
        .env("LATENT_STUDIO_TUNING_CACHE", "off")
        .envs(envs.iter().copied())
        .output()
        .expect("run latent-studio")
}

/// `--init-image` runs img2img as diffusers' img2img pipeline (tests/fixtures/img2img_cases.json
/// case0), at the image's own size, and records the strength; a strength that runs no step is
/// refused before any work.
#[test]
fn init_image_runs_img2img_like_diffusers() {
    let dir = scratch("img2img");
    let out = dir.join("img2img.png");
    let (model, out_s) = (model(), out.display().to_string());
    let init = fixtures().join("img2img-init.png").display().to_string();
    let args = |strength: &'static str| {
        vec![
            "generate",
            "--model",
            &model,
            "--device",
            "cpu",
            "--out",
            &out_s,
            "--overwrite",
            "--init-image",
            &init,
            "--denoising-strength",
            strength,
            "--prompt",
            "a watercolor fox in the snow",
            "--negative",
            "blurry",
            "--seed",
            "7",
            "--steps",
            "6",
            "--cfg",
            "7.5",
            "--sampler",
            "euler",
            "--precision",
            "f32",
        ]
    };
    let o = studio(&args("0.1"));
    assert!(!o.status.success() && !out.exists());
    assert!(String::from_utf8_lossy(&o.stderr).contains("runs no step"));
    let o = studio(&args("0.6"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (image, text) = decode_png(&std::fs::read(&out).unwrap()).unwrap();
    let text = text.unwrap();
    assert!(
        text.contains("Size: 64x64") && text.contains("Denoising strength: 0.6"),
        "{text}"
    );
    let expected = SafetensorsFile::open(&fixtures().join("img2img-expected.safetensors")).unwrap();
    let want = expected.bytes(expected.entry("case0.image").unwrap());
    let worst = image
        .pixels
        .iter()
        .zip(want)
        .map(|(a, b)| a.abs_diff(*b))
        .max()
        .unwrap();
    assert!(worst <= 1, "pixels differ by up to {worst}");
}

/// `--lora` adds A1111's tag to the prompt; the LoRA from `--loras` is merged, the image changes,
/// and the parameters keep the tag and A1111's `Lora hashes` (the hash of the file's tensor data,
/// computed here with Python's hashlib). A tag without a folder is refused before any work.
#[test]
fn loras_are_merged_and_recorded_as_a1111_does() {
    let dir = scratch("lora");
    let out = dir.join("lora.png");
    let loras = fixtures().join("loras").display().to_string();
    let o = generate_with(
        &["--device", "cpu", "--loras", &loras, "--lora", "kohya:0.7"],
        &out,
        &[],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && stderr.contains("LoRAs merged"),
        "{stderr}"
    );
    let (image, text) = decode_png(&std::fs::read(&out).unwrap()).unwrap();
    let text = text.unwrap();
    assert!(
        text.contains(r#"Lora hashes: "kohya: 9914b8a508a5""#),
        "{text}"
    );
    let p = Parameters::parse_a1111(&text).unwrap();
    assert_eq!(p.prompt, "a watercolor fox in the snow <lora:kohya:0.7>");
    assert!(worst_vs_case0(&image) > 8, "the LoRA changed nothing");
    std::fs::remove_file(&out).unwrap();
    let o = generate_with(&["--device", "cpu", "--lora", "kohya:0.7"], &out, &[]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && !out.exists(), "{stderr}");
    assert!(
        stderr.contains("kohya") && stderr.contains("--loras"),
        "{stderr}"
    );
}

/// `--outpaint` extends the picture (here 16 px to the right, grown to a multiple of 8 from 13),
/// masks the band and 8 px beside it, and inpaints: the image is wider, the picture outside the
/// mask comes back exactly (no mask blur), and the band is new.
#[test]
fn outpaint_extends_the_canvas_and_keeps_the_picture() {
    let dir = scratch("outpaint");
    let out = dir.join("wide.png");
    let init = fixtures().join("img2img-init.png").display().to_string();
    let (model, out_s) = (model(), out.display().to_string());
    let o = studio(&[
        "generate",
        "--model",
        &model,
        "--device",
        "cpu",
        "--out",
        &out_s,
        "--overwrite",
        "--prompt",
        "a red apple",
        "--seed",
        "3",
        "--steps",
        "4",
        "--precision",
        "f32",
        "--init-image",
        &init,
        "--outpaint",
        "0,13,0,0",
        "--masked-content",
        "latent-noise",
        "--denoising-strength",
        "1",
        "--mask-blur",
        "0",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (image, _) = decode_png(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!((image.width, image.height), (80, 64));
    let original =
        latent_engine::image_io::load_image(&fixtures().join("img2img-init.png")).unwrap();
    let px = |img: &latent_engine::image_io::RgbImage, x: usize, y: usize| {
        img.pixels[(y * img.width + x) * 3..][..3].to_vec()
    };
    for y in 0..64 {
        for x in 0..56 {
            assert_eq!(px(&image, x, y), px(&original, x, y), "kept at ({x}, {y})");
        }
    }
    // The band is not the repeated edge column it started from.
    let edge_repeats = (0..64).all(|y| (64..80).all(|x| px(&image, x, y) == px(&original, 63, y)));
    assert!(!edge_repeats, "the band was not painted");
    let o = generate_with(&["--device", "cpu", "--outpaint", "8,0,0,0"], &out, &[]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--outpaint needs --init-image"));
}

/// `--model-cache on` writes the disk cache on the first launch and loads from it on the second,
/// with a byte-identical PNG; `off` writes nothing.
#[test]
fn model_cache_flag_uses_the_disk_cache_on_the_next_launch() {
    let dir = scratch("model-cache");
    let cache = dir.join("cache");
    let cache_s = cache.display().to_string();
    let mut pngs = Vec::new();
    for (i, expect) in ["from the checkpoint", "from the disk cache"]
        .iter()
        .enumerate()
    {
        let out = dir.join(format!("{i}.png"));
        let o = generate_with(
            &[
                "--device",
                "cpu",
                "--model-cache",
                "on",
                "--cache-dir",
                &cache_s,
            ],
            &out,
            &[],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert!(err.contains(expect), "launch {i}: {err}");
        pngs.push(std::fs::read(&out).unwrap());
    }
    assert!(
        pngs[0] == pngs[1],
        "the cached launch must give the same file"
    );
    let off = dir.join("off-cache");
    let o = generate_with(
        &[
            "--device",
            "cpu",
            "--model-cache",
            "off",
            "--cache-dir",
            &off.display().to_string(),
        ],
        &dir.join("off.png"),
        &[],
    );
    assert!(o.status.success());
    assert!(!off.exists(), "cache off writes nothing");
}

/// Every file under `dir`, recursively, as paths relative to it.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// A folder that cannot be written. Root ignores permission bits, so there it is a path under
/// a regular file instead, which no one can create.
fn unwritable_folder(base: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let ro = base.join("read-only");
    std::fs::create_dir_all(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let probe = ro.join("probe");
    if std::fs::write(&probe, b"x").is_err() {
        return ro;
    }
    let _ = std::fs::remove_file(&probe);
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = base.join("a-file");
    std::fs::write(&file, b"not a folder").unwrap();
    file.join("outputs")
}

/// An outputs folder that cannot be written fails with one line, and leaves no partial or
/// temporary file and every existing file as it was.
#[test]
fn unwritable_outputs_fail_cleanly() {
    let dir = scratch("unwritable");
    let target = unwritable_folder(&dir);
    let keep = dir.join("keep.png");
    std::fs::write(&keep, b"artist's work").unwrap();
    let before = files_under(&dir);
    let model = model();
    let quick = [
        "--prompt", "x", "--steps", "1", "--width", "64", "--height", "64", "--device", "cpu",
        "--seed", "1",
    ];
    let outputs = target.display().to_string();
    let out = target.join("x.png").display().to_string();
    let keep_s = keep.display().to_string();
    for (what, flags) in [
        ("--outputs", vec!["--outputs", outputs.as_str()]),
        ("--out", vec!["--out", out.as_str()]),
        ("--out existing", vec!["--out", keep_s.as_str()]),
    ] {
        let mut args = vec!["generate", "--model", &model];
        args.extend_from_slice(&flags);
        args.extend_from_slice(&quick);
        let o = studio(&args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{what} succeeded");
        // Progress lines may come first; the error is one line, the last, said once.
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "{what}: {stderr}");
        assert_eq!(stderr.trim().lines().last(), Some(errors[0]), "{what}");
        assert!(
            errors[0].matches("os error").count() <= 1,
            "{what}: {stderr}"
        );
        assert_eq!(files_under(&dir), before, "{what} left files behind");
        assert_eq!(std::fs::read(&keep).unwrap(), b"artist's work", "{what}");
    }
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(
        dir.join("read-only"),
        std::fs::Permissions::from_mode(0o755),
    );
}

/// `doctor` runs the demo model on the device and on the CPU backend and prints each component.
fn doctor_agrees(device: &str) {
    let o = studio(&["doctor", "--device", device]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{device}: {stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for component in ["text encoder", "UNet step", "VAE decode"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(component))
            .unwrap_or_else(|| panic!("{device}: no {component} line in {stdout}"));
        assert!(
            line.contains("max abs diff") && line.contains("rel error") && line.ends_with("ok"),
            "{device}: {line}"
        );
    }
    assert!(stdout.contains("all components agree"), "{stdout}");
    // Which compiler the device really got: none on the CPU backend, WGSL on lavapipe (CI),
    // SPIR-V on a hardware Vulkan adapter.
    let compiler = stdout
        .lines()
        .find(|l| l.starts_with("shader compiler: "))
        .unwrap_or_else(|| panic!("{device}: no shader compiler line in {stdout}"));
    if device == "cpu" {
        assert!(compiler.contains("CPU backend"), "{compiler}");
    } else {
        assert!(
            compiler.contains("WGSL") || compiler.contains("SPIR-V"),
            "{compiler}"
        );
    }
}

#[test]
fn doctor_on_cpu() {
    doctor_agrees("cpu");
    // A model that is not one is a clear error, not a pass.
    let o = studio(&[
        "doctor",
        "--device",
        "cpu",
        "--model",
        "/nonexistent.safetensors",
    ]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("nonexistent"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `auto` is lavapipe in CI: slow (kernels compile and autotune on first use), so a test of its own.
#[test]
fn doctor_on_auto() {
    doctor_agrees("auto");
}

/// A copy of the tiny model in `dir` whose VAE `post_quant_conv` is changed by `edit` (on its f32
/// weight and bias), with the tiny model's config beside it.
fn crafted_model(dir: &Path, edit: impl Fn(&mut Vec<f32>, &mut Vec<f32>)) -> String {
    let source = SafetensorsFile::open(&fixtures().join("tiny-sd.safetensors")).unwrap();
    let prefix = "first_stage_model.post_quant_conv.";
    let mut weight = source.read_f32(&format!("{prefix}weight")).unwrap();
    let mut bias = source.read_f32(&format!("{prefix}bias")).unwrap();
    edit(&mut weight, &mut bias);
    let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut tensors = Vec::new();
    for (name, entry) in source.entries() {
        let (dtype, bytes) = if name == &format!("{prefix}weight") {
            ("F32".to_string(), f32_bytes(&weight))
        } else if name == &format!("{prefix}bias") {
            ("F32".to_string(), f32_bytes(&bias))
        } else {
            (format!("{:?}", entry.dtype), source.bytes(entry).to_vec())
        };
        tensors.push((name.clone(), dtype, entry.shape.clone(), bytes));
    }
    let refs: Vec<_> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), d.as_str(), s.clone(), b.clone()))
        .collect();
    let path = dir.join("crafted.safetensors");
    common::write_safetensors(&path, &refs);
    std::fs::copy(fixtures().join("tiny-sd.json"), dir.join("crafted.json")).unwrap();
    path.display().to_string()
}

/// A VAE that decodes NaN whatever the precision: `generate` exits non-zero with one clear line
/// and writes no file, temporary or final. On the CPU: the guard does not depend on the backend
/// (`tests/nan_guard.rs`), and what this tests is the command's exit and files.
#[test]
fn a_vae_that_decodes_nan_fails_cleanly_without_a_file() {
    let dir = scratch("nan-vae");
    let model = crafted_model(&dir, |_, bias| bias[0] = f32::NAN);
    let outputs = dir.join("outputs");
    std::fs::create_dir_all(&outputs).unwrap();
    let out = outputs.join("nan.png");
    let out_s = out.display().to_string();
    let mut args = vec![
        "generate", "--model", &model, "--out", &out_s, "--device", "cpu",
    ];
    args.extend_from_slice(CASE0);
    let o = studio(&args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{err}");
    let last = err.trim().lines().last().unwrap_or_default();
    assert!(
        last.contains("NaN") && last.contains("no image"),
        "stderr: {err}"
    );
    assert!(
        files_under(&outputs).is_empty(),
        "{:?}",
        files_under(&outputs)
    );
}

/// A VAE that overflows f16 but not f32: `--precision f16` warns once, retries in f32 and writes
/// the image.
#[test]
fn an_f16_vae_overflow_is_retried_in_f32_with_one_warning() {
    let dir = scratch("f16-vae");
    // ~3e4 times the weights: finite in f16, but the activations pass 65504.
    let model = crafted_model(&dir, |weight, _| weight.iter_mut().for_each(|w| *w *= 3e4));
    let out = dir.join("retried.png");
    let out_s = out.display().to_string();
    let mut args = vec!["generate", "--model", &model, "--out", &out_s];
    // CASE0 without its last pair, `--precision f32`.
    args.extend_from_slice(&CASE0[..CASE0.len() - 2]);
    args.extend_from_slice(&[
        "--precision",
        "f16",
        "--device",
        "cpu",
        "--vae-tiling",
        "on",
    ]);
    let o = studio(&args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    let warnings = err.lines().filter(|l| l.contains("decoded again in f32"));
    assert_eq!(warnings.count(), 1, "{err}");
    let (image, _) = decode_png(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!((image.width, image.height), (64, 64));
}

/// The first software adapter (lavapipe) wgpu reports here, if any.
fn software_adapter() -> Option<latent_engine::adapters::AdapterSummary> {
    latent_engine::adapters::enumerate()
        .into_iter()
        .find(|a| a.kind == latent_engine::adapters::AdapterKind::Software)
}

/// A `--device` name that matches no adapter is one clear line listing the adapters, before any
/// model is loaded (a name that does match runs in
/// `generate_writes_diffusers_image_with_parameters`).
#[test]
fn an_unknown_device_name_is_one_clear_line() {
    let dir = scratch("named");
    let out = dir.join("named.png");
    let o = generate_with(&["--device", "nosuchgpu"], &out, &[]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        stderr.contains("no adapter name contains `nosuchgpu`"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(!out.exists());
}

/// A device whose opening never finishes (injected hang) is a clear error naming the adapter
/// after `--device-timeout`, not a hung process.
#[test]
fn a_hanging_device_times_out_with_a_clear_message() {
    let dir = scratch("hang");
    let out = dir.join("hang.png");
    let started = std::time::Instant::now();
    let o = generate_with(
        &["--device-timeout", "2"],
        &out,
        &[("LATENT_STUDIO_TEST_HANG_DEVICE", "1")],
    );
    let waited = started.elapsed();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(
        waited < std::time::Duration::from_secs(30),
        "took {waited:?}"
    );
    let auto = latent_engine::adapters::enumerate();
    let adapter = match latent_engine::adapters::choose_auto(&auto) {
        Some(a) => a.name.clone(),
        None => "CPU backend".into(),
    };
    assert!(
        stderr.contains(&adapter)
            && stderr.contains("within 2 s")
            && stderr.contains("--device cpu"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(!out.exists());
}

/// A device that stops making progress after it opened (the test hook parks the engine after
/// image 2's first step, as a kernel compile that never finishes would): after twice the device
/// timeout the run says so in one warning, and image 1, finished before, is already saved.
#[test]
#[allow(clippy::disallowed_methods)] // a short-lived thread reading the child's stderr
fn a_device_stalled_mid_batch_is_reported_and_the_finished_image_is_saved() {
    use std::io::BufRead;
    let dir = scratch("stall");
    let model = model();
    let outputs = dir.join("outputs");
    std::fs::create_dir_all(&outputs).unwrap();
    let outputs_s = outputs.display().to_string();
    let mut args = vec!["generate", "--model", &model, "--outputs", &outputs_s];
    args.extend_from_slice(CASE0);
    args.extend_from_slice(&[
        "--device",
        "cpu",
        "--batch-count",
        "2",
        "--device-timeout",
        "2",
    ]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_latent-studio"))
        .args(&args)
        .env(latent_studio::test_seam::STALL_AT, "2:1")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run latent-studio");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let started = std::time::Instant::now();
    let mut seen = Vec::new();
    let warning = loop {
        let left = std::time::Duration::from_secs(120).saturating_sub(started.elapsed());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("no progress for") => break line,
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = child.kill();
                panic!("no stall warning: {seen:#?}");
            }
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        warning.starts_with("warning: no progress for") && warning.contains(" s on cpu"),
        "{warning}"
    );
    assert!(
        seen.iter().any(|l| l.starts_with("image 2 step 1/")),
        "stalled in image 2: {seen:#?}"
    );
    let saved = files_under(&outputs);
    assert_eq!(saved.len(), 1, "image 1 is saved: {saved:?}");
    let (image, _) = decode_png(&std::fs::read(outputs.join(&saved[0])).unwrap()).unwrap();
    assert!(worst_vs_case0(&image) <= 1, "image 1 is case0");
}

/// The adapters `--device auto` may use (every one: software adapters get WGSL).
fn auto_candidates() -> Vec<latent_engine::adapters::AdapterSummary> {
    latent_engine::adapters::enumerate()
}

/// A probe child that dies (injected abort, as a driver segfault would) costs the child only:
/// the verdict is remembered as crashed, `--device auto` falls back to the CPU with one notice
/// line and writes the image, a later run skips the adapter without probing, and `devices` shows
/// the verdict.
#[test]
fn a_crashing_probe_is_remembered_and_auto_falls_back_to_the_cpu() {
    let candidates = auto_candidates();
    if candidates.is_empty() {
        eprintln!("no GPU adapter here; nothing to probe");
        return;
    }
    let dir = scratch("probe-crash");
    let config = dir.join("config");
    let config_s = config.display().to_string();
    let out = dir.join("fallback.png");
    let o = generate_with(
        &["--probe", "on"],
        &out,
        &[
            ("LATENT_STUDIO_CONFIG", &config_s),
            ("LATENT_STUDIO_TEST_PROBE_CRASH", "1"),
        ],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(out.exists());
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("warning:"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].contains("crashed when probed")
            && warnings[0].contains("using the CPU backend"),
        "{stderr}"
    );
    let saved = std::fs::read_to_string(config.join("probes.json")).expect("verdicts saved");
    for a in &candidates {
        assert!(warnings[0].contains(&a.name), "{stderr}");
        assert!(saved.contains(&a.name), "{saved}");
    }
    assert!(saved.contains("\"crashed\""), "{saved}");

    // Remembered: without the crash hook and without probing, the adapter is still skipped.
    std::fs::remove_file(&out).unwrap();
    let o = generate_with(&[], &out, &[("LATENT_STUDIO_CONFIG", &config_s)]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(out.exists());
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("warning:"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(warnings[0].contains("using the CPU backend"), "{stderr}");

    let o = Command::new(env!("CARGO_BIN_EXE_latent-studio"))
        .arg("devices")
        .env("LATENT_STUDIO_CONFIG", &config_s)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("probe: crashed"), "{stdout}");
    assert!(
        !stdout.contains("* gpu:"),
        "a crashed adapter is not the automatic choice: {stdout}"
    );
}

/// A probe child that never answers is killed after the device timeout and remembered as hung;
/// `--device auto` goes on without it.
#[test]
fn a_hanging_probe_is_killed_and_remembered_as_hung() {
    if auto_candidates().is_empty() {
        eprintln!("no GPU adapter here; nothing to probe");
        return;
    }
    let dir = scratch("probe-hang");
    let config = dir.join("config");
    let config_s = config.display().to_string();
    let out = dir.join("fallback.png");
    let started = std::time::Instant::now();
    let o = generate_with(
        &["--probe", "on", "--device-timeout", "2"],
        &out,
        &[
            ("LATENT_STUDIO_CONFIG", &config_s),
            ("LATENT_STUDIO_TEST_PROBE_HANG", "1"),
        ],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(out.exists());
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert!(
        stderr.contains("hung when probed: no answer within 2 s"),
        "{stderr}"
    );
    let saved = std::fs::read_to_string(config.join("probes.json")).expect("verdicts saved");
    assert!(saved.contains("\"hung\""), "{saved}");
}

/// The probe child itself, on the software adapter: one JSON line saying it computed.
#[test]
fn probe_child_reports_one_json_line() {
    let Some(soft) = software_adapter() else {
        eprintln!("no software adapter here; the probe run is skipped");
        return;
    };
    let o = studio(&["probe", "--adapter", &soft.index.to_string()]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: latent_engine::probe::ProbeReport =
        serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert!(report.ok, "{report:?}");
    assert_eq!((report.adapter, report.driver), (soft.name, soft.driver));
}
