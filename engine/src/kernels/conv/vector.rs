//! The SIMT convolution with its staged operands read as vectors of 4 f32.
//!
//! [`super::kernel::conv2d_gemm`] reads workgroup memory one f32 at a time: for a 4 × 4 lane
//! block that is 8 loads for 16 products a reduction index, so on a card the kernel is bound by
//! workgroup-memory instructions, not by its products (12–14 TFLOP/s of an H200's ~60 in f32
//! under WGSL, BENCHMARKS.md sixth session). Here a lane owns 4 neighbouring pixels per vector
//! (pixels `4·(tx + lanes_x·jj) ..` of its tile) instead of pixels `lanes_x` apart, so its
//! block's weights and inputs each come in `block / 4` vector loads: 2 loads for 16 products
//! (4 × 4), 4 for 64 (8 × 8). Staging stores vectors too: each lane gathers 4 neighbouring
//! pixels of one reduction index, their coordinates computed once, and the index's channel and
//! tap once for the four. With `prefetch`, the next step's global loads are issued before this
//! step's products (their registers live across them).
//!
//! With `deep`, each step stages 32 reduction indices instead of 16: half the barriers and
//! loop overhead a reduction, twice the workgroup memory (16 KiB for 64-channel tiles of 4 × 4
//! blocks, 20 KiB for 32-channel ones; the launcher keeps 16 where it would pass 32 KiB).
//! With `pv = 2` (4 × 8 blocks) a lane owns two vectors of pixels for its 4 channels.
//!
//! Same tiles, split and epilogue as the scalar kernel; the output is written 4 neighbouring
//! pixels a lane (coalesced along the map's rows).

use burn::cubecl;
use burn::cubecl::prelude::*;

use super::kernel::{BK, LANES, with_adds};

/// The reduction indices a step stages: [`BK`], or twice that with `deep`.
pub(super) const fn step_depth(deep: bool) -> usize {
    if deep { 2 * BK } else { BK }
}

/// Values per staged vector.
pub(super) const SV: usize = 4;

/// The tile's pixels for `rows` output channels, lane blocks of `block` channels and `pv`
/// vectors of pixels (`block / 4` for square blocks, [`super::kernel::tile_pixels`]).
pub(super) const fn tile_cols(rows: usize, block: usize, pv: usize) -> usize {
    LANES * block * pv * SV / rows
}

