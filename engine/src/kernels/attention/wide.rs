//! Flash attention for heads too wide for one plane's registers (the VAE mid block's single
//! 512-wide head) on cooperative matrices: the planes of a cube split the head's columns instead
//! of the query rows.
//!
//! The planes kernel ([`super::planes`]) keeps a plane's whole output rows in accumulator
//! fragments: at 512 columns that is 32 fragments of 16 × 16 f32 a row block, past what a lane's
//! registers hold. Here each of `planes` planes owns a `dp / planes`-wide slice of every query
//! row of the cube (its q fragments and its output fragments), so every plane's products stay
//! within ~100 registers a lane. A key tile's scores need the whole head, so each plane stores
//! its slice's partial q·kᵀ to workgroup memory; the cube's lanes add the slices in f32, take the
//! online softmax (f32 maxima and sums, the planes kernel's lazy reference) and write the
//! probabilities once, which every plane multiplies by its slice of v. Keys and values share one
//! staged tile (k for the scores, then v over the softmax), rows padded by 16 bytes.
//!
//! Per 16 keys a plane runs as many products on the scores as on the values (`slice / 16` each):
//! at 512 wide, eight times the planes kernel's products per softmax element at 64 wide.
//!
//! Measured on an H200 (BENCHMARKS.md, forty-seventh session; f16, SD 1.5's VAE with random
//! weights): within 4.0e-4 (4096 tokens) and 5.8e-4 (16 384) of the sliced matmuls on every
//! tiling; in the 512² decode's kernel profile 0.46 ms against 0.87 for the matmuls and their
//! softmax, the decode replayed 20.00 ms against 20.13 (five interleaved rounds) and the whole
//! 1024² decode 94.71 against 95.16 ms (three), with no score matrix (the matmuls' is 64 MiB at
//! 512² and 1 GiB at 1024², built in slices of 128 MiB). 8 planes over 32 query rows and 16 keys
//! was the fastest tiling alone at both sizes.

use burn::cubecl;
use burn::cubecl::prelude::*;

use super::planes::{PROB_PAD, RESCALE_MARGIN, SCORE_PAD};
use super::round_trip::staged_operand;

/// Elements of padding per staged key/value/query row (16 bytes of f16): rows 16 bytes apart in
/// the banks, so a fragment load's rows do not collide.
pub(super) const ROW_PAD: usize = 8;

