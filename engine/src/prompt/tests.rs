//! The chunker and parser against A1111's behaviour on the cases of
//! `tests/fixtures/make_prompt_fixtures.py` (the conditioning itself is compared in
//! `tests/model_parity.rs`, where the tiny text encoder is loaded).

use serde::Deserialize;

use super::weights::parse_prompt_attention;
use super::{Chunks, Emphasis, MAX_CHUNKS, common_chunks};
use crate::tokenizer::{ClipTokenizer, MAX_PROMPT_TOKENS};

#[derive(Deserialize)]
struct Case {
    name: String,
    prompt: String,
    fragments: Vec<(String, f64)>,
    emphasis: String,
    chunks: Vec<ChunkCase>,
    token_count: usize,
}

#[derive(Deserialize)]
struct ChunkCase {
    ids: Vec<u32>,
    weights: Vec<f64>,
}

fn cases() -> Vec<Case> {
    serde_json::from_str(include_str!("../../../tests/fixtures/prompt_cases.json"))
        .expect("prompt_cases.json")
}

/// Fragments, chunk ids and weights, and the token count as A1111 builds them.
#[test]
fn chunks_match_a1111() {
    let tok = ClipTokenizer::new().expect("tokenizer");
    for case in cases() {
        let name = &case.name;
        let parsed = parse_prompt_attention(&case.prompt);
        assert_eq!(parsed.len(), case.fragments.len(), "{name}: {parsed:?}");
        for ((text, w), (want_text, want_w)) in parsed.iter().zip(&case.fragments) {
            assert_eq!(text, want_text, "{name}");
            assert!((f64::from(*w) - want_w).abs() < 1e-6, "{name}: {text} {w}");
        }
        let emphasis = Emphasis::from_name(&case.emphasis).expect("emphasis");
        let got = Chunks::new(&tok, &case.prompt, emphasis);
        assert_eq!(got.token_count, case.token_count, "{name}: token count");
        assert_eq!(got.chunks.len(), case.chunks.len(), "{name}: chunks");
        for (i, (chunk, want)) in got.chunks.iter().zip(&case.chunks).enumerate() {
            assert_eq!(chunk.ids.to_vec(), want.ids, "{name}: chunk {i} ids");
            for (w, want_w) in chunk.weights.iter().zip(&want.weights) {
                assert!((f64::from(*w) - want_w).abs() < 1e-6, "{name}: chunk {i}");
            }
        }
    }
}

/// The emphasis modes: `Off` reads brackets as text, `Ignore` drops them and their weights;
/// a `BREAK` inside brackets is text; names round-trip.
#[test]
fn emphasis_modes_and_breaks() {
    let tok = ClipTokenizer::new().expect("tokenizer");
    let text = "a (red:1.5) fox";
    let off = Chunks::new(&tok, text, Emphasis::Off);
    assert!(!off.chunks[0].weighted());
    assert_eq!(off.token_count, tok.encode(text).len());
    let ignore = Chunks::new(&tok, text, Emphasis::Ignore);
    assert!(!ignore.chunks[0].weighted());
    assert_eq!(ignore.token_count, tok.encode("a red fox").len());
    let original = Chunks::new(&tok, text, Emphasis::Original);
    assert_eq!(original.chunks[0].ids, ignore.chunks[0].ids);
    assert!(original.chunks[0].weights.contains(&1.5));

    let bracketed = Chunks::new(&tok, "a (cat BREAK dog)", Emphasis::Original);
    assert_eq!(bracketed.chunks.len(), 1, "a BREAK inside brackets is text");
    let broken = Chunks::new(&tok, "a cat BREAK BREAK dog", Emphasis::Original);
    assert_eq!(broken.chunks.len(), 3, "an empty chunk between two breaks");

    // 75 tokens fit one chunk; the 76th opens a second.
    let fits = vec!["cat"; MAX_PROMPT_TOKENS].join(" ");
    assert_eq!(Chunks::new(&tok, &fits, Emphasis::Original).chunks.len(), 1);
    let over = vec!["cat"; MAX_PROMPT_TOKENS + 1].join(" ");
    let over = Chunks::new(&tok, &over, Emphasis::Original);
    assert_eq!(
        (over.chunks.len(), over.token_count),
        (2, MAX_PROMPT_TOKENS + 1)
    );
    assert!(!over.truncated);
    // Past 32 chunks the rest is cut, the count still whole.
    let novel = vec!["cat"; MAX_PROMPT_TOKENS * MAX_CHUNKS + 10].join(" ");
    let novel = Chunks::new(&tok, &novel, Emphasis::Original);
    assert_eq!(novel.chunks.len(), MAX_CHUNKS);
    assert!(novel.truncated);
    assert_eq!(novel.token_count, MAX_PROMPT_TOKENS * MAX_CHUNKS + 10);

    for e in [
        Emphasis::Original,
        Emphasis::NoNorm,
        Emphasis::Comfy,
        Emphasis::Ignore,
        Emphasis::Off,
    ] {
        assert_eq!(Emphasis::from_name(e.name()), Some(e));
    }
    assert_eq!(Emphasis::from_name("no NORM "), Some(Emphasis::NoNorm));
    assert_eq!(Emphasis::from_name("sometimes"), None);
    assert_eq!(common_chunks(2, 3), 6);
    assert_eq!(common_chunks(0, 4), 4);
}
