//! Timestep embeddings (diffusers `Timesteps` + `TimestepEmbedding`).

use burn::tensor::{DType, Device, Tensor, TensorData};

use crate::checkpoint::Weights;
use crate::error::Result;
use crate::nn::{Linear, silu};

/// Sinusoidal projection of (possibly fractional) timesteps, computed in f32 as diffusers does.
///
/// # Shapes
/// `[b] -> [b, dim]`
pub fn timestep_projection(
    timesteps: &[f32],
    dim: usize,
    flip_sin_to_cos: bool,
    freq_shift: f32,
    device: &Device,
) -> Tensor<2> {
    let half = dim / 2;
    let mut out = Vec::with_capacity(timesteps.len() * dim);
    for &t in timesteps {
        // Same f32 arithmetic order as diffusers' get_timestep_embedding.
        let args: Vec<f32> = (0..half)
            .map(|i| {
                let exponent = -(10000f32.ln()) * i as f32 / (half as f32 - freq_shift);
                t * exponent.exp()
            })
            .collect();
        let (first, second): (Vec<f32>, Vec<f32>) = if flip_sin_to_cos {
            (
                args.iter().map(|a| a.cos()).collect(),
                args.iter().map(|a| a.sin()).collect(),
            )
        } else {
            (
                args.iter().map(|a| a.sin()).collect(),
                args.iter().map(|a| a.cos()).collect(),
            )
        };
        out.extend(first);
        out.extend(second);
        if dim % 2 == 1 {
            out.push(0.0);
        }
    }
    Tensor::from_data(
        TensorData::new(out, [timesteps.len(), dim]),
        (device, DType::F32),
    )
}

#[derive(Debug, Clone)]
pub struct TimestepEmbedding {
    linear_1: Linear,
    linear_2: Linear,
}

impl TimestepEmbedding {
    pub fn load(w: &Weights, d_in: usize, d_out: usize) -> Result<Self> {
        Ok(Self {
            linear_1: Linear::load(&w.pp("linear_1"), d_in, d_out, true)?,
            linear_2: Linear::load(&w.pp("linear_2"), d_out, d_out, true)?,
        })
    }

    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.linear_2.forward(silu(self.linear_1.forward(x)))
    }
}
