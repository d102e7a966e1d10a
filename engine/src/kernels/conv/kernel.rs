//! The convolution's two `#[cube]` kernels: the implicit GEMM (whole or one slice of the
//! reduction) and the sum of the slices with the epilogue.

use burn::cubecl;
use burn::cubecl::prelude::*;

use super::super::accumulate_4x4;

/// Output channels per cube.
pub(super) const BM: usize = 64;
/// Output pixels per cube.
pub(super) const BN: usize = 64;
/// Reduction step staged in workgroup memory.
pub(super) const BK: usize = 16;
/// Lanes per cube: 16 × 16, each a 4 × 4 block.
pub(super) const LANES: usize = 256;

/// The output value at `(co, p)`: `acc` plus the epilogue's adds, in f32, each where its flag is
/// set: `bias[co]`, `channel_add[batch, channel_col + co]` (the UNet's time embedding: a column
/// range of rows `channel_row` wide, the projections of every resnet made at once),
/// `residual[out_index]` (same layout as the output: the resnet's shortcut).
#[cube]
#[allow(clippy::too_many_arguments)]
fn with_adds<F: Float>(
    acc: f32,
    co: usize,
    batch: usize,
    out_index: usize,
    bias: &[F],
    channel_add: &[F],
    residual: &[F],
    channel_row: usize,
    channel_col: usize,
    #[comptime] add_bias: bool,
    #[comptime] add_channel: bool,
    #[comptime] add_residual: bool,
) -> f32 {
    let mut v = acc;
    if add_bias {
        v += f32::cast_from(bias[co]);
    }
    if add_channel {
        v += f32::cast_from(channel_add[batch * channel_row + channel_col + co]);
    }
    if add_residual {
        v += f32::cast_from(residual[out_index]);
    }
    v
}

/// The input is `x` (`[b, c_in, h, wd]`) upsampled `up`× by nearest neighbour, read in place.
/// Cube `(pixel tile, channel tile, slice)`. Lane `(tx, ty)` owns output channels
/// `ty·4 .. ty·4 + 4` and pixels `tx + 16·j`: neighbouring lanes touch neighbouring pixels, so
/// the staged input is read without bank conflicts and the output is written coalesced. Split
/// (`split`), slice `z` covers reduction steps `z·steps_per_split ..` and writes its f32 sums to
/// `partial[z, co, p]`; whole, the cube applies the epilogue and writes `out[b, co, oy, ox]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn conv2d_gemm<F: Float>(
    x: &[F],
    w: &[F],
    bias: &[F],
    channel_add: &[F],
    residual: &[F],
    out: &mut [F],
    partial: &mut [f32],
    c_in: usize,
    h: usize,
    wd: usize,
    c_out: usize,
    oh: usize,
    ow: usize,
    pixels: usize,
    stride: usize,
    pad: usize,
    steps_per_split: usize,
    channel_row: usize,
    channel_col: usize,
    #[comptime] kh: usize,
    #[comptime] kw: usize,
    #[comptime] up: usize,
    #[comptime] add_bias: bool,
    #[comptime] add_channel: bool,
    #[comptime] add_residual: bool,
    #[comptime] split: bool,
) {
    let lane = UNIT_POS as usize;
    let tx = lane % 16;
    let ty = lane / 16;
    let n0 = CUBE_POS_X as usize * BN;
    let m0 = CUBE_POS_Y as usize * BM;
    let k_total = c_in * kh * kw;
    let plane = oh * ow;

    // The staging position of this lane is the same at every step (256 is a multiple of 64):
    // column `lane % 64` of rows `lane / 64 + 4·r`. Its pixel's coordinates are computed once.
    let col = lane % BN;
    let row0 = lane / BN;
    let p_stage = n0 + col;
    let p_valid = p_stage < pixels;
    let mut p_clamped = 0usize;
    if p_valid {
        p_clamped = p_stage;
    }
    let s_batch = p_clamped / plane;
    let s_rem = p_clamped % plane;
    let iy0 = (s_rem / ow) * stride;
    let ix0 = (s_rem % ow) * stride;
    let x_base = s_batch * c_in * h * wd;
    let co_stage = m0 + col;

    let mut a_s = Shared::<[f32]>::new_slice(BK * BM);
    let mut b_s = Shared::<[f32]>::new_slice(BK * BN);
    let mut acc = Array::<f32>::new(16usize);
    #[unroll]
    for i in 0..16usize {
        acc[i] = 0.0f32;
    }

    let steps = k_total.div_ceil(BK);
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
        load_step_simt::<F>(
            w, x, &mut a_reg, &mut b_reg, s, row0, co_stage, c_out, k_total, p_valid, x_base, iy0,
            ix0, h, wd, pad, kh, kw, up,
        );
        // Stage w[k0 .. k0 + 16, m0 .. m0 + 64] and the gathered input for pixels n0 .. n0 + 64.
        #[unroll]
        for r in 0..4usize {
            let kk = row0 + 4 * r;
            a_s[kk * BM + col] = a_reg[r];
            b_s[kk * BN + col] = b_reg[r];
        }
        sync_cube();
        accumulate_4x4(a_s.clone(), b_s.clone(), &mut acc, tx, ty, BK, BM, BN);
        sync_cube();
    }

    write_block::<F>(
        &acc,
        out,
        partial,
        bias,
        channel_add,
        residual,
        m0,
        n0,
        tx,
        ty,
        c_out,
        pixels,
        plane,
        channel_row,
        channel_col,
        add_bias,
        add_channel,
        add_residual,
        split,
    );
}

