//! Property tests ("fuzzing" with proptest) of the parsers that read files from strangers:
//! the safetensors header (`SafetensorsFile::open`, then `Checkpoint::open`), A1111's PNG
//! `parameters` text (`Parameters::parse_a1111`) and model configs (a sidecar or `config.json`:
//! `ModelConfig::validate`, then building the model). None may panic; a file that opens must only
//! point inside itself; valid parameters survive a print/parse round trip exactly; a config with
//! a zero count is refused.
//!
//! Every run also replays the handcrafted corpus in tests/fixtures/fuzz/ (written by
//! tests/fixtures/make_fuzz_corpus.py, which says what each file is).
//! Failures proptest finds are saved in tests/fuzz.proptest-regressions and replayed first.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{fixtures, scratch_dir};
use latent_engine::Error;
use latent_engine::checkpoint::{Checkpoint, SafetensorsFile};
use latent_engine::parameters::Parameters;
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Value, json};

/// Cases per property on every test run: seconds in all. `PROPTEST_CASES=100000` fuzzes longer.
const CASES: u32 = 256;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CASES);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// safetensors

/// A fresh file name for each case: cases may run on several test threads at once.
fn scratch_file(bytes: &[u8]) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = scratch_dir("fuzz-safetensors");
    let path = dir.join(format!(
        "case-{}.safetensors",
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, bytes).expect("write case");
    path
}

/// Opens `bytes` as a checkpoint file and checks the contract: a clear error, or entries whose
/// bytes lie inside the file and match their shape and dtype.
fn check_safetensors(bytes: &[u8]) -> Result<(), TestCaseError> {
    let path = scratch_file(bytes);
    let opened = SafetensorsFile::open(&path);
    match &opened {
        Ok(file) => {
            let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
            let data_len = bytes.len() - 8 - header_len;
            let mut total = 0usize;
            for (name, entry) in file.entries() {
                let numel = entry
                    .shape
                    .iter()
                    .try_fold(1usize, |a, &d| a.checked_mul(d));
                let want = numel
                    .and_then(|n| n.checked_mul(entry.dtype.bitsize()))
                    .map(|bits| bits / 8);
                // `bytes` slices the map: an out-of-range entry panics here and fails the case.
                let got = file.bytes(entry);
                prop_assert_eq!(Some(got.len()), want, "{}", name);
                total += got.len();
                if let Ok(values) = file.read_f32(name) {
                    prop_assert_eq!(Some(values.len()), numel, "{}", name);
                }
            }
            // Entries do not overlap and cover the data exactly (the format has no gaps).
            prop_assert_eq!(total, data_len);
        }
        Err(e) => {
            prop_assert!(
                matches!(e, Error::InvalidSafetensors { .. }),
                "unexpected error kind: {e}"
            );
            let text = e.to_string();
            prop_assert!(text.contains(&path.display().to_string()), "{text}");
        }
    }
    // The next stage, family detection, must cope with whatever the header parser accepted.
    if let Err(e) = Checkpoint::open(&path) {
        prop_assert!(!e.to_string().is_empty());
    }
    let _ = std::fs::remove_file(&path);
    Ok(())
}

/// One tensor of a generated valid file.
#[derive(Debug, Clone)]
struct Tensor {
    name: String,
    dtype: &'static str,
    shape: Vec<usize>,
}

fn dtype_bytes(dtype: &str) -> usize {
    match dtype {
        "F64" | "I64" => 8,
        "F32" | "I32" => 4,
        "F16" | "BF16" | "I16" => 2,
        _ => 1,
    }
}

fn tensor() -> impl Strategy<Value = Tensor> {
    let name = prop_oneof![
        Just("model.diffusion_model.input_blocks.0.0.weight".to_string()),
        Just(
            "cond_stage_model.transformer.text_model.embeddings.token_embedding.weight".to_string()
        ),
        Just("first_stage_model.decoder.conv_in.weight".to_string()),
        Just("conditioner.embedders.0.model.ln_final.weight".to_string()),
        "[a-z_.0-9]{1,24}",
    ];
    let dtype = prop::sample::select(vec![
        "F32", "F16", "BF16", "F64", "I64", "I32", "I16", "U8", "BOOL", "F8_E4M3",
    ]);
    let shape = prop::collection::vec(0usize..6, 0..5);
    (name, dtype, shape).prop_map(|(name, dtype, shape)| Tensor { name, dtype, shape })
}

