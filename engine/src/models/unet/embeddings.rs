//! Timestep embeddings (diffusers `Timesteps` + `TimestepEmbedding`).

use burn::tensor::{DType, Device, Tensor, TensorData};

use crate::error::{Error, Result};
use crate::nn::{Linear, silu};
use crate::weights::Weights;

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

/// SDXL's added conditioning (diffusers' `addition_embed_type = "text_time"`): each of the six
/// size and crop values (the refiner's five: sizes, crop and an aesthetic score) through the
/// UNet's sinusoid (`add_time_proj`), beside the pooled text
/// embedding, through `add_embedding` (a [`TimestepEmbedding`]); the result is added to the time
/// embedding of every step.
#[derive(Debug, Clone)]
pub struct AddEmbedding {
    pub(super) embedding: TimestepEmbedding,
    /// Sinusoid width of each value.
    pub(super) time_dim: usize,
    /// The embedding's input width: pooled + (6 or 5) × `time_dim`.
    pub(super) input: usize,
}

impl AddEmbedding {
    /// # Shapes
    /// text_embeds `[b, pooled]`, `b` rows of `n` time ids -> `[b, 4·c0]`
    pub fn forward(
        &self,
        text_embeds: &Tensor<2>,
        time_ids: &[impl AsRef<[f32]>],
        config: &super::UNetConfig,
    ) -> Result<Tensor<2>> {
        let [b, pooled] = text_embeds.dims();
        let n = time_ids.first().map_or(0, |r| r.as_ref().len());
        let ragged = time_ids.iter().any(|r| r.as_ref().len() != n);
        if time_ids.len() != b || ragged || pooled + n * self.time_dim != self.input {
            return Err(Error::InvalidInput(format!(
                "added conditioning: {} rows of {n} size values for {b} pooled embeddings of \
                 width {pooled}; the UNet takes {} = pooled + {} × {}",
                time_ids.len(),
                self.input,
                self.input.saturating_sub(pooled) / self.time_dim.max(1),
                self.time_dim
            )));
        }
        let flat: Vec<f32> = time_ids.iter().flat_map(|r| r.as_ref()).copied().collect();
        let device = text_embeds.device();
        let times = timestep_projection(
            &flat,
            self.time_dim,
            config.flip_sin_to_cos,
            config.freq_shift,
            &device,
        )
        .reshape([b, n * self.time_dim]);
        let dtype = text_embeds.dtype();
        // As diffusers: the sinusoids in f32, cast with the pooled embedding to the model's dtype.
        let input = Tensor::cat(vec![text_embeds.clone(), times.cast(dtype)], 1);
        Ok(self.embedding.forward(input))
    }
}
