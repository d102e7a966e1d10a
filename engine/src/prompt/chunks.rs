//! A prompt's token chunks as A1111 builds them (`tokenize_line` of its custom-words CLIP
//! wrapper): every weighted fragment tokenized on its own, tokens filled into chunks of 75, a
//! `BREAK` starting a new chunk, and a chunk that fills up within 20 tokens of a comma moving the
//! words after the comma to the next chunk, so that a phrase is not cut in two.

use crate::tokenizer::{BOS, CONTEXT_LEN, ClipTokenizer, EOS, MAX_PROMPT_TOKENS};

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

/// One encoder input: `[BOS] + 75 ids (padded with EOS) + [EOS]`, and each position's weight.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    pub ids: [u32; CONTEXT_LEN],
    pub weights: [f32; CONTEXT_LEN],
}

impl Chunk {
    /// The empty prompt's chunk: BOS, then EOS to the end, every weight 1.
    pub fn empty() -> Self {
        let mut ids = [EOS; CONTEXT_LEN];
        ids[0] = BOS;
        Chunk {
            ids,
            weights: [1.0; CONTEXT_LEN],
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
            for id in tokenizer.encode(&fragment) {
                builder.push(id, weight, Some(id) == comma);
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
}

impl Builder {
    fn push(&mut self, id: u32, weight: f32, is_comma: bool) {
        if is_comma {
            self.last_comma = Some(self.ids.len());
        } else if let Some(comma) = self.last_comma {
            let full = self.ids.len() == MAX_PROMPT_TOKENS;
            if full && self.ids.len() - comma <= COMMA_BACKTRACK {
                // The words after the comma open the next chunk.
                let ids = self.ids.split_off(comma + 1);
                let weights = self.weights.split_off(comma + 1);
                self.close(false);
                self.ids = ids;
                self.weights = weights;
            }
        }
        if self.ids.len() == MAX_PROMPT_TOKENS {
            self.close(false);
        }
        self.ids.push(id);
        self.weights.push(weight);
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
        self.chunks.push(chunk);
        self.ids.clear();
        self.weights.clear();
        self.last_comma = None;
    }
}
