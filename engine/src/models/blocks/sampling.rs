//! `Downsample2D` and `Upsample2D`, shared by the UNet and the VAE.

use burn::tensor::Tensor;
use burn::tensor::module::interpolate;
use burn::tensor::ops::{InterpolateMode, InterpolateOptions};

use crate::error::Result;
use crate::nn::Conv2d;
use crate::weights::Weights;

/// `Downsample2D`: a stride-2 3x3 convolution.
#[derive(Debug, Clone)]
pub struct Downsample {
    conv: Conv2d,
}

impl Downsample {
    pub fn load(w: &Weights, channels: usize, padding: usize) -> Result<Self> {
        Ok(Self {
            conv: Conv2d::load(&w.pp("conv"), channels, channels, 3, 2, padding)?,
        })
    }

    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        self.conv.forward(x)
    }
}

/// `Upsample2D`: nearest-neighbour ×2 then a 3x3 convolution.
#[derive(Debug, Clone)]
pub struct Upsample {
    conv: Conv2d,
}

impl Upsample {
    pub fn load(w: &Weights, channels: usize) -> Result<Self> {
        Ok(Self {
            conv: Conv2d::load(&w.pp("conv"), channels, channels, 3, 1, 1)?,
        })
    }

    /// A copy with its weights in `dtype`.
    pub fn cast(&self, dtype: burn::tensor::DType) -> Self {
        Self {
            conv: self.conv.cast(dtype),
        }
    }

    /// The 3x3 convolution after the ×2 nearest upsampling.
    pub fn conv(&self) -> &Conv2d {
        &self.conv
    }

    /// Doubles the size, or matches `size` when given: latents whose sides are not multiples of the
    /// UNet's total downscale come back to the skip connection's size (diffusers' `upsample_size`).
    pub fn forward(&self, x: Tensor<4>, size: Option<[usize; 2]>) -> Tensor<4> {
        let [_, _, h, w] = x.dims();
        let size = size.unwrap_or([h * 2, w * 2]);
        if size == [h * 2, w * 2] {
            return self.conv.forward_upsampled(x);
        }
        let up = interpolate(
            x,
            InterpolateOptions::new(InterpolateMode::Nearest).with_output_size(size),
        );
        self.conv.forward(up)
    }
}