/// The (upsampled, zero-padded) input value at reduction index `k = (ci, ky, kx)` for the output
/// pixel whose top-left input corner is `(iy0, ix0)` in image `x_base`, in f32.
/// Step `s`'s staging values of this lane into registers: packed weights `w[k, co_stage]` and
/// the gathered input, at rows `row0 + 4·r` (zeros past the edges).
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_step_simt<F: Float>(
    w: &[F],
    x: &[F],
    a_reg: &mut Array<f32>,
    b_reg: &mut Array<f32>,
    s: usize,
    row0: usize,
    co_stage: usize,
    c_out: usize,
    k_total: usize,
    p_valid: bool,
    x_base: usize,
    iy0: usize,
    ix0: usize,
    h: usize,
    wd: usize,
    pad: usize,
    #[comptime] kh: usize,
    #[comptime] kw: usize,
    #[comptime] up: usize,
) {
    #[unroll]
    for r in 0..4usize {
        let k = s * BK + row0 + 4 * r;
        let mut a = 0.0f32;
        if k < k_total && co_stage < c_out {
            a = f32::cast_from(w[k * c_out + co_stage]);
        }
        a_reg[r] = a;
        let mut b = 0.0f32;
        if k < k_total && p_valid {
            b = gather::<F>(x, x_base, k, iy0, ix0, h, wd, pad, kh, kw, up);
        }
        b_reg[r] = b;
    }
}

#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn gather<F: Float>(
    x: &[F],
    x_base: usize,
    k: usize,
    iy0: usize,
    ix0: usize,
    h: usize,
    wd: usize,
    pad: usize,
    #[comptime] kh: usize,
    #[comptime] kw: usize,
    #[comptime] up: usize,
) -> f32 {
    let taps = comptime!(kh * kw);
    let ci = k / taps;
    let tap = k % taps;
    let iy = iy0 + tap / kw;
    let ix = ix0 + tap % kw;
    let mut b = 0.0f32;
    // Unsigned: `iy - pad` is only formed inside the (upsampled) image, whose pixel (y, x) is
    // the input's (y / up, x / up).
    if iy >= pad && ix >= pad && iy - pad < h * up && ix - pad < wd * up {
        let sy = (iy - pad) / up;
        let sx = (ix - pad) / up;
        b = f32::cast_from(x[x_base + (ci * h + sy) * wd + sx]);
    }
    b
}

