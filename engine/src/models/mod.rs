//! The networks of a Stable Diffusion checkpoint: the text encoder ([`clip`]), the denoising
//! [`unet`], the [`vae`] (with its compiled decoder and tiling) and the small preview decoder
//! ([`taesd`]), and the [`blocks`] the UNet and VAE share. Each is built from [`crate::nn`]
//! layers and [`crate::kernels`]; the pipeline strings them together.

pub mod blocks;
pub mod clip;
pub mod taesd;
pub mod unet;
pub mod vae;
