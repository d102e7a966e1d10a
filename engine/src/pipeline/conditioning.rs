//! Stage 2 of a run: the request's prompts as the UNet's conditioning, in A1111's 75-token chunks
//! with its emphasis weights; SDXL's two encoders side by side with bigG's pooled state; the
//! negative's zeros where SDXL's rule says. The model keeps the last conditioning
//! ([`crate::prompt::ConditioningMemo`]): a request whose prompts, LoRAs and settings match the
//! previous one's reuses it and brings no text encoder to the device.

use burn::tensor::Tensor;

use super::{Notice, Observer, Txt2ImgRequest, sdxl};
use crate::error::Result;
use crate::prompt::{self, Chunks, Conditioning, ConditioningKey};
use crate::stable_diffusion::{Refiner, StableDiffusion};
use crate::tokenizer::ClipTokenizer;

/// The request's conditioning (`[2, 77·k, d]`, unconditional first, when `guided`; CFG ≤ 1 skips
/// the unconditional pass, as diffusers does) and the embeddings it used, `(name, short hash)`.
pub(super) fn encode(
    model: &StableDiffusion,
    tokenizer: &ClipTokenizer,
    req: &Txt2ImgRequest,
    guided: bool,
    observer: &mut dyn Observer,
) -> Result<(Conditioning, Vec<(String, String)>)> {
    let zeroed_negative = guided && sdxl::zero_negative(&model.config, &req.negative_prompt);
    let (key, ti_hashes) = key_of(tokenizer, req, guided, zeroed_negative, observer);
    if let Some(known) = model.conditioning.get(&key) {
        tracing::debug!("the prompts are the last request's: its conditioning is reused");
        return Ok((known, ti_hashes));
    }
    // The networks of the request's LoRA set; a parked model's text encoders come to the device
    // for this and leave when it returns.
    let networks = model.networks(&req.loras)?;
    // SDXL: both encoders side by side, and bigG's pooled state for the added conditioning.
    let conditioning = assemble(&key, |chunks| match &networks.text_encoder_2 {
        Some(second) => {
            let c = prompt::encode_sdxl(
                Some(&networks.text_encoder),
                second,
                chunks,
                key.clip_skip,
                key.emphasis,
            )?;
            Ok((c.context, Some(c.pooled)))
        }
        None => Ok((
            prompt::encode(&networks.text_encoder, chunks, key.clip_skip, key.emphasis)?,
            None,
        )),
    })?;
    model.conditioning.set(key, conditioning.clone());
    Ok((conditioning, ti_hashes))
}

/// The request's conditioning for SDXL's refiner: bigG's states alone and its pooled state,
/// the negative zeroed by the refiner's own rule (a refiner folder says false: the empty string
/// is encoded). The refiner runs without the request's LoRAs (they are the base model's).
pub(super) fn encode_refiner(
    refiner: &Refiner,
    tokenizer: &ClipTokenizer,
    req: &Txt2ImgRequest,
    guided: bool,
) -> Result<Conditioning> {
    let zeroed_negative = guided && sdxl::zero_negative(&refiner.config, &req.negative_prompt);
    // The base's encode said what there was to say about the prompts (truncation).
    let (mut key, _) = key_of(tokenizer, req, guided, zeroed_negative, &mut super::Quiet);
    key.loras = Default::default();
    if let Some(known) = refiner.conditioning.get(&key) {
        return Ok(known);
    }
    // A parked refiner's encoder comes to the device for this encode only.
    let text_encoder = refiner.text_encoder()?;
    let conditioning = assemble(&key, |chunks| {
        let c = prompt::encode_sdxl(None, &text_encoder, chunks, key.clip_skip, key.emphasis)?;
        Ok((c.context, Some(c.pooled)))
    })?;
    refiner.conditioning.set(key, conditioning.clone());
    Ok(conditioning)
}

/// What the request's conditioning depends on (its prompts as chunks, with their emphasis,
/// embeddings and LoRA set), and the embeddings used, `(name, short hash)`; a prompt cut short
/// is said to `observer`.
fn key_of(
    tokenizer: &ClipTokenizer,
    req: &Txt2ImgRequest,
    guided: bool,
    zeroed_negative: bool,
    observer: &mut dyn Observer,
) -> (ConditioningKey, Vec<(String, String)>) {
    let mut ti_hashes: Vec<(String, String)> = Vec::new();
    let mut chunks_of = |text: &str, which: &'static str, observer: &mut dyn Observer| {
        // Extra-network tags are read by the front end, not by the text encoder.
        let text = crate::lora::tags::strip(text);
        let chunks =
            Chunks::with_embeddings(tokenizer, &text, req.emphasis, req.embeddings.as_deref());
        for (_, e) in chunks.chunks.iter().flat_map(|c| &c.fixes) {
            if !ti_hashes.iter().any(|(name, _)| name == &e.name) {
                ti_hashes.push((e.name.clone(), e.hash.chars().take(12).collect()));
            }
        }
        if chunks.truncated {
            let notice = Notice::PromptTruncated {
                which,
                tokens: chunks.token_count,
                kept: prompt::MAX_CHUNKS * crate::tokenizer::MAX_PROMPT_TOKENS,
            };
            tracing::warn!("{notice}");
            observer.notice(&notice);
        }
        chunks
    };
    let prompt = chunks_of(&req.prompt, "prompt", observer);
    let negative = (guided && !zeroed_negative)
        .then(|| chunks_of(&req.negative_prompt, "negative prompt", observer));
    let embeddings = std::iter::once(&prompt)
        .chain(&negative)
        .flat_map(|c| &c.chunks)
        .flat_map(|c| &c.fixes)
        .map(|(_, e)| e.hash.clone())
        .collect();
    let key = ConditioningKey {
        prompt,
        negative,
        zeroed_negative,
        embeddings,
        clip_skip: req.clip_skip,
        emphasis: req.emphasis,
        loras: req.loras.clone(),
    };
    (key, ti_hashes)
}

/// `key`'s chunks through `encode` (a prompt's context and, for SDXL, its pooled state): the
/// prompt's, and the negative's or its zeros where guided, `[2, 77·k, d]` unconditional first.
fn assemble(
    key: &ConditioningKey,
    encode: impl Fn(&Chunks) -> Result<(Tensor<3>, Option<Tensor<2>>)>,
) -> Result<Conditioning> {
    let (cond, cond_pooled) = encode(&key.prompt)?;
    let (uncond, uncond_pooled) = match (&key.negative, key.zeroed_negative) {
        (Some(negative), _) => encode(negative)?,
        (None, true) => (
            cond.zeros_like(),
            cond_pooled.as_ref().map(|p| p.zeros_like()),
        ),
        (None, false) => {
            return Ok(Conditioning {
                context: cond,
                pooled: cond_pooled,
            });
        }
    };
    // Different chunk counts meet at their least common multiple (exact for attention).
    let chunks = |t: &Tensor<3>| t.dims()[1] / crate::tokenizer::CONTEXT_LEN;
    let common = prompt::common_chunks(chunks(&cond), chunks(&uncond));
    let (uncond, cond) = (
        prompt::repeat_chunks(uncond, common),
        prompt::repeat_chunks(cond, common),
    );
    // [2, 77·k, d]: unconditional first, as diffusers.
    let pooled = match (uncond_pooled, cond_pooled) {
        (Some(u), Some(c)) => Some(Tensor::cat(vec![u, c], 0)),
        _ => None,
    };
    Ok(Conditioning {
        context: Tensor::cat(vec![uncond, cond], 0),
        pooled,
    })
}