/// Lane `(tx, ty)`'s 4 × 4 block of a 64 × 64 tile at `(m0, n0)`: output channels `ty·4 ..`,
/// pixels `tx + 16·j`, written to the slice's partial sums (`split`) or, with the epilogue's
/// adds, to the output.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn write_block<F: Float>(
    acc: &Array<f32>,
    out: &mut [F],
    partial: &mut [f32],
    bias: &[F],
    channel_add: &[F],
    residual: &[F],
    m0: usize,
    n0: usize,
    tx: usize,
    ty: usize,
    c_out: usize,
    pixels: usize,
    plane: usize,
    channel_row: usize,
    channel_col: usize,
    #[comptime] add_bias: bool,
    #[comptime] add_channel: bool,
    #[comptime] add_residual: bool,
    #[comptime] split: bool,
) {
    #[unroll]
    for i in 0..4usize {
        let co = m0 + ty * 4 + i;
        if co < c_out {
            #[unroll]
            for j in 0..4usize {
                let p = n0 + tx + 16 * j;
                if p < pixels {
                    if split {
                        let z = CUBE_POS_Z as usize;
                        partial[(z * c_out + co) * pixels + p] = acc[i * 4 + j];
                    } else {
                        let batch = p / plane;
                        let o = (batch * c_out + co) * plane + p % plane;
                        let v = with_adds::<F>(
                            acc[i * 4 + j],
                            co,
                            batch,
                            o,
                            bias,
                            channel_add,
                            residual,
                            channel_row,
                            channel_col,
                            add_bias,
                            add_channel,
                            add_residual,
                        );
                        out[o] = F::cast_from(v);
                    }
                }
            }
        }
    }
}

/// The input unrolled for the product: `col[k, p]` is the value the implicit GEMM gathers for
/// reduction index `k` (channel, tap) and output pixel `p` (zero outside the image), in order, so
/// that neighbouring lanes write neighbouring pixels. With `batch_major` the layout is
/// `[b, k, oh·ow]` instead (one matrix per image, for a batched product whose output is already
/// `[b, c_out, oh·ow]`). One lane a value; cube `x + y·CUBE_COUNT_X`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn im2col<F: Float>(
    x: &[F],
    col: &mut [F],
    c_in: usize,
    h: usize,
    wd: usize,
    oh: usize,
    ow: usize,
    pixels: usize,
    stride: usize,
    pad: usize,
    k_total: usize,
    #[comptime] kh: usize,
    #[comptime] kw: usize,
    #[comptime] up: usize,
    #[comptime] batch_major: bool,
) {
    let cube = CUBE_POS_X as usize + CUBE_POS_Y as usize * CUBE_COUNT_X as usize;
    let o = cube * LANES + UNIT_POS as usize;
    if o < k_total * pixels {
        let map = oh * ow;
        let mut k = o / pixels;
        let mut p = o % pixels;
        if batch_major {
            let per_image = k_total * map;
            k = (o % per_image) / map;
            p = (o / per_image) * map + o % map;
        }
        let rem = p % map;
        let x_base = (p / map) * c_in * h * wd;
        let v = gather::<F>(
            x,
            x_base,
            k,
            (rem / ow) * stride,
            (rem % ow) * stride,
            h,
            wd,
            pad,
            kh,
            kw,
            up,
        );
        col[o] = F::cast_from(v);
    }
}

/// One lane per output value: the sum of `splits` slices of `partial` (`[splits, c_out,
/// pixels]`), plus the epilogue's adds, written `[b, c_out, oh, ow]`. Cube `x + y·CUBE_COUNT_X`
/// takes values `256·cube ..`, in output order (coalesced writes; the reads stride by plane).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn conv2d_split_sum<F: Float>(
    partial: &[f32],
    bias: &[F],
    channel_add: &[F],
    residual: &[F],
    out: &mut [F],
    c_out: usize,
    oh: usize,
    ow: usize,
    pixels: usize,
    splits: usize,
    channel_row: usize,
    channel_col: usize,
    #[comptime] add_bias: bool,
    #[comptime] add_channel: bool,
    #[comptime] add_residual: bool,
) {
    let cube = CUBE_POS_X as usize + CUBE_POS_Y as usize * CUBE_COUNT_X as usize;
    let o = cube * LANES + UNIT_POS as usize;
    let plane = oh * ow;
    let total = pixels * c_out;
    if o < total {
        let rem = o % plane;
        let bc = o / plane;
        let co = bc % c_out;
        let batch = bc / c_out;
        let p = batch * plane + rem;
        let mut sum = 0.0f32;
        for z in 0..splits {
            sum += partial[(z * c_out + co) * pixels + p];
        }
        let v = with_adds::<F>(
            sum,
            co,
            batch,
            o,
            bias,
            channel_add,
            residual,
            channel_row,
            channel_col,
            add_bias,
            add_channel,
            add_residual,
        );
        out[o] = F::cast_from(v);
    }
}
