//! Textual-inversion embeddings against A1111's placement and the tiny text encoder
//! (tests/fixtures/make_embedding_fixtures.py): the folder's files loaded or skipped with a
//! reason, the chunks (placeholders, weights, where the vectors go, a chunk change when they do
//! not fit) and the conditioning within 1e-4 (f32, CPU).

use crate::common;

use std::sync::Arc;

use burn::tensor::Device;
use common::{fixtures, to_vec};
use latent_engine::checkpoint::{Checkpoint, SafetensorsFile};
use latent_engine::prompt::{self, Chunks, Embeddings, Emphasis};
use latent_engine::tokenizer::ClipTokenizer;
use latent_engine::{LoadOptions, StableDiffusion};
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    name: String,
    prompt: String,
    chunks: Vec<ChunkCase>,
}

#[derive(Deserialize)]
struct ChunkCase {
    ids: Vec<u32>,
    weights: Vec<f64>,
    fixes: Vec<(usize, String)>,
}

#[test]
fn embeddings_are_placed_and_encoded_as_a1111() {
    let tok = ClipTokenizer::new().unwrap();
    let (library, notes) =
        Embeddings::load_dir(&fixtures().join("embeddings"), &tok, 16, None).unwrap();
    assert_eq!(library.names(), ["badhands", "tinystyle"]);
    assert_eq!(notes.len(), 3, "{notes:?}");
    assert!(
        notes[0].contains("tinyxl") && notes[0].contains("SDXL"),
        "{notes:?}"
    );
    assert!(
        notes[1].contains("wide") && notes[1].contains("768 wide"),
        "{notes:?}"
    );
    assert!(
        notes[2].contains("xlstyle") && notes[2].contains("SDXL"),
        "{notes:?}"
    );
    let library = Arc::new(library);

    let ckpt = Checkpoint::open(&fixtures().join("tiny-sd")).unwrap();
    let model = StableDiffusion::load(&ckpt, &Device::flex(), LoadOptions::default()).unwrap();
    let expected =
        SafetensorsFile::open(&fixtures().join("embedding-expected.safetensors")).unwrap();
    let text = std::fs::read_to_string(fixtures().join("embedding_cases.json")).unwrap();
    let cases: Vec<Case> = serde_json::from_str(&text).unwrap();
    for case in cases {
        let name = &case.name;
        let got = Chunks::with_embeddings(&tok, &case.prompt, Emphasis::Original, Some(&library));
        assert_eq!(got.chunks.len(), case.chunks.len(), "{name}: chunks");
        for (i, (chunk, want)) in got.chunks.iter().zip(&case.chunks).enumerate() {
            assert_eq!(chunk.ids.to_vec(), want.ids, "{name}: chunk {i} ids");
            for (w, want_w) in chunk.weights.iter().zip(&want.weights) {
                assert!((f64::from(*w) - want_w).abs() < 1e-6, "{name}: chunk {i}");
            }
            let fixes: Vec<(usize, String)> = chunk
                .fixes
                .iter()
                .map(|(at, e)| (*at, e.name.clone()))
                .collect();
            assert_eq!(fixes, want.fixes, "{name}: chunk {i} fixes");
        }
        let z = prompt::encode(&model.text_encoder, &got, 1, Emphasis::Original).unwrap();
        let (got, want) = (to_vec(z), expected.read_f32(name).unwrap());
        assert_eq!(got.len(), want.len(), "{name}");
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= 1e-4 * scale.max(1.0),
            "{name}: differs by {worst:e}"
        );
    }
    // A1111's `TI hashes`: the first 12 hex digits of each file's SHA-256 (as hashlib gives it).
    let got = Chunks::with_embeddings(
        &tok,
        "tinystyle badhands",
        Emphasis::Original,
        Some(&library),
    );
    let hashes: Vec<(String, String)> = got.chunks[0]
        .fixes
        .iter()
        .map(|(_, e)| (e.name.clone(), e.hash[..12].to_string()))
        .collect();
    let want = [("tinystyle", "270c2b0fb183"), ("badhands", "9c0ced79755e")];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(n, h)| (n.to_string(), h.to_string()))
        .collect();
    assert_eq!(hashes, want);
    // Without the library the names are plain words.
    let plain = Chunks::new(&tok, "a fox in tinystyle", Emphasis::Original);
    assert!(plain.chunks[0].fixes.is_empty() && !plain.chunks[0].ids.contains(&0));
}

