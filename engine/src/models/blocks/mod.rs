//! Blocks the UNet and the VAE share (diffusers `resnet.py`, `downsampling.py`,
//! `upsampling.py`): the resnet block and the ×2 down- and upsamplers.

pub mod resnet;
mod sampling;

pub use resnet::{ResnetBlock2D, ResnetSpec};
pub use sampling::{Downsample, Upsample};
