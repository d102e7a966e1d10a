//! The flash-attention kernel itself (launched by [`super::attention_planned`]).

use burn::cubecl;
use burn::cubecl::prelude::*;

use super::plan::LANES;

/// Cube `(t, bh)`: query rows `t·bq ..` of batch `bh / heads`, head `bh % heads`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn flash_attention<F: Float>(
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
    #[comptime] bq: usize,
    #[comptime] bk: usize,
    #[comptime] cmma: bool,
    #[comptime] fm: usize,
    #[comptime] fn_: usize,
    #[comptime] fk: usize,
) {
    let lane = UNIT_POS as usize;
    let bh = CUBE_POS_Y as usize;
    let batch = bh / heads;
    let col0 = (bh % heads) * d;
    let row0 = CUBE_POS_X as usize * bq;

    let mut q_s = Shared::<[F]>::new_slice(bq * dp);
    let mut k_s = Shared::<[F]>::new_slice(bk * dp);
    let mut v_s = Shared::<[F]>::new_slice(bk * dp);
    let mut p_s = Shared::<[F]>::new_slice(bq * bk);
    let mut s_s = Shared::<[f32]>::new_slice(bq * bk);
    let mut o_s = Shared::<[f32]>::new_slice(bq * dp);
    let mut m_s = Shared::<[f32]>::new_slice(bq);
    let mut l_s = Shared::<[f32]>::new_slice(bq);
    let mut red_max = Shared::<[f32]>::new_slice(LANES);
    let mut red_sum = Shared::<[f32]>::new_slice(LANES);

    // The query tile, zero past the last row and the head width; the output starts at zero.
    let q_base = q_at + batch * q_batch + col0;
    let mut i = lane;
    while i < bq * dp {
        let r = i / dp;
        let c = i % dp;
        let row = row0 + r;
        let mut value = F::from_int(0);
        if row < n_q && c < d {
            value = q[q_base + row * q_row + c];
        }
        q_s[i] = value;
        o_s[i] = 0.0f32;
        i += LANES;
    }
    let mut r0 = lane;
    while r0 < bq {
        m_s[r0] = -1.0e30f32;
        l_s[r0] = 0.0f32;
        r0 += LANES;
    }
    sync_cube();

    let k_base = k_at + batch * k_batch + col0;
    let v_base = v_at + batch * v_batch + col0;
    let tiles = n_k.div_ceil(bk);
    for t in 0..tiles {
        let key0 = t * bk;
        let mut i = lane;
        while i < bk * dp {
            let j = i / dp;
            let c = i % dp;
            let key = key0 + j;
            let mut kv = F::from_int(0);
            let mut vv = F::from_int(0);
            if key < n_k && c < d {
                kv = k[k_base + key * k_row + c];
                vv = v[v_base + key * v_row + c];
            }
            k_s[i] = kv;
            v_s[i] = vv;
            i += LANES;
        }
        sync_cube();

        // Scores s = q·kᵀ (unscaled) for the tile.
        if cmma {
            let planes = LANES / PLANE_DIM as usize;
            let mut f = (UNIT_POS / PLANE_DIM) as usize;
            while f < (bq / fm) * (bk / fn_) {
                let fr = f / (bk / fn_);
                let fc = f % (bk / fn_);
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
                    let a_at = fr * fm * dp + kk * fk;
                    let b_at = fc * fn_ * dp + kk * fk;
                    let a = cmma::Matrix::<F>::from_slice(
                        cmma::MatrixIdent::A,
                        fm,
                        fn_,
                        fk,
                        cmma::MatrixLayout::RowMajor,
                        &q_s[a_at..bq * dp],
                        dp as u32,
                    );
                    // kᵀ's column j is k's row j: column-major with the row stride.
                    let b = cmma::Matrix::<F>::from_slice(
                        cmma::MatrixIdent::B,
                        fm,
                        fn_,
                        fk,
                        cmma::MatrixLayout::ColMajor,
                        &k_s[b_at..bk * dp],
                        dp as u32,
                    );
                    cmma::execute(&a, &b, &acc, &acc);
                }
                let s_at = fr * fm * bk + fc * fn_;
                cmma::store(
                    &mut s_s[s_at..bq * bk],
                    &acc,
                    bk as u32,
                    cmma::MatrixLayout::RowMajor,
                );
                f += planes;
            }
        } else {
            let mut i = lane;
            while i < bq * bk {
                let r = i / bk;
                let j = i % bk;
                // Lanes of one row start at different columns (bank spread), wrapping around.
                let mut acc = 0.0f32;
                let mut c = j % d;
                for _ in 0..d {
                    acc += f32::cast_from(q_s[r * dp + c]) * f32::cast_from(k_s[j * dp + c]);
                    c += 1;
                    if c == d {
                        c = 0;
                    }
                }
                s_s[i] = acc;
                i += LANES;
            }
        }
        sync_cube();

        // Online softmax: the new row maximum, the tile's probabilities and the rescale of what
        // came before, over every lane: `LANES / bq` lanes a row (a power of two), each taking
        // every `lpr`-th key, their partial maxima and sums meeting in workgroup memory. One lane
        // a row left three quarters of a 32-row cube idle through the loop that dominated it.
        let lpr = comptime!(LANES / bq);
        let mut valid = n_k - key0;
        if valid > bk {
            valid = bk;
        }
        // `lpr · bq` is the cube: every lane has a row.
        let r = lane / lpr;
        let part = lane % lpr;
        let old = m_s[r];
        let mut local = old;
        let mut j = part;
        while j < valid {
            let s = s_s[r * bk + j] * scale;
            if s > local {
                local = s;
            }
            j += lpr;
        }
        red_max[lane] = local;
        sync_cube();
        let mut max = old;
        #[unroll]
        for i in 0..lpr {
            let m = red_max[r * lpr + i];
            if m > max {
                max = m;
            }
        }
        // The output so far, rescaled to the new maximum by the same lanes (PV comes after the
        // next barrier).
        let alpha = f32::exp(old - max);
        let mut c = part;
        while c < dp {
            o_s[r * dp + c] *= alpha;
            c += lpr;
        }
        let mut sum = 0.0f32;
        let mut jj = part;
        while jj < bk {
            let mut p = 0.0f32;
            if jj < valid {
                p = f32::exp(s_s[r * bk + jj] * scale - max);
            }
            p_s[r * bk + jj] = F::cast_from(p);
            sum += p;
            jj += lpr;
        }
        red_sum[lane] = sum;
        sync_cube();
        if part == 0 {
            let mut total = 0.0f32;
            #[unroll]
            for i in 0..lpr {
                total += red_sum[r * lpr + i];
            }
            l_s[r] = l_s[r] * alpha + total;
            m_s[r] = max;
        }
        sync_cube();

        // o += p·v (o was rescaled with the softmax).
        if cmma {
            let planes = LANES / PLANE_DIM as usize;
            let mut f = (UNIT_POS / PLANE_DIM) as usize;
            while f < (bq / fm) * (dp / fn_) {
                let fr = f / (dp / fn_);
                let fc = f % (dp / fn_);
                let o_at = fr * fm * dp + fc * fn_;
                let acc = cmma::Matrix::<f32>::from_slice(
                    cmma::MatrixIdent::Accumulator,
                    fm,
                    fn_,
                    fk,
                    cmma::MatrixLayout::RowMajor,
                    &o_s[o_at..bq * dp],
                    dp as u32,
                );
                #[unroll]
                for kk in 0..bk / fk {
                    let a = cmma::Matrix::<F>::from_slice(
                        cmma::MatrixIdent::A,
                        fm,
                        fn_,
                        fk,
                        cmma::MatrixLayout::RowMajor,
                        &p_s[fr * fm * bk + kk * fk..bq * bk],
                        bk as u32,
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
                    &mut o_s[o_at..bq * dp],
                    &acc,
                    dp as u32,
                    cmma::MatrixLayout::RowMajor,
                );
                f += planes;
            }
        } else {
            let mut i = lane;
            while i < bq * dp {
                let r = i / dp;
                let c = i % dp;
                let mut acc = o_s[i];
                for j in 0..bk {
                    acc += f32::cast_from(p_s[r * bk + j]) * f32::cast_from(v_s[j * dp + c]);
                }
                o_s[i] = acc;
                i += LANES;
            }
        }
        sync_cube();
    }

    let width = heads * d;
    let mut i = lane;
    while i < bq * dp {
        let r = i / dp;
        let c = i % dp;
        let row = row0 + r;
        if row < n_q && c < d {
            out[(batch * n_q + row) * width + col0 + c] = F::cast_from(o_s[i] / l_s[r]);
        }
        i += LANES;
    }
}

