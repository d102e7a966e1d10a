//! Latent Studio's engine: Stable Diffusion models in burn, checkpoint loading, tokenizer and
//! noise, with one code path for every burn device (wgpu and CPU) and dtype (f32 and f16).

pub mod adapters;
pub mod attention;
pub mod bounds;
pub mod checkpoint;
pub mod compiler;
pub mod device;
pub mod error;
pub mod io;
pub mod kernels;
pub mod limits;
pub mod lora;
pub mod model_cache;
pub mod models;
pub mod nn;
pub mod noise;
pub mod pipeline;
pub mod precision;
pub mod preview;
pub mod probe;
pub mod profile;
pub mod prompt;
pub mod schedulers;
pub mod selfcheck;
pub mod stable_diffusion;
pub mod tokenizer;
pub mod weights;

// The models' modules at the crate root too: their paths predate the `models` folder.
pub use models::vae::{compile as vae_compile, tiling as vae_tiling};
pub use models::{clip, taesd, unet, vae};

pub use error::{Error, Result};
// The paths these had before `io/`.
pub use io::{image as image_io, parameters};
pub use stable_diffusion::{LoadOptions, Precision, Refiner, StableDiffusion, TextEncoders};
