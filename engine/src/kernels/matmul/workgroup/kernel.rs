//! The workgroup-scope GEMM's kernel ([`super`]): a cube's tile, its bias and residual, and the
//! reduction's steps with operands loaded as strided matrices or through tensor layouts.

use burn::cubecl;
use burn::cubecl::prelude::*;

/// A workgroup-scope matrix of the cube's `bm × bn` product over `depth`, not yet loaded: every
/// caller loads it before any other use (reading it unloaded is invalid on Vulkan).
#[cube]
fn unloaded<F: Float>(
    #[comptime] ident: cmma::MatrixIdent,
    #[comptime] bm: usize,
    #[comptime] bn: usize,
    #[comptime] depth: usize,
    layout: cmma::MatrixLayout,
) -> cmma::Matrix<F, cmma::Cube> {
    // SAFETY: see above; each call site loads the matrix on the next line.
    unsafe { cmma::Matrix::<F, cmma::Cube>::uninitialized(ident, bm, bn, depth, layout) }
}

#[cube]
#[allow(clippy::too_many_arguments)]
fn first_value<F: Float>(
    residual: &[F],
    start: usize,
    stride: usize,
    #[comptime] bm: usize,
    #[comptime] bn: usize,
    #[comptime] bk: usize,
    #[comptime] add_residual: bool,
) -> cmma::Matrix<f32, cmma::Cube> {
    if comptime!(add_residual) {
        let mut r = unloaded::<F>(
            cmma::MatrixIdent::Accumulator,
            bm,
            bn,
            bk,
            cmma::MatrixLayout::RowMajor,
        );
        cmma::load_with_layout(
            &mut r,
            &residual[start..residual.len()],
            stride as u32,
            cmma::MatrixLayout::RowMajor,
        );
        cmma::cast::<F, f32, cmma::Cube>(&r)
    } else {
        cmma::Matrix::<f32, cmma::Cube>::from_value(
            cmma::MatrixIdent::Accumulator,
            bm,
            bn,
            bk,
            cmma::MatrixLayout::Undefined,
            0.0,
        )
    }
}

/// `out[z] = a[z] · b[z] (+ bias) (+ residual)`: `a` `[m, k]` row-major, `b` `[k, n]` or
/// (`b_nk`) `[n, k]`, `out` and `residual` `[m, n]`; one cube a `bm × bn` tile.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_workgroup<F: Float>(
    a: &[F],
    b: &[F],
    bias: &[F],
    residual: &[F],
    out: &mut [F],
    partial: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
    a_batch: usize,
    b_batch: usize,
    c_batch: usize,
    #[comptime] bm: usize,
    #[comptime] bn: usize,
    #[comptime] bk: usize,
    #[comptime] kg: usize,
    #[comptime] b_nk: bool,
    #[comptime] add_bias: bool,
    #[comptime] bias_per_row: bool,
    #[comptime] add_residual: bool,
    #[comptime] f32_out: bool,
    #[comptime] tensor: bool,
) {
    let col0 = CUBE_POS_X as usize * bn;
    let row0 = CUBE_POS_Y as usize * bm;
    let z = CUBE_POS_Z as usize;
    let c_start = z * c_batch + row0 * n + col0;
    let acc = first_value::<F>(residual, c_start, n, bm, bn, bk, add_residual);

    if comptime!(add_bias) {
        // One more product: every row of the `kg`-deep operand read from the bias (a zero
        // stride), the other operand `1 / kg`, so the sum over `kg` is the bias itself.
        let share = F::new(comptime!(1.0 / kg as f32));
        if comptime!(bias_per_row) {
            let mut ba = unloaded::<F>(
                cmma::MatrixIdent::A,
                bm,
                bn,
                kg,
                cmma::MatrixLayout::ColMajor,
            );
            cmma::load(&mut ba, &bias[row0..bias.len()], 0u32);
            let ones = cmma::Matrix::<F, cmma::Cube>::from_value(
                cmma::MatrixIdent::B,
                bm,
                bn,
                kg,
                cmma::MatrixLayout::RowMajor,
                share,
            );
            cmma::execute(&ba, &ones, &acc, &acc);
        } else {
            let ones = cmma::Matrix::<F, cmma::Cube>::from_value(
                cmma::MatrixIdent::A,
                bm,
                bn,
                kg,
                cmma::MatrixLayout::RowMajor,
                share,
            );
            let mut bb = unloaded::<F>(
                cmma::MatrixIdent::B,
                bm,
                bn,
                kg,
                cmma::MatrixLayout::RowMajor,
            );
            cmma::load(&mut bb, &bias[col0..bias.len()], 0u32);
            cmma::execute(&ones, &bb, &acc, &acc);
        }
    }

    if comptime!(tensor) {
        tensor_steps::<F>(
            a, b, &acc, m, n, k, a_batch, b_batch, row0, col0, z, bm, bn, bk, b_nk,
        );
    } else {
        strided_steps::<F>(
            a, b, &acc, n, k, a_batch, b_batch, row0, col0, z, bm, bn, bk, b_nk,
        );
    }
    if comptime!(f32_out) {
        let partial_len = partial.len();
        cmma::store(
            &mut partial[c_start..partial_len],
            &acc,
            n as u32,
            cmma::MatrixLayout::RowMajor,
        );
    } else {
        let result = cmma::cast::<f32, F, cmma::Cube>(&acc);
        let out_len = out.len();
        cmma::store(
            &mut out[c_start..out_len],
            &result,
            n as u32,
            cmma::MatrixLayout::RowMajor,
        );
    }
}