/// One query row per `parts` lanes, for plain lanes (no cooperative matrices): each lane keeps
/// its `d / parts` columns of the row's scaled q and of its output in registers, the keys and
/// values of a tile are staged once in f32 and read by every row alike (a broadcast, no bank
/// conflicts), and the online softmax runs per lane. With `parts > 1` (heads wider than a lane's
/// registers hold: 80, 128, 160) the lanes of a row add their partial scores through shared
/// memory and each then runs the same softmax. Cube `(t, bh)`: query rows `t·rows ..` of batch
/// `bh / heads`, head `bh % heads`; `rows · parts` lanes.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn flash_attention_rows<F: Float>(
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
    #[comptime] rows: usize,
    #[comptime] parts: usize,
    #[comptime] bk: usize,
) {
    let lane = UNIT_POS as usize;
    let bh = CUBE_POS_Y as usize;
    let batch = bh / heads;
    let col0 = (bh % heads) * d;
    let row = CUBE_POS_X as usize * rows + lane / parts;
    // This lane's columns of the head.
    let c0 = (lane % parts) * (d / parts);
    let live = row < n_q;

    let mut qr = Array::<f32>::new(d / parts);
    let mut o = Array::<f32>::new(d / parts);
    let q_base = q_at + batch * q_batch + row * q_row + col0 + c0;
    #[unroll]
    for c in 0..d / parts {
        let mut value = 0.0f32;
        if live {
            value = f32::cast_from(q[q_base + c]) * scale;
        }
        qr[c] = value;
        o[c] = 0.0f32;
    }
    let mut m = f32::cast_from(-1.0e30f32);
    let mut l = 0.0f32;
    let mut s = Array::<f32>::new(bk);
    let mut k_s = Shared::<[f32]>::new_slice(bk * d);
    let mut v_s = Shared::<[f32]>::new_slice(bk * d);
    // Partial scores, key-major so that neighbouring lanes write neighbouring banks.
    let mut partial =
        Shared::<[f32]>::new_slice(comptime!(if parts > 1 { bk * rows * parts } else { 1 }));

    let k_base = k_at + batch * k_batch + col0;
    let v_base = v_at + batch * v_batch + col0;
    let tiles = n_k.div_ceil(bk);
    for t in 0..tiles {
        let key0 = t * bk;
        let mut i = lane;
        while i < bk * d {
            let key = key0 + i / d;
            let c = i % d;
            let mut kv = 0.0f32;
            let mut vv = 0.0f32;
            if key < n_k {
                kv = f32::cast_from(k[k_base + key * k_row + c]);
                vv = f32::cast_from(v[v_base + key * v_row + c]);
            }
            k_s[i] = kv;
            v_s[i] = vv;
            i += rows * parts;
        }
        sync_cube();

        #[unroll]
        for j in 0..bk {
            let mut acc = 0.0f32;
            #[unroll]
            for c in 0..d / parts {
                acc += qr[c] * k_s[j * d + c0 + c];
            }
            s[j] = acc;
        }
        let (valid, max) = row_scores(&mut s, &mut partial, lane, m, n_k, key0, rows, parts, bk);
        let alpha = f32::exp(m - max);
        l *= alpha;
        #[unroll]
        for c in 0..d / parts {
            o[c] *= alpha;
        }
        #[unroll]
        for j in 0..bk {
            let mut p = 0.0f32;
            if j < valid {
                p = f32::exp(s[j] - max);
            }
            l += p;
            #[unroll]
            for c in 0..d / parts {
                o[c] += p * v_s[j * d + c0 + c];
            }
        }
        m = max;
        sync_cube();
    }

    if live {
        let o_base = (batch * n_q + row) * heads * d + col0 + c0;
        #[unroll]
        for c in 0..d / parts {
            out[o_base + c] = F::cast_from(o[c] / l);
        }
    }
}

