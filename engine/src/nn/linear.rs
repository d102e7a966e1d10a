//! `nn.Linear`, with our product where the device runs it ([`crate::kernels::matmul`]).

use std::sync::{Arc, OnceLock};

use burn::tensor::module::linear;
use burn::tensor::{DType, Tensor};

use crate::error::Result;
use crate::kernels::matmul::{self, LinearEpilogue, WeightLayout};
use crate::weights::Weights;

/// `nn.Linear`; the weight is kept as `[in, out]`.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor<2>,
    bias: Option<Tensor<1>>,
    /// How `weight`'s buffer lies (our product reads it in place).
    layout: WeightLayout,
    /// Where this layer's device stands for our SIMT product ([`matmul::place_of`]), settled at
    /// the first call; clones share it, a cast makes a new layer.
    place: Arc<OnceLock<matmul::Place>>,
    /// The cooperative-matrix GEMM where this layer's device runs it ([`matmul::mma_gemm_on`]),
    /// settled at the first call while [`matmul::mma_linears`] is on.
    mma: Arc<OnceLock<Option<matmul::MmaGemm>>>,
}

impl Linear {
    pub fn load(w: &Weights, d_in: usize, d_out: usize, bias: bool) -> Result<Self> {
        let weight = w.tensor("weight", [d_out, d_in])?.transpose();
        let bias = if bias {
            Some(w.tensor("bias", [d_out])?)
        } else {
            None
        };
        Ok(Self::with_layout(weight, bias, WeightLayout::OutIn))
    }

    /// From a `[in, out]` weight and an optional bias (benchmarks, tests).
    pub fn from_tensors(weight: Tensor<2>, bias: Option<Tensor<1>>) -> Self {
        Self::with_layout(weight, bias, WeightLayout::InOut)
    }

    fn with_layout(weight: Tensor<2>, bias: Option<Tensor<1>>, layout: WeightLayout) -> Self {
        Self {
            weight,
            bias,
            layout,
            place: Arc::default(),
            mma: Arc::default(),
        }
    }