/// A well-formed file: its header as JSON (so mutations can edit it) and its data bytes.
#[derive(Debug, Clone)]
struct ValidFile {
    header: serde_json::Map<String, Value>,
    data: Vec<u8>,
}

fn valid_file() -> impl Strategy<Value = ValidFile> {
    (
        prop::collection::vec(tensor(), 0..6),
        any::<bool>(),
        any::<u8>(),
    )
        .prop_map(|(tensors, metadata, fill)| {
            let mut header = serde_json::Map::new();
            if metadata {
                header.insert("__metadata__".into(), json!({"format": "pt"}));
            }
            let mut data = Vec::new();
            for t in tensors {
                if header.contains_key(&t.name) {
                    continue;
                }
                let len = t.shape.iter().product::<usize>() * dtype_bytes(t.dtype);
                let start = data.len();
                data.extend((0..len).map(|i| fill.wrapping_add(i as u8)));
                header.insert(
                    t.name,
                    json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [start, start + len]}),
                );
            }
            ValidFile { header, data }
        })
}

fn assemble(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(data);
    out
}

/// What can go wrong in a file from the internet, at the JSON level and at the byte level.
#[derive(Debug, Clone)]
enum Mutation {
    /// The length prefix says anything at all.
    HeaderLen(u64),
    /// The length prefix is off by a little.
    HeaderLenDelta(i8),
    Truncate(Index),
    Append(Vec<u8>),
    FlipByte(Index, u8),
    /// A tensor's `data_offsets` replaced (out of range, reversed, overlapping, negative, …).
    Offsets(Index, Value),
    /// A dtype string that may not exist.
    Dtype(Index, String),
    /// Shapes whose product overflows or that are not lists of integers.
    Shape(Index, Value),
    /// The header bytes replaced: not UTF-8, not JSON, or JSON of the wrong type.
    HeaderBytes(Vec<u8>),
    /// A key written twice with different contents.
    DuplicateKey(Index),
}

fn json_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0u64..64).prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(json!(u64::MAX)),
        Just(json!(1.5)),
        Just(json!("8")),
        Just(Value::Null),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<u64>().prop_map(Mutation::HeaderLen),
        any::<i8>().prop_map(Mutation::HeaderLenDelta),
        any::<Index>().prop_map(Mutation::Truncate),
        prop::collection::vec(any::<u8>(), 1..16).prop_map(Mutation::Append),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::FlipByte(i, b)),
        (
            any::<Index>(),
            prop_oneof![
                (json_number(), json_number()).prop_map(|(a, b)| json!([a, b])),
                prop::collection::vec(json_number(), 0..4).prop_map(Value::from),
                Just(json!("0,8")),
            ]
        )
            .prop_map(|(i, v)| Mutation::Offsets(i, v)),
        (
            any::<Index>(),
            prop_oneof![
                Just("F4".to_string()),
                Just("f32".to_string()),
                Just("Q4_K".to_string()),
                Just(String::new()),
                "[A-Z0-9_]{1,8}",
            ]
        )
            .prop_map(|(i, d)| Mutation::Dtype(i, d)),
        (
            any::<Index>(),
            prop_oneof![
                Just(json!([u64::MAX, u64::MAX])),
                Just(json!([1u64 << 32, 1u64 << 32, 16])),
                Just(json!([usize::MAX / 2 + 1, 2])),
                Just(json!([-1])),
                Just(json!("2x2")),
                prop::collection::vec(json_number(), 0..6).prop_map(Value::from),
            ]
        )
            .prop_map(|(i, s)| Mutation::Shape(i, s)),
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..64),
            Just(b"\xff\xfe{\"a\":1}".to_vec()),
            Just(b"[]".to_vec()),
            Just(b"null".to_vec()),
            Just(b"{\"w\":[1,2,3]}".to_vec()),
            Just(b"{\"w\":{\"dtype\":\"F32\"}}".to_vec()),
            Just(b"{".to_vec()),
            Just(b"{}   ".to_vec()),
        ]
        .prop_map(Mutation::HeaderBytes),
        any::<Index>().prop_map(Mutation::DuplicateKey),
    ]
}

/// The tensor keys of a header (not `__metadata__`), for mutations that pick one.
fn tensor_key(header: &serde_json::Map<String, Value>, i: &Index) -> Option<String> {
    let keys: Vec<&String> = header.keys().filter(|k| *k != "__metadata__").collect();
    (!keys.is_empty()).then(|| keys[i.index(keys.len())].clone())
}

