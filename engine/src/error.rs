//! The engine's one error type. Messages are for artists: what happened, then the path.

use std::path::PathBuf;

/// Everything the engine can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // The OS error is in the message and deliberately not a `source`: `{:#}` chains (anyhow)
    // would print it twice.
    #[error("cannot {access} {what}: {cause} ({path})")]
    Io {
        access: Access,
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
        "unsupported model family: {found}. Latent Studio generates with Stable Diffusion 1.x, 2.x and XL for now ({path})"
    )]
    UnsupportedFamily { found: String, path: PathBuf },
    #[error(
        "not an SDXL refiner: {found}. A refiner is SDXL's second-stage model (sd_xl_refiner_1.0 and its fine-tunes) ({path})"
    )]
    NotARefiner { found: String, path: PathBuf },
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
         use f16, a device with larger limits, or the CPU",
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
    /// A config problem found before the file it came from is known; [`Error::in_file`] names it.
    #[error("invalid model config: {0}")]
    Config(String),
    #[error("{path} already exists and was left as it is")]
    OutputExists { path: PathBuf },
    #[error("unknown {what} `{value}`; expected one of: {expected}")]
    UnknownName {
        what: &'static str,
        value: String,
        expected: String,
    },
    #[error("not A1111 generation parameters: {0}")]
    InvalidParameters(String),
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    #[error("LoRA `{name}`: {reason}")]
    Lora { name: String, reason: String },
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("device error: {0}")]
    Device(String),
    #[error(
        "{adapter} did not open and compile its first kernels within {secs:.0} s (the driver may be \
         stuck); choose another adapter or the CPU"
    )]
    DeviceTimeout { adapter: String, secs: f64 },
    #[error(
        "{adapter} failed while opening (the driver panicked); choose another adapter or the CPU"
    )]
    DevicePanicked { adapter: String },
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

/// Which way a file operation went, so a full disk does not read as "cannot read".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Access::Read => "read",
            Access::Write => "write",
        })
    }
}

/// Bytes as MiB for messages.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Reading `what` at `path` failed.
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>, cause: std::io::Error) -> Self {
        Error::Io {
            access: Access::Read,
            what,
            path: path.into(),
            cause,
        }
    }

    /// Writing (creating, syncing, renaming) `what` at `path` failed.
    pub(crate) fn write(
        what: &'static str,
        path: impl Into<PathBuf>,
        cause: std::io::Error,
    ) -> Self {
        Error::Io {
            access: Access::Write,
            what,
            path: path.into(),
            cause,
        }
    }

    /// A [`Error::Config`] placed in the file it came from; other errors pass unchanged.
    pub fn in_file(self, path: impl Into<PathBuf>) -> Self {
        match self {
            Error::Config(reason) => Error::InvalidConfig {
                reason,
                path: path.into(),
            },
            other => other,
        }
    }

    /// An unknown name among `expected` (a setting, a sampler, a device kind).
    pub fn unknown(what: &'static str, value: &str, expected: &[&str]) -> Self {
        Error::UnknownName {
            what,
            value: value.to_string(),
            expected: expected.join(", "),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed write says "write" (a full disk once read "cannot read output file").
    #[test]
    fn io_errors_say_which_way_they_went() {
        let cause = || std::io::Error::new(std::io::ErrorKind::StorageFull, "disk full");
        let w = Error::write("output file", "/o/1.png", cause()).to_string();
        assert!(w.starts_with("cannot write output file: disk full"), "{w}");
        let r = Error::io("checkpoint", "/m.safetensors", cause()).to_string();
        assert!(r.starts_with("cannot read checkpoint"), "{r}");
    }

    /// Engine messages are shown by the studio too: no command-line flags in them.
    #[test]
    fn messages_name_no_command_line_flags() {
        let all = [
            Error::TensorTooLarge {
                name: "w".into(),
                bytes: 1 << 30,
                limit: 1 << 28,
            },
            Error::DeviceTimeout {
                adapter: "gpu:0".into(),
                secs: 60.0,
            },
            Error::DevicePanicked {
                adapter: "gpu:0".into(),
            },
            Error::OutputExists {
                path: "a.png".into(),
            },
            Error::Config("zero groups".into()).in_file("m.json"),
            Error::unknown("sampler", "eulr", &["euler", "euler_a"]),
        ];
        for e in all {
            let text = e.to_string();
            assert!(!text.contains("--"), "{text}");
        }
    }
}
