//! What the cooperative-matrix GEMM ([`super::mma`]) reads from global memory at each reduction
//! step: one 16-byte vector of `a` or `b` a call, zeros past the edges, `b` as a matrix (either
//! layout, a GEGLU's columns interleaved) or a convolution's input read in place
//! ([`super::implicit`]).

use burn::cubecl;
use burn::cubecl::prelude::*;

use super::channels_last::conv_a_vector;
use super::implicit::{ConvGeometry, ConvTaps, conv_b_vector};
use super::mma::VEC;

/// The weight row (and bias entry) behind column `c` of a GEGLU product: the columns alternate
/// `f`-wide blocks of values (rows `0..half`) and of their gates (rows `half..`), so that each
/// plane holds a value fragment beside its gate's.
#[cube]
pub(super) fn weight_row(c: usize, half: usize, #[comptime] f: usize) -> usize {
    let block = c / f;
    (block % 2) * half + (block / 2) * f + c % f
}

/// Vector `i` of this lane's share of step `s` of `a`: row `v / p`, vector `v % p` of the step
/// (`p = bk / 8`, `v = lane + lanes·i`); a channels-last convolution's input read in place with
/// `a_conv` (the row's pixel split before the reduction: `a_rows`, `a_oy`, `a_ox`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_a<F: Float, N: Size>(
    a: &[Vector<F, N>],
    a_rows: &Array<usize>,
    a_oy: &Array<usize>,
    a_ox: &Array<usize>,
    s: usize,
    lane: usize,
    m0: usize,
    m: usize,
    k: usize,
    a_base: usize,
    geometry: &ConvGeometry,
    #[comptime] i: usize,
    #[comptime] bk: usize,
    #[comptime] lanes: usize,
    #[comptime] hoist: bool,
    #[comptime] a_conv: ConvTaps,
) -> Vector<F, N> {
    let per_k = comptime!(bk / VEC);
    let v = lane + i * lanes;
    let mut x = Vector::<F, N>::new(F::new(0.0));
    if comptime!(a_conv.k > 0) {
        // The step lies in one tap (`channels_last::fits_rows`); padding and rows past `m`
        // read as zeros.
        x = conv_a_vector::<F, N>(
            a,
            a_rows[i],
            a_oy[i],
            a_ox[i],
            s * bk,
            (v % per_k) * VEC,
            geometry,
            a_conv.k,
            a_conv.upsample,
            VEC,
        );
    } else {
        let row = m0 + v / per_k;
        let kk = s * bk + (v % per_k) * VEC;
        if row < m && kk < k {
            if hoist {
                x = a[(a_base + a_rows[i] + kk) / VEC];
            } else {
                x = a[(a_base + row * k + kk) / VEC];
            }
        }
    }
    x
}

/// Vector `i` of this lane's share of step `s` of `b`: as `[n, k]`, column `v / p`, vector
/// `v % p` of the step; as `[k, n]`, row `v / (bn / 8)` of the step, vector `v % (bn / 8)`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_b<F: Float, N: Size>(
    b: &[Vector<F, N>],
    b_rows: &Array<usize>,
    s: usize,
    lane: usize,
    n0: usize,
    cols: usize,
    k: usize,
    b_base: usize,
    geometry: &ConvGeometry,
    conv_oy: usize,
    conv_ox: usize,
    #[comptime] i: usize,
    #[comptime] bn: usize,
    #[comptime] bk: usize,
    #[comptime] fn_: usize,
    #[comptime] lanes: usize,
    #[comptime] b_nk: bool,
    #[comptime] geglu: bool,
    #[comptime] hoist: bool,
    #[comptime] conv: ConvTaps,
) -> Vector<F, N> {
    let k0 = s * bk;
    let per_k = comptime!(bk / VEC);
    let v = lane + i * lanes;
    let mut x = Vector::<F, N>::new(F::new(0.0));
    if b_nk {
        let col = n0 + v / per_k;
        let kk = k0 + (v % per_k) * VEC;
        if col < cols && kk < k {
            if hoist {
                x = b[(b_base + b_rows[i] + kk) / VEC];
            } else {
                let mut row = col;
                if geglu {
                    row = weight_row(col, cols / 2, fn_);
                }
                x = b[(b_base + row * k + kk) / VEC];
            }
        }
    } else {
        let per_row = comptime!(bn / VEC);
        let kk = k0 + v / per_row;
        let col = n0 + (v % per_row) * VEC;
        if col < cols && kk < k {
            if comptime!(hoist && conv.k == 0) {
                x = b[(b_base + k0 * cols + b_rows[i]) / VEC];
            } else if comptime!(conv.k > 0) {
                x = conv_b_vector::<F, N>(
                    b,
                    b_base,
                    kk,
                    conv_oy,
                    conv_ox,
                    geometry,
                    conv.k,
                    conv.upsample,
                    VEC,
                );
            } else {
                x = b[(b_base + kk * cols + col) / VEC];
            }
        }
    }
    x
}

