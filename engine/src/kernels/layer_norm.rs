//! LayerNorm over the last dimension in one launch: [`ROW_LANES`] lanes a row, [`ROWS`] rows a
//! cube. Each lane sums its share of the row in f32, shifted by the row's first value (so a
//! large mean does not cancel the spread), the row's lanes pool their sums in workgroup memory,
//! then each lane writes its share normalised and affine in the data type (the row, just read,
//! comes from cache). Rows whose width comes in fours are read and written as vectors of four.
//! The twin is burn's `layer_norm` in f32 ([`crate::nn::LayerNorm::forward_plain`]).
//!
//! The first version gave each row a cube of 128 lanes and reduced twice across it: SD 1.5's 48
//! LayerNorms took 0.639 ms of kernels a step on an H200, 0.528 ms since (BENCHMARKS.md,
//! forty-fifth session). Loading a lane's vectors at once and keeping them for the second pass
//! changed nothing there (0.522 ms) and was left out.

use burn::cubecl;
use burn::cubecl::prelude::*;
use burn::tensor::Tensor;

use super::{Element, buffer_arg, grid, output, resolve, vector_arg};

/// Lanes per row: a row of 320 is 80 vectors, under three a lane.
const ROW_LANES: usize = 32;
const LOG2_ROW_LANES: usize = 5;
/// Rows per cube (256 lanes).
const ROWS: usize = 8;
const LANES: usize = ROW_LANES * ROWS;
/// Elements of a vector where the width allows (the widest WGSL takes).
const VEC: usize = 4;

/// Cube `(x, y)` normalises rows `ROWS·(x + y·CUBE_COUNT_X) + …` of `rows`, each of `dim / vec`
/// vectors of `vec` values.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn layer_norm_rows<F: Float, N: Size>(
    x: &[Vector<F, N>],
    y: &mut [Vector<F, N>],
    gamma: &[f32],
    beta: &[f32],
    rows: usize,
    dim: usize,
    eps: f32,
    #[comptime] vec: usize,
) {
    let lane = UNIT_POS as usize;
    let sub = lane % ROW_LANES;
    let cube = CUBE_POS_X as usize + CUBE_POS_Y as usize * CUBE_COUNT_X as usize;
    let row = cube * ROWS + lane / ROW_LANES;
    let vectors = dim / vec;
    let base = row * vectors;
    let mut shared = Shared::<[f32]>::new_slice(2 * LANES);

    let mut shift = 0.0f32;
    let mut s1 = 0.0f32;
    let mut s2 = 0.0f32;
    // Lanes past the last row still reach every barrier.
    if row < rows {
        shift = f32::cast_from(x[base].extract(0usize));
        let mut i = sub;
        while i < vectors {
            let xv = x[base + i];
            #[unroll]
            for e in 0..vec {
                let d = f32::cast_from(xv.extract(e)) - shift;
                s1 += d;
                s2 += d * d;
            }
            i += ROW_LANES;
        }
    }
    shared[lane] = s1;
    shared[LANES + lane] = s2;
    sync_cube();
    // Unrolled with constant strides (a runtime-halved stride miscompiles in CubeCL 0.11.3).
    #[unroll]
    for k in 1..LOG2_ROW_LANES + 1 {
        let stride = ROW_LANES >> k;
        if sub < stride {
            shared[lane] += shared[lane + stride];
            shared[LANES + lane] += shared[LANES + lane + stride];
        }
        sync_cube();
    }
    let first = lane - sub;
    let n = f32::cast_from(dim as u32);
    let t1 = shared[first];
    let t2 = shared[LANES + first];
    let mean = shift + t1 / n;
    let var = f32::max((t2 - t1 * t1 / n) / n, 0.0);
    let inv_std = f32::inverse_sqrt(var + eps);

    if row < rows {
        let mut i = sub;
        while i < vectors {
            let xv = x[base + i];
            let mut yv = Vector::<F, N>::new(F::new(0.0));
            #[unroll]
            for e in 0..vec {
                let k = i * vec + e;
                let v = (f32::cast_from(xv.extract(e)) - mean) * inv_std * gamma[k] + beta[k];
                yv.insert(e, F::cast_from(v));
            }
            y[base + i] = yv;
            i += ROW_LANES;
        }
    }
}

