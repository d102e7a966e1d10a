//! A GEMM on cooperative matrices with large tiles: `c[z] = a[z] · b[z] (+ bias)`, f16 in, f32
//! accumulators, f16 out. Written when a device-timestamp profile of the UNet step on an H100
//! (BENCHMARKS.md, seventeenth session) put 45 % of the step in burn's matmul at ~25 TFLOP/s.
//!
//! A cube of `pm × pn` planes computes a `BM × BN` tile, `BM = pm·tm·fm`, `BN = pn·tn·fn`; the
//! default stands 8 planes of 32 as 2 × 4, each keeping `tm × tn` accumulator fragments (8 at
//! 128 × 128), so every fragment of `a` loaded from workgroup memory feeds `tn` products and
//! every one of `b` feeds `tm` (the convolution's kernel loads 1.5 fragments a product). Global
//! memory is read 16 bytes a lane (vectors of 8) and staged as vectors. The launcher's knobs
//! ([`super::GemmKnobs`]) may also prefetch the next step into registers during the products,
//! keep two staging copies (one barrier a step), or stand 4 planes of 64 × 64; on an H100 each
//! of those made the step slower (BENCHMARKS.md, twenty-second session): registers and
//! workgroup memory a cube holds cost more resident cubes than they save. `b` lies `[k, n]` or, for a linear layer's
//! weight as checkpoints store it, `[n, k]` (read as column-major fragments, no copy).
//!
//! The reduction step `bk` is 32 or 64 (the launcher's [`super::GemmKnobs`]): 64 halves the
//! barriers per product, at 36 KiB of staging for a 128 × 128 tile. Each plane writes its
//! fragments out through its own 1 KiB of f32 scratch with plane barriers only, 16 bytes a lane,
//! the bias added in f32 before the one cast.
//!
//! The epilogue may add a residual `[m, n]` (a transformer block's skip), or take a GEGLU's
//! value and gate from one product (`n = 2·inner` weight rows, values first) and write
//! `value · gelu(gate)` `[m, inner]`: the columns are read in alternating blocks of values and
//! gates (`weight_row`) so each plane holds a value fragment beside its gate's. Burn fuses both
//! into its matmul; without them our product lost more in separate elementwise kernels than it
//! gained (BENCHMARKS.md, eighteenth session).
//!
//! With `split`, cube layer `z` sums slice `z / batch` of the reduction for matrix `z % batch`
//! and writes its f32 sums as they are; `super::split_sum::split_sum` then adds the
//! slices, the bias, a GEGLU's gate and the residual (small grids: `super::split_slices`).
//!
//! With `conv` (its taps' side non-zero), `b` is a convolution's input read in place as its
//! unrolled `[k, n]` operand ([`super::implicit`]); each lane splits its output column once.
//! With `a_conv`, `a` is a channels-last input read in place as its unrolled `[pixels, k]`
//! operand ([`super::channels_last`]); each lane splits its rows' pixels once.
//!
//! Requires `k`, `n` and the output's batch stride multiples of 8 and 16-byte aligned buffers
//! (the launcher checks); any `m`.
//!
//! A step's staging is [`super::staging::stage_step`], its products
//! [`super::products::step_products`]. What bounds them on an H200 ([`super::ceiling`],
//! thirty-second session): the products alone ~643 TFLOP/s, with the fragment loads, barriers
//! and staging stores ~370, this kernel ~183 on 4096³. Two ways past the staging lost there:
//! planes that only stage into a second copy (one cube an SM: 65–111 TFLOP/s, SDXL's step
//! 184 → 208–233 ms) and fragments loaded straight from global memory (21–58 TFLOP/s).
//!
//! Measured on an H100 (seventeenth session): faster than burn's convolution on the deep, narrow
//! 3×3 layers it now takes (`conv::ConvRules`), slower than burn's matmul on the linears' short
//! reductions (320–1280), where the epilogue's round trip through workgroup memory weighs most.
//! With the epilogue below and the 64-deep step (eighteenth session) it is faster than burn's on
//! those too, and the linear layers take it ([`super::mma_linears`]).

use burn::cubecl;
use burn::cubecl::prelude::*;

use super::channels_last::conv_a_row;
use super::implicit::{ConvGeometry, ConvTaps};
use super::products::step_products;
use super::staging::{load_step, stage_step, weight_row};