/// Step `s`'s vectors of this lane into registers ([`load_a`], [`load_b`]); with `hoist`, at the
/// offsets `a_rows` and `b_rows` formed before the reduction (not for a convolution's input read
/// in place, which forms its own).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn load_step<F: Float, N: Size>(
    a: &[Vector<F, N>],
    b: &[Vector<F, N>],
    a_reg: &mut Array<Vector<F, N>>,
    b_reg: &mut Array<Vector<F, N>>,
    a_rows: &Array<usize>,
    b_rows: &Array<usize>,
    a_oy: &Array<usize>,
    a_ox: &Array<usize>,
    s: usize,
    lane: usize,
    m0: usize,
    n0: usize,
    m: usize,
    cols: usize,
    k: usize,
    a_base: usize,
    b_base: usize,
    geometry: &ConvGeometry,
    conv_oy: usize,
    conv_ox: usize,
    #[comptime] bm: usize,
    #[comptime] bn: usize,
    #[comptime] bk: usize,
    #[comptime] fn_: usize,
    #[comptime] lanes: usize,
    #[comptime] b_nk: bool,
    #[comptime] geglu: bool,
    #[comptime] hoist: bool,
    #[comptime] conv: ConvTaps,
    #[comptime] a_conv: ConvTaps,
) {
    #[unroll]
    for i in 0..comptime!(bm * bk / VEC / lanes) {
        a_reg[i] = load_a::<F, N>(
            a, a_rows, a_oy, a_ox, s, lane, m0, m, k, a_base, geometry, i, bk, lanes, hoist, a_conv,
        );
    }
    #[unroll]
    for i in 0..comptime!(bn * bk / VEC / lanes) {
        b_reg[i] = load_b::<F, N>(
            b, b_rows, s, lane, n0, cols, k, b_base, geometry, conv_oy, conv_ox, i, bn, bk, fn_,
            lanes, b_nk, geglu, hoist, conv,
        );
    }
}

/// This lane's loaded vectors ([`load_step`]) into staging copy `s % stages`: `a`'s rows and a
/// `[n, k]` `b`'s columns each `bk` wide plus one vector of padding, a `[k, n]` `b`'s rows `bn`
/// wide plus one vector.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn stage_step<F: Float, N: Size>(
    a_s: &mut Shared<[Vector<F, N>]>,
    b_s: &mut Shared<[Vector<F, N>]>,
    a_reg: &Array<Vector<F, N>>,
    b_reg: &Array<Vector<F, N>>,
    s: usize,
    lane: usize,
    #[comptime] a_len: usize,
    #[comptime] b_len: usize,
    #[comptime] bm: usize,
    #[comptime] bn: usize,
    #[comptime] bk: usize,
    #[comptime] stages: usize,
    #[comptime] lanes: usize,
    #[comptime] b_nk: bool,
) {
    let per_k = comptime!(bk / VEC);
    let k_row = comptime!(bk + VEC);
    let n_row = comptime!(bn + VEC);
    let mut a_off = 0;
    let mut b_off = 0;
    if comptime!(stages > 1) {
        a_off = (s % stages) * a_len;
        b_off = (s % stages) * b_len;
    }
    #[unroll]
    for i in 0..comptime!(bm * bk / VEC / lanes) {
        let v = lane + i * lanes;
        a_s[a_off + v / per_k * (k_row / VEC) + v % per_k] = a_reg[i];
    }
    #[unroll]
    for i in 0..comptime!(bn * bk / VEC / lanes) {
        let v = lane + i * lanes;
        if b_nk {
            b_s[b_off + v / per_k * (k_row / VEC) + v % per_k] = b_reg[i];
        } else {
            let per_row = comptime!(bn / VEC);
            b_s[b_off + v / per_row * (n_row / VEC) + v % per_row] = b_reg[i];
        }
    }
}
