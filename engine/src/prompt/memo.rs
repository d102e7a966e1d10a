//! The last conditioning a model encoded, kept so that a request with the same prompts (a new
//! seed, another sampler) encodes nothing, as A1111 keeps its `cached_c`/`cached_uc`. With the
//! text encoders parked in host memory ([`crate::TextEncoders`]) that also spares bringing them
//! to the device.

use std::sync::Mutex;

use burn::tensor::Tensor;

use super::{Chunks, Emphasis};
use crate::lora::LoraSet;

/// Everything a request's conditioning depends on besides the model's own weights.
#[derive(Debug, Clone, PartialEq)]
pub struct ConditioningKey {
    /// The prompt as encoded: tokens, weights, where each embedding goes (by name).
    pub prompt: Chunks,
    /// The negative prompt's chunks; `None` where there is none to encode (CFG off, or SDXL's
    /// zeroed empty negative).
    pub negative: Option<Chunks>,
    /// Whether the unconditional half is zeros (SDXL's `force_zeros_for_empty_prompt`).
    pub zeroed_negative: bool,
    /// The files of the embeddings both prompts use, by hash in order: a name's vectors change
    /// when its file is replaced or the folder is another.
    pub embeddings: Vec<String>,
    pub clip_skip: usize,
    pub emphasis: Emphasis,
    /// The LoRAs merged into the text encoders (the whole set: a changed UNet strength only
    /// costs an encode).
    pub loras: LoraSet,
}

/// A request's conditioning: `[b, 77·k, d]` context, SDXL's pooled `[b, projection]`.
#[derive(Debug, Clone)]
pub struct Conditioning {
    pub context: Tensor<3>,
    pub pooled: Option<Tensor<2>>,
}

/// The last key and what it encoded to.
#[derive(Debug, Default)]
pub struct ConditioningMemo {
    last: Mutex<Option<(ConditioningKey, Conditioning)>>,
    encodes: std::sync::atomic::AtomicUsize,
}

impl ConditioningMemo {
    /// What `key` encoded to last time, if it was the last key.
    pub fn get(&self, key: &ConditioningKey) -> Option<Conditioning> {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.as_ref()
            .filter(|(k, _)| k == key)
            .map(|(_, c)| c.clone())
    }

    /// Remembers `conditioning` as `key`'s (and counts an encode).
    pub fn set(&self, key: ConditioningKey, conditioning: Conditioning) {
        self.encodes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some((key, conditioning));
    }

    /// How many conditionings were encoded (not found here) so far.
    pub fn encodes(&self) -> usize {
        self.encodes.load(std::sync::atomic::Ordering::Relaxed)
    }
}
