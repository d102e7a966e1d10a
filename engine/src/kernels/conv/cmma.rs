//! The implicit GEMM on cooperative matrices: the SIMT kernel's 64 × 64 tile, staging and
//! epilogue ([`super::kernel`]), with the tile's products on the device's f16×f16→f32 fragments.
//! What it adds over burn's cooperative-matrix convolution is the split reduction: on 8×8 and
//! 16×16 maps a layer has 40 to 160 tiles, and burn's kernel, with no split, left most of an
//! H100 idle (5.5 TFLOP/s at 8×8 against 21.5 at 16², BENCHMARKS.md, eleventh session).

use burn::cubecl;
use burn::cubecl::prelude::*;

use super::kernel::{BM, BN, LANES, gather, write_block};

/// Reduction step staged in workgroup memory (two fragment depths).
pub(super) const BK_MMA: usize = 32;
/// Staged row lengths, padded by 16 bytes of f16 so that fragment loads spread over the banks.
const A_ROW: usize = BK_MMA + 8;
const B_ROW: usize = BN + 8;

/// As [`super::kernel::conv2d_gemm`], with each plane of `plane` lanes computing two
/// `fm × fn_` fragments of the tile (sharing their rows): `(BM/fm)·(BN/fn_) = 2·(LANES/plane)`,
/// which the launcher checks. The weights are read as stored, OIHW viewed `[c_out, c_in·kh·kw]`
/// (lanes along the reduction read them coalesced), so no packed copy is kept.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn conv2d_gemm_mma<F: Float>(
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
    #[comptime] plane: usize,
    #[comptime] fm: usize,
    #[comptime] fn_: usize,
    #[comptime] fk: usize,
    #[comptime] from_col: bool,
    #[comptime] prefetch: bool,
) {
    let lane = UNIT_POS as usize;
    let n0 = CUBE_POS_X as usize * BN;
    let m0 = CUBE_POS_Y as usize * BM;
    let k_total = c_in * kh * kw;
    let map = oh * ow;

    // Staging as in the SIMT kernel: column `lane % 64`, rows `lane / 64 + 4·r`.
    let col = lane % BN;
    let row0 = lane / BN;
    let p_stage = n0 + col;
    let p_valid = p_stage < pixels;
    let mut p_clamped = 0usize;
    if p_valid {
        p_clamped = p_stage;
    }
    let s_batch = p_clamped / map;
    let s_rem = p_clamped % map;
    let iy0 = (s_rem / ow) * stride;
    let ix0 = (s_rem % ow) * stride;
    let x_base = s_batch * c_in * h * wd;

    // a_s[co, kk] (A = w, row-major), b_s[kk, p] (B, row-major), in the element type.
    let mut a_s = Shared::<[F]>::new_slice(comptime!(BM * A_ROW));
    let mut b_s = Shared::<[F]>::new_slice(comptime!(BK_MMA * B_ROW));
    let mut c_s = Shared::<[f32]>::new_slice(comptime!(BM * BN));
    // The weights this lane stages: reduction column `kk_a` of channels `co_a + 8·r`.
    let kk_a = lane % BK_MMA;
    let co_a = lane / BK_MMA;

    // This plane's two fragments: row block `fr`, column blocks `fc` and `fc + 1`.
    let first = (lane / plane) * 2;
    let fr = first / comptime!(BN / fn_);
    let fc = first % comptime!(BN / fn_);
    let acc0 = cmma::Matrix::<f32>::from_value(
        cmma::MatrixIdent::Accumulator,
        fm,
        fn_,
        fk,
        cmma::MatrixLayout::Undefined,
        0.0f32,
    );
    let acc1 = cmma::Matrix::<f32>::from_value(
        cmma::MatrixIdent::Accumulator,
        fm,
        fn_,
        fk,
        cmma::MatrixLayout::Undefined,
        0.0f32,
    );

    let steps = k_total.div_ceil(BK_MMA);
    let mut s0 = 0usize;
    let mut last = steps;
    if split {
        s0 = CUBE_POS_Z as usize * steps_per_split;
        let end = s0 + steps_per_split;
        if end < steps {
            last = end;
        }
    }
    // One step's staged values in registers, all loaded before any is stored; with `prefetch`
    // the next step's are loaded while this one's products run (with the input unrolled the
    // loads are the staging's whole cost, and overlapping them paid: BENCHMARKS.md, sixteenth
    // session).
    let mut a_reg = Array::<F>::new(comptime!(BM / (LANES / BK_MMA)));
    let mut b_reg = Array::<F>::new(comptime!(BK_MMA / 4));
    if prefetch && s0 < last {
        load_step::<F>(
            w, x, &mut a_reg, &mut b_reg, s0, kk_a, co_a, m0, c_out, k_total, row0, p_valid,
            x_base, iy0, ix0, h, wd, pad, pixels, p_stage, kh, kw, up, from_col,
        );
    }
    for s in s0..last {
        if !prefetch {
            load_step::<F>(
                w, x, &mut a_reg, &mut b_reg, s, kk_a, co_a, m0, c_out, k_total, row0, p_valid,
                x_base, iy0, ix0, h, wd, pad, pixels, p_stage, kh, kw, up, from_col,
            );
        }
        #[unroll]
        for r in 0..comptime!(BM / (LANES / BK_MMA)) {
            a_s[(co_a + r * comptime!(LANES / BK_MMA)) * A_ROW + kk_a] = a_reg[r];
        }
        #[unroll]
        for r in 0..BK_MMA / 4 {
            b_s[(row0 + 4 * r) * B_ROW + col] = b_reg[r];
        }
        sync_cube();
        if prefetch && s + 1 < last {
            load_step::<F>(
                w,
                x,
                &mut a_reg,
                &mut b_reg,
                s + 1,
                kk_a,
                co_a,
                m0,
                c_out,
                k_total,
                row0,
                p_valid,
                x_base,
                iy0,
                ix0,
                h,
                wd,
                pad,
                pixels,
                p_stage,
                kh,
                kw,
                up,
                from_col,
            );
        }
        #[unroll]
        for kk in 0..BK_MMA / fk {
            let a = cmma::Matrix::<F>::from_slice(
                cmma::MatrixIdent::A,
                fm,
                fn_,
                fk,
                cmma::MatrixLayout::RowMajor,
                &a_s[fr * fm * A_ROW + kk * fk..BM * A_ROW],
                A_ROW as u32,
            );
            let b0 = cmma::Matrix::<F>::from_slice(
                cmma::MatrixIdent::B,
                fm,
                fn_,
                fk,
                cmma::MatrixLayout::RowMajor,
                &b_s[kk * fk * B_ROW + fc * fn_..BK_MMA * B_ROW],
                B_ROW as u32,
            );
            let b1 = cmma::Matrix::<F>::from_slice(
                cmma::MatrixIdent::B,
                fm,
                fn_,
                fk,
                cmma::MatrixLayout::RowMajor,
                &b_s[kk * fk * B_ROW + (fc + 1) * fn_..BK_MMA * B_ROW],
                B_ROW as u32,
            );
            cmma::execute(&a, &b0, &acc0, &acc0);
            cmma::execute(&a, &b1, &acc1, &acc1);
        }
        sync_cube();
    }

    cmma::store(
        &mut c_s[fr * fm * BN + fc * fn_..BM * BN],
        &acc0,
        BN as u32,
        cmma::MatrixLayout::RowMajor,
    );
    cmma::store(
        &mut c_s[fr * fm * BN + (fc + 1) * fn_..BM * BN],
        &acc1,
        BN as u32,
        cmma::MatrixLayout::RowMajor,
    );
    sync_cube();

    // The SIMT kernel's lane blocks from here: lane (tx, ty) takes channels ty·4 .., pixels
    // tx + 16·j of the tile.
    let tx = lane % 16;
    let ty = lane / 16;
    let mut acc = Array::<f32>::new(16usize);
    #[unroll]
    for i in 0..4usize {
        #[unroll]
        for j in 0..4usize {
            acc[i * 4 + j] = c_s[(ty * 4 + i) * BN + tx + 16 * j];
        }
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
        map,
        channel_row,
        channel_col,
        add_bias,
        add_channel,
        add_residual,
        split,
        16usize,
        4usize,
    );
}