/// The scores of a query row whose columns `parts` lanes share, for the scalar per-row kernel
/// ([`flash_attention_rows`]; the vector kernel pools its rows' scores in place): each lane's partial
/// scores `s` over the tile's `bk` keys are exchanged through `partial` (key-major, so that
/// neighbouring lanes write neighbouring banks) and summed, so every lane of the row holds the
/// row's scores. Returns how many of the tile's keys (from `key0`) exist and the row's maximum
/// over them and its running maximum `m`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn row_scores(
    s: &mut Array<f32>,
    partial: &mut Shared<[f32]>,
    lane: usize,
    m: f32,
    n_k: usize,
    key0: usize,
    #[comptime] rows: usize,
    #[comptime] parts: usize,
    #[comptime] bk: usize,
) -> (usize, f32) {
    if parts > 1 {
        #[unroll]
        for j in 0..bk {
            partial[j * rows * parts + lane] = s[j];
        }
        sync_cube();
        let first = lane - lane % parts;
        #[unroll]
        for j in 0..bk {
            let mut acc = 0.0f32;
            #[unroll]
            for p in 0..parts {
                acc += partial[j * rows * parts + first + p];
            }
            s[j] = acc;
        }
    }
    let mut valid = n_k - key0;
    if valid > bk {
        valid = bk;
    }
    let mut max = m;
    #[unroll]
    for j in 0..bk {
        if j < valid && s[j] > max {
            max = s[j];
        }
    }
    (valid, max)
}