/// See the module docs. Cube `(pixel tile, channel tile, slice)` as the scalar kernel's; lane
/// `(tx, ty)` owns output channels `ty·block ..` and the `pv` pixel vectors `tx + lanes_x·jj`
/// (`pv = block / 4`: square blocks; 2 with 4 channels: 4 × 8 blocks, twice the pixels a tile).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn conv2d_gemm_vec<F: Float, N: Size>(
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
    #[comptime] pv: usize,
    #[comptime] prefetch: bool,
    #[comptime] deep: bool,
) {
    let bk = comptime!(step_depth(deep));
    let cols = comptime!(tile_cols(rows, block, pv));
    // Lanes along the pixels: each holds `pv` vectors of a channel's row.
    let lanes_x = comptime!(tile_cols(rows, block, pv) / (pv * SV));
    let bv = comptime!(block / SV);
    let lane = UNIT_POS as usize;
    let tx = lane % lanes_x;
    let ty = lane / lanes_x;
    let n0 = CUBE_POS_X as usize * cols;
    let m0 = CUBE_POS_Y as usize * rows;
    let k_total = c_in * kh * kw;
    let plane = oh * ow;

    // Staging: the weights' step is `bk` rows of `rows / 4` vectors, the input's `bk` rows of
    // `cols / 4`. A lane stages vector column `lane % row_vecs` of rows `lane / row_vecs +
    // (LANES / row_vecs)·r`; with fewer weight vectors than lanes (16- and 32-channel tiles),
    // the lanes past them stage none.
    let a_row_vecs = comptime!(rows / SV);
    let b_row_vecs = comptime!(cols / SV);
    let a_per = comptime!((step_depth(deep) * rows / SV).div_ceil(LANES));
    let b_per = comptime!(step_depth(deep) * cols / SV / LANES);
    let a_k0 = lane / a_row_vecs;
    let a_kstep = comptime!(LANES / a_row_vecs);
    let a_col = lane % a_row_vecs;
    let co_stage = m0 + a_col * SV;
    let b_k0 = lane / b_row_vecs;
    let b_kstep = comptime!(LANES / b_row_vecs);
    let b_col = lane % b_row_vecs;

    // The 4 pixels this lane gathers: their image's offset and top-left input corner, once.
    let mut p_valid = Array::<bool>::new(SV);
    let mut p_base = Array::<usize>::new(SV);
    let mut p_iy = Array::<usize>::new(SV);
    let mut p_ix = Array::<usize>::new(SV);
    #[unroll]
    for e in 0..SV {
        let p = n0 + b_col * SV + e;
        let valid = p < pixels;
        let mut pc = 0usize;
        if valid {
            pc = p;
        }
        let rem = pc % plane;
        p_valid[e] = valid;
        p_base[e] = (pc / plane) * c_in * h * wd;
        p_iy[e] = (rem / ow) * stride;
        p_ix[e] = (rem % ow) * stride;
    }

    let mut a_s = Shared::<[Vector<f32, N>]>::new_slice(comptime!(step_depth(deep) * rows / SV));
    let mut b_s = Shared::<[Vector<f32, N>]>::new_slice(comptime!(step_depth(deep) * cols / SV));
    let mut acc = Array::<Vector<f32, N>>::new(comptime!(block * pv));
    #[unroll]
    for i in 0..comptime!(block * pv) {
        acc[i] = Vector::<f32, N>::new(0.0f32);
    }

    let steps = k_total.div_ceil(bk);
    let mut first = 0usize;
    let mut last = steps;
    if split {
        first = CUBE_POS_Z as usize * steps_per_split;
        let end = first + steps_per_split;
        if end < steps {
            last = end;
        }
    }
    let mut a_reg = Array::<Vector<f32, N>>::new(a_per);
    let mut b_reg = Array::<Vector<f32, N>>::new(b_per);
    if prefetch && first < last {
        load_vectors::<F, N>(
            w, x, &mut a_reg, &mut b_reg, first, a_k0, b_k0, co_stage, c_out, k_total, &p_valid,
            &p_base, &p_iy, &p_ix, h, wd, pad, kh, kw, up, a_per, a_kstep, b_per, b_kstep, bk,
        );
    }
    for s in first..last {
        if !prefetch {
            load_vectors::<F, N>(
                w, x, &mut a_reg, &mut b_reg, s, a_k0, b_k0, co_stage, c_out, k_total, &p_valid,
                &p_base, &p_iy, &p_ix, h, wd, pad, kh, kw, up, a_per, a_kstep, b_per, b_kstep, bk,
            );
        }
        #[unroll]
        for r in 0..a_per {
            let kk = a_k0 + a_kstep * r;
            if kk < bk {
                a_s[kk * a_row_vecs + a_col] = a_reg[r];
            }
        }
        #[unroll]
        for r in 0..b_per {
            b_s[(b_k0 + b_kstep * r) * b_row_vecs + b_col] = b_reg[r];
        }
        sync_cube();
        if prefetch && s + 1 < last {
            load_vectors::<F, N>(
                w,
                x,
                &mut a_reg,
                &mut b_reg,
                s + 1,
                a_k0,
                b_k0,
                co_stage,
                c_out,
                k_total,
                &p_valid,
                &p_base,
                &p_iy,
                &p_ix,
                h,
                wd,
                pad,
                kh,
                kw,
                up,
                a_per,
                a_kstep,
                b_per,
                b_kstep,
                bk,
            );
        }
        let mut av = Array::<Vector<f32, N>>::new(bv);
        let mut xv = Array::<Vector<f32, N>>::new(pv);
        #[unroll]
        for q in 0..bk {
            #[unroll]
            for i in 0..bv {
                av[i] = a_s[q * a_row_vecs + ty * bv + i];
            }
            #[unroll]
            for jj in 0..pv {
                xv[jj] = b_s[q * b_row_vecs + tx + lanes_x * jj];
            }
            #[unroll]
            for i in 0..block {
                let a = Vector::<f32, N>::new(av[i / SV].extract(i % SV));
                #[unroll]
                for jj in 0..pv {
                    acc[i * pv + jj] += a * xv[jj];
                }
            }
        }
        sync_cube();
    }

    // Channel `m0 + ty·block + i`, pixels `n0 + 4·(tx + lanes_x·jj) + e`.
    #[unroll]
    for i in 0..block {
        let co = m0 + ty * block + i;
        if co < c_out {
            #[unroll]
            for jj in 0..pv {
                let v = acc[i * pv + jj];
                #[unroll]
                for e in 0..SV {
                    let p = n0 + (tx + lanes_x * jj) * SV + e;
                    if p < pixels {
                        if split {
                            let z = CUBE_POS_Z as usize;
                            partial[(z * c_out + co) * pixels + p] = v.extract(e);
                        } else {
                            let batch = p / plane;
                            let o = (batch * c_out + co) * plane + p % plane;
                            let y = with_adds::<F>(
                                v.extract(e),
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
                            out[o] = F::cast_from(y);
                        }
                    }
                }
            }
        }
    }
}

/// Step `s`'s staging vectors of this lane into registers: 4 neighbouring output channels of
/// the packed weights `w[k, co_stage ..]` at rows `a_k0 + a_kstep·r`, and the gathered input
/// of this lane's 4 pixels at rows `b_k0 + b_kstep·r`; zeros past the edges.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_vectors<F: Float, N: Size>(
    w: &[F],
    x: &[F],
    a_reg: &mut Array<Vector<f32, N>>,
    b_reg: &mut Array<Vector<f32, N>>,
    s: usize,
    a_k0: usize,
    b_k0: usize,
    co_stage: usize,
    c_out: usize,
    k_total: usize,
    p_valid: &Array<bool>,
    p_base: &Array<usize>,
    p_iy: &Array<usize>,
    p_ix: &Array<usize>,
    h: usize,
    wd: usize,
    pad: usize,
    #[comptime] kh: usize,
    #[comptime] kw: usize,
    #[comptime] up: usize,
    #[comptime] a_per: usize,
    #[comptime] a_kstep: usize,
    #[comptime] b_per: usize,
    #[comptime] b_kstep: usize,
    #[comptime] bk: usize,
) {
    #[unroll]
    for r in 0..a_per {
        let kk = a_k0 + a_kstep * r;
        let k = s * bk + kk;
        let mut v = Vector::<f32, N>::new(0.0f32);
        if kk < bk && k < k_total {
            #[unroll]
            for e in 0..SV {
                let co = co_stage + e;
                if co < c_out {
                    v.insert(e, f32::cast_from(w[k * c_out + co]));
                }
            }
        }
        a_reg[r] = v;
    }
    #[unroll]
    for r in 0..b_per {
        let k = s * bk + b_k0 + b_kstep * r;
        let mut v = Vector::<f32, N>::new(0.0f32);
        if k < k_total {
            // The reduction index's channel and tap, once for the four pixels.
            let taps = comptime!(kh * kw);
            let ci = k / taps;
            let tap = k % taps;
            let ky = tap / kw;
            let kx = tap % kw;
            #[unroll]
            for e in 0..SV {
                // Unsigned: `iy - pad` is only formed inside the (upsampled) image.
                let iy = p_iy[e] + ky;
                let ix = p_ix[e] + kx;
                if p_valid[e] && iy >= pad && ix >= pad && iy - pad < h * up && ix - pad < wd * up {
                    let at = p_base[e] + (ci * h + (iy - pad) / up) * wd + (ix - pad) / up;
                    v.insert(e, f32::cast_from(x[at]));
                }
            }
        }
        b_reg[r] = v;
    }
}