/// SDXL (tests/fixtures/make_sdxl_embedding_fixtures.py): of the same folder only the
/// `clip_l`/`clip_g` file fitting the tiny SDXL's encoders loads; in "a fox in tinyxl" each
/// encoder takes its own vectors, and the conditioning (both penultimate states side by side,
/// the pooled projection) is A1111's within 1e-4 (f32, CPU).
#[test]
fn sdxl_embeddings_give_each_encoder_its_vectors() {
    let tok = ClipTokenizer::new().unwrap();
    let (library, notes) =
        Embeddings::load_dir(&fixtures().join("embeddings"), &tok, 4, Some(8)).unwrap();
    assert_eq!(library.names(), ["tinyxl"], "{notes:?}");
    assert_eq!(notes.len(), 4, "{notes:?}");
    assert!(
        notes[0].contains("badhands") && notes[0].contains("not an SDXL one"),
        "{notes:?}"
    );
    assert!(
        notes[3].contains("xlstyle") && notes[3].contains("32 wide"),
        "{notes:?}"
    );
    let ckpt = Checkpoint::open(&fixtures().join("tiny-sdxl")).unwrap();
    let model = StableDiffusion::load(&ckpt, &Device::flex(), LoadOptions::default()).unwrap();
    let chunks = Chunks::with_embeddings(
        &tok,
        "a fox in tinyxl",
        Emphasis::Original,
        Some(&Arc::new(library)),
    );
    let second = model.text_encoder_2.as_ref().unwrap();
    let got = prompt::encode_sdxl(
        Some(&model.text_encoder),
        second,
        &chunks,
        1,
        Emphasis::Original,
    )
    .unwrap();
    let expected =
        SafetensorsFile::open(&fixtures().join("sdxl-embedding-expected.safetensors")).unwrap();
    for (name, got) in [
        ("context", to_vec(got.context)),
        ("pooled", to_vec(got.pooled)),
    ] {
        let want = expected.read_f32(name).unwrap();
        common::assert_close(name, &got, &want, burn::tensor::DType::F32);
    }
}

/// An SD 2.x embedding (A1111's `emb_params`, as wide as OpenCLIP's states) on the tiny SD 2
/// (tests/fixtures/make_sd2_embedding_fixtures.py): loaded for its width, placed as A1111 places
/// it, padded with OpenCLIP's id 0, encoded as diffusers encodes SD 2's prompts, within 1e-4.
#[test]
fn sd2_embeddings_are_encoded_as_a1111() {
    let tok = ClipTokenizer::new().unwrap();
    let (library, notes) =
        Embeddings::load_dir(&fixtures().join("embeddings-sd2"), &tok, 32, None).unwrap();
    assert_eq!(library.names(), ["tinysd2"], "{notes:?}");
    let ckpt = Checkpoint::open(&fixtures().join("tiny-sd2")).unwrap();
    let model = StableDiffusion::load(&ckpt, &Device::flex(), LoadOptions::default()).unwrap();
    assert_eq!(
        model.config.text_encoder.pad_token, 0,
        "OpenCLIP pads with 0"
    );
    let chunks = Chunks::with_embeddings(
        &tok,
        "a fox in tinysd2",
        Emphasis::Original,
        Some(&Arc::new(library)),
    );
    let got = prompt::encode(&model.text_encoder, &chunks, 1, Emphasis::Original).unwrap();
    let expected =
        SafetensorsFile::open(&fixtures().join("sd2-embedding-expected.safetensors")).unwrap();
    let want = expected.read_f32("context").unwrap();
    common::assert_close("context", &to_vec(got), &want, burn::tensor::DType::F32);
    // An SD 1.x embedding (16 wide) is not one for this model.
    let (sd1, notes) =
        Embeddings::load_dir(&fixtures().join("embeddings"), &tok, 32, None).unwrap();
    assert!(!sd1.names().contains(&"tinystyle".to_string()), "{notes:?}");
}

/// The model's kept conditioning ([`prompt::ConditioningMemo`]) follows an embedding's file: the
/// same name from a replaced file (other vectors, another hash) encodes again and changes the
/// image; the same file again reuses it.
#[test]
fn a_replaced_embedding_file_is_encoded_again() {
    use latent_engine::pipeline::{Quiet, Txt2ImgRequest, txt2img};
    let tok = ClipTokenizer::new().unwrap();
    let scratch = std::env::temp_dir().join(format!("latent-ti-memo-{}", std::process::id()));
    let [first, second] = ["a", "b"].map(|d| scratch.join(d));
    let original = std::fs::read(fixtures().join("embeddings/tinystyle.safetensors")).unwrap();
    // The same safetensors header, one vector value changed in its last byte.
    let mut replaced = original.clone();
    *replaced.last_mut().unwrap() ^= 0x40;
    for (dir, bytes) in [(&first, &original), (&second, &replaced)] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("tinystyle.safetensors"), bytes).unwrap();
    }
    let load =
        |dir: &std::path::Path| Arc::new(Embeddings::load_dir(dir, &tok, 16, None).unwrap().0);
    let ckpt = Checkpoint::open(&fixtures().join("tiny-sd")).unwrap();
    let model = StableDiffusion::load(&ckpt, &Device::flex(), LoadOptions::default()).unwrap();
    let mut req = Txt2ImgRequest {
        prompt: "a fox, tinystyle".into(),
        seed: 5,
        steps: 1,
        width: 32,
        height: 32,
        embeddings: Some(load(&first)),
        ..Default::default()
    };
    let cancel = std::sync::atomic::AtomicBool::new(false);
    let run = |req: &Txt2ImgRequest| {
        let out = txt2img(&model, &tok, req, &cancel, &mut Quiet).unwrap();
        (out[0].image.pixels.clone(), model.conditioning_encodes())
    };
    let (a, n) = run(&req);
    assert_eq!(n, 1);
    req.embeddings = Some(load(&second));
    let (b, n) = run(&req);
    assert_eq!(n, 2, "the replaced file is encoded again");
    assert_ne!(a, b, "its vectors change the image");
    req.embeddings = Some(load(&second));
    assert_eq!(
        run(&req),
        (b, 2),
        "the same file again reuses the conditioning"
    );
    let _ = std::fs::remove_dir_all(&scratch);
}