fn set_field(header: &mut serde_json::Map<String, Value>, i: &Index, field: &str, v: Value) {
    if let Some(k) = tensor_key(header, i)
        && let Some(Value::Object(t)) = header.get_mut(&k)
    {
        t.insert(field.into(), v);
    }
}

fn mutate(file: &ValidFile, mutations: &[Mutation]) -> Vec<u8> {
    // JSON-level edits first, then the header is serialised and byte-level edits follow.
    let mut header = file.header.clone();
    let mut header_bytes: Option<Vec<u8>> = None;
    let mut duplicate: Option<String> = None;
    for m in mutations {
        match m {
            Mutation::Offsets(i, v) => set_field(&mut header, i, "data_offsets", v.clone()),
            Mutation::Dtype(i, d) => set_field(&mut header, i, "dtype", json!(d)),
            Mutation::Shape(i, s) => set_field(&mut header, i, "shape", s.clone()),
            Mutation::HeaderBytes(b) => header_bytes = Some(b.clone()),
            Mutation::DuplicateKey(i) => duplicate = tensor_key(&header, i),
            _ => {}
        }
    }
    let mut text = Value::Object(header).to_string().into_bytes();
    if let Some(key) = duplicate {
        // serde_json never writes a key twice; splice one in by hand.
        let extra = format!(
            r#","{key}":{{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}}}"#,
            key = key.replace('"', "\\\"")
        );
        text.pop();
        text.extend_from_slice(extra.as_bytes());
    }
    let mut out = assemble(&header_bytes.unwrap_or(text), &file.data);
    for m in mutations {
        match m {
            Mutation::HeaderLen(n) if out.len() >= 8 => out[..8].copy_from_slice(&n.to_le_bytes()),
            Mutation::HeaderLenDelta(d) if out.len() >= 8 => {
                let n = u64::from_le_bytes(out[..8].try_into().expect("8 bytes"));
                out[..8].copy_from_slice(&n.wrapping_add_signed(i64::from(*d)).to_le_bytes());
            }
            Mutation::Truncate(i) => out.truncate(i.index(out.len() + 1)),
            Mutation::Append(b) => out.extend_from_slice(b),
            Mutation::FlipByte(i, b) if !out.is_empty() => {
                let at = i.index(out.len());
                out[at] ^= b | 1;
            }
            _ => {}
        }
    }
    out
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn safetensors_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        check_safetensors(&bytes)?;
    }

    /// A valid length prefix followed by arbitrary header bytes reaches the JSON parser.
    #[test]
    fn safetensors_arbitrary_header(header in prop::collection::vec(any::<u8>(), 0..128),
                                    data in prop::collection::vec(any::<u8>(), 0..32)) {
        check_safetensors(&assemble(&header, &data))?;
    }

    /// Unmutated generated files open and read back exactly the bytes written: this keeps the
    /// generator honest, so the mutated cases below start from files the parser really accepts.
    #[test]
    fn safetensors_valid_files_open(file in valid_file()) {
        let bytes = mutate(&file, &[]);
        let path = scratch_file(&bytes);
        let opened = SafetensorsFile::open(&path);
        prop_assert!(opened.is_ok(), "{:?}", opened.err());
        let opened = opened.expect("checked");
        let tensors = file.header.keys().filter(|k| *k != "__metadata__").count();
        prop_assert_eq!(opened.entries().len(), tensors);
        let header_len = bytes.len() - file.data.len();
        for (name, entry) in opened.entries() {
            let offsets = &file.header[name]["data_offsets"];
            let start = header_len + offsets[0].as_u64().expect("offset") as usize;
            let end = header_len + offsets[1].as_u64().expect("offset") as usize;
            prop_assert_eq!(opened.bytes(entry), &bytes[start..end]);
        }
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn safetensors_mutated_files(file in valid_file(),
                                 mutations in prop::collection::vec(mutation(), 1..4)) {
        check_safetensors(&mutate(&file, &mutations))?;
    }
}

// ---------------------------------------------------------------------------------------------
// A1111 parameters

/// The keys `Parameters` has fields for; an extra with one of these names is not representable.
const KNOWN_KEYS: &[&str] = &[
    "Steps",
    "Sampler",
    "Schedule type",
    "CFG scale",
    "Seed",
    "Size",
    "Model hash",
    "Model",
];