    /// `[d_in, d_out]`.
    pub fn dims(&self) -> [usize; 2] {
        self.weight.dims()
    }

    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        self.forward_with(x, LinearEpilogue::Plain)
    }

    /// `forward(x) + residual`, the add fused into the product where our GEMM runs it.
    pub fn forward_add<const D: usize>(&self, x: Tensor<D>, residual: Tensor<D>) -> Tensor<D> {
        self.forward_with(x, LinearEpilogue::Residual(residual))
    }

    /// A GEGLU projection (outputs: values then gates): `value · gelu(gate)`, half as wide, the
    /// gate fused into the product where our GEMM runs it.
    pub fn forward_geglu<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        self.forward_with(x, LinearEpilogue::Geglu)
    }

    fn forward_with<const D: usize>(&self, x: Tensor<D>, epilogue: LinearEpilogue<D>) -> Tensor<D> {
        crate::profile::record(|| {
            let dims = x.dims();
            let [d_in, d_out] = self.weight.dims();
            crate::profile::OpShape::Linear {
                rows: dims[..D - 1].iter().product(),
                d_in,
                d_out,
                bias: self.bias.is_some(),
            }
        });
        if matmul::mma_linears()
            && let Some(gemm) = *self
                .mma
                .get_or_init(|| matmul::mma_gemm_on(&x.device(), self.weight.dtype()))
            && let Some(y) = matmul::linear_mma(
                gemm,
                x.clone(),
                &self.weight,
                self.layout,
                self.bias.as_ref(),
                None,
                epilogue.clone(),
            )
        {
            return y;
        }
        let dims = x.dims();
        let rows = dims[..D - 1].iter().product();
        let [_, cols] = self.weight.dims();
        let out_cols = match epilogue {
            LinearEpilogue::Geglu => cols / 2,
            _ => cols,
        };
        let place = *self
            .place
            .get_or_init(|| matmul::place_of(&x.device(), self.weight.dtype()));
        let rules = matmul::product_rules();
        if let Some(block) = rules.block(place, x.dtype(), rows, out_cols)
            && let Some(y) = matmul::linear(
                x.clone(),
                &self.weight,
                self.layout,
                self.bias.as_ref(),
                epilogue.clone(),
                matmul::Tiling {
                    slices: None,
                    block,
                    vector: rules.vector,
                    prefetch: rules.prefetch,
                },
            )
        {
            return y;
        }
        let y = linear(x, self.weight.clone(), self.bias.clone());
        match epilogue {
            LinearEpilogue::Plain => y,
            LinearEpilogue::Residual(r) => y + r,
            LinearEpilogue::Geglu => {
                let dims = y.dims();
                let half = dims[D - 1] / 2;
                let value = y.clone().narrow(D - 1, 0, half);
                let gate = y.narrow(D - 1, half, half);
                value * super::gelu(gate)
            }
        }
    }

    /// One layer computing `parts` side by side: output columns are each part's in order (q, k and
    /// v of an attention as one matmul). Parts without a bias get zeros where another has one.
    pub fn concat(parts: &[Linear]) -> Self {
        // Stacked as checkpoints store weights, `[out, in]`, and used through the transposed
        // view: burn's matmul on plain lanes ran q/k/v 2–4× faster that way than from a written
        // `[in, out]` (H100 under WGSL, eleventh session, BENCHMARKS.md).
        let out_in = Tensor::cat(
            parts.iter().map(|p| p.weight.clone().transpose()).collect(),
            0,
        );
        let bias = parts.iter().any(|p| p.bias.is_some()).then(|| {
            let biases = parts
                .iter()
                .map(|p| {
                    p.bias.clone().unwrap_or_else(|| {
                        let [_, d_out] = p.weight.dims();
                        Tensor::zeros([d_out], (&p.weight.device(), p.weight.dtype()))
                    })
                })
                .collect();
            Tensor::cat(biases, 0)
        });
        Self::with_layout(out_in.transpose(), bias, WeightLayout::OutIn)
    }

    /// Where the parts' weights are kept ([`Weights::keeping`]: a LoRA set is merged from them),
    /// keeps them (and their biases) as views of this fused layer's instead of the tensors they
    /// were loaded as, which the model would otherwise hold a second time (~1.2 GiB of SDXL's q/k/v,
    /// BENCHMARKS.md). `parts`: each part's weights and output width, in the order fused.
    pub fn keep_parts_as_views(&self, parts: &[(&Weights, usize)]) {
        // `[out, in]` as stored: each part's rows are a slice of the buffer, not a copy.
        let stacked = match self.layout {
            WeightLayout::OutIn => self.weight.clone().transpose(),
            WeightLayout::InOut => return,
        };
        let mut offset = 0;
        for (w, width) in parts {
            w.keep_instead("weight", stacked.clone().narrow(0, offset, *width));
            // Biased parts (the VAE's q/k/v) the same: their biases are slices of this one's.
            if let Some(bias) = &self.bias
                && w.contains("bias")
            {
                w.keep_instead("bias", bias.clone().narrow(0, offset, *width));
            }
            offset += width;
        }
    }

    /// A copy with its weights in `dtype` (e.g. the f32 VAE retry of an f16 model).
    pub fn cast(&self, dtype: DType) -> Self {
        // Cast the buffer as it lies, so the copy lies the same way.
        let weight = match self.layout {
            WeightLayout::OutIn => self.weight.clone().transpose().cast(dtype).transpose(),
            WeightLayout::InOut => self.weight.clone().cast(dtype),
        };
        Self::with_layout(
            weight,
            self.bias.clone().map(|b| b.cast(dtype)),
            self.layout,
        )
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{DType, Device, Tensor};

    use super::Linear;
    use crate::weights::Weights;

    /// A fused layer's parts, kept as slices of its weight, keep the values and shapes they were
    /// loaded with (each part's own rows), so a LoRA set merges from the same numbers. (That the
    /// model then holds them once is measured on the GPU: `bench --sdxl`, BENCHMARKS.md.)
    #[test]
    fn fused_parts_kept_as_slices_keep_their_loaded_values() {
        let device = Device::flex();
        let w = Weights::random("test", &device, DType::F32).keeping();
        let (wa, wb) = (w.pp("a"), w.pp("b"));
        let a = Linear::load(&wa, 4, 3, false).expect("a");
        let b = Linear::load(&wb, 4, 5, false).expect("b");
        let values = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().expect("f32");
        let a_out_in = values(a.weight.clone().transpose());
        let b_out_in = values(b.weight.clone().transpose());
        let fused = Linear::concat(&[a, b]);
        fused.keep_parts_as_views(&[(&wa, 3), (&wb, 5)]);
        let kept = w.take_kept();
        let read = |name: &str, shape: [usize; 2]| {
            values(kept.get(name).and_then(|k| k.as_shape(shape)).expect(name))
        };
        assert_eq!(read("a.weight", [3, 4]), a_out_in);
        assert_eq!(read("b.weight", [5, 4]), b_out_in);
    }
}
