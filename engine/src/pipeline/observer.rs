//! What the pipeline tells its caller while it runs: each step, notices, finished images.

use std::time::Duration;

use burn::tensor::Tensor;

use crate::image_io::RgbImage;

/// Where the pipeline is, for progress bars and previews.
pub struct StepState<'a> {
    /// Index of the image within the batch count.
    pub image: usize,
    /// Steps done so far (1-based after a step).
    pub step: usize,
    pub total: usize,
    pub elapsed: Duration,
    /// The latent the sampler continues from. Read it, never mutate it.
    pub latents: &'a Tensor<4>,
    /// The predicted denoised latent of this step (a new tensor, safe to hand to previews).
    pub denoised: &'a Tensor<4>,
}

/// Things worth telling the artist that are not errors.
#[derive(Debug, Clone, PartialEq)]
pub enum Notice {
    /// The prompt passed [`crate::prompt::MAX_CHUNKS`] chunks of 75 tokens; the rest was not read.
    PromptTruncated {
        which: &'static str,
        tokens: usize,
        kept: usize,
    },
    PreviewFallback {
        wanted: &'static str,
        used: &'static str,
        reason: &'static str,
    },
    /// VAE compilation was abandoned for this model; the plain path decodes from now on.
    VaeCompileFallback { reason: String },
    /// The f16 VAE decoded NaN or infinite pixels; the image was decoded again in f32, and this
    /// model's VAE stays in f32 from now on (A1111's automatic `--no-half-vae`).
    VaeRetriedInF32,
}

impl std::fmt::Display for Notice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Notice::PromptTruncated {
                which,
                tokens,
                kept,
            } => write!(
                f,
                "the {which} has {tokens} tokens; only the first {kept} are read"
            ),
            Notice::PreviewFallback {
                wanted,
                used,
                reason,
            } => {
                write!(
                    f,
                    "preview: {wanted} is not available ({reason}); showing {used} instead"
                )
            }
            Notice::VaeCompileFallback { reason } => write!(
                f,
                "VAE compilation is off for this model: {reason}. Decoding uses the plain path; images are unaffected"
            ),
            Notice::VaeRetriedInF32 => f.write_str(
                "the VAE produced NaN in f16, so the image was decoded again in f32; \
                 this model's VAE stays in f32 from now on (slower, more memory)",
            ),
        }
    }
}

/// What the pipeline reports while it runs.
pub trait Observer {
    fn notice(&mut self, _notice: &Notice) {}
    fn step(&mut self, _state: &StepState<'_>) {}
    /// An image of the batch count is finished (decoded), before the next one starts: save it
    /// now, so that a later failure or a stuck device never costs the finished ones.
    fn image(&mut self, _generated: &Generated) {}
    /// A VAE decode starts, in `tiles` tiles (1: the whole latent at once). A tiled decode gives
    /// the untiled image, so this is the one sign of it.
    fn decoding(&mut self, _tiles: usize) {}
    /// A pass at `width`×`height` is the first at its shapes on this GPU since launch: its first
    /// step waits for the kernels' autotune (seconds to minutes), later runs start at once.
    fn tuning(&mut self, _width: usize, _height: usize) {}
}

/// An observer that ignores everything.
pub struct Quiet;
impl Observer for Quiet {}

/// One finished image and the seed it came from.
#[derive(Debug, Clone)]
pub struct Generated {
    pub image: RgbImage,
    pub seed: u64,
    /// The textual-inversion embeddings the prompts used, in order: (name, A1111's 12-digit
    /// hash), for the `TI hashes` entry of the parameters.
    pub ti_hashes: Vec<(String, String)>,
}
