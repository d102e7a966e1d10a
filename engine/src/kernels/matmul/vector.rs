//! [`super::kernel::matmul_nt`] with its staged operands laid along the reduction and read as
//! vectors of 4 f32.
//!
//! The scalar kernel stages both tiles depth-major and reads one f32 per row or column a step:
//! `2·block` workgroup-memory loads for `block²` products, as the SIMT convolution did before
//! its vectors (BENCHMARKS.md, thirty-fourth session: there, vectors took the f16 step under
//! WGSL from 115 to 98 ms). Here each staged row (of `x`, or of the weight's output features)
//! holds the step's 16 reduction indices as 4 vectors plus one of padding, so a lane reads one
//! vector per row and column for 4 products each: `2·block` loads for `4·block²` products. The
//! lane ownership, split and epilogue are the scalar kernel's ([`super::kernel::write_tile`]).
//! With `prefetch`, the next step's global loads are issued before this step's products (their
//! registers live across them), as the SIMT convolution's.

use burn::cubecl;
use burn::cubecl::prelude::*;

use super::kernel::{BK, LANES, SIDE, tile, weight_col, write_tile};

/// Values per vector.
pub(super) const SV: usize = 4;

/// See the module docs and [`super::kernel::matmul_nt`] (same arguments and cubes).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul_nt_vec<F: Float, N: Size>(
    x: &[F],
    w: &[F],
    bias: &[F],
    residual: &[F],
    out: &mut [F],
    partial: &mut [f32],
    rows: usize,
    cols: usize,
    depth: usize,
    half: usize,
    steps_per_split: usize,
    #[comptime] w_out_in: bool,
    #[comptime] add_bias: bool,
    #[comptime] add_residual: bool,
    #[comptime] geglu: bool,
    #[comptime] split: bool,
    #[comptime] block: usize,
    #[comptime] prefetch: bool,
) {
    let t = comptime!(tile(block));
    // Vectors a staged row holds: the step's 4, and one of padding so that the 8 lanes of a
    // 16-byte load phase (rows 5 vectors apart) fall in distinct banks.
    let kv = comptime!(BK / SV + 1);
    let lane = UNIT_POS as usize;
    let tx = lane % SIDE;
    let ty = lane / SIDE;
    let cx = CUBE_POS_X as usize;
    let m0 = CUBE_POS_Y as usize * t;

    let mut a_s = Shared::<[Vector<f32, N>]>::new_slice(comptime!(tile(block) * (BK / SV + 1)));
    let mut b_s = Shared::<[Vector<f32, N>]>::new_slice(comptime!(tile(block) * (BK / SV + 1)));
    let mut acc = Array::<f32>::new(comptime!(block * block));
    #[unroll]
    for i in 0..comptime!(block * block) {
        acc[i] = 0.0f32;
    }

    let steps = depth.div_ceil(BK);
    let mut first = 0usize;
    let mut last = steps;
    if split {
        first = CUBE_POS_Z as usize * steps_per_split;
        let end = first + steps_per_split;
        if end < steps {
            last = end;
        }
    }
    // Staging vector `v = lane + 256·r` of a tile: row `v / 4`, reduction vector `v % 4` (for a
    // `[depth, cols]` weight: column `v % t`, reduction vector `v / t`).
    let per = comptime!(tile(block) * BK / SV / LANES);
    let mut a_reg = Array::<Vector<f32, N>>::new(per);
    let mut b_reg = Array::<Vector<f32, N>>::new(per);
    let mut bv = Array::<Vector<f32, N>>::new(block);
    if prefetch && first < last {
        load_vectors::<F, N>(
            x, w, &mut a_reg, &mut b_reg, first, lane, m0, cx, rows, cols, half, depth, w_out_in,
            geglu, block,
        );
    }
    for s in first..last {
        if !prefetch {
            load_vectors::<F, N>(
                x, w, &mut a_reg, &mut b_reg, s, lane, m0, cx, rows, cols, half, depth, w_out_in,
                geglu, block,
            );
        }
        #[unroll]
        for r in 0..per {
            let v = lane + LANES * r;
            a_s[(v / SV) * kv + v % SV] = a_reg[r];
            if w_out_in {
                b_s[(v / SV) * kv + v % SV] = b_reg[r];
            } else {
                b_s[(v % t) * kv + v / t] = b_reg[r];
            }
        }
        sync_cube();
        if prefetch && s + 1 < last {
            load_vectors::<F, N>(
                x,
                w,
                &mut a_reg,
                &mut b_reg,
                s + 1,
                lane,
                m0,
                cx,
                rows,
                cols,
                half,
                depth,
                w_out_in,
                geglu,
                block,
            );
        }
        #[unroll]
        for q in 0..comptime!(BK / SV) {
            #[unroll]
            for j in 0..block {
                bv[j] = b_s[(tx + SIDE * j) * kv + q];
            }
            #[unroll]
            for i in 0..block {
                let a = a_s[(ty * block + i) * kv + q];
                #[unroll]
                for j in 0..block {
                    let b = bv[j];
                    let at = i * block + j;
                    acc[at] += a.extract(0usize) * b.extract(0usize);
                    acc[at] += a.extract(1usize) * b.extract(1usize);
                    acc[at] += a.extract(2usize) * b.extract(2usize);
                    acc[at] += a.extract(3usize) * b.extract(3usize);
                }
            }
        }
        sync_cube();
    }

    write_tile::<F>(
        &acc,
        out,
        partial,
        bias,
        residual,
        rows,
        cols,
        half,
        m0,
        cx,
        tx,
        ty,
        add_bias,
        add_residual,
        geglu,
        split,
        block,
    );
}