/// Cube `(t, bh)`: query rows `t·rows·fm ..` of batch `bh / heads`, head `bh % heads`; `planes ·
/// plane` lanes, plane `p` owning columns `p·dp/planes ..` of every row.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn flash_attention_wide<F: Float, N: Size>(
    q: &[Vector<F, N>],
    k: &[Vector<F, N>],
    v: &[Vector<F, N>],
    out: &mut [Vector<F, N>],
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
    #[comptime] rows: usize,
    #[comptime] bk: usize,
    #[comptime] fm: usize,
    #[comptime] fn_: usize,
    #[comptime] fk: usize,
    #[comptime] vec: usize,
) {
    let lanes = comptime!(planes * plane);
    // The plane's slice of the head, and the cube's query rows.
    let w = comptime!(dp / planes);
    let bq = comptime!(rows * fm);
    // Lanes of one row in the softmax, and the keys each takes.
    let lpr = comptime!(lanes / bq);
    let per_part = comptime!(bk / lpr);
    let kv_row = comptime!(dp + ROW_PAD);
    let q_stride = comptime!(w + ROW_PAD);
    let s_row = comptime!(bk + SCORE_PAD);
    let s_plane = comptime!(bq * s_row);
    let s_len = comptime!(planes * bq * s_row);
    let p_row = comptime!(bk + PROB_PAD);
    let o_row = comptime!(fn_ + SCORE_PAD);
    let dv = comptime!(d / vec);
    let dpv = comptime!(dp / vec);
    let wv = comptime!(w / vec);
    let kv_len = comptime!(bk * kv_row / vec);
    let per_lane = comptime!((bk * dpv).div_ceil(lanes));
    let q_frags = comptime!(w / fk);
    let o_frags = comptime!(w / fn_);

    let lane = UNIT_POS as usize;
    let pi = lane / plane;
    let in_plane = lane % plane;
    let r = lane / lpr;
    let part = lane % lpr;
    let bh = CUBE_POS_Y as usize;
    let batch = bh / heads;
    let col0 = (bh % heads) * d;
    let row0 = CUBE_POS_X as usize * bq;
    let slice0 = pi * w;
    let scratch = pi * s_plane;

    let mut kv_s = Shared::<[Vector<F, N>]>::new_slice(kv_len);
    let mut s_s = Shared::<[f32]>::new_slice(s_len);
    let mut p_s = Shared::<[F]>::new_slice(comptime!(bq * p_row));
    // Per row: the tile's rescale factor, then (after the walk) the row sum.
    let mut stat_s = Shared::<[f32]>::new_slice(comptime!(2 * bq));

    // Each plane's query fragments (its slice of the head), staged a slice at a time through
    // the key/value tile.
    let mut qf = Sequence::<cmma::Matrix<F>>::new();
    #[unroll]
    for _ in 0..comptime!(rows * q_frags) {
        // SAFETY: loaded below, in the round of this plane's slice, before any product.
        qf.push(unsafe {
            cmma::Matrix::<F>::uninitialized(
                cmma::MatrixIdent::A,
                fm,
                fn_,
                fk,
                cmma::MatrixLayout::RowMajor,
            )
        });
    }
    let q_base = q_at + batch * q_batch + col0;
    #[unroll]
    for p in 0..planes {
        let mut i = lane;
        while i < comptime!(bq * wv) {
            let row = row0 + i / wv;
            let c = p * wv + i % wv;
            let mut value = Vector::<F, N>::new(F::new(0.0));
            if row < n_q && c < dv {
                value = q[(q_base + row * q_row) / vec + c];
            }
            kv_s[(i / wv) * comptime!(q_stride / vec) + i % wv] = value;
            i += lanes;
        }
        sync_cube();
        if pi == p {
            #[unroll]
            for rb in 0..rows {
                #[unroll]
                for kk in 0..q_frags {
                    cmma::load(
                        qf.index_mut(rb * q_frags + kk),
                        &kv_s[(rb * fm * q_stride + kk * fk) / vec..kv_len],
                        q_stride as u32,
                    );
                }
            }
        }
        sync_cube();
    }

    let mut acc = Sequence::<cmma::Matrix<f32>>::new();
    #[unroll]
    for _ in 0..comptime!(rows * o_frags) {
        acc.push(cmma::Matrix::<f32>::from_value(
            cmma::MatrixIdent::Accumulator,
            fm,
            fn_,
            fk,
            cmma::MatrixLayout::Undefined,
            0.0f32,
        ));
    }
    let mut m = f32::cast_from(-1.0e30f32);
    let mut l = 0.0f32;
    let mut sc = Array::<f32>::new(per_part);

    let k_base = k_at + batch * k_batch + col0;
    let v_base = v_at + batch * v_batch + col0;
    let tiles = n_k.div_ceil(bk);
    let mut kr = Array::<Vector<F, N>>::new(per_lane);
    let mut vr = Array::<Vector<F, N>>::new(per_lane);
    load_rows::<F, N>(
        k, &mut kr, k_base, k_row, 0usize, n_k, lane, dv, dpv, bk, lanes, vec,
    );
    for t in 0..tiles {
        let key0 = t * bk;
        // Every plane is done with the last tile's values and probabilities.
        sync_cube();
        stage_rows::<F, N>(
            &mut kv_s,
            &kr,
            lane,
            dpv,
            bk,
            lanes,
            comptime!(kv_row / vec),
        );
        sync_cube();

        // The plane's partial scores over its slice, to its score rows.
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
            for kk in 0..q_frags {
                // kᵀ's column j is k's row j: column-major with the padded row stride.
                let b = staged_operand::<F, N>(
                    &kv_s,
                    (fc * fn_ * kv_row + slice0 + kk * fk) / vec,
                    kv_len,
                    kv_row,
                    fm,
                    fn_,
                    fk,
                    cmma::MatrixLayout::ColMajor,
                );
                #[unroll]
                for rb in 0..rows {
                    let s = sf.index(rb);
                    cmma::execute(qf.index(rb * q_frags + kk), &b, s, s);
                }
            }
            #[unroll]
            for rb in 0..rows {
                cmma::store(
                    &mut s_s[scratch + rb * comptime!(fm * s_row) + fc * fn_..s_len],
                    sf.index(rb),
                    s_row as u32,
                    cmma::MatrixLayout::RowMajor,
                );
            }
        }
        // The values' loads are in flight over the barrier and the softmax.
        load_rows::<F, N>(
            v, &mut vr, v_base, v_row, key0, n_k, lane, dv, dpv, bk, lanes, vec,
        );
        sync_cube();
        stage_rows::<F, N>(
            &mut kv_s,
            &vr,
            lane,
            dpv,
            bk,
            lanes,
            comptime!(kv_row / vec),
        );

        // The whole scores (the slices added in f32), their row maximum over the row's lanes,
        // and the probabilities against the row's reference.
        let mut valid = n_k - key0;
        if valid > bk {
            valid = bk;
        }
        let mut local = f32::cast_from(-1.0e30f32);
        #[unroll]
        for jj in 0..per_part {
            let j = part + jj * lpr;
            let mut s = 0.0f32;
            #[unroll]
            for p in 0..planes {
                s += s_s[p * s_plane + r * s_row + j];
            }
            s *= scale;
            sc[jj] = s;
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
        // The reference moves only past the margin (always on the first tile).
        let mut reference = m;
        if local > m + RESCALE_MARGIN {
            reference = local;
        }
        let alpha = f32::exp(m - reference);
        let mut sum = 0.0f32;
        #[unroll]
        for jj in 0..per_part {
            let j = part + jj * lpr;
            let mut p = 0.0f32;
            if j < valid {
                p = f32::exp(sc[jj] - reference);
            }
            p_s[r * p_row + j] = F::cast_from(p);
            sum += p;
        }
        let mut mask = 1u32;
        #[unroll]
        for _ in 0..comptime!(lpr.trailing_zeros() as usize) {
            sum += plane_shuffle_xor(sum, mask);
            mask *= 2;
        }
        l = l * alpha + sum;
        m = reference;
        if part == 0 {
            stat_s[r] = alpha;
        }
        // The next tile's keys are in flight over the products.
        if t + 1 < tiles {
            load_rows::<F, N>(
                k,
                &mut kr,
                k_base,
                k_row,
                key0 + bk,
                n_k,
                lane,
                dv,
                dpv,
                bk,
                lanes,
                vec,
            );
        }
        sync_cube();

        // Where some row's reference moved, the plane's output fragments are scaled to it.
        if t > 0 {
            let mut moved = false;
            #[unroll]
            for c in 0..comptime!(bq.div_ceil(plane)) {
                let row = in_plane + c * plane;
                if row < bq && stat_s[row] != 1.0f32 {
                    moved = true;
                }
            }
            if plane_any(moved) {
                #[unroll]
                for i in 0..comptime!(rows * o_frags) {
                    cmma::store(
                        &mut s_s[scratch..s_len],
                        acc.index(i),
                        o_row as u32,
                        cmma::MatrixLayout::RowMajor,
                    );
                    sync_plane();
                    #[unroll]
                    for e in 0..comptime!((fm * fn_).div_ceil(plane)) {
                        let x = in_plane + e * plane;
                        if x < comptime!(fm * fn_) {
                            let fr = x / fn_;
                            let at = scratch + fr * o_row + x % fn_;
                            s_s[at] *= stat_s[comptime!(i / o_frags) * fm + fr];
                        }
                    }
                    sync_plane();
                    cmma::load_with_layout(
                        acc.index_mut(i),
                        &s_s[scratch..s_len],
                        o_row as u32,
                        cmma::MatrixLayout::RowMajor,
                    );
                    sync_plane();
                }
            }
        }

        // This tile's p·v for the plane's slice.
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
                    &p_s[rb * comptime!(fm * p_row) + kk * fk..comptime!(bq * p_row)],
                    p_row as u32,
                ));
            }
        }
        #[unroll]
        for fc in 0..o_frags {
            #[unroll]
            for kk in 0..bk / fk {
                let b = staged_operand::<F, N>(
                    &kv_s,
                    (kk * fk * kv_row + slice0 + fc * fn_) / vec,
                    kv_len,
                    kv_row,
                    fm,
                    fn_,
                    fk,
                    cmma::MatrixLayout::RowMajor,
                );
                #[unroll]
                for rb in 0..rows {
                    let o = acc.index(rb * o_frags + fc);
                    cmma::execute(pf.index(rb * comptime!(bk / fk) + kk), &b, o, o);
                }
            }
        }
    }

    // The row sums, then each output fragment through the plane's score rows, divided by them.
    if part == 0 {
        stat_s[bq + r] = l;
    }
    sync_cube();
    let frag_vectors = comptime!(fm * fn_ / vec);
    let row_vectors = comptime!(fn_ / vec);
    #[unroll]
    for i in 0..comptime!(rows * o_frags) {
        let rb = comptime!(i / o_frags);
        let fc = comptime!(i % o_frags);
        cmma::store(
            &mut s_s[scratch..s_len],
            acc.index(i),
            o_row as u32,
            cmma::MatrixLayout::RowMajor,
        );
        sync_plane();
        #[unroll]
        for e in 0..comptime!(frag_vectors.div_ceil(plane)) {
            let x = in_plane + e * plane;
            let fr = x / row_vectors;
            let row = row0 + rb * fm + fr;
            let c = (slice0 + fc * fn_) / vec + x % row_vectors;
            if x < frag_vectors && row < n_q && c < dv {
                let inv = 1.0f32 / stat_s[bq + rb * fm + fr];
                let at = scratch + fr * o_row + (x % row_vectors) * vec;
                let mut o = Vector::<F, N>::new(F::new(0.0));
                #[unroll]
                for u in 0..vec {
                    o.insert(u, F::cast_from(s_s[at + u] * inv));
                }
                out[((batch * n_q + row) * heads * d + col0) / vec + c] = o;
            }
        }
        sync_plane();
    }
}