/// Text that leans on the characters the format treats specially.
fn tricky_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => "[a-z0-9 ]{1,6}",
        1 => Just("\n".to_string()),
        1 => Just(", ".to_string()),
        1 => Just(",".to_string()),
        1 => Just(":".to_string()),
        1 => Just("\"".to_string()),
        1 => Just("\\".to_string()),
        1 => Just(" ".to_string()),
        1 => Just("Steps: 3".to_string()),
        1 => Just("Negative prompt:".to_string()),
        1 => Just("(masterpiece:1.2)".to_string()),
        1 => any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..12).prop_map(|v| v.concat())
}

/// A prompt A1111's format can carry: no line of it may start with `Negative prompt:`, which
/// is where the format says the negative prompt begins (A1111 reads it the same way).
fn carriable_prompt() -> impl Strategy<Value = String> {
    tricky_text().prop_filter("a line starting `Negative prompt:`", |p| {
        !p.split('\n')
            .any(|line| line.starts_with("Negative prompt:"))
    })
}

fn extra_key() -> impl Strategy<Value = String> {
    "[A-Z][a-z]{0,8}( [a-z0-9]{1,6}){0,2}"
        .prop_filter("a known key", |k| !KNOWN_KEYS.contains(&k.as_str()))
}

prop_compose! {
    fn parameters()(
        prompt in carriable_prompt(),
        negative_prompt in tricky_text(),
        steps in any::<usize>(),
        sampler in tricky_text(),
        schedule in tricky_text(),
        cfg_scale in any::<f32>().prop_map(f32::abs).prop_filter("finite", |v| v.is_finite()),
        seed in any::<u64>(),
        width in any::<usize>(),
        height in any::<usize>(),
        model_hash in prop::option::of(tricky_text()),
        model in prop::option::of(tricky_text()),
        extra in prop::collection::vec((extra_key(), tricky_text()), 0..3),
    ) -> Parameters {
        Parameters {
            prompt, negative_prompt, steps, sampler, schedule, cfg_scale, seed, width, height,
            model_hash, model, extra,
        }
    }
}

/// Byte offset of the `i`-th char boundary of `s` (including its end).
fn boundary(s: &str, i: &Index) -> usize {
    let mut bounds: Vec<usize> = s.char_indices().map(|(b, _)| b).collect();
    bounds.push(s.len());
    bounds[i.index(bounds.len())]
}

#[derive(Debug, Clone)]
enum Edit {
    Delete(Index, Index),
    Insert(Index, String),
    Truncate(Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Edit::Delete(a, b)),
        (any::<Index>(), tricky_text()).prop_map(|(a, t)| Edit::Insert(a, t)),
        any::<Index>().prop_map(Edit::Truncate),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut s = text.to_string();
    for e in edits {
        match e {
            Edit::Delete(a, b) => {
                let (a, b) = (boundary(&s, a), boundary(&s, b));
                s.replace_range(a.min(b)..a.max(b), "");
            }
            Edit::Insert(a, t) => {
                let at = boundary(&s, a);
                s.insert_str(at, t);
            }
            Edit::Truncate(a) => {
                let at = boundary(&s, a);
                s.truncate(at);
            }
        }
    }
    s
}

