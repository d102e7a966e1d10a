//! From prompt text to the text encoder's conditioning, as A1111 builds it: emphasis weights in
//! its syntax ([`weights`]), 75-token chunks with `BREAK` and comma backtracking ([`Chunks`]),
//! each chunk encoded on its own, weighted ([`Emphasis`]), and the chunks concatenated along
//! the tokens, so that a prompt longer than 75 tokens is read whole rather than truncated.

mod chunks;
mod embeddings;
mod memo;
#[cfg(test)]
mod tests;
pub mod weights;

use burn::tensor::{DType, Tensor, TensorData};

pub use chunks::{Chunk, Chunks, Emphasis, MAX_CHUNKS};
pub use embeddings::{Embedding, Embeddings};
pub use memo::{Conditioning, ConditioningKey, ConditioningMemo};

use crate::Result;
use crate::clip::ClipTextModel;
use crate::tokenizer::{CONTEXT_LEN, EOS};

/// Rewrites every id after each row's first end token as `pad` (SD 2.x pads with 0 where SD 1.x
/// repeats the end token: A1111's `id_pad`, ComfyUI's `pad_with_end=False`).
fn pad_after_end(ids: &mut [Vec<u32>], pad: u32) {
    if pad == EOS {
        return;
    }
    for row in ids {
        if let Some(end) = row.iter().position(|&id| id == EOS) {
            row[end + 1..].fill(pad);
        }
    }
}

/// The conditioning of `chunks`: each chunk through `encoder` (A1111's `clip_skip`), its
/// weights applied as `emphasis` says, the chunks side by side.
///
/// # Shapes
/// -> `[1, 77 · chunks, hidden]`, in the encoder's dtype
pub fn encode(
    encoder: &ClipTextModel,
    chunks: &Chunks,
    clip_skip: usize,
    emphasis: Emphasis,
) -> Result<Tensor<3>> {
    encode_rows(
        chunks,
        emphasis,
        encoder.config().pad_token,
        false,
        |ids, fixes| encoder.forward_with(ids, clip_skip, fixes),
    )
}

/// SDXL's conditioning: `chunks` through both encoders as diffusers' `encode_prompt` and
/// ComfyUI use them (each one's layer `clip_skip` before the last, 2 by default, without the
/// final norm; [`ClipTextModel::encode_sdxl`]), each weighted as `emphasis` says, side by side
/// along the features; the pooled conditioning is the second encoder's projected end token of
/// the first chunk (as A1111 and ComfyUI take it for a long prompt). The refiner has no `first`:
/// its context is bigG's states alone.
///
/// # Shapes
/// -> context `[1, 77 · chunks, hidden₁ + hidden₂]`, pooled `[1, projection]`
pub fn encode_sdxl(
    first: Option<&ClipTextModel>,
    second: &ClipTextModel,
    chunks: &Chunks,
    clip_skip: usize,
    emphasis: Emphasis,
) -> Result<SdxlConditioning> {
    // A1111's `clip_skip` counts from the last layer, diffusers' counts the layers skipped past
    // the penultimate one, which SDXL always starts from: 1 (the request's default) and 2 both
    // mean the penultimate.
    let extra_skip = clip_skip.max(2) - 2;
    let a = first
        .map(|first| {
            encode_rows(
                chunks,
                emphasis,
                first.config().pad_token,
                false,
                |ids, fixes| first.encode_sdxl(ids, extra_skip, fixes).map(|e| e.hidden),
            )
        })
        .transpose()?;
    let mut pooled = None;
    let b = encode_rows(
        chunks,
        emphasis,
        second.config().pad_token,
        true,
        |ids, fixes| {
            let e = second.encode_sdxl(ids, extra_skip, fixes)?;
            pooled = e.pooled.map(|p| {
                let d = p.dims()[1];
                p.slice([0..1, 0..d])
            });
            Ok(e.hidden)
        },
    )?;
    let pooled = pooled.ok_or_else(|| {
        crate::Error::InvalidInput("SDXL's second text encoder has no projection".into())
    })?;
    Ok(SdxlConditioning {
        context: match a {
            Some(a) => Tensor::cat(vec![a, b], 2),
            None => b,
        },
        pooled,
    })
}

/// What SDXL conditions its UNet on besides the size and crop values.
#[derive(Debug, Clone)]
pub struct SdxlConditioning {
    /// Both encoders' states side by side, `[1, 77 · chunks, hidden₁ + hidden₂]`.
    pub context: Tensor<3>,
    /// The second encoder's projected end token, `[1, projection]`.
    pub pooled: Tensor<2>,
}

