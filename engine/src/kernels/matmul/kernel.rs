//! The product's two `#[cube]` kernels: the tiled product (whole or one slice of the reduction)
//! and the sum of the slices with the epilogue.

use burn::cubecl;
use burn::cubecl::prelude::*;

use super::super::accumulate;

/// Reduction step staged in workgroup memory.
pub(super) const BK: usize = 16;
/// Lanes per cube: 16 × 16, each a `block` × `block` block of the tile.
pub(super) const LANES: usize = 256;
/// Lanes along either side of the tile.
pub(super) const SIDE: usize = 16;

/// The tile's side (rows and columns) for lane blocks of `block` × `block`: 64 or 128.
pub(super) const fn tile(block: usize) -> usize {
    SIDE * block
}

/// diffusers' GEGLU gate: gelu with erf.
#[cube]
pub(super) fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + Erf::erf(x * 0.70710677))
}

/// The weight column behind column `c` of cube column `cx`'s tile (`t` wide), and whether it
/// exists. Plain: `cx·t + c`. A GEGLU (`half` value columns, then their gates) maps the tile's
/// first half to values `cx·t/2 + c` and its second half to their gates, so the lane holding a
/// value (block column `j`) holds its gate too (`j + block/2`).
#[cube]
pub(super) fn weight_col(
    cx: usize,
    c: usize,
    cols: usize,
    half: usize,
    #[comptime] t: usize,
    #[comptime] geglu: bool,
) -> (usize, bool) {
    let mut n = cx * t + c;
    let mut valid = n < cols;
    if geglu {
        let h = comptime!(t / 2);
        let value = cx * h + c % h;
        valid = value < half;
        n = value;
        if c >= h {
            n = half + value;
        }
    }
    (n, valid)
}

