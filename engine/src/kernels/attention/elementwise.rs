//! The planes kernel's tiles with their probabilities taken in registers, on NVIDIA's
//! `VK_NV_cooperative_matrix2` (per-element operations and conversions between a fragment's
//! uses): the FlashAttention-2 way, which the KHR extension cannot express (a fragment's
//! elements there have no known row, so row maxima need the scores in workgroup memory).
//!
//! A row's scores start from its reference (the lazy rescale's, [`super::planes`]): the score
//! fragment's first value is the reference negated and over the scale, loaded from the plane's
//! score rows, so that the per-element operation only takes `exp(s · scale)`. The fragment is
//! converted in registers to f16 and to the left operand of the product with the staged values,
//! and the rows' sums come from one more product, with a fragment of ones. Nothing is rescaled
//! and no row maximum is taken: a probability past f16's range (a score more than [`OVERFLOW`]
//! above its reference) becomes infinity instead, which reaches the row's sum; the kernel then
//! walks the keys again with every tile through workgroup memory ([`super::planes`]). The first
//! tile, the last partial one and that second walk take the round trip, which sets the
//! references.

use burn::cubecl;
use burn::cubecl::prelude::*;

use super::round_trip::staged_operand;

/// How far (natural log) above its row's reference a score may lie in a tile taken in
/// registers: e^11 ≈ 59 874 is within f16's 65 504.
pub(super) const OVERFLOW: f32 = 11.0;

/// One whole key tile staged in `k_s`/`v_s`: the plane's scores against it from the
/// references `init` (one accumulator fragment per row fragment, each row's reference negated
/// and over the scale), their probabilities in registers, added times v to `acc` and times ones
/// to `sums` (one fragment of row sums per query fragment).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn elementwise_tile<F: Float, N: Size>(
    k_s: &Shared<[Vector<F, N>]>,
    v_s: &Shared<[Vector<F, N>]>,
    qf: &Sequence<cmma::Matrix<F>>,
    acc: &mut Sequence<cmma::Matrix<f32>>,
    sums: &mut Sequence<cmma::Matrix<f32>>,
    ones: &Sequence<cmma::Matrix<F>>,
    init: &Sequence<cmma::Matrix<f32>>,
    scale: f32,
    #[comptime] dp: usize,
    #[comptime] bk: usize,
    #[comptime] fm: usize,
    #[comptime] fn_: usize,
    #[comptime] fk: usize,
    #[comptime] rows: usize,
    #[comptime] vec: usize,
    #[comptime] kv_row: usize,
    #[comptime] kv_end: usize,
) {
    #[unroll]
    for j in 0..bk / fn_ {
        // Scores of keys `j·fn_ ..` from the references: the first product adds to them.
        let mut sf = Sequence::<cmma::Matrix<f32>>::new();
        #[unroll]
        for _ in 0..rows {
            sf.push(unsafe {
                cmma::Matrix::<f32>::uninitialized(
                    cmma::MatrixIdent::Accumulator,
                    fm,
                    fn_,
                    fk,
                    cmma::MatrixLayout::Undefined,
                )
            });
        }
        #[unroll]
        for kk in 0..dp / fk {
            // kᵀ's column j is k's row j: column-major with the row stride.
            let b = staged_operand::<F, N>(
                k_s,
                (j * fn_ * kv_row + kk * fk) / vec,
                kv_end,
                kv_row,
                fm,
                fn_,
                fk,
                cmma::MatrixLayout::ColMajor,
            );
            #[unroll]
            for rb in 0..rows {
                let s = sf.index(rb);
                let q = qf.index(rb * comptime!(dp / fk) + kk);
                if comptime!(kk == 0) {
                    cmma::execute(q, &b, init.index(rb), s);
                } else {
                    cmma::execute(q, &b, s, s);
                }
            }
        }
        // Probabilities in registers, as the left operand of the products with v and ones.
        let mut pf = Sequence::<cmma::Matrix<F>>::new();
        #[unroll]
        for rb in 0..rows {
            let s = sf.index(rb);
            cmma::execute_elementwise_op(s, s, |_row, _col, x| {
                let y = x * scale;
                select(y > OVERFLOW, f32::INFINITY, f32::exp(y))
            });
            pf.push(left_operand::<F>(s));
        }
        #[unroll]
        for fc in 0..dp / fn_ {
            let b = staged_operand::<F, N>(
                v_s,
                (j * fk * kv_row + fc * fn_) / vec,
                kv_end,
                kv_row,
                fm,
                fn_,
                fk,
                cmma::MatrixLayout::RowMajor,
            );
            #[unroll]
            for rb in 0..rows {
                let o = acc.index(rb * comptime!(dp / fn_) + fc);
                cmma::execute(pf.index(rb), &b, o, o);
            }
        }
        #[unroll]
        for rb in 0..rows {
            let l = sums.index(rb);
            cmma::execute(pf.index(rb), ones.index(0), l, l);
        }
    }
}

/// An f32 accumulator fragment as an f16 left operand, converted in registers (f32 to f16 in
/// place, then between uses: `VK_NV_cooperative_matrix2`'s conversions).
#[allow(unused_variables)]
pub(super) fn left_operand<F: Float>(scores: &cmma::Matrix<f32>) -> cmma::Matrix<F> {
    cubecl::unexpanded!()
}

/// [`left_operand`]'s expansion, written out: cubecl 0.11.3's `#[cube]` passes the operand of
/// `cast_with_ident` by reference where its expansion takes it by value.
pub(super) mod left_operand {
    use burn::cubecl::cmma::{self, MatrixExpand, MatrixIdent, Plane};
    use burn::cubecl::prelude::*;

    pub fn expand<F: Float>(
        scope: &Scope,
        scores: &MatrixExpand<f32, Plane>,
    ) -> MatrixExpand<F, Plane> {
        let half = cmma::cast::expand::<f32, F, Plane>(scope, scores);
        cmma::cast_with_ident::expand::<F, F, Plane>(scope, half, MatrixIdent::A)
    }
}