/// Most lanes a cube may have (8 planes of 32).
pub(super) const MAX_LANES: usize = 256;
/// Elements per vector: 16 bytes of f16.
pub(super) const VEC: usize = 8;

#[cube(launch, launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_mma<F: Float, N: Size>(
    a: &[Vector<F, N>],
    b: &[Vector<F, N>],
    bias: &[F],
    residual: &[Vector<F, N>],
    out: &mut [Vector<F, N>],
    partial: &mut [f32],
    m: usize,
    cols: usize,
    k: usize,
    a_batch: usize,
    b_batch: usize,
    c_batch: usize,
    batch: usize,
    per_slice: usize,
    geometry: ConvGeometry,
    #[comptime] tm: usize,
    #[comptime] tn: usize,
    #[comptime] fm: usize,
    #[comptime] fn_: usize,
    #[comptime] fk: usize,
    #[comptime] bk: usize,
    #[comptime] plane: usize,
    #[comptime] pm: usize,
    #[comptime] pn: usize,
    #[comptime] stages: usize,
    #[comptime] prefetch: bool,
    #[comptime] b_nk: bool,
    #[comptime] add_bias: bool,
    #[comptime] bias_per_row: bool,
    #[comptime] add_residual: bool,
    #[comptime] geglu: bool,
    #[comptime] hoist: bool,
    #[comptime] fence: bool,
    #[comptime] split: bool,
    #[comptime] conv: ConvTaps,
    #[comptime] a_conv: ConvTaps,
) {
    let lanes = comptime!(pm * pn * plane);
    let bm = comptime!(pm * tm * fm);
    let bn = comptime!(pn * tn * fn_);
    // A staged row of `a` (and of `b` as `[n, k]`): the step plus one vector of padding, so
    // that fragment loads spread over the banks.
    let k_row = comptime!(bk + VEC);
    let lane = UNIT_POS as usize;
    let warp = lane / plane;
    let in_warp = lane % plane;
    let wm = warp / pn;
    let wn = warp % pn;
    let n0 = CUBE_POS_X as usize * bn;
    let m0 = CUBE_POS_Y as usize * bm;
    let z = CUBE_POS_Z as usize;
    let mut a_base = z * a_batch;
    let mut b_base = z * b_batch;
    let mut c_base = z * c_batch;
    let steps = k.div_ceil(bk);
    // Split: `z` is slice `z / batch` (of `per_slice` steps) of matrix `z % batch`; its sums go
    // to `partial` `[slice, batch, m, cols]`.
    let mut s0 = 0;
    let mut s1 = steps;
    if split {
        let matrix = z % batch;
        a_base = matrix * a_batch;
        b_base = matrix * b_batch;
        c_base = 0;
        s0 = (z / batch) * per_slice;
        let end = s0 + per_slice;
        if end < steps {
            s1 = end;
        }
    }

    // `stages` copies of the staging: with two, a step's stores go to the buffer the previous
    // step did not read, so one barrier a step suffices.
    let a_len = comptime!(bm * k_row / VEC);
    let b_len = comptime!(if b_nk {
        bn * k_row / VEC
    } else {
        bk * (bn + VEC) / VEC
    });
    let a_end = comptime!(stages * a_len);
    let b_end = comptime!(stages * b_len);
    let mut a_s = Shared::<[Vector<F, N>]>::new_slice(a_end);
    let mut b_s = Shared::<[Vector<F, N>]>::new_slice(b_end);
    let mut c_s = Shared::<[f32]>::new_slice(comptime!(pm * pn * fm * fn_));

    let mut acc = Sequence::<cmma::Matrix<f32>>::new();
    #[unroll]
    for _ in 0..comptime!(tm * tn) {
        acc.push(cmma::Matrix::<f32>::from_value(
            cmma::MatrixIdent::Accumulator,
            fm,
            fn_,
            fk,
            cmma::MatrixLayout::Undefined,
            0.0f32,
        ));
    }

    // An implicit convolution's output row and first column of the vectors this lane stages
    // (the same at every step: `lanes` is a multiple of the `bn / VEC` vectors of a row).
    let mut conv_oy = 0usize;
    let mut conv_ox = 0usize;
    if comptime!(conv.k > 0) {
        let col = n0 + (lane % comptime!(bn / VEC)) * VEC;
        conv_oy = col / geometry.ow;
        conv_ox = col % geometry.ow;
    }
    let a_per = comptime!(bm * bk / VEC / lanes);
    let b_per = comptime!(bn * bk / VEC / lanes);
    let mut a_reg = Array::<Vector<F, N>>::new(a_per);
    let mut b_reg = Array::<Vector<F, N>>::new(b_per);
    // With `hoist` each staged vector's offset that does not change from step to step is formed
    // once here: its row of `a`, and its row of a `[n, k]` `b` (a GEGLU's interleaved weight
    // row included) or its row within the step and column of a `[k, n]` one. Formed at every
    // step instead, SDXL's step took 170.5 ms against 154.9 (H200, forty-second session); with
    // only a GEGLU's weight rows read in order (a diagnostic) it took 155.6, so nearly all of
    // that was the interleaved rows' arithmetic.
    let mut a_rows = Array::<usize>::new(a_per);
    let mut b_rows = Array::<usize>::new(b_per);
    // A channels-last convolution's `a` ([`super::channels_last`]): each row's image offset
    // (in `a_rows`) and window corner, formed once whatever `hoist` says.
    let mut a_oy = Array::<usize>::new(a_per);
    let mut a_ox = Array::<usize>::new(a_per);
    if comptime!(a_conv.k > 0) {
        let per_k = comptime!(bk / VEC);
        #[unroll]
        for i in 0..a_per {
            let row = m0 + (lane + i * lanes) / per_k;
            conv_a_row(row, m, &geometry, &mut a_rows, &mut a_oy, &mut a_ox, i);
        }
    } else if hoist {
        let per_k = comptime!(bk / VEC);
        #[unroll]
        for i in 0..a_per {
            a_rows[i] = (m0 + (lane + i * lanes) / per_k) * k;
        }
    }
    if hoist {
        let per_k = comptime!(bk / VEC);
        #[unroll]
        for i in 0..b_per {
            let v = lane + i * lanes;
            if b_nk {
                let col = n0 + v / per_k;
                let mut row = col;
                if geglu {
                    row = weight_row(col, cols / 2, fn_);
                }
                b_rows[i] = row * k;
            } else {
                let per_row = comptime!(bn / VEC);
                b_rows[i] = (v / per_row) * cols + n0 + (v % per_row) * VEC;
            }
        }
    }
    // With `prefetch` the next step's vectors load while this step's products run (their
    // registers live across the products); without, each step loads then stages, and
    // other cubes on the SM hide the wait.
    if prefetch {
        load_step::<F, N>(
            a, b, &mut a_reg, &mut b_reg, &a_rows, &b_rows, &a_oy, &a_ox, s0, lane, m0, n0, m,
            cols, k, a_base, b_base, &geometry, conv_oy, conv_ox, bm, bn, bk, fn_, lanes, b_nk,
            geglu, hoist, conv, a_conv,
        );
    }
    for s in s0..s1 {
        if !prefetch {
            load_step::<F, N>(
                a, b, &mut a_reg, &mut b_reg, &a_rows, &b_rows, &a_oy, &a_ox, s, lane, m0, n0, m,
                cols, k, a_base, b_base, &geometry, conv_oy, conv_ox, bm, bn, bk, fn_, lanes, b_nk,
                geglu, hoist, conv, a_conv,
            );
        }
        stage_step::<F, N>(
            &mut a_s, &mut b_s, &a_reg, &b_reg, s, lane, a_len, b_len, bm, bn, bk, stages, lanes,
            b_nk,
        );
        sync_cube();
        if prefetch && s + 1 < s1 {
            load_step::<F, N>(
                a,
                b,
                &mut a_reg,
                &mut b_reg,
                &a_rows,
                &b_rows,
                &a_oy,
                &a_ox,
                s + 1,
                lane,
                m0,
                n0,
                m,
                cols,
                k,
                a_base,
                b_base,
                &geometry,
                conv_oy,
                conv_ox,
                bm,
                bn,
                bk,
                fn_,
                lanes,
                b_nk,
                geglu,
                hoist,
                conv,
                a_conv,
            );
        }
        let mut a_off = 0;
        let mut b_off = 0;
        if comptime!(stages > 1) {
            a_off = (s % stages) * a_len;
            b_off = (s % stages) * b_len;
        }
        step_products::<F, N>(
            &a_s, &b_s, &mut acc, a_off, b_off, wm, wn, a_end, b_end, tm, tn, fm, fn_, fk, bk, bn,
            b_nk, fence,
        );
        if comptime!(stages == 1) {
            sync_cube();
        }
    }

    // Each plane writes its fragments through its own scratch (plane barriers only), a
    // vector of 8 outputs a lane, adding the bias (and the residual) in f32.
    let scratch = warp * comptime!(fm * fn_);
    let vecs = comptime!(fm * fn_ / VEC);
    let row_vecs = comptime!(fn_ / VEC);
    let per_lane = comptime!(vecs.div_ceil(plane));
    if geglu {
        // Fragment pairs: `2p` holds values, `2p + 1` their gates (see `weight_row`).
        let half = cols / 2;
        let mut values = Array::<f32>::new(comptime!(per_lane * VEC));
        #[unroll]
        for i in 0..tm {
            #[unroll]
            for p in 0..comptime!(tn / 2) {
                let block = (n0 + wn * comptime!(tn * fn_)) / fn_ + 2 * p;
                #[unroll]
                for g in 0..2u32 {
                    cmma::store(
                        &mut c_s[scratch..scratch + comptime!(fm * fn_)],
                        acc.index(i * tn + 2 * p + g as usize),
                        fn_ as u32,
                        cmma::MatrixLayout::RowMajor,
                    );
                    sync_plane();
                    #[unroll]
                    for e in 0..per_lane {
                        let idx = in_warp + e * plane;
                        let r = idx / row_vecs;
                        let cv = idx % row_vecs;
                        let row = m0 + wm * comptime!(tm * fm) + i * fm + r;
                        let col = (block + g as usize) * fn_ + cv * VEC;
                        if idx < vecs && row < m && col < cols {
                            let mut v = Vector::<F, N>::new(F::new(0.0));
                            #[unroll]
                            for t in 0..VEC {
                                let mut x = c_s[scratch + r * fn_ + cv * VEC + t];
                                if add_bias {
                                    x += f32::cast_from(bias[weight_row(col + t, half, fn_)]);
                                }
                                if g == 0 {
                                    values[e * VEC + t] = x;
                                } else {
                                    // diffusers' GEGLU: value · gelu(gate), gelu with erf.
                                    let gelu = 0.5 * x * (1.0 + Erf::erf(x * 0.70710677));
                                    v.insert(t, F::cast_from(values[e * VEC + t] * gelu));
                                }
                            }
                            if g == 1 {
                                let ocol = block / 2 * fn_ + cv * VEC;
                                out[(c_base + row * half + ocol) / VEC] = v;
                            }
                        }
                    }
                    sync_plane();
                }
            }
        }
    } else {
        #[unroll]
        for i in 0..tm {
            #[unroll]
            for j in 0..tn {
                cmma::store(
                    &mut c_s[scratch..scratch + comptime!(fm * fn_)],
                    acc.index(i * tn + j),
                    fn_ as u32,
                    cmma::MatrixLayout::RowMajor,
                );
                sync_plane();
                #[unroll]
                for e in 0..per_lane {
                    let idx = in_warp + e * plane;
                    let r = idx / row_vecs;
                    let cv = idx % row_vecs;
                    let row = m0 + wm * comptime!(tm * fm) + i * fm + r;
                    let col = n0 + wn * comptime!(tn * fn_) + j * fn_ + cv * VEC;
                    let inside = idx < vecs && row < m && col < cols;
                    if split {
                        // The slice's f32 sums, as they are: the finishing pass adds the rest.
                        if inside {
                            #[unroll]
                            for t in 0..VEC {
                                partial[(z * m + row) * cols + col + t] =
                                    c_s[scratch + r * fn_ + cv * VEC + t];
                            }
                        }
                    } else if inside {
                        let at = (c_base + row * cols + col) / VEC;
                        let mut v = Vector::<F, N>::new(F::new(0.0));
                        let mut res = Vector::<F, N>::new(F::new(0.0));
                        if add_residual {
                            res = residual[at];
                        }
                        #[unroll]
                        for t in 0..VEC {
                            let mut x = c_s[scratch + r * fn_ + cv * VEC + t];
                            if add_bias {
                                if bias_per_row {
                                    x += f32::cast_from(bias[row]);
                                } else {
                                    x += f32::cast_from(bias[col + t]);
                                }
                            }
                            if add_residual {
                                x += f32::cast_from(res.extract(t));
                            }
                            v.insert(t, F::cast_from(x));
                        }
                        out[at] = v;
                    }
                }
                sync_plane();
            }
        }
    }
}
