//! The convolution's two `#[cube]` kernels: the implicit GEMM (whole or one slice of the
//! reduction) and the sum of the slices with the epilogue.

use burn::cubecl;
use burn::cubecl::prelude::*;

use super::super::accumulate;

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
pub(super) fn with_adds<F: Float>(
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

/// The pixels of a tile `rows` output channels tall: 256 lanes of `block` × `block` blocks.
pub(super) const fn tile_pixels(rows: usize, block: usize) -> usize {
    LANES * block * block / rows
}

/// The lane block's side for `c_out` output channels: 8 (a 128 × 128 tile) where
/// [`ConvRules::simt_wide`] asks for it and tiles of 128 channels divide the layer, else 4. On an
/// H100 in f32 the wide tile was 10–35 % faster on every SD 1.5 layer of 640 and 1280 channels,
/// but 4–9 % slower on the 320-channel ones at 64×64 as 64 × 256 tiles (BENCHMARKS.md,
/// twentieth session).
///
/// [`ConvRules::simt_wide`]: super::ConvRules::simt_wide
pub(super) fn tile_block(c_out: usize, wide: bool) -> usize {
    if wide && c_out.is_multiple_of(2 * BM) {
        8
    } else {
        4
    }
}

/// The tile height (output channels) for `c_out` and the lane block's side. With 4 × 4 blocks:
/// the smallest of 16, 32 and 64 that holds them all, else 64 — a narrower tile is as many lanes
/// over more pixels, so few channels (a 3-channel output, a small model's 16 or 32) are not
/// computed four or two times over. With 8 × 8 blocks: 128 (by 128 pixels).
pub(super) fn tile_rows(c_out: usize, block: usize) -> usize {
    if block == 8 {
        return 2 * BM;
    }
    match c_out {
        0..=16 => 16,
        17..=32 => 32,
        _ => BM,
    }
}

/// The input is `x` (`[b, c_in, h, wd]`) upsampled `up`× by nearest neighbour, read in place.
/// Cube `(pixel tile, channel tile, slice)`; the tile is `rows` ([`tile_rows`]) output channels by
/// [`tile_pixels`]`(rows, block)` pixels. Lane `(tx, ty)` owns output channels `ty·block ..
/// ty·block + block` and pixels `tx + lanes_x·j` (`lanes_x = cols / block` lanes share a `ty`;
/// `block` is 4 or 8, [`tile_block`]): neighbouring lanes touch
/// neighbouring pixels, so the staged input is read without bank conflicts and the output is
/// written coalesced. Split (`split`), slice `z` covers reduction steps `z·steps_per_split ..`
/// and writes its f32 sums to `partial[z, co, p]`; whole, the cube applies the epilogue and
/// writes `out[b, co, oy, ox]`.
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
    #[comptime] rows: usize,
    #[comptime] block: usize,
) {
    let cols = comptime!(tile_pixels(rows, block));
    let lanes_x = comptime!(cols / block);
    let lane = UNIT_POS as usize;
    let tx = lane % lanes_x;
    let ty = lane / lanes_x;
    let n0 = CUBE_POS_X as usize * cols;
    let m0 = CUBE_POS_Y as usize * rows;
    let k_total = c_in * kh * kw;
    let plane = oh * ow;

    // The staging positions of this lane are the same at every step (256 is a multiple of the
    // tile's sides): weights at column `lane % rows` of rows `lane / rows + (256 / rows)·r`,
    // input at column `lane % cols` of rows `lane / cols + (256 / cols)·r`. The input pixel's
    // coordinates are computed once.
    let col = lane % cols;
    let row0 = lane / cols;
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
    let co_stage = m0 + lane % rows;
    let a_row0 = lane / rows;

    let mut a_s = Shared::<[f32]>::new_slice(comptime!(BK * rows));
    let mut b_s = Shared::<[f32]>::new_slice(comptime!(BK * cols));
    let mut acc = Array::<f32>::new(comptime!(block * block));
    #[unroll]
    for i in 0..comptime!(block * block) {
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
    let a_per = comptime!(BK * rows / LANES);
    let b_per = comptime!(BK * cols / LANES);
    let mut a_reg = Array::<f32>::new(a_per);
    let mut b_reg = Array::<f32>::new(b_per);
    for s in first..last {
        load_step_simt::<F>(
            w, x, &mut a_reg, &mut b_reg, s, a_row0, row0, co_stage, c_out, k_total, p_valid,
            x_base, iy0, ix0, h, wd, pad, kh, kw, up, rows, cols,
        );
        // Stage w[k0 .. k0 + 16, m0 .. m0 + rows] and the gathered input for the tile's pixels.
        #[unroll]
        for r in 0..a_per {
            a_s[(a_row0 + comptime!(LANES / rows) * r) * rows + lane % rows] = a_reg[r];
        }
        #[unroll]
        for r in 0..b_per {
            b_s[(row0 + comptime!(LANES / cols) * r) * cols + col] = b_reg[r];
        }
        sync_cube();
        accumulate(
            a_s.clone(),
            b_s.clone(),
            &mut acc,
            tx,
            ty,
            BK,
            rows,
            cols,
            lanes_x,
            block,
        );
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
        lanes_x,
        block,
    );
}

/// Step `s`'s staging values of this lane into registers: packed weights `w[k, co_stage]` at
/// rows `a_row0 + (256 / rows)·r` and the gathered (upsampled, zero-padded) input at rows
/// `row0 + (256 / cols)·r`, zeros past the edges.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_step_simt<F: Float>(
    w: &[F],
    x: &[F],
    a_reg: &mut Array<f32>,
    b_reg: &mut Array<f32>,
    s: usize,
    a_row0: usize,
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
    #[comptime] rows: usize,
    #[comptime] cols: usize,
) {
    #[unroll]
    for r in 0..comptime!(BK * rows / LANES) {
        let k = s * BK + a_row0 + comptime!(LANES / rows) * r;
        let mut a = 0.0f32;
        if k < k_total && co_stage < c_out {
            a = f32::cast_from(w[k * c_out + co_stage]);
        }
        a_reg[r] = a;
    }
    #[unroll]
    for r in 0..comptime!(BK * cols / LANES) {
        let k = s * BK + row0 + comptime!(LANES / cols) * r;
        let mut b = 0.0f32;
        if k < k_total && p_valid {
            b = gather::<F>(x, x_base, k, iy0, ix0, h, wd, pad, kh, kw, up);
        }
        b_reg[r] = b;
    }
}

/// The (upsampled, zero-padded) input value at reduction index `k = (ci, ky, kx)` for the output
/// pixel whose top-left input corner is `(iy0, ix0)` in image `x_base`, in f32.
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

/// Lane `(tx, ty)`'s `block` × `block` block of a tile at `(m0, n0)`: output channels `ty·block ..`, pixels
/// `tx + lanes_x·j`, written to the slice's partial sums (`split`) or, with the epilogue's
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
    #[comptime] lanes_x: usize,
    #[comptime] block: usize,
) {
    #[unroll]
    for i in 0..block {
        let co = m0 + ty * block + i;
        if co < c_out {
            #[unroll]
            for j in 0..block {
                let p = n0 + tx + lanes_x * j;
                if p < pixels {
                    if split {
                        let z = CUBE_POS_Z as usize;
                        partial[(z * c_out + co) * pixels + p] = acc[i * block + j];
                    } else {
                        let batch = p / plane;
                        let o = (batch * c_out + co) * plane + p % plane;
                        let v = with_adds::<F>(
                            acc[i * block + j],
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
