//! The finishing pass of a product whose reduction was split over more cubes
//! ([`super::split_slices`]): the slices' f32 sums added, with the bias, a GEGLU's gate and the
//! residual, into the f16 output. Both cooperative-matrix GEMMs (plane and workgroup scope)
//! finish through it.

use burn::backend::wgpu::CubeTensor;
use burn::cubecl;
use burn::cubecl::prelude::*;

use super::kernel::{LANES as SUM_LANES, gelu};

/// Outputs a lane of [`split_sum`] finishes where the output's rows come in fours: 16-byte
/// loads of the f32 slices.
const VEC: usize = 4;

/// `vec` output values a lane (1, or 4 where `out_cols % 4 == 0`): the sum of `splits` slices of
/// `partial` (`[splits, rows, cols]`) plus the bias (per column, or with `bias_per_row` per row
/// of each `row_block`-row matrix the rows stack) and the epilogue (a GEGLU's output is `half`
/// wide: value column `n`, gate `half + n`; the residual is laid out as the output). Cube
/// `x + y·CUBE_COUNT_X` takes vectors `256·cube ..` in output order. Four a lane took SD 1.5's
/// 60 finishing passes a step from 0.679 ms of kernels (one a lane) to 0.577–0.581 (H200,
/// BENCHMARKS.md, forty-fifth session).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn split_sum<F: Float, N: Size>(
    partial: &[Vector<f32, N>],
    bias: &[F],
    residual: &[Vector<F, N>],
    out: &mut [Vector<F, N>],
    rows: usize,
    cols: usize,
    half: usize,
    splits: usize,
    row_block: usize,
    #[comptime] add_bias: bool,
    #[comptime] bias_per_row: bool,
    #[comptime] add_residual: bool,
    #[comptime] geglu: bool,
    #[comptime] vec: usize,
) {
    let cube = CUBE_POS_X as usize + CUBE_POS_Y as usize * CUBE_COUNT_X as usize;
    let o = cube * SUM_LANES + UNIT_POS as usize;
    let mut out_cols = cols;
    if geglu {
        out_cols = half;
    }
    let out_vectors = out_cols / vec;
    if o < rows * out_vectors {
        let m = o / out_vectors;
        let n = (o % out_vectors) * vec;
        let plane = rows * cols / vec;
        let mut sum = Vector::<f32, N>::new(0.0);
        for z in 0..splits {
            sum += partial[z * plane + (m * cols + n) / vec];
        }
        let mut gate = Vector::<f32, N>::new(0.0);
        if geglu {
            for z in 0..splits {
                gate += partial[z * plane + (m * cols + half + n) / vec];
            }
        }
        let mut residual_v = Vector::<F, N>::new(F::new(0.0));
        if add_residual {
            residual_v = residual[o];
        }
        let mut y = Vector::<F, N>::new(F::new(0.0));
        #[unroll]
        for e in 0..vec {
            let mut v = sum.extract(e);
            if add_bias {
                if bias_per_row {
                    v += f32::cast_from(bias[m % row_block]);
                } else {
                    v += f32::cast_from(bias[n + e]);
                }
            }
            if geglu {
                let mut g = gate.extract(e);
                if add_bias {
                    g += f32::cast_from(bias[half + n + e]);
                }
                v *= gelu(g);
            }
            if add_residual {
                v += f32::cast_from(residual_v.extract(e));
            }
            y.insert(e, F::cast_from(v));
        }
        out[o] = y;
    }
}

/// What a split product's finishing pass adds to its sums.
#[derive(Debug, Clone, Copy)]
pub(super) struct Finish {
    pub bias: bool,
    pub bias_per_row: bool,
    pub residual: bool,
    pub geglu: bool,
}

/// Launches [`split_sum`] (four outputs a lane where the rows come in fours): `out`
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
    let vec = if out_cols.is_multiple_of(VEC) { VEC } else { 1 };
    let (gx, gy) = super::super::grid((batch * m * out_cols / vec).div_ceil(SUM_LANES))?;
    // The matrices' rows stacked: `[slices, batch·m, n]`, a per-row bias repeating every `m`.
    split_sum::launch::<half::f16>(
        &out.client,
        CubeCount::Static(gx, gy, 1),
        CubeDim::new_1d(SUM_LANES as u32),
        vec,
        super::super::vector_arg(partial, vec),
        super::super::buffer_arg(bias),
        super::super::vector_arg(residual, vec),
        super::super::vector_arg(out, vec),
        batch * m,
        n,
        n / 2,
        slices,
        m,
        finish.bias,
        finish.bias_per_row,
        finish.residual,
        finish.geglu,
        vec,
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
        // 16 columns: four outputs a lane; 12 (a GEGLU's 6): one.
        for (slices, batch, m, n) in [(3, 2, 5, 16), (2, 2, 3, 12)] {
            split_sums_case(slices, batch, m, n);
        }
    }

    fn split_sums_case(slices: usize, batch: usize, m: usize, n: usize) {
        let (device, cpu) = (wgpu(), Device::flex());
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