/// Step `s`'s staging vectors of this lane (zeros past the edges): 4 neighbouring reduction
/// indices of `x`'s row `m0 + v / 4` and of the weight's output feature for tile column `v / 4`
/// (`w_out_in`) or `v % t` (a `[depth, cols]` weight, read down 4 of its rows), columns mapped
/// by [`weight_col`].
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_vectors<F: Float, N: Size>(
    x: &[F],
    w: &[F],
    a_reg: &mut Array<Vector<f32, N>>,
    b_reg: &mut Array<Vector<f32, N>>,
    s: usize,
    lane: usize,
    m0: usize,
    cx: usize,
    rows: usize,
    cols: usize,
    half: usize,
    depth: usize,
    #[comptime] w_out_in: bool,
    #[comptime] geglu: bool,
    #[comptime] block: usize,
) {
    let t = comptime!(tile(block));
    #[unroll]
    for r in 0..comptime!(tile(block) * BK / SV / LANES) {
        let v = lane + LANES * r;
        let k = s * BK + (v % SV) * SV;
        let m = m0 + v / SV;
        let mut a = Vector::<f32, N>::new(0.0f32);
        if m < rows {
            #[unroll]
            for e in 0..SV {
                if k + e < depth {
                    a.insert(e, f32::cast_from(x[m * depth + k + e]));
                }
            }
        }
        a_reg[r] = a;
        let mut b = Vector::<f32, N>::new(0.0f32);
        if w_out_in {
            let (n, valid) = weight_col(cx, v / SV, cols, half, t, geglu);
            if valid {
                #[unroll]
                for e in 0..SV {
                    if k + e < depth {
                        b.insert(e, f32::cast_from(w[n * depth + k + e]));
                    }
                }
            }
        } else {
            let k2 = s * BK + (v / t) * SV;
            let (n, valid) = weight_col(cx, v % t, cols, half, t, geglu);
            if valid {
                #[unroll]
                for e in 0..SV {
                    if k2 + e < depth {
                        b.insert(e, f32::cast_from(w[(k2 + e) * cols + n]));
                    }
                }
            }
        }
        b_reg[r] = b;
    }
}