/// `out[m, n] = Σ_k x[m, k] · w[n, k] (+ bias[n])` and the epilogue: `x` is `[rows, depth]`
/// row-major; `w` is `[cols, depth]` (`w_out_in`: a linear weight as checkpoints store it) or
/// `[depth, cols]` (q, k and v concatenated), row-major. The epilogue adds `residual` (shaped as
/// the output) or, for a GEGLU (`cols = 2·half`: values then gates), writes `value ·
/// gelu(gate)` `[rows, half]` ([`weight_col`] puts both in one lane).
///
/// Cube `(column tile, row tile, slice)`; the tile is `16·block` square ([`tile`]). Each step
/// stages a `tile × 16` block of each operand, read along its contiguous axis and stored
/// depth-major; lane `(tx, ty)` then owns rows `ty·block ..` and columns `tx + 16·j`, so
/// neighbouring lanes write neighbouring outputs. 8 × 8 blocks do four times the products per
/// staged value read, as the convolution's ([`super::super::conv`]). Split (`split`), slice `z`
/// covers steps `z·steps_per_split ..` and writes f32 sums to `partial[z, m, n]` (weight
/// columns), summed by [`super::split_sum::split_sum`].
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul_nt<F: Float>(
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
) {
    let t = comptime!(tile(block));
    // One more than the tile's side, so the transposing stores (16 lanes writing one column)
    // fall in different banks.
    let stride = comptime!(tile(block) + 1);
    let lane = UNIT_POS as usize;
    let tx = lane % SIDE;
    let ty = lane / SIDE;
    let cx = CUBE_POS_X as usize;
    let m0 = CUBE_POS_Y as usize * t;

    // Staging: value `r` of a lane is row `lane / 16 + 16·r`, depth `lane % 16` (or, for a
    // `[depth, cols]` weight, depth `lane / t + (256 / t)·r`, column `lane % t`).
    let kk = lane % BK;
    let r0 = lane / BK;

    let mut a_s = Shared::<[f32]>::new_slice(comptime!(BK * (tile(block) + 1)));
    let mut b_s = Shared::<[f32]>::new_slice(comptime!(BK * (tile(block) + 1)));
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
    // A step's staged values, all loaded into registers before any is stored.
    let mut a_reg = Array::<f32>::new(block);
    let mut b_reg = Array::<f32>::new(block);
    for s in first..last {
        load_step::<F>(
            x, w, &mut a_reg, &mut b_reg, s, lane, m0, cx, rows, cols, half, depth, w_out_in,
            geglu, block,
        );
        #[unroll]
        for r in 0..block {
            let rr = r0 + comptime!(LANES / BK) * r;
            a_s[kk * stride + rr] = a_reg[r];
            if w_out_in {
                b_s[kk * stride + rr] = b_reg[r];
            } else {
                b_s[(lane / t + comptime!(LANES / tile(block)) * r) * stride + lane % t] = b_reg[r];
            }
        }
        sync_cube();
        accumulate(
            a_s.clone(),
            b_s.clone(),
            &mut acc,
            tx,
            ty,
            BK,
            stride,
            stride,
            SIDE,
            block,
        );
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

/// Lane `(tx, ty)`'s `block` × `block` sums of the tile at `(m0, cx)`: rows `ty·block ..`,
/// tile columns `tx + 16·j` ([`weight_col`]), written as slice sums (`split`), a GEGLU's
/// `value · gelu(gate)`, or with the bias and residual added. Shared by [`matmul_nt`] and
/// [`super::vector::matmul_nt_vec`] (same lane ownership).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn write_tile<F: Float>(
    acc: &Array<f32>,
    out: &mut [F],
    partial: &mut [f32],
    bias: &[F],
    residual: &[F],
    rows: usize,
    cols: usize,
    half: usize,
    m0: usize,
    cx: usize,
    tx: usize,
    ty: usize,
    #[comptime] add_bias: bool,
    #[comptime] add_residual: bool,
    #[comptime] geglu: bool,
    #[comptime] split: bool,
    #[comptime] block: usize,
) {
    let t = comptime!(tile(block));
    if split {
        let z = CUBE_POS_Z as usize;
        #[unroll]
        for i in 0..block {
            let m = m0 + ty * block + i;
            if m < rows {
                #[unroll]
                for j in 0..block {
                    let (n, valid) = weight_col(cx, tx + SIDE * j, cols, half, t, geglu);
                    if valid {
                        partial[(z * rows + m) * cols + n] = acc[i * block + j];
                    }
                }
            }
        }
    } else if geglu {
        #[unroll]
        for i in 0..block {
            let m = m0 + ty * block + i;
            if m < rows {
                #[unroll]
                for j in 0..comptime!(block / 2) {
                    let (n, valid) = weight_col(cx, tx + SIDE * j, cols, half, t, geglu);
                    if valid {
                        let mut v = acc[i * block + j];
                        let mut g = acc[i * block + j + comptime!(block / 2)];
                        if add_bias {
                            v += f32::cast_from(bias[n]);
                            g += f32::cast_from(bias[half + n]);
                        }
                        out[m * half + n] = F::cast_from(v * gelu(g));
                    }
                }
            }
        }
    } else {
        #[unroll]
        for i in 0..block {
            let m = m0 + ty * block + i;
            if m < rows {
                #[unroll]
                for j in 0..block {
                    let n = cx * t + tx + SIDE * j;
                    if n < cols {
                        let mut v = acc[i * block + j];
                        if add_bias {
                            v += f32::cast_from(bias[n]);
                        }
                        if add_residual {
                            v += f32::cast_from(residual[m * cols + n]);
                        }
                        out[m * cols + n] = F::cast_from(v);
                    }
                }
            }
        }
    }
}

/// Step `s`'s staging values of this lane into registers (zeros past the edges): `x` at depth
/// `lane % 16` of rows `lane / 16 + 16·r`; `w` likewise (`w_out_in`) or at depth `lane / t +
/// (256 / t)·r` of column `lane % t`, its columns mapped by [`weight_col`].
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_step<F: Float>(
    x: &[F],
    w: &[F],
    a_reg: &mut Array<f32>,
    b_reg: &mut Array<f32>,
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
    let k = s * BK + lane % BK;
    let r0 = lane / BK;
    #[unroll]
    for r in 0..block {
        let rr = r0 + comptime!(LANES / BK) * r;
        let m = m0 + rr;
        let mut a = 0.0f32;
        if k < depth && m < rows {
            a = f32::cast_from(x[m * depth + k]);
        }
        a_reg[r] = a;
        let mut b = 0.0f32;
        if w_out_in {
            let (n, valid) = weight_col(cx, rr, cols, half, t, geglu);
            if k < depth && valid {
                b = f32::cast_from(w[n * depth + k]);
            }
        } else {
            let k2 = s * BK + lane / t + comptime!(LANES / tile(block)) * r;
            let (n, valid) = weight_col(cx, lane % t, cols, half, t, geglu);
            if k2 < depth && valid {
                b = f32::cast_from(w[k2 * cols + n]);
            }
        }
        b_reg[r] = b;
    }
}
