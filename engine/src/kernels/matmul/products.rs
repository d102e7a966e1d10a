//! One reduction step's products of the cooperative-matrix GEMM ([`super::mma`]): each plane
//! loads its `tn` B and `tm` A fragments of the staged step from workgroup memory and
//! accumulates `tm × tn` products, `bk / fk` times.
//!
//! With `fence`, a plane barrier (acquire/release over workgroup memory) closes each 16-deep
//! sub-step, so the driver's compiler cannot load the next sub-step's fragments before this
//! one's products: a lane holds one sub-step's fragments, not the whole step's (up to 96
//! registers at 4 × 2 fragments a plane and 64 deep). The launcher's rule says where
//! ([`super::GemmKnobs::fence`]).

use burn::cubecl;
use burn::cubecl::prelude::*;

use super::mma::VEC;

/// The products of the step staged at `a_off` / `b_off` (vectors) into `acc`, for the plane at
/// row `wm`, column `wn` of the cube's planes.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn step_products<F: Float, N: Size>(
    a_s: &Shared<[Vector<F, N>]>,
    b_s: &Shared<[Vector<F, N>]>,
    acc: &mut Sequence<cmma::Matrix<f32>>,
    a_off: usize,
    b_off: usize,
    wm: usize,
    wn: usize,
    #[comptime] a_end: usize,
    #[comptime] b_end: usize,
    #[comptime] tm: usize,
    #[comptime] tn: usize,
    #[comptime] fm: usize,
    #[comptime] fn_: usize,
    #[comptime] fk: usize,
    #[comptime] bk: usize,
    #[comptime] bn: usize,
    #[comptime] b_nk: bool,
    #[comptime] fence: bool,
) {
    let k_row = comptime!(bk + VEC);
    let n_row = comptime!(bn + VEC);
    #[unroll]
    for kk in 0..comptime!(bk / fk) {
        let mut bf = Sequence::<cmma::Matrix<F>>::new();
        #[unroll]
        for j in 0..tn {
            let col = wn * comptime!(tn * fn_) + j * fn_;
            if b_nk {
                let mut f = unsafe {
                    cmma::Matrix::<F>::uninitialized(
                        cmma::MatrixIdent::B,
                        fm,
                        fn_,
                        fk,
                        cmma::MatrixLayout::ColMajor,
                    )
                };
                cmma::load(
                    &mut f,
                    &b_s[b_off + (col * k_row + kk * fk) / VEC..b_end],
                    k_row as u32,
                );
                bf.push(f);
            } else {
                let mut f = unsafe {
                    cmma::Matrix::<F>::uninitialized(
                        cmma::MatrixIdent::B,
                        fm,
                        fn_,
                        fk,
                        cmma::MatrixLayout::RowMajor,
                    )
                };
                cmma::load(
                    &mut f,
                    &b_s[b_off + (kk * fk * n_row + col) / VEC..b_end],
                    n_row as u32,
                );
                bf.push(f);
            }
        }
        #[unroll]
        for i in 0..tm {
            let row = wm * comptime!(tm * fm) + i * fm;
            let mut af = unsafe {
                cmma::Matrix::<F>::uninitialized(
                    cmma::MatrixIdent::A,
                    fm,
                    fn_,
                    fk,
                    cmma::MatrixLayout::RowMajor,
                )
            };
            cmma::load(
                &mut af,
                &a_s[a_off + (row * k_row + kk * fk) / VEC..a_end],
                k_row as u32,
            );
            #[unroll]
            for j in 0..tn {
                let c = acc.index(i * tn + j);
                cmma::execute(&af, bf.index(j), c, c);
            }
        }
        if fence {
            sync_plane();
        }
    }
}
