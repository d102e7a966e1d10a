//! `nn.Conv2d`: burn's convolution, or our implicit GEMM where it is the faster one.

use burn::tensor::module::conv2d;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Tensor};

use crate::checkpoint::Weights;
use crate::error::Result;

/// `nn.Conv2d` with square kernel, equal stride and symmetric padding.
#[derive(Debug, Clone)]
pub struct Conv2d {
    weight: Tensor<4>,
    bias: Option<Tensor<1>>,
    stride: usize,
    padding: usize,
    /// Our implicit-GEMM kernel, where it runs (devices without cooperative matrices).
    ours: crate::kernels::conv::Prepared,
}

impl Conv2d {
    pub fn load(
        w: &Weights,
        c_in: usize,
        c_out: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
    ) -> Result<Self> {
        Ok(Self {
            weight: w.tensor("weight", [c_out, c_in, kernel, kernel])?,
            bias: w.optional("bias", [c_out])?,
            stride,
            padding,
            ours: Default::default(),
        })
    }

    /// From an OIHW weight and an optional bias (benchmarks, tests).
    pub fn from_tensors(
        weight: Tensor<4>,
        bias: Option<Tensor<1>>,
        stride: usize,
        padding: usize,
    ) -> Self {
        Self {
            weight,
            bias,
            stride,
            padding,
            ours: Default::default(),
        }
    }

    /// # Shapes
    /// `[b, c_in, h, w] -> [b, c_out, h', w']`
    ///
    /// The bias is added after the convolution, not passed to it: in burn 0.22 / CubeCL 0.11 a
    /// bias adds a full-tile accumulator stage to the implicit-GEMM (cooperative-matrix) kernels,
    /// which then pass the 48 KiB workgroup-memory limit on most SD shapes and drop out of
    /// autotune, leaving the direct kernel (10x slower per UNet step on an H200). The add is
    /// fused with what follows. Where our kernel runs, the bias is added in its epilogue.
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        crate::profile::record(|| {
            let [b, c_in, h, w] = x.dims();
            let [c_out, _, k, _] = self.weight.dims();
            crate::profile::OpShape::Conv {
                b,
                c_in,
                c_out,
                h,
                w,
                k,
                stride: self.stride,
                padding: self.padding,
                bias: self.bias.is_some(),
            }
        });
        let ours = self.ours.forward(
            &x,
            &self.weight,
            self.bias.as_ref(),
            self.stride,
            self.padding,
        );
        if let Some(y) = ours {
            return y;
        }
        let options = ConvOptions::new([self.stride; 2], [self.padding; 2], [1, 1], 1);
        let y = conv2d(x, self.weight.clone(), None, options);
        match &self.bias {
            Some(b) => {
                let c = b.dims()[0];
                y + b.clone().reshape([1, c, 1, 1])
            }
            None => y,
        }
    }

    /// A copy with its weights in `dtype`.
    pub fn cast(&self, dtype: DType) -> Self {
        Self {
            weight: self.weight.clone().cast(dtype),
            bias: self.bias.clone().map(|b| b.cast(dtype)),
            stride: self.stride,
            padding: self.padding,
            ours: Default::default(),
        }
    }
}