/// Whatever the parser accepts, printing it and parsing again gives the same text: the studio
/// can restore parameters from any PNG and save them again without drift.
fn check_parameters(text: &str) -> Result<(), TestCaseError> {
    if let Ok(p) = Parameters::parse_a1111(text) {
        let printed = p.to_a1111();
        let again = Parameters::parse_a1111(&printed);
        prop_assert!(
            again.is_ok(),
            "{:?} -> {:?}: {:?}",
            text,
            printed,
            again.err()
        );
        prop_assert_eq!(again.expect("checked").to_a1111(), printed);
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn parameters_round_trip(p in parameters()) {
        let text = p.to_a1111();
        let parsed = Parameters::parse_a1111(&text);
        prop_assert!(parsed.is_ok(), "{:?}: {:?}", text, parsed.as_ref().err());
        prop_assert_eq!(parsed.expect("checked"), p, "{:?}", text);
    }

    #[test]
    fn parameters_arbitrary_text(text in any::<String>()) {
        check_parameters(&text)?;
    }

    #[test]
    fn parameters_tricky_text(text in tricky_text(), settings in tricky_text()) {
        check_parameters(&format!("{text}\nSteps: {settings}"))?;
    }

    #[test]
    fn parameters_mutated(p in parameters(), edits in prop::collection::vec(edit(), 1..4)) {
        check_parameters(&apply(&p.to_a1111(), &edits))?;
    }
}

// ---------------------------------------------------------------------------------------------
// Configs and sidecars

/// The tiny model's sidecar: real diffusers and transformers configs.
fn tiny_sidecar() -> Value {
    let bytes = std::fs::read(fixtures().join("tiny-sd.json")).expect("tiny-sd.json");
    serde_json::from_slice(&bytes).expect("sidecar json")
}

/// The fields a layer is sized from, where a zero must be refused.
const COUNT_FIELDS: [(&str, &str); 19] = [
    ("text_encoder", "vocab_size"),
    ("text_encoder", "hidden_size"),
    ("text_encoder", "intermediate_size"),
    ("text_encoder", "num_hidden_layers"),
    ("text_encoder", "num_attention_heads"),
    ("text_encoder", "max_position_embeddings"),
    ("unet", "in_channels"),
    ("unet", "out_channels"),
    ("unet", "layers_per_block"),
    ("unet", "norm_num_groups"),
    ("unet", "cross_attention_dim"),
    ("unet", "attention_head_dim"),
    ("unet", "sample_size"),
    ("unet", "transformer_layers_per_block"),
    ("vae", "in_channels"),
    ("vae", "out_channels"),
    ("vae", "latent_channels"),
    ("vae", "layers_per_block"),
    ("vae", "norm_num_groups"),
];

/// Other fields worth disturbing: widths lists, floats, flags, block types.
const OTHER_FIELDS: [(&str, &str); 8] = [
    ("unet", "block_out_channels"),
    ("vae", "block_out_channels"),
    ("unet", "norm_eps"),
    ("unet", "freq_shift"),
    ("unet", "down_block_types"),
    ("unet", "num_attention_heads"),
    ("vae", "scaling_factor"),
    ("text_encoder", "layer_norm_eps"),
];

/// Values a config field may hold in a stranger's file.
fn config_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        2 => Just(json!(0)),
        6 => prop::sample::select(vec![1u64, 2, 3, 4, 7, 8, 16, 32, 33, 64]).prop_map(|n| json!(n)),
        1 => prop::sample::select(vec![1u64 << 20, u32::MAX as u64, 1 << 40, u64::MAX]).prop_map(|n| json!(n)),
        1 => prop::sample::select(vec![-1.0, 0.5, 1e-30, 1e308, -1e308]).prop_map(|x| json!(x)),
        1 => Just(Value::Null),
        1 => Just(json!("x")),
        1 => prop::collection::vec(prop::sample::select(vec![0u64, 1, 8, 16, 32, 64, 96]), 0..5)
            .prop_map(|v| json!(v)),
        1 => Just(json!(["CrossAttnDownBlock2D", "Nonsense2D"])),
    ]
}

/// Edits of the sidecar: (field index over both lists, value).
fn config_edits() -> impl Strategy<Value = Vec<(Index, Value)>> {
    prop::collection::vec((any::<Index>(), config_value()), 1..4)
}

/// Applies the edits; the count fields set to zero.
fn edit_sidecar(edits: &[(Index, Value)]) -> (Value, Vec<String>) {
    let mut sidecar = tiny_sidecar();
    let mut zeroed = Vec::new();
    for (i, value) in edits {
        let n = COUNT_FIELDS.len() + OTHER_FIELDS.len();
        let k = i.index(n);
        let (section, field) = COUNT_FIELDS
            .get(k)
            .copied()
            .unwrap_or_else(|| OTHER_FIELDS[k - COUNT_FIELDS.len()]);
        if k < COUNT_FIELDS.len() && *value == json!(0) {
            zeroed.push(format!("{section}.{field}"));
        } else {
            zeroed.retain(|z| *z != format!("{section}.{field}"));
        }
        sidecar[section][field] = value.clone();
    }
    (sidecar, zeroed)
}

/// Small enough to build with random weights in a test case (every width and count bounded).
fn small(config: &latent_engine::checkpoint::ModelConfig) -> bool {
    let (t, u, v) = (&config.text_encoder, &config.unet, &config.vae);
    t.vocab_size <= 50_000
        && t.hidden_size <= 64
        && t.intermediate_size <= 128
        && t.num_hidden_layers <= 4
        && u.block_out_channels.iter().all(|&c| c <= 96)
        && u.layers_per_block <= 3
        && (0..u.block_out_channels.len()).all(|i| u.transformer_layers(i) <= 2)
        && u.cross_attention_dim <= 64
        && v.block_out_channels.iter().all(|&c| c <= 96)
        && v.layers_per_block <= 3
        && [
            u.in_channels,
            u.out_channels,
            v.in_channels,
            v.out_channels,
            v.latent_channels,
        ]
        .iter()
        .all(|&c| c <= 16)
}

