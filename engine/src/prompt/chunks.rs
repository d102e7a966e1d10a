//! A prompt's token chunks as A1111 builds them (`tokenize_line` of its custom-words CLIP
//! wrapper): every weighted fragment tokenized on its own, tokens filled into chunks of 75, a
//! `BREAK` starting a new chunk, and a chunk that fills up within 20 tokens of a comma moving the
//! words after the comma to the next chunk, so that a phrase is not cut in two. A
//! textual-inversion embedding named in the prompt takes as many positions as it has vectors,
//! in the chunk where they all fit.

use std::sync::Arc;

use crate::tokenizer::{BOS, CONTEXT_LEN, ClipTokenizer, EOS, MAX_PROMPT_TOKENS};

use super::embeddings::{Embedding, Embeddings};
use super::weights::parse_prompt_attention;

/// Most chunks read (2400 tokens): A1111 sets no bound, but a pasted novel must not become a
/// context of hundreds of thousands of tokens. Past it the prompt is cut with a notice.
pub const MAX_CHUNKS: usize = 32;

/// A1111's `comma_padding_backtrack` default: how far back a comma may be for the words after
/// it to move to the next chunk.
const COMMA_BACKTRACK: usize = 20;

/// How the weights of `(word:1.3)` are read and applied (A1111's "Emphasis mode" setting, plus
/// ComfyUI's rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Emphasis {
    /// A1111's default: each token's hidden state scaled by its weight, then the whole chunk
    /// rescaled so that its mean is what it was.
    #[default]
    Original,
    /// Scaled by the weights, the mean left as it falls.
    NoNorm,
    /// ComfyUI's: each weighted token's hidden state moved away from the empty prompt's state
    /// at the same position, `empty + (z − empty)·w`.
    Comfy,
    /// The syntax is parsed (brackets and weights removed from the text), the weights unused.
    Ignore,
    /// No syntax: brackets and weights are text like any other.
    Off,
}

impl Emphasis {
    /// Every mode, A1111's default first.
    pub const ALL: [Emphasis; 5] = [
        Emphasis::Original,
        Emphasis::NoNorm,
        Emphasis::Comfy,
        Emphasis::Ignore,
        Emphasis::Off,
    ];

    /// The name in the PNG's parameters text (A1111's option values; "ComfyUI" is ours).
    pub fn name(self) -> &'static str {
        match self {
            Emphasis::Original => "Original",
            Emphasis::NoNorm => "No norm",
            Emphasis::Comfy => "ComfyUI",
            Emphasis::Ignore => "Ignore",
            Emphasis::Off => "None",
        }
    }

    /// The mode a parameters text names, case-insensitively.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|e| e.name().eq_ignore_ascii_case(name.trim()))
    }
}

/// One encoder input: `[BOS] + 75 ids (padded with EOS) + [EOS]`, each position's weight, and
/// the embeddings whose vectors replace the placeholder ids (0) from a position on.
#[derive(Debug, Clone)]
pub struct Chunk {
    pub ids: [u32; CONTEXT_LEN],
    pub weights: [f32; CONTEXT_LEN],
    pub fixes: Vec<(usize, Arc<Embedding>)>,
}

impl PartialEq for Chunk {
    fn eq(&self, other: &Self) -> bool {
        let names = |c: &Chunk| -> Vec<(usize, String)> {
            c.fixes
                .iter()
                .map(|(at, e)| (*at, e.name.clone()))
                .collect()
        };
        self.ids == other.ids && self.weights == other.weights && names(self) == names(other)
    }
}

impl Chunk {
    /// The empty prompt's chunk: BOS, then EOS to the end, every weight 1.
    pub fn empty() -> Self {
        let mut ids = [EOS; CONTEXT_LEN];
        ids[0] = BOS;
        Chunk {
            ids,
            weights: [1.0; CONTEXT_LEN],
            fixes: Vec::new(),
        }
    }

    /// Whether any position's weight is not 1.
    pub fn weighted(&self) -> bool {
        self.weights.iter().any(|&w| w != 1.0)
    }
}

/// A prompt as chunks, with A1111's token count (75 for every chunk but the last, whose own
/// length counts): what the studio's counter shows against `75 · chunks`.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunks {
    pub chunks: Vec<Chunk>,
    pub token_count: usize,
    /// Whether chunks past [`MAX_CHUNKS`] were dropped (`token_count` counts them all).
    pub truncated: bool,
}

impl Chunks {
    /// `text` in chunks, its fragments weighted as `emphasis` reads them.
    pub fn new(tokenizer: &ClipTokenizer, text: &str, emphasis: Emphasis) -> Self {
        Self::with_embeddings(tokenizer, text, emphasis, None)
    }

