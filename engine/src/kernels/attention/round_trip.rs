//! The planes kernel's round trip through workgroup memory ([`super::planes`]): a tile's scores
//! stored to the plane's score rows for the scalar softmax, the resident fragments rescaled
//! where a row's reference moved, and the probabilities read back for their products with v.

use burn::cubecl;
use burn::cubecl::prelude::*;

/// The plane's scores against the staged key tile (unscaled, `q·kᵀ`), stored row-major to its
/// score rows from `s_at_plane`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn scores_to_rows<F: Float, N: Size>(
    k_s: &Shared<[Vector<F, N>]>,
    s_s: &mut Shared<[f32]>,
    qf: &Sequence<cmma::Matrix<F>>,
    s_at_plane: usize,
    #[comptime] dp: usize,
    #[comptime] bk: usize,
    #[comptime] bq: usize,
    #[comptime] fm: usize,
    #[comptime] fn_: usize,
    #[comptime] fk: usize,
    #[comptime] rows: usize,
    #[comptime] vec: usize,
    #[comptime] s_row: usize,
    #[comptime] kv_row: usize,
) {
    // Scores s = q·kᵀ (unscaled) for this plane's rows.
    #[unroll]
    for fc in 0..bk / fn_ {
        let mut sf = Sequence::<cmma::Matrix<f32>>::new();
        #[unroll]
        for _ in 0..rows {
            sf.push(cmma::Matrix::<f32>::from_value(
                cmma::MatrixIdent::Accumulator,
                fm,
                fn_,
                fk,
                cmma::MatrixLayout::Undefined,
                0.0f32,
            ));
        }
        #[unroll]
        for kk in 0..dp / fk {
            // kᵀ's column j is k's row j: column-major with the row stride.
            let b = staged_operand::<F, N>(
                k_s,
                (fc * fn_ * kv_row + kk * fk) / vec,
                comptime!(bk * kv_row / vec),
                kv_row,
                fm,
                fn_,
                fk,
                cmma::MatrixLayout::ColMajor,
            );
            #[unroll]
            for rb in 0..rows {
                let s = sf.index(rb);
                cmma::execute(qf.index(rb * comptime!(dp / fk) + kk), &b, s, s);
            }
        }
        #[unroll]
        for rb in 0..rows {
            cmma::store(
                &mut s_s[s_at_plane + rb * comptime!(fm * s_row) + fc * fn_..bq * s_row],
                sf.index(rb),
                s_row as u32,
                cmma::MatrixLayout::RowMajor,
            );
        }
    }
}

/// The plane's fragments `frags` (`count` a fragment of query rows, side by side) scaled row by
/// row by each row's `alpha`, through its score rows: stored, scaled by the row's lanes, loaded
/// back. For the resident output where a row's reference moved, and its row sums.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn rescale_rows(
    s_s: &mut Shared<[f32]>,
    frags: &mut Sequence<cmma::Matrix<f32>>,
    alpha: f32,
    s_at_plane: usize,
    s_at_row: usize,
    part: usize,
    #[comptime] count: usize,
    #[comptime] fm: usize,
    #[comptime] fn_: usize,
    #[comptime] rows: usize,
    #[comptime] lpr: usize,
    #[comptime] s_row: usize,
    #[comptime] s_end: usize,
) {
    sync_plane();
    #[unroll]
    for rb in 0..rows {
        #[unroll]
        for fc in 0..count {
            cmma::store(
                &mut s_s[s_at_plane + rb * comptime!(fm * s_row) + fc * fn_..s_end],
                frags.index(rb * count + fc),
                s_row as u32,
                cmma::MatrixLayout::RowMajor,
            );
        }
    }
    sync_plane();
    #[unroll]
    for c in 0..comptime!(count * fn_ / lpr) {
        s_s[s_at_row + part + c * lpr] *= alpha;
    }
    sync_plane();
    #[unroll]
    for rb in 0..rows {
        #[unroll]
        for fc in 0..count {
            cmma::load_with_layout(
                frags.index_mut(rb * count + fc),
                &s_s[s_at_plane + rb * comptime!(fm * s_row) + fc * fn_..s_end],
                s_row as u32,
                cmma::MatrixLayout::RowMajor,
            );
        }
    }
    sync_plane();
}

/// The tile's probabilities, read from the plane's probability rows from `p_at_plane`, times the
/// staged values into `acc`; with `elementwise`, also times ones into the row sums `sums`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn add_probabilities<F: Float, N: Size>(
    p_s: &Shared<[F]>,
    v_s: &Shared<[Vector<F, N>]>,
    acc: &mut Sequence<cmma::Matrix<f32>>,
    sums: &mut Sequence<cmma::Matrix<f32>>,
    ones: &Sequence<cmma::Matrix<F>>,
    p_at_plane: usize,
    #[comptime] dp: usize,
    #[comptime] bk: usize,
    #[comptime] bq: usize,
    #[comptime] fm: usize,
    #[comptime] fn_: usize,
    #[comptime] fk: usize,
    #[comptime] rows: usize,
    #[comptime] vec: usize,
    #[comptime] p_row: usize,
    #[comptime] kv_row: usize,
    #[comptime] elementwise: bool,
) {
    // This tile's p·v, added to the resident output.
    let mut pf = Sequence::<cmma::Matrix<F>>::new();
    #[unroll]
    for rb in 0..rows {
        #[unroll]
        for kk in 0..bk / fk {
            pf.push(cmma::Matrix::<F>::from_slice(
                cmma::MatrixIdent::A,
                fm,
                fn_,
                fk,
                cmma::MatrixLayout::RowMajor,
                &p_s[p_at_plane + rb * comptime!(fm * p_row) + kk * fk..bq * p_row],
                p_row as u32,
            ));
        }
    }
    #[unroll]
    for fc in 0..dp / fn_ {
        #[unroll]
        for kk in 0..bk / fk {
            let b = staged_operand::<F, N>(
                v_s,
                (kk * fk * kv_row + fc * fn_) / vec,
                comptime!(bk * kv_row / vec),
                kv_row,
                fm,
                fn_,
                fk,
                cmma::MatrixLayout::RowMajor,
            );
            #[unroll]
            for rb in 0..rows {
                let o = acc.index(rb * comptime!(dp / fn_) + fc);
                cmma::execute(pf.index(rb * comptime!(bk / fk) + kk), &b, o, o);
            }
        }
    }
    if comptime!(elementwise) {
        #[unroll]
        for kk in 0..bk / fk {
            #[unroll]
            for rb in 0..rows {
                let s = sums.index(rb);
                cmma::execute(pf.index(rb * comptime!(bk / fk) + kk), ones.index(0), s, s);
            }
        }
    }
}

/// A right operand from a staged key or value tile at vector `at`, rows `stride` elements apart:
/// kᵀ's fragment column-major (k's rows are its columns), v's row-major.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn staged_operand<F: Float, N: Size>(
    tile: &Shared<[Vector<F, N>]>,
    at: usize,
    #[comptime] end: usize,
    #[comptime] stride: usize,
    #[comptime] fm: usize,
    #[comptime] fn_: usize,
    #[comptime] fk: usize,
    layout: cmma::MatrixLayout,
) -> cmma::Matrix<F> {
    // SAFETY: loaded on the next line, before any use.
    let mut b =
        unsafe { cmma::Matrix::<F>::uninitialized(cmma::MatrixIdent::B, fm, fn_, fk, layout) };
    cmma::load(&mut b, &tile[at..end], stride as u32);
    b
}