impl SdxlConditioning {
    /// diffusers' zeroed negative (`force_zeros_for_empty_prompt`): zeros shaped like `self`.
    pub fn zeros_like(&self) -> Self {
        Self {
            context: self.context.zeros_like(),
            pooled: self.pooled.zeros_like(),
        }
    }
}

/// [`encode`] with the rows `[n (+1), 77]` of ids (padded with `pad` after each end token)
/// run through `run`, which returns their states `[rows, 77, d]`; `second`: for SDXL's second
/// encoder, whose embedding vectors are each embedding's `second`.
fn encode_rows(
    chunks: &Chunks,
    emphasis: Emphasis,
    pad: u32,
    second: bool,
    run: impl FnOnce(&[Vec<u32>], &[Vec<(usize, &Embedding)>]) -> Result<Tensor<3>>,
) -> Result<Tensor<3>> {
    let weighted = chunks.chunks.iter().any(Chunk::weighted)
        && !matches!(emphasis, Emphasis::Ignore | Emphasis::Off);
    let mut ids: Vec<Vec<u32>> = chunks.chunks.iter().map(|c| c.ids.to_vec()).collect();
    // ComfyUI's rule moves each state away from the empty prompt's: encoded in the same batch.
    let with_empty = weighted && emphasis == Emphasis::Comfy;
    if with_empty {
        ids.push(Chunk::empty().ids.to_vec());
    }
    pad_after_end(&mut ids, pad);
    let fixes: Vec<Vec<(usize, &Embedding)>> = chunks
        .chunks
        .iter()
        .map(|c| {
            c.fixes
                .iter()
                .map(|(at, e)| match (second, &e.second) {
                    (true, Some(g)) => (*at, g.as_ref()),
                    _ => (*at, e.as_ref()),
                })
                .collect()
        })
        .collect();
    let z = run(&ids, &fixes)?; // [n (+1), 77, d]
    let [rows, n_tok, d] = z.dims();
    let n = chunks.chunks.len();
    let z = if weighted {
        let dtype = z.dtype();
        let device = z.device();
        let z = z.cast(DType::F32);
        let w: Vec<f32> = chunks.chunks.iter().flat_map(|c| c.weights).collect();
        let w = Tensor::<3>::from_data(
            TensorData::new(w, [n, CONTEXT_LEN, 1]),
            (&device, DType::F32),
        );
        let zc = z.clone().slice([0..n, 0..n_tok, 0..d]);
        let out = match emphasis {
            Emphasis::Original => {
                // Per chunk, as A1111 (one prompt per batch): the mean over tokens and channels
                // restored after scaling.
                let before = zc.clone().mean_dim(2).mean_dim(1);
                let scaled = zc * w;
                let after = scaled.clone().mean_dim(2).mean_dim(1);
                scaled * (before / after)
            }
            Emphasis::NoNorm => zc * w,
            Emphasis::Comfy => {
                let empty = z.slice([n..rows, 0..n_tok, 0..d]); // [1, 77, d]
                let empty = empty.repeat_dim(0, n);
                (zc - empty.clone()) * w + empty
            }
            Emphasis::Ignore | Emphasis::Off => zc,
        };
        out.cast(dtype)
    } else {
        z.slice([0..n, 0..n_tok, 0..d])
    };
    // [n, 77, d] -> [1, n·77, d]: the chunks one after another.
    Ok(z.reshape([1, n * n_tok, d]))
}

/// `context` (`[b, 77·k, d]`) repeated along the tokens to `77·chunks` (a multiple of `k`).
/// Attention over keys repeated whole is attention over the keys once (each weight and the
/// softmax's sum scale alike), so a prompt and a negative prompt of different chunk counts can
/// share one batch at their least common multiple, as ComfyUI batches them; A1111 runs the two
/// apart, with the same result.
pub fn repeat_chunks(context: Tensor<3>, chunks: usize) -> Tensor<3> {
    let [_, n, _] = context.dims();
    let have = n / CONTEXT_LEN;
    if have == 0 || chunks <= have || !chunks.is_multiple_of(have) {
        return context;
    }
    context.repeat_dim(1, chunks / have)
}

/// The least common multiple of two chunk counts (at least 1).
pub fn common_chunks(a: usize, b: usize) -> usize {
    let gcd = |mut x: usize, mut y: usize| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    let (a, b) = (a.max(1), b.max(1));
    a / gcd(a, b) * b
}