    /// [`Self::new`] with the names of `embeddings` replaced by their vectors.
    pub fn with_embeddings(
        tokenizer: &ClipTokenizer,
        text: &str,
        emphasis: Emphasis,
        embeddings: Option<&Embeddings>,
    ) -> Self {
        let fragments = match emphasis {
            Emphasis::Off => vec![(text.to_string(), 1.0)],
            _ => parse_prompt_attention(text),
        };
        let comma = tokenizer.encode(",").first().copied();
        let mut builder = Builder::default();
        for (fragment, weight) in fragments {
            // Only a bare `BREAK` (weight exactly -1) breaks; inside brackets it is text.
            if fragment == "BREAK" && weight == -1.0 {
                builder.close(false);
                continue;
            }
            let weight = if emphasis == Emphasis::Ignore {
                1.0
            } else {
                weight
            };
            let tokens = tokenizer.encode(&fragment);
            let mut at = 0;
            while at < tokens.len() {
                let id = tokens[at];
                builder.make_room(Some(id) == comma);
                match embeddings.and_then(|e| e.find_at(&tokens, at)) {
                    Some((embedding, name_len)) => {
                        builder.push_embedding(embedding.clone(), weight);
                        at += name_len;
                    }
                    None => {
                        builder.ids.push(id);
                        builder.weights.push(weight);
                        at += 1;
                    }
                }
            }
        }
        if !builder.ids.is_empty() || builder.chunks.is_empty() {
            builder.close(true);
        }
        let mut chunks = builder.chunks;
        let truncated = chunks.len() > MAX_CHUNKS;
        chunks.truncate(MAX_CHUNKS);
        Chunks {
            chunks,
            token_count: builder.token_count,
            truncated,
        }
    }
}

/// The chunk being filled and those done.
#[derive(Default)]
struct Builder {
    chunks: Vec<Chunk>,
    ids: Vec<u32>,
    weights: Vec<f32>,
    token_count: usize,
    /// Where the last comma of the open chunk stands.
    last_comma: Option<usize>,
    /// Embeddings placed in the open chunk, at positions counted without BOS.
    fixes: Vec<(usize, Arc<Embedding>)>,
}

impl Builder {
    /// A1111's checks before each token: note a comma; a full chunk moves the words after a
    /// recent comma to the next one, or else closes.
    fn make_room(&mut self, is_comma: bool) {
        if is_comma {
            self.last_comma = Some(self.ids.len());
        } else if let Some(comma) = self.last_comma {
            let full = self.ids.len() == MAX_PROMPT_TOKENS;
            if full && self.ids.len() - comma <= COMMA_BACKTRACK {
                // The words after the comma open the next chunk (with any embedding among them:
                // A1111 leaves those behind, misplaced; they move with their words here).
                let ids = self.ids.split_off(comma + 1);
                let weights = self.weights.split_off(comma + 1);
                let (stay, moved): (Vec<_>, Vec<_>) =
                    self.fixes.drain(..).partition(|(at, _)| *at <= comma);
                self.fixes = stay;
                self.close(false);
                self.ids = ids;
                self.weights = weights;
                self.fixes = moved
                    .into_iter()
                    .map(|(at, e)| (at - (comma + 1), e))
                    .collect();
            }
        }
        if self.ids.len() == MAX_PROMPT_TOKENS {
            self.close(false);
        }
    }

    /// An embedding's placeholders, in a new chunk when its vectors do not fit this one.
    fn push_embedding(&mut self, embedding: Arc<Embedding>, weight: f32) {
        let n = embedding.vectors;
        if self.ids.len() + n > MAX_PROMPT_TOKENS {
            self.close(false);
        }
        self.fixes.push((self.ids.len(), embedding));
        self.ids.extend(std::iter::repeat_n(0, n));
        self.weights.extend(std::iter::repeat_n(weight, n));
    }

    /// Pads the open chunk with EOS at weight 1, wraps it in BOS/EOS and starts the next.
    fn close(&mut self, is_last: bool) {
        self.token_count += if is_last {
            self.ids.len()
        } else {
            MAX_PROMPT_TOKENS
        };
        let mut chunk = Chunk::empty();
        let n = self.ids.len().min(MAX_PROMPT_TOKENS);
        chunk.ids[1..=n].copy_from_slice(&self.ids[..n]);
        chunk.weights[1..=n].copy_from_slice(&self.weights[..n]);
        // Positions shift by the BOS in front.
        chunk.fixes = self.fixes.drain(..).map(|(at, e)| (at + 1, e)).collect();
        self.chunks.push(chunk);
        self.ids.clear();
        self.weights.clear();
        self.last_comma = None;
    }
}
