//! Flash attention on cooperative matrices with each plane owning its own query rows.
//!
//! The tiled kernel ([`super::kernel::flash_attention`]) shares a cube's rows among all its
//! lanes: four cube-wide barriers per key tile and the output rescaled in workgroup memory. On an
//! H100 it reached about 12 TFLOP/s, no better than plain lanes. Here each plane (warp/subgroup)
//! owns `m` query rows of the fragment shape outright: the cube shares only the staged key and
//! value tiles (one barrier pair per tile), the scores and probabilities of a plane's rows never
//! leave the plane (plane barriers, row maxima and sums by lane shuffles), and each lane keeps its
//! row's slice of the output in registers, rescaling it there and adding the tile's p·v, which the
//! plane computes on fresh accumulators. The plane width is fixed at compile time, so this runs only
//! where the device has one width (every NVIDIA and AMD card; Intel's, which varies, keeps the
//! per-row kernel).

use burn::cubecl;
use burn::cubecl::prelude::*;

/// f32 words of padding per score row in workgroup memory: 16 bytes keeps fragment stores aligned
/// and spreads the rows a plane's lanes read over the banks.
pub(super) const SCORE_PAD: usize = 4;
/// Elements of padding per probability row (16 bytes of f16).
pub(super) const PROB_PAD: usize = 8;

