//! The finishing pass of a product whose reduction was split over more cubes
//! ([`super::split_slices`]): the slices' f32 sums added, with the bias, a GEGLU's gate and the
//! residual, into the f16 output. Both cooperative-matrix GEMMs (plane and workgroup scope)
//! finish through it.

use burn::backend::wgpu::CubeTensor;
use burn::cubecl::prelude::*;

use super::kernel::{LANES as SUM_LANES, matmul_split_sum};

/// What a split product's finishing pass adds to its sums.
#[derive(Debug, Clone, Copy)]
pub(super) struct Finish {
    pub bias: bool,
    pub bias_per_row: bool,
    pub residual: bool,
    pub geglu: bool,
}

/// Launches [`matmul_split_sum`] (the SIMT product's, per-row biases included): `out`
/// `[batch, m, n]` (`[batch, m, n / 2]` for a GEGLU, f16) from the f32 `partial` sums
/// `[slices, batch, m, n]`, `bias` and `residual` as `finish` says.
pub(super) fn finish_split(
    partial: &CubeTensor,
    bias: &CubeTensor,
    residual: &CubeTensor,
    out: &CubeTensor,
    [m, n]: [usize; 2],
    [slices, batch]: [usize; 2],
    finish: Finish,
) -> Option<()> {
    let out_cols = if finish.geglu { n / 2 } else { n };
    let (gx, gy) = super::super::grid((batch * m * out_cols).div_ceil(SUM_LANES))?;
    // The matrices' rows stacked: `[slices, batch·m, n]`, a per-row bias repeating every `m`.
    matmul_split_sum::launch::<half::f16>(
        &out.client,
        CubeCount::Static(gx, gy, 1),
        CubeDim::new_1d(SUM_LANES as u32),
        super::super::buffer_arg(partial),
        super::super::buffer_arg(bias),
        super::super::buffer_arg(residual),
        super::super::buffer_arg(out),
        batch * m,
        n,
        n / 2,
        slices,
        m,
        finish.bias,
        finish.bias_per_row,
        finish.residual,
        finish.geglu,
    );
    Some(())
}

#[cfg(test)]
mod tests {
    use super::{Finish, finish_split};
    use crate::kernels::testing::{read, relative, tensor, values, wgpu};
    use crate::kernels::{output, resolve};
    use burn::tensor::{DType, Device, Tensor};

    /// The split product's finishing pass on any adapter (the GEMM itself needs cooperative
    /// matrices): the slices summed, the bias per row or per column, a GEGLU's gate and the
    /// residual, over two matrices, against the same arithmetic in burn ops on the CPU.
    #[test]
    fn split_sums_finish_as_the_unsplit_epilogue() {
        let (device, cpu) = (wgpu(), Device::flex());
        let (slices, batch, m, n) = (3, 2, 5, 16);
        let partial_values = values(slices * batch * m * n, 0.3);
        let partial: Tensor<4> = tensor(
            partial_values.clone(),
            [slices, batch, m, n],
            &device,
            DType::F32,
        );
        let sums = tensor::<4>(partial_values, [slices, batch, m, n], &cpu, DType::F32)
            .sum_dim(0)
            .reshape([batch, m, n]);
        for (per_row, geglu, with_residual) in [
            (false, false, false),
            (true, false, true),
            (false, true, false),
            (false, true, true),
        ] {
            let cols = if geglu { n / 2 } else { n };
            let bias_len = if per_row { m } else { n };
            let (bias_values, residual_values) =
                (values(bias_len, -0.2), values(batch * m * cols, 0.7));
            let bias_f: Tensor<1> = tensor(bias_values.clone(), [bias_len], &cpu, DType::F32);
            let biased = if per_row {
                sums.clone() + bias_f.reshape([1, m, 1])
            } else {
                sums.clone() + bias_f.reshape([1, 1, n])
            };
            let mut want = if geglu {
                let value = biased.clone().narrow(2, 0, cols);
                let gate = biased.narrow(2, cols, cols);
                value * crate::nn::gelu(gate)
            } else {
                biased
            };
            if with_residual {
                want = want + tensor(residual_values.clone(), [batch, m, cols], &cpu, DType::F32);
            }
            let bias: Tensor<1> = tensor(bias_values, [bias_len], &device, DType::F16);
            let residual: Tensor<3> =
                tensor(residual_values, [batch, m, cols], &device, DType::F16);
            let (out, oc) = output([batch, m, cols], DType::F16, &device).expect("output");
            let pc = resolve(partial.clone()).expect("partial");
            let bc = resolve(bias).expect("bias");
            let rc = resolve(residual).expect("residual");
            finish_split(
                &pc,
                &bc,
                &rc,
                &oc,
                [m, n],
                [slices, batch],
                Finish {
                    bias: true,
                    bias_per_row: per_row,
                    residual: with_residual,
                    geglu,
                },
            )
            .expect("launches");
            let rel = relative(&read(out), &read(want));
            assert!(
                rel < 1e-2,
                "per row {per_row}, GEGLU {geglu}, residual {with_residual}: {rel}"
            );
        }
    }
}
