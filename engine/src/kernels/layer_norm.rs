//! LayerNorm over the last dimension in one launch: one cube per row computes the row's mean and
//! M2 in f32 (two passes over a row that stays in cache), then writes the normalised, affine row in
//! the data type. The twin is burn's `layer_norm` in f32 ([`crate::nn::LayerNorm::forward_plain`]).

use burn::cubecl;
use burn::cubecl::prelude::*;
use burn::tensor::Tensor;

use super::{Element, buffer_arg, grid, output, resolve, span_moments};

/// Lanes per cube (one row each); a power of two for the reduction.
const LANES: usize = 128;
const LOG2_LANES: usize = 7;

/// Cube `(x, y)` normalises row `x + y·CUBE_COUNT_X` of `rows`.
#[cube(launch)]
fn layer_norm_rows<F: Float>(
    x: &[F],
    y: &mut [F],
    gamma: &[f32],
    beta: &[f32],
    rows: usize,
    dim: usize,
    eps: f32,
) {
    let row = CUBE_POS_X as usize + CUBE_POS_Y as usize * CUBE_COUNT_X as usize;
    if row >= rows {
        terminate!();
    }
    let lane = UNIT_POS as usize;
    let base = row * dim;
    let shared = Shared::<[f32]>::new_slice(LANES);
    let (mean, m2) = span_moments(x, base, dim, shared, LANES, LOG2_LANES);
    let inv_std = f32::inverse_sqrt(m2 / f32::cast_from(dim as u32) + eps);

    let mut k = lane;
    while k < dim {
        let v = (f32::cast_from(x[base + k]) - mean) * inv_std * gamma[k] + beta[k];
        y[base + k] = F::cast_from(v);
        k += LANES;
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
    if dim == 0 || rows == 0 || dim >= u32::MAX as usize {
        return None;
    }
    let (gx, gy) = grid(rows)?;
    let xc = resolve(x.clone())?;
    let gc = resolve(gamma.clone().cast(burn::tensor::DType::F32))?;
    let bc = resolve(beta.clone().cast(burn::tensor::DType::F32))?;
    let (out, oc) = output(dims, dtype, &device)?;
    let client = xc.client.clone();
    let count = CubeCount::Static(gx, gy, 1);
    let cube = CubeDim::new_1d(LANES as u32);
    let (xa, ya, ga, ba) = (
        buffer_arg(&xc),
        buffer_arg(&oc),
        buffer_arg(&gc),
        buffer_arg(&bc),
    );
    match element {
        Element::F32 => layer_norm_rows::launch::<f32>(
            &client, count, cube, xa, ya, ga, ba, rows, dim, eps as f32,
        ),
        Element::F16 => layer_norm_rows::launch::<half::f16>(
            &client, count, cube, xa, ya, ga, ba, rows, dim, eps as f32,
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