/// LayerNorm of `x` over its last dimension with f32 `gamma`/`beta`, by our kernel. `None` where it
/// does not run (CPU backend, other dtypes, too many rows); the caller then uses the twin.
///
/// # Shapes
/// x `[..., dim]`, gamma and beta `[dim]` -> like x
pub fn layer_norm<const D: usize>(
    x: &Tensor<D>,
    gamma: &Tensor<1>,
    beta: &Tensor<1>,
    eps: f64,
) -> Option<Tensor<D>> {
    let device = x.device();
    if !super::available(&device) {
        return None;
    }
    let dtype = x.dtype();
    let element = Element::of(dtype)?;
    let dims = x.dims();
    let dim = dims[D - 1];
    let rows: usize = dims[..D - 1].iter().product();
    if dim == 0 || rows == 0 || rows.saturating_mul(dim) >= u32::MAX as usize {
        return None;
    }
    let (gx, gy) = grid(rows.div_ceil(ROWS))?;
    let xc = resolve(x.clone())?;
    let gc = resolve(gamma.clone().cast(burn::tensor::DType::F32))?;
    let bc = resolve(beta.clone().cast(burn::tensor::DType::F32))?;
    let (out, oc) = output(dims, dtype, &device)?;
    let client = xc.client.clone();
    let count = CubeCount::Static(gx, gy, 1);
    let cube = CubeDim::new_1d(LANES as u32);
    let vec = if dim.is_multiple_of(VEC) { VEC } else { 1 };
    let (xa, ya, ga, ba) = (
        vector_arg(&xc, vec),
        vector_arg(&oc, vec),
        buffer_arg(&gc),
        buffer_arg(&bc),
    );
    let eps = eps as f32;
    match element {
        Element::F32 => layer_norm_rows::launch::<f32>(
            &client, count, cube, vec, xa, ya, ga, ba, rows, dim, eps, vec,
        ),
        Element::F16 => layer_norm_rows::launch::<half::f16>(
            &client, count, cube, vec, xa, ya, ga, ba, rows, dim, eps, vec,
        ),
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use burn::tensor::DType;

    use super::super::testing::{on_cpu, read, relative, tensor, values, wgpu};
    use crate::nn::LayerNorm;

    /// The kernel against burn's f32 `layer_norm`, in f32 and f16: widths below, at and past the
    /// lane count and not a multiple of it, batch 2, and a large mean.
    #[test]
    fn layer_norm_kernel_matches_burn_ops() {
        let device = wgpu();
        for (b, rows, dim, offset) in [
            (2, 3, 5, 1.0),
            (2, 77, 128, -2.0),
            (1, 64, 320, 3.0),
            (2, 9, 1281, 200.0),
            (1, 17, 1280, -50.0),
            (2, 5, 6, 0.5),
        ] {
            let gamma: Vec<f32> = (0..dim).map(|i| 0.5 + i as f32 / dim as f32).collect();
            let beta: Vec<f32> = (0..dim).map(|i| (i as f32 - 3.0) / 10.0).collect();
            let gamma = tensor(gamma, [dim], &device, DType::F32);
            let beta = tensor(beta, [dim], &device, DType::F32);
            // The twin on the CPU backend (burn's reductions would tune on lavapipe).
            let norm = LayerNorm::from_tensors(on_cpu(&gamma), on_cpu(&beta), 1e-5);
            for dtype in [DType::F32, DType::F16] {
                let x = tensor(
                    values(b * rows * dim, offset),
                    [b, rows, dim],
                    &device,
                    dtype,
                );
                let twin = norm.forward_plain(on_cpu(&x));
                let ours = super::layer_norm(&x, &gamma, &beta, 1e-5).expect("runs on wgpu");
                assert_eq!(ours.dtype(), dtype);
                let rel = relative(&read(ours), &read(twin));
                let tol = if dtype == DType::F32 { 1e-4 } else { 1e-2 };
                assert!(rel <= tol, "{b}x{rows}x{dim} {dtype:?}: rel {rel}");
            }
        }
    }
}