/// Cube `(t, bh)`: query rows `t·planes·fm ..` of batch `bh / heads`, head `bh % heads`;
/// `planes · plane` lanes.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn flash_attention_planes<F: Float>(
    q: &[F],
    k: &[F],
    v: &[F],
    out: &mut [F],
    q_at: usize,
    q_row: usize,
    q_batch: usize,
    k_at: usize,
    k_row: usize,
    k_batch: usize,
    v_at: usize,
    v_row: usize,
    v_batch: usize,
    n_q: usize,
    n_k: usize,
    heads: usize,
    scale: f32,
    #[comptime] d: usize,
    #[comptime] dp: usize,
    #[comptime] planes: usize,
    #[comptime] plane: usize,
    #[comptime] bk: usize,
    #[comptime] fm: usize,
    #[comptime] fn_: usize,
    #[comptime] fk: usize,
) {
    let lanes = comptime!(planes * plane);
    let bq = comptime!(planes * fm);
    // Lanes per query row (a power of two), the output columns each keeps, and the strides of
    // the plane-private score (or p·v) and probability rows.
    let lpr = comptime!(plane / fm);
    let cols = comptime!(dp / lpr);
    let s_row = comptime!(bk.max(dp) + SCORE_PAD);
    let p_row = comptime!(bk + PROB_PAD);

    let lane = UNIT_POS as usize;
    let pi = lane / plane;
    let in_plane = lane % plane;
    let r = in_plane / lpr;
    let part = in_plane % lpr;
    let bh = CUBE_POS_Y as usize;
    let batch = bh / heads;
    let col0 = (bh % heads) * d;
    let row0 = CUBE_POS_X as usize * bq;

    let mut q_s = Shared::<[F]>::new_slice(comptime!(bq * dp));
    let mut k_s = Shared::<[F]>::new_slice(comptime!(bk * dp));
    let mut v_s = Shared::<[F]>::new_slice(comptime!(bk * dp));
    let mut s_s = Shared::<[f32]>::new_slice(comptime!(bq * s_row));
    let mut p_s = Shared::<[F]>::new_slice(comptime!(bq * p_row));

    // The query tile, zero past the last row and the head width.
    let q_base = q_at + batch * q_batch + col0;
    let mut i = lane;
    while i < bq * dp {
        let row = row0 + i / dp;
        let c = i % dp;
        let mut value = F::from_int(0);
        if row < n_q && c < d {
            value = q[q_base + row * q_row + c];
        }
        q_s[i] = value;
        i += lanes;
    }

    let mut o = Array::<f32>::new(cols);
    #[unroll]
    for c in 0..cols {
        o[c] = 0.0f32;
    }
    let mut m = f32::cast_from(-1.0e30f32);
    let mut l = 0.0f32;
    // This plane's rows: of q in q_s, of scores in s_s, of probabilities in p_s.
    let q_at_plane = pi * fm * dp;
    let s_at_plane = pi * fm * s_row;
    let p_at_plane = pi * fm * p_row;
    let s_at_row = s_at_plane + r * s_row;
    let p_at_row = p_at_plane + r * p_row;

    let k_base = k_at + batch * k_batch + col0;
    let v_base = v_at + batch * v_batch + col0;
    let tiles = n_k.div_ceil(bk);
    for t in 0..tiles {
        let key0 = t * bk;
        // Every lane is done with the previous tile (and its plane with its scores).
        sync_cube();
        let mut i = lane;
        while i < bk * dp {
            let key = key0 + i / dp;
            let c = i % dp;
            let mut kv = F::from_int(0);
            let mut vv = F::from_int(0);
            if key < n_k && c < d {
                kv = k[k_base + key * k_row + c];
                vv = v[v_base + key * v_row + c];
            }
            k_s[i] = kv;
            v_s[i] = vv;
            i += lanes;
        }
        sync_cube();

        // Scores s = q·kᵀ (unscaled) for this plane's rows.
        #[unroll]
        for fc in 0..bk / fn_ {
            let acc = cmma::Matrix::<f32>::from_value(
                cmma::MatrixIdent::Accumulator,
                fm,
                fn_,
                fk,
                cmma::MatrixLayout::Undefined,
                0.0f32,
            );
            #[unroll]
            for kk in 0..dp / fk {
                let a = cmma::Matrix::<F>::from_slice(
                    cmma::MatrixIdent::A,
                    fm,
                    fn_,
                    fk,
                    cmma::MatrixLayout::RowMajor,
                    &q_s[q_at_plane + kk * fk..bq * dp],
                    dp as u32,
                );
                // kᵀ's column j is k's row j: column-major with the row stride.
                let b = cmma::Matrix::<F>::from_slice(
                    cmma::MatrixIdent::B,
                    fm,
                    fn_,
                    fk,
                    cmma::MatrixLayout::ColMajor,
                    &k_s[fc * fn_ * dp + kk * fk..bk * dp],
                    dp as u32,
                );
                cmma::execute(&a, &b, &acc, &acc);
            }
            cmma::store(
                &mut s_s[s_at_plane + fc * fn_..bq * s_row],
                &acc,
                s_row as u32,
                cmma::MatrixLayout::RowMajor,
            );
        }
        sync_plane();

        // Online softmax of the row, its keys spread over the row's `lpr` lanes.
        let mut valid = n_k - key0;
        if valid > bk {
            valid = bk;
        }
        let mut local = m;
        #[unroll]
        for jj in 0..bk / lpr {
            let j = part + jj * lpr;
            let s = s_s[s_at_row + j] * scale;
            if j < valid && s > local {
                local = s;
            }
        }
        let mut mask = 1u32;
        #[unroll]
        for _ in 0..comptime!(lpr.trailing_zeros() as usize) {
            let other = plane_shuffle_xor(local, mask);
            if other > local {
                local = other;
            }
            mask *= 2;
        }
        let max = local;
        let alpha = f32::exp(m - max);
        let mut sum = 0.0f32;
        #[unroll]
        for jj in 0..bk / lpr {
            let j = part + jj * lpr;
            let mut p = 0.0f32;
            if j < valid {
                p = f32::exp(s_s[s_at_row + j] * scale - max);
            }
            p_s[p_at_row + j] = F::cast_from(p);
            sum += p;
        }
        let mut mask = 1u32;
        #[unroll]
        for _ in 0..comptime!(lpr.trailing_zeros() as usize) {
            sum += plane_shuffle_xor(sum, mask);
            mask *= 2;
        }
        l = l * alpha + sum;
        m = max;
        sync_plane();

        // This tile's p·v on fresh accumulators, into the plane's score rows (read above).
        #[unroll]
        for fc in 0..dp / fn_ {
            let acc = cmma::Matrix::<f32>::from_value(
                cmma::MatrixIdent::Accumulator,
                fm,
                fn_,
                fk,
                cmma::MatrixLayout::Undefined,
                0.0f32,
            );
            #[unroll]
            for kk in 0..bk / fk {
                let a = cmma::Matrix::<F>::from_slice(
                    cmma::MatrixIdent::A,
                    fm,
                    fn_,
                    fk,
                    cmma::MatrixLayout::RowMajor,
                    &p_s[p_at_plane + kk * fk..bq * p_row],
                    p_row as u32,
                );
                let b = cmma::Matrix::<F>::from_slice(
                    cmma::MatrixIdent::B,
                    fm,
                    fn_,
                    fk,
                    cmma::MatrixLayout::RowMajor,
                    &v_s[kk * fk * dp + fc * fn_..bk * dp],
                    dp as u32,
                );
                cmma::execute(&a, &b, &acc, &acc);
            }
            cmma::store(
                &mut s_s[s_at_plane + fc * fn_..bq * s_row],
                &acc,
                s_row as u32,
                cmma::MatrixLayout::RowMajor,
            );
        }
        sync_plane();

        // The output so far, rescaled to the new maximum, plus this tile's share.
        #[unroll]
        for c in 0..cols {
            o[c] = o[c] * alpha + s_s[s_at_row + part + c * lpr];
        }
    }

    let row = row0 + pi * fm + r;
    if row < n_q {
        let o_base = (batch * n_q + row) * heads * d + col0;
        #[unroll]
        for c in 0..cols {
            let col = part + c * lpr;
            if col < d {
                out[o_base + col] = F::cast_from(o[c] / l);
            }
        }
    }
}