/// The reduction's steps with each operand loaded as a strided matrix.
#[cube]
#[allow(clippy::too_many_arguments)]
fn strided_steps<F: Float>(
    a: &[F],
    b: &[F],
    acc: &cmma::Matrix<f32, cmma::Cube>,
    n: usize,
    k: usize,
    a_batch: usize,
    b_batch: usize,
    row0: usize,
    col0: usize,
    z: usize,
    #[comptime] bm: usize,
    #[comptime] bn: usize,
    #[comptime] bk: usize,
    #[comptime] b_nk: bool,
) {
    let a_start = z * a_batch + row0 * k;
    let steps = k / bk;
    for s in 0..steps {
        let kk = s * bk;
        let mut am = unloaded::<F>(
            cmma::MatrixIdent::A,
            bm,
            bn,
            bk,
            cmma::MatrixLayout::RowMajor,
        );
        cmma::load(&mut am, &a[a_start + kk..a.len()], k as u32);
        if comptime!(b_nk) {
            let mut bmat = unloaded::<F>(
                cmma::MatrixIdent::B,
                bm,
                bn,
                bk,
                cmma::MatrixLayout::ColMajor,
            );
            cmma::load(
                &mut bmat,
                &b[z * b_batch + col0 * k + kk..b.len()],
                k as u32,
            );
            cmma::execute(&am, &bmat, acc, acc);
        } else {
            let mut bmat = unloaded::<F>(
                cmma::MatrixIdent::B,
                bm,
                bn,
                bk,
                cmma::MatrixLayout::RowMajor,
            );
            cmma::load(
                &mut bmat,
                &b[z * b_batch + kk * n + col0..b.len()],
                n as u32,
            );
            cmma::execute(&am, &bmat, acc, acc);
        }
    }
}

/// The reduction's steps with each operand loaded through a tensor layout (`[m, k]` and
/// `[n, k]` or `[k, n]` of this batch's matrix), sliced to the cube's step.
#[cube]
#[allow(clippy::too_many_arguments)]
fn tensor_steps<F: Float>(
    a: &[F],
    b: &[F],
    acc: &cmma::Matrix<f32, cmma::Cube>,
    m: usize,
    n: usize,
    k: usize,
    a_batch: usize,
    b_batch: usize,
    row0: usize,
    col0: usize,
    z: usize,
    #[comptime] bm: usize,
    #[comptime] bn: usize,
    #[comptime] bk: usize,
    #[comptime] b_nk: bool,
) {
    let a_len = a.len();
    let b_len = b.len();
    let a_mat = &a[z * a_batch..a_len];
    let b_mat = &b[z * b_batch..b_len];
    let mut a_shape = Sequence::<u32>::new();
    a_shape.push(m as u32);
    a_shape.push(k as u32);
    let a_view = TensorView::<F>::new(a_mat, a_shape).finish();
    let mut b_shape = Sequence::<u32>::new();
    if comptime!(b_nk) {
        b_shape.push(n as u32);
        b_shape.push(k as u32);
    } else {
        b_shape.push(k as u32);
        b_shape.push(n as u32);
    }
    let b_view = TensorView::<F>::new(b_mat, b_shape).finish();
    let steps = k / bk;
    for s in 0..steps {
        let kk = s * bk;
        let mut a_offs = Sequence::<u32>::new();
        a_offs.push(row0 as u32);
        a_offs.push(kk as u32);
        let mut a_span = Sequence::<u32>::new();
        a_span.push(bm as u32);
        a_span.push(bk as u32);
        let mut am = unloaded::<F>(
            cmma::MatrixIdent::A,
            bm,
            bn,
            bk,
            cmma::MatrixLayout::Undefined,
        );
        cmma::load_tensor(&mut am, &a_view.slice(a_offs, a_span));
        let mut bmat = unloaded::<F>(
            cmma::MatrixIdent::B,
            bm,
            bn,
            bk,
            cmma::MatrixLayout::Undefined,
        );
        let mut b_offs = Sequence::<u32>::new();
        let mut b_span = Sequence::<u32>::new();
        if comptime!(b_nk) {
            b_offs.push(col0 as u32);
            b_offs.push(kk as u32);
            b_span.push(bn as u32);
            b_span.push(bk as u32);
            let mut order = Sequence::<usize>::new();
            order.push(1usize);
            order.push(0usize);
            cmma::load_tensor(&mut bmat, &b_view.slice(b_offs, b_span).permuted(order));
        } else {
            b_offs.push(kk as u32);
            b_offs.push(col0 as u32);
            b_span.push(bk as u32);
            b_span.push(bn as u32);
            cmma::load_tensor(&mut bmat, &b_view.slice(b_offs, b_span));
        }
        cmma::execute(&am, &bmat, acc, acc);
    }
}
