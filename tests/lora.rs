//! LoRAs merged into the tiny model against diffusers with the same files loaded and fused
//! (tests/fixtures/make_lora_fixtures.py): a diffusers/PEFT file, a kohya file with LoCon
//! convolutions and split strengths, and both at once; the text encoder's output and the UNet's
//! prediction within 1e-4 (f32) on the CPU backend and on wgpu (lavapipe in CI). Refusals name
//! the family or the algorithm; a merge is kept while its set is asked for again and never
//! changes the model itself.

use crate::common;

use std::sync::Arc;

use burn::tensor::{DType, Device, Tensor, TensorData};
use common::{assert_close, devices, fixtures, scratch_dir, to_vec, write_safetensors};
use latent_engine::checkpoint::{Checkpoint, SafetensorsFile};
use latent_engine::lora::{Lora, LoraLibrary, LoraSet};
use latent_engine::{Error, LoadOptions, StableDiffusion};
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    name: String,
    loras: Vec<(String, f32, f32)>,
    ids: Vec<u32>,
    timestep: f32,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(fixtures().join("lora_cases.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn library() -> LoraLibrary {
    LoraLibrary::new(Some(fixtures().join("loras")))
}

fn set(library: &LoraLibrary, loras: &[(String, f32, f32)]) -> LoraSet {
    let prompt: String = loras
        .iter()
        .map(|(name, te, unet)| format!("<lora:{name}:{te}:{unet}> "))
        .collect();
    let (set, ignored) = library.resolve(&format!("a fox {prompt}")).unwrap();
    assert!(ignored.is_empty());
    set
}

/// The text encoder's and UNet's outputs of the model with `set` merged.
fn outputs(model: &StableDiffusion, set: &LoraSet, case: &Case) -> (Vec<f32>, Vec<f32>) {
    let expected = SafetensorsFile::open(&fixtures().join("lora-expected.safetensors")).unwrap();
    let networks = model.networks(set).unwrap();
    let context = networks
        .text_encoder
        .forward(std::slice::from_ref(&case.ids), 1)
        .unwrap();
    let latents = Tensor::<4>::from_data(
        TensorData::new(expected.read_f32("latents").unwrap(), [1, 4, 8, 8]),
        (&model.device, DType::F32),
    );
    let eps = networks.unet.forward(latents, &[case.timestep], &context);
    (to_vec(context), to_vec(eps))
}

#[test]
fn loras_merge_as_diffusers_fuses_them() {
    let expected = SafetensorsFile::open(&fixtures().join("lora-expected.safetensors")).unwrap();
    let library = library();
    let cases = cases();
    for (backend, device) in devices() {
        let ckpt = Checkpoint::open(&fixtures().join("tiny-sd")).unwrap();
        let model = StableDiffusion::load(&ckpt, &device, LoadOptions::default()).unwrap();
        // lavapipe: one case covers every format at once; the CPU runs them all.
        let run: Vec<&Case> = match backend {
            "cpu" => cases.iter().collect(),
            _ => cases.iter().filter(|c| c.name == "both").collect(),
        };
        for case in run {
            let set = set(&library, &case.loras);
            let (text, eps) = outputs(&model, &set, case);
            let name = &case.name;
            let want = |part: &str| expected.read_f32(&format!("{name}.{part}")).unwrap();
            assert_close(
                &format!("{backend} {name}: text"),
                &text,
                &want("text"),
                DType::F32,
            );
            assert_close(
                &format!("{backend} {name}: unet"),
                &eps,
                &want("unet"),
                DType::F32,
            );
        }
        // The model itself is unchanged: no LoRA gives diffusers' output without one.
        let (text, eps) = outputs(&model, &LoraSet::default(), &cases[0]);
        assert_close(
            "no LoRA: text",
            &text,
            &expected.read_f32("none.text").unwrap(),
            DType::F32,
        );
        assert_close(
            "no LoRA: unet",
            &eps,
            &expected.read_f32("none.unet").unwrap(),
            DType::F32,
        );
    }
}

#[test]
fn a_single_file_checkpoint_takes_the_same_loras() {
    // The LDM layout's keys are renamed at load; the kept tensors carry diffusers' names.
    let expected = SafetensorsFile::open(&fixtures().join("lora-expected.safetensors")).unwrap();
    let ckpt = Checkpoint::open(&fixtures().join("tiny-sd.safetensors")).unwrap();
    let model = StableDiffusion::load(&ckpt, &Device::flex(), LoadOptions::default()).unwrap();
    let case = cases()
        .into_iter()
        .find(|c| c.name == "kohya_split")
        .unwrap();
    let set = set(&library(), &case.loras);
    let (text, eps) = outputs(&model, &set, &case);
    assert_close(
        "single file: text",
        &text,
        &expected.read_f32("kohya_split.text").unwrap(),
        DType::F32,
    );
    assert_close(
        "single file: unet",
        &eps,
        &expected.read_f32("kohya_split.unet").unwrap(),
        DType::F32,
    );
    // Asked again, the same merge is returned; another set replaces it.
    let first = model.networks(&set).unwrap();
    assert!(Arc::ptr_eq(&first, &model.networks(&set).unwrap()));
    let other = self::set(&library(), &[("kohya".into(), 0.5, 1.0)]);
    assert!(!Arc::ptr_eq(&first, &model.networks(&other).unwrap()));
}

#[test]
fn loras_for_other_models_are_refused_by_name() {
    let dir = scratch_dir("loras");
    let f32s = |n: usize| vec![0u8; n * 4];
    let message = |path: &std::path::Path| match Lora::open(path) {
        Err(e @ Error::Lora { .. }) => e.to_string(),
        other => panic!("{}: expected a LoRA error, got {other:?}", path.display()),
    };
    let flux = dir.join("flux.safetensors");
    write_safetensors(
        &flux,
        &[(
            "transformer.single_transformer_blocks.0.attn.to_q.lora_A.weight",
            "F32",
            vec![2, 2],
            f32s(4),
        )],
    );
    assert!(message(&flux).contains("Flux"), "{}", message(&flux));

    let loha = dir.join("loha.safetensors");
    write_safetensors(
        &loha,
        &[(
            "lora_unet_mid_block_resnets_0_conv1.hada_w1_a",
            "F32",
            vec![2, 2],
            f32s(4),
        )],
    );
    assert!(message(&loha).contains("LoHa"), "{}", message(&loha));

    let ckpt = Checkpoint::open(&fixtures().join("tiny-sd")).unwrap();
    let model = StableDiffusion::load(&ckpt, &Device::flex(), LoadOptions::default()).unwrap();
    // An SDXL LoRA's second text encoder, on a model with one.
    let (sdxl, _) = library().resolve("<lora:sdxl_te2:1>").unwrap();
    let e = model.networks(&sdxl).unwrap_err().to_string();
    assert!(e.contains("made for SDXL"), "{e}");
    let merge = |file: &str, tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]| {
        write_safetensors(&dir.join(file), tensors);
        let library = LoraLibrary::new(Some(dir.clone()));
        let stem = file.trim_end_matches(".safetensors");
        let (set, _) = library.resolve(&format!("<lora:{stem}:1>")).unwrap();
        match model.networks(&set) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{file} merged"),
        }
    };
    // An SDXL-sized cross-attention: 2048 context features against the tiny model's 16.
    let wide = merge(
        "wide.safetensors",
        &[
            (
                "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn2_to_k.lora_down.weight",
                "F32",
                vec![2, 2048],
                f32s(4096),
            ),
            (
                "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn2_to_k.lora_up.weight",
                "F32",
                vec![32, 2],
                f32s(64),
            ),
        ],
    );
    assert!(
        wide.contains("another model family") && wide.contains("attn2"),
        "{wide}"
    );
    let nowhere = merge(
        "nowhere.safetensors",
        &[
            (
                "lora_unet_input_blocks_9_1_proj_in.lora_down.weight",
                "F32",
                vec![2, 32],
                f32s(64),
            ),
            (
                "lora_unet_input_blocks_9_1_proj_in.lora_up.weight",
                "F32",
                vec![32, 2],
                f32s(64),
            ),
        ],
    );
    assert!(nowhere.contains("match nothing"), "{nowhere}");
    // A name the folder does not have.
    let missing = library()
        .resolve("<lora:absent:1>")
        .unwrap_err()
        .to_string();
    assert!(
        missing.contains("absent") && missing.contains("LoRA folder"),
        "{missing}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[derive(Deserialize)]
struct SdxlCase {
    name: String,
    loras: Vec<(String, f32, f32)>,
    ids: Vec<u32>,
    timestep: f32,
    time_ids: [f32; 6],
}

/// SDXL LoRAs (tests/fixtures/make_sdxl_lora_fixtures.py): a diffusers/PEFT file for the UNet and
/// both text encoders, and a kohya file in SDXL's names (the UNet's original layout, `lora_te1_`
/// and `lora_te2_`, LoCon convolutions), each merged at split strengths: the first encoder's last
/// state, the second's penultimate state and pooled projection, and the UNet's prediction with
/// added conditioning within 1e-4 of diffusers' fused networks, on the CPU (both files) and wgpu
/// (the kohya file); the model itself unchanged after.
#[test]
fn sdxl_loras_merge_into_both_encoders_and_the_unet_as_diffusers_fuses_them() {
    let expected =
        SafetensorsFile::open(&fixtures().join("sdxl-lora-expected.safetensors")).unwrap();
    let cases: Vec<SdxlCase> = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("sdxl_lora_cases.json")).unwrap(),
    )
    .unwrap();
    let library = library();
    let ckpt = Checkpoint::open(&fixtures().join("tiny-sdxl")).unwrap();
    for (backend, device) in devices() {
        let model = StableDiffusion::load(&ckpt, &device, LoadOptions::default()).unwrap();
        let tensor = |name: &str, shape: Vec<usize>| {
            Tensor::<1>::from_data(
                TensorData::new(
                    expected.read_f32(name).unwrap(),
                    [shape.iter().product::<usize>()],
                ),
                (&device, DType::F32),
            )
        };
        let shape = |name: &str| expected.entry(name).unwrap().shape.clone();
        let [c, d] = [shape("context"), shape("pooled")];
        let latents = tensor("latents", vec![256]).reshape([1, 4, 8, 8]);
        let context = tensor("context", c.clone()).reshape([c[0], c[1], c[2]]);
        let pooled = tensor("pooled", d.clone()).reshape([d[0], d[1]]);
        let check = |set: &LoraSet, case: &SdxlCase, name: &str| {
            let networks = model.networks(set).unwrap();
            let ids = std::slice::from_ref(&case.ids);
            let te1 = networks.text_encoder.forward(ids, 1).unwrap();
            let second = networks.text_encoder_2.as_ref().expect("SDXL");
            let te2 = second.encode_sdxl(ids, 0, &[]).unwrap();
            let added = networks
                .unet
                .added_conditioning(&pooled, &[case.time_ids])
                .unwrap();
            let eps =
                networks
                    .unet
                    .forward_added(latents.clone(), &[case.timestep], &context, &added);
            for (part, got) in [
                ("te1", to_vec(te1)),
                ("te2", to_vec(te2.hidden)),
                ("pooled", to_vec(te2.pooled.expect("projection"))),
                ("unet", to_vec(eps)),
            ] {
                let want = expected.read_f32(&format!("{name}.{part}")).unwrap();
                assert_close(
                    &format!("{backend} {name}: {part}"),
                    &got,
                    &want,
                    DType::F32,
                );
            }
        };
        for case in &cases {
            if backend != "cpu" && case.name != "sdxl_kohya" {
                continue;
            }
            check(&set(&library, &case.loras), case, &case.name);
        }
        check(&LoraSet::default(), &cases[0], "none");
    }
}