/// This lane's share of the `bk` rows of `x` from `key0` (vector `lane + e · lanes` of the
/// tile's rows of `dpv` vectors, `dv` of them the head's) into `regs`, zero past the last key
/// and the head. The base and row stride are in elements, multiples of `vec`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_rows<F: Float, N: Size>(
    x: &[Vector<F, N>],
    regs: &mut Array<Vector<F, N>>,
    base: usize,
    row: usize,
    key0: usize,
    n_k: usize,
    lane: usize,
    #[comptime] dv: usize,
    #[comptime] dpv: usize,
    #[comptime] bk: usize,
    #[comptime] lanes: usize,
    #[comptime] vec: usize,
) {
    #[unroll]
    for e in 0..comptime!((bk * dpv).div_ceil(lanes)) {
        let i = lane + e * lanes;
        let key = key0 + i / dpv;
        let c = i % dpv;
        let mut value = Vector::<F, N>::new(F::new(0.0));
        if i < comptime!(bk * dpv) && key < n_k && c < dv {
            value = x[(base + key * row) / vec + c];
        }
        regs[e] = value;
    }
}

/// [`load_rows`]' registers into the staged tile, rows `row_vectors` vectors apart.
#[cube]
fn stage_rows<F: Float, N: Size>(
    tile: &mut Shared<[Vector<F, N>]>,
    regs: &Array<Vector<F, N>>,
    lane: usize,
    #[comptime] dpv: usize,
    #[comptime] bk: usize,
    #[comptime] lanes: usize,
    #[comptime] row_vectors: usize,
) {
    #[unroll]
    for e in 0..comptime!((bk * dpv).div_ceil(lanes)) {
        let i = lane + e * lanes;
        if i < comptime!(bk * dpv) {
            tile[(i / dpv) * row_vectors + i % dpv] = regs[e];
        }
    }
}
