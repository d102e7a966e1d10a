//! The few layers Stable Diffusion is built from, as plain tensors with a `load` from [`Weights`]
//! and a `forward`. Norms compute in f32 whatever the model dtype: their reductions over thousands
//! of values lose too much in f16 (diffusers' CUDA kernels accumulate in f32 too).

use burn::tensor::activation;
use burn::tensor::module::{embedding, layer_norm};
use burn::tensor::{DType, Int, Tensor, TensorData};

use crate::error::{Error, Result};
use crate::weights::Weights;

mod conv;
mod group_norm;
pub mod isolated;
mod linear;
pub mod rows;

pub use crate::attention::{MAX_SCORE_BYTES, multi_head_attention, wide_head_attention};
pub use conv::Conv2d;
pub use group_norm::{GroupMoments, GroupNorm, Kernels};
pub use linear::Linear;

/// `nn.LayerNorm` over the last dimension.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Tensor<1>,
    bias: Tensor<1>,
    eps: f64,
}

impl LayerNorm {
    pub fn load(w: &Weights, dim: usize, eps: f64) -> Result<Self> {
        Ok(Self {
            weight: w.tensor("weight", [dim])?.cast(DType::F32),
            bias: w.tensor("bias", [dim])?.cast(DType::F32),
            eps,
        })
    }

    /// From f32 affine parameters (benchmarks, tests).
    pub fn from_tensors(weight: Tensor<1>, bias: Tensor<1>, eps: f64) -> Self {
        Self { weight, bias, eps }
    }

    /// Our one-launch kernel ([`crate::kernels::layer_norm`]) where it runs, else
    /// [`Self::forward_plain`].
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        crate::profile::record(|| {
            let dims = x.dims();
            crate::profile::OpShape::LayerNorm {
                rows: dims[..D - 1].iter().product(),
                dim: dims[D - 1],
            }
        });
        if let Some(y) =
            crate::kernels::layer_norm::layer_norm(&x, &self.weight, &self.bias, self.eps)
        {
            return y;
        }
        self.forward_plain(x)
    }

    /// burn's `layer_norm` in f32: the kernel's twin, and what the CPU backend runs.
    pub fn forward_plain<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let dtype = x.dtype();
        layer_norm(
            x.cast(DType::F32),
            self.weight.clone(),
            Some(self.bias.clone()),
            self.eps,
        )
        .cast(dtype)
    }
}

/// `nn.Embedding`, its table in row chunks that each fit one buffer of the device (see
/// [`Weights::tensor_rows`]; one chunk unless the table is larger than the device allows).
#[derive(Debug, Clone)]
pub struct Embedding {
    chunks: Vec<Tensor<2>>,
    /// Rows of every chunk but the last.
    rows_per_chunk: usize,
    count: usize,
    dim: usize,
}

impl Embedding {
    pub fn load(w: &Weights, count: usize, dim: usize) -> Result<Self> {
        let chunks = w.tensor_rows("weight", [count, dim])?;
        let rows_per_chunk = chunks.first().map_or(count, |c| c.dims()[0]).max(1);
        Ok(Self {
            chunks,
            rows_per_chunk,
            count,
            dim,
        })
    }

    /// Looks up `ids` (`b` rows of `n`, row-major). Ids come from the host, so a table in chunks
    /// needs no device-side search: each chunk gathers the rows it holds, and one more gather puts
    /// them back in token order. Gathers copy, so the result equals a lookup in one table.
    ///
    /// # Shapes
    /// ids `b·n` -> `[b, n, dim]`
    pub fn forward(&self, ids: &[usize], b: usize, n: usize) -> Result<Tensor<3>> {
        if ids.len() != b * n {
            return Err(Error::InvalidInput(format!(
                "{} ids for a {b} x {n} lookup",
                ids.len()
            )));
        }
        if let Some(bad) = ids.iter().find(|&&id| id >= self.count) {
            return Err(Error::InvalidInput(format!(
                "id {bad} is outside the {}-row embedding",
                self.count
            )));
        }
        let device = self.device();
        let index = |values: Vec<i64>| {
            let len = values.len();
            Tensor::<1, Int>::from_data(TensorData::new(values, [len]), &device)
        };
        let to_i64 = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        if let [table] = self.chunks.as_slice() {
            let ids = index(ids.iter().map(|&id| to_i64(id)).collect()).reshape([b, n]);
            return Ok(embedding(table.clone(), ids));
        }
        let mut parts = Vec::new();
        // Token positions in the order the chunks gathered them.
        let mut gathered = Vec::with_capacity(ids.len());
        for (c, table) in self.chunks.iter().enumerate() {
            let first = c * self.rows_per_chunk;
            let (positions, local): (Vec<usize>, Vec<i64>) = ids
                .iter()
                .enumerate()
                .filter(|&(_, &id)| id / self.rows_per_chunk == c)
                .map(|(p, &id)| (p, to_i64(id - first)))
                .unzip();
            if !local.is_empty() {
                parts.push(table.clone().select(0, index(local)));
                gathered.extend(positions);
            }
        }
        let mut slot = vec![0i64; ids.len()];
        for (s, &p) in gathered.iter().enumerate() {
            slot[p] = to_i64(s);
        }
        Ok(Tensor::cat(parts, 0)
            .select(0, index(slot))
            .reshape([b, n, self.dim]))
    }

    pub fn device(&self) -> burn::tensor::Device {
        match self.chunks.first() {
            Some(t) => t.device(),
            None => burn::tensor::Device::flex(),
        }
    }

    /// How many tensors hold the table.
    pub fn chunks(&self) -> usize {
        self.chunks.len()
    }
}

pub fn silu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    activation::silu(x)
}

/// Exact (erf) GELU, as `torch.nn.functional.gelu` by default.
pub fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    activation::gelu(x)
}

/// CLIP's `quick_gelu`: `x * sigmoid(1.702 x)`.
pub fn quick_gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    x.clone() * activation::sigmoid(x * 1.702)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, Distribution};

    /// A table in chunks of 3 rows (ragged last chunk) looks up exactly what the whole table
    /// does, ids in any order and repeated.
    #[test]
    fn chunked_embedding_equals_one_table() {
        let device = Device::flex();
        let (count, dim) = (10, 4);
        let table = Tensor::<2>::random([count, dim], Distribution::Normal(0.0, 1.0), &device);
        let chunks = (0..count)
            .step_by(3)
            .map(|s| table.clone().slice([s..(s + 3).min(count), 0..dim]))
            .collect();
        let whole = Embedding {
            chunks: vec![table],
            rows_per_chunk: count,
            count,
            dim,
        };
        let split = Embedding {
            chunks,
            rows_per_chunk: 3,
            count,
            dim,
        };
        assert_eq!(split.chunks(), 4);
        let ids = [9, 0, 4, 4, 3, 2, 8, 1];
        let values = |e: &Embedding| {
            e.forward(&ids, 2, 4)
                .unwrap()
                .into_data()
                .try_to_vec::<f32>()
                .unwrap()
        };
        assert_eq!(values(&split), values(&whole));
        assert!(split.forward(&[10], 1, 1).is_err(), "id outside the table");
        assert!(
            split.forward(&[1, 2], 1, 1).is_err(),
            "ids and shape disagree"
        );
    }
}