/// Step `s`'s staging values of this lane into registers: the weights at reduction column
/// `kk_a` of channels `co_a + 8·r`, and the gathered input at rows `row0 + 4·r` of its pixel
/// (zeros past the edges).
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_step<F: Float>(
    w: &[F],
    x: &[F],
    a_reg: &mut Array<F>,
    b_reg: &mut Array<F>,
    s: usize,
    kk_a: usize,
    co_a: usize,
    m0: usize,
    c_out: usize,
    k_total: usize,
    row0: usize,
    p_valid: bool,
    x_base: usize,
    iy0: usize,
    ix0: usize,
    h: usize,
    wd: usize,
    pad: usize,
    pixels: usize,
    p_stage: usize,
    #[comptime] kh: usize,
    #[comptime] kw: usize,
    #[comptime] up: usize,
    #[comptime] from_col: bool,
) {
    let k0 = s * BK_MMA;
    #[unroll]
    for r in 0..comptime!(BM / (LANES / BK_MMA)) {
        let co = co_a + r * comptime!(LANES / BK_MMA);
        let k = k0 + kk_a;
        let mut a = F::from_int(0);
        if k < k_total && m0 + co < c_out {
            a = w[(m0 + co) * k_total + k];
        }
        a_reg[r] = a;
    }
    #[unroll]
    for r in 0..BK_MMA / 4 {
        let k = k0 + row0 + 4 * r;
        let mut b = 0.0f32;
        if k < k_total && p_valid {
            if from_col {
                // `x` is the input unrolled ([`super::kernel::im2col`]): `[k_total, pixels]`.
                b = f32::cast_from(x[k * pixels + p_stage]);
            } else {
                b = gather::<F>(x, x_base, k, iy0, ix0, h, wd, pad, kh, kw, up);
            }
        }
        b_reg[r] = F::cast_from(b);
    }
}