/// The contract for a sidecar: a parse error, a clear refusal (always when a count is zero), or
/// a config that builds a model without panicking.
fn check_sidecar(edits: &[(Index, Value)]) -> Result<(), TestCaseError> {
    use latent_engine::checkpoint::ModelConfig;
    let (sidecar, zeroed) = edit_sidecar(edits);
    let Ok(config) = serde_json::from_value::<ModelConfig>(sidecar) else {
        return Ok(());
    };
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| config.validate()))
        .map_err(|_| TestCaseError::fail("validate panicked"))?;
    match checked {
        Err(reason) => prop_assert!(!reason.to_string().is_empty()),
        Ok(()) => {
            prop_assert!(zeroed.is_empty(), "zero {zeroed:?} accepted");
            if small(&config) {
                let device = burn::tensor::Device::flex();
                let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    latent_engine::StableDiffusion::random(
                        &config,
                        &device,
                        latent_engine::Precision::F32,
                    )
                    .map(|_| ())
                }));
                let built = built.map_err(|_| TestCaseError::fail("building panicked"))?;
                // What validation accepts, the model builds.
                prop_assert!(built.is_ok(), "accepted but not built: {:?}", built.err());
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: config().cases.min(64), ..config() })]

    #[test]
    fn sidecar_configs_never_panic(edits in config_edits()) {
        check_sidecar(&edits)?;
    }
}

/// Each count field at zero alone, and a zero width in either model's list, is refused with
/// the field named.
#[test]
fn every_zero_count_is_refused() {
    use latent_engine::checkpoint::ModelConfig;
    let zeroes = COUNT_FIELDS
        .iter()
        .map(|&(section, field)| (section, field, json!(0)))
        .chain([
            ("unet", "block_out_channels", json!([32, 0])),
            ("vae", "block_out_channels", json!([0, 32, 32, 32])),
        ]);
    for (section, field, value) in zeroes {
        let mut sidecar = tiny_sidecar();
        sidecar[section][field] = value;
        let config: ModelConfig = serde_json::from_value(sidecar).expect("parses");
        let reason = config
            .validate()
            .expect_err(&format!("{section}.{field} = 0 accepted"));
        assert!(
            reason.to_string().contains(field),
            "{section}.{field}: {reason}"
        );
    }
    if let Err(e) = tiny_sidecar_config().validate() {
        panic!("the tiny sidecar is refused: {e}");
    }
}

fn tiny_sidecar_config() -> latent_engine::checkpoint::ModelConfig {
    serde_json::from_value(tiny_sidecar()).expect("the tiny sidecar parses")
}

/// Through `Checkpoint::open`: a sidecar with zero groups beside the tiny model is refused at
/// open, naming the field and the sidecar.
#[test]
fn zero_groups_in_a_sidecar_is_a_clear_error() {
    let dir = scratch_dir("fuzz-sidecar");
    let model = dir.join("zero-groups.safetensors");
    std::fs::copy(fixtures().join("tiny-sd.safetensors"), &model).expect("copy");
    let mut sidecar = tiny_sidecar();
    sidecar["unet"]["norm_num_groups"] = json!(0);
    std::fs::write(model.with_extension("json"), sidecar.to_string()).expect("sidecar");
    match Checkpoint::open(&model) {
        Ok(_) => panic!("a zero-group sidecar opened"),
        Err(e @ Error::InvalidConfig { .. }) => {
            let text = e.to_string();
            assert!(text.contains("norm_num_groups is 0"), "{text}");
            assert!(text.contains("zero-groups.json"), "{text}");
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The committed corpus

fn corpus(kind: &str) -> Vec<PathBuf> {
    let dir = fixtures().join("fuzz").join(kind);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    files.sort();
    assert!(files.len() >= 5, "corpus {kind} has {} files", files.len());
    files
}

fn run_case(path: &Path, check: impl Fn(&[u8]) -> Result<(), TestCaseError>) {
    let bytes = std::fs::read(path).expect("corpus file");
    if let Err(e) = check(&bytes) {
        panic!("{}: {e}", path.display());
    }
}

#[test]
fn safetensors_corpus() {
    for path in corpus("safetensors") {
        run_case(&path, check_safetensors);
    }
}

#[test]
fn parameters_corpus() {
    for path in corpus("parameters") {
        run_case(&path, |bytes| {
            check_parameters(&String::from_utf8_lossy(bytes))
        });
    }
}
