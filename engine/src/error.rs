//! The engine's one error type. Messages are for artists: what happened, then the path.

use std::path::PathBuf;

/// Everything the engine can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // The OS error is in the message and deliberately not a `source`: `{:#}` chains (anyhow)
    // would print it twice.
    #[error("cannot read {what}: {cause} ({path})")]
    Io {
        what: &'static str,
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("not a valid safetensors file: {reason} ({path})")]
    InvalidSafetensors { reason: String, path: PathBuf },
    #[error(
        "refusing to load a pickle checkpoint: .ckpt/.pt/.bin files can run arbitrary code when opened; \
         convert it to .safetensors first ({path})"
    )]
    PickleRefused { path: PathBuf },
    #[error(
        "unsupported model family: {found}. Latent Studio supports Stable Diffusion 1.x for now ({path})"
    )]
    UnsupportedFamily { found: String, path: PathBuf },
    #[error("missing tensor `{name}` required by the {component}")]
    MissingTensor {
        component: &'static str,
        name: String,
    },
    #[error("tensor `{name}` has shape {found:?}, the {component} expects {expected:?}")]
    ShapeMismatch {
        component: &'static str,
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error(
        "tensor `{name}` takes {}, more than the {} this device allows in one buffer; \
         use f16, a device with larger limits, or --device cpu",
        mib(*.bytes), mib(*.limit)
    )]
    TensorTooLarge {
        name: String,
        bytes: u64,
        limit: u64,
    },
    #[error("tensor `{name}` has dtype {dtype}, which cannot be used as a weight")]
    UnsupportedDtype { name: String, dtype: String },
    #[error("invalid model config: {reason} ({path})")]
    InvalidConfig { reason: String, path: PathBuf },
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("device error: {0}")]
    Device(String),
    #[error(
        "{adapter} did not open and compile its first kernels within {secs:.0} s (the driver may be \
         stuck); choose another adapter (see `latent-studio devices`, --device gpu:N) or use --device cpu"
    )]
    DeviceTimeout { adapter: String, secs: f64 },
    #[error("cancelled")]
    Cancelled,
    #[error(
        "the sampler produced NaN or infinite latents, so there is no image to decode; \
         try f32 precision or a lower CFG scale"
    )]
    NonFiniteLatents,
    #[error(
        "the VAE decoded NaN or infinite pixels even in {precision}; no image was made. \
         The VAE weights may be damaged or unsuited to this model"
    )]
    NonFiniteImage { precision: &'static str },
}

/// Bytes as MiB for messages.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>, cause: std::io::Error) -> Self {
        Error::Io {
            what,
            path: path.into(),
            cause,
        }
    }
}
