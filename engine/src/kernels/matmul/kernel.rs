//! The product's two `#[cube]` kernels: the tiled product (whole or one slice of the reduction)
//! and the sum of the slices with the bias.

use burn::cubecl;
use burn::cubecl::prelude::*;

use super::super::accumulate_4x4;

/// Rows (tokens) per cube.
pub(super) const BM: usize = 64;
/// Columns (output features) per cube.
pub(super) const BN: usize = 64;
/// Reduction step staged in workgroup memory.
pub(super) const BK: usize = 16;
/// Lanes per cube: 16 × 16, each a 4 × 4 block.
pub(super) const LANES: usize = 256;
/// Row stride of the staged tiles: one more than a tile's width, so the transposing stores
/// (16 lanes writing one column) fall in different banks.
const STRIDE: usize = BM + 1;

/// `out[m, n] = Σ_k x[m, k] · w[n, k] (+ bias[n])`: `x` is `[rows, depth]` row-major; `w` is
/// `[cols, depth]` (`w_out_in`: a linear weight as checkpoints store it) or `[depth, cols]`
/// (q, k and v concatenated), row-major. Cube `(column tile, row tile, slice)`. Each step stages a
/// 64 × 16 block of each operand, read along its contiguous axis (16 or 64 consecutive values)
/// and stored depth-major; lane `(tx, ty)` then
/// owns rows `ty·4 .. ty·4 + 4` and columns `tx + 16·j`, so neighbouring lanes write neighbouring
/// outputs. Split (`split`), slice `z` covers steps `z·steps_per_split ..` and writes f32 sums
/// to `partial[z, m, n]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul_nt<F: Float>(
    x: &[F],
    w: &[F],
    bias: &[F],
    out: &mut [F],
    partial: &mut [f32],
    rows: usize,
    cols: usize,
    depth: usize,
    steps_per_split: usize,
    #[comptime] w_out_in: bool,
    #[comptime] add_bias: bool,
    #[comptime] split: bool,
) {
    let lane = UNIT_POS as usize;
    let tx = lane % 16;
    let ty = lane / 16;
    let n0 = CUBE_POS_X as usize * BN;
    let m0 = CUBE_POS_Y as usize * BM;

    // Staging: value `lane + 256·r` of a 64 × 16 block is row `lane / 16 + 16·r`, depth `lane % 16`.
    let kk = lane % BK;
    let r0 = lane / BK;

    let mut a_s = Shared::<[f32]>::new_slice(BK * STRIDE);
    let mut b_s = Shared::<[f32]>::new_slice(BK * STRIDE);
    let mut acc = Array::<f32>::new(16usize);
    #[unroll]
    for i in 0..16usize {
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
    let mut a_reg = Array::<f32>::new(4usize);
    let mut b_reg = Array::<f32>::new(4usize);
    for s in first..last {
        load_step::<F>(
            x, w, &mut a_reg, &mut b_reg, s, lane, kk, r0, m0, n0, rows, cols, depth, w_out_in,
        );
        #[unroll]
        for r in 0..4usize {
            let rr = r0 + 16 * r;
            a_s[kk * STRIDE + rr] = a_reg[r];
            if w_out_in {
                b_s[kk * STRIDE + rr] = b_reg[r];
            } else {
                // Value `lane + 256·r` is depth `lane / 64 + 4·r`, column `lane % 64`.
                b_s[(lane / BN + 4 * r) * STRIDE + lane % BN] = b_reg[r];
            }
        }
        sync_cube();
        accumulate_4x4(
            a_s.clone(),
            b_s.clone(),
            &mut acc,
            tx,
            ty,
            BK,
            STRIDE,
            STRIDE,
            16usize,
        );
        sync_cube();
    }

    #[unroll]
    for i in 0..4usize {
        let m = m0 + ty * 4 + i;
        if m < rows {
            #[unroll]
            for j in 0..4usize {
                let n = n0 + tx + 16 * j;
                if n < cols {
                    if split {
                        let z = CUBE_POS_Z as usize;
                        partial[(z * rows + m) * cols + n] = acc[i * 4 + j];
                    } else {
                        let mut v = acc[i * 4 + j];
                        if add_bias {
                            v += f32::cast_from(bias[n]);
                        }
                        out[m * cols + n] = F::cast_from(v);
                    }
                }
            }
        }
    }
}

/// Step `s`'s staging values of this lane into registers (zeros past the edges): `x` at depth
/// `kk` of rows `r0 + 16·r`; `w` likewise (`w_out_in`) or at depth `lane / 64 + 4·r` of column
/// `lane % 64`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_step<F: Float>(
    x: &[F],
    w: &[F],
    a_reg: &mut Array<f32>,
    b_reg: &mut Array<f32>,
    s: usize,
    lane: usize,
    kk: usize,
    r0: usize,
    m0: usize,
    n0: usize,
    rows: usize,
    cols: usize,
    depth: usize,
    #[comptime] w_out_in: bool,
) {
    let k = s * BK + kk;
    #[unroll]
    for r in 0..4usize {
        let rr = r0 + 16 * r;
        let m = m0 + rr;
        let mut a = 0.0f32;
        if k < depth && m < rows {
            a = f32::cast_from(x[m * depth + k]);
        }
        a_reg[r] = a;
        let mut b = 0.0f32;
        if w_out_in {
            let n = n0 + rr;
            if k < depth && n < cols {
                b = f32::cast_from(w[n * depth + k]);
            }
        } else {
            let k2 = s * BK + lane / BN + 4 * r;
            let n = n0 + lane % BN;
            if k2 < depth && n < cols {
                b = f32::cast_from(w[k2 * cols + n]);
            }
        }
        b_reg[r] = b;
    }
}

/// One lane per output value: the sum of `splits` slices of `partial` (`[splits, rows, cols]`)
/// plus the bias. Cube `x + y·CUBE_COUNT_X` takes values `256·cube ..` in output order.
#[cube(launch)]
pub(super) fn matmul_split_sum<F: Float>(
    partial: &[f32],
    bias: &[F],
    out: &mut [F],
    rows: usize,
    cols: usize,
    splits: usize,
    #[comptime] add_bias: bool,
) {
    let cube = CUBE_POS_X as usize + CUBE_POS_Y as usize * CUBE_COUNT_X as usize;
    let o = cube * LANES + UNIT_POS as usize;
    let total = rows * cols;
    if o < total {
        let mut sum = 0.0f32;
        for z in 0..splits {
            sum += partial[z * total + o];
        }
        if add_bias {
            sum += f32::cast_from(bias[o % cols]);
        }
        out[o] = F::cast_from(sum);
    }
}
