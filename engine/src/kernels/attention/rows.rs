//! [`super::kernel::flash_attention_rows`] with the staged keys and values, the query row and
//! the output held as vectors of 4 f32.
//!
//! Every lane of the per-row kernel reads the same staged key (a broadcast) one f32 at a time:
//! one workgroup-memory load per product, in both the scores and the weighted sum of values,
//! so on a card the kernel is bound by those loads (~7 TFLOP/s on an H200 under WGSL,
//! BENCHMARKS.md thirty-fourth session). Read as vectors of 4 it is one load per 4 products;
//! each score is the sum of its vector's four partial sums (another order of the same f32
//! additions). Same cubes, lanes, online softmax and partial-score exchange as the scalar
//! kernel; head widths are multiples of 4 (40, 64, 80, 128, 160, 512), as are a lane's columns.

use burn::cubecl;
use burn::cubecl::prelude::*;

use super::kernel::row_scores;

/// Values per vector.
pub(super) const RV: usize = 4;

/// See the module docs and [`super::kernel::flash_attention_rows`]: cube `(t, bh)`, query rows
/// `t·rows ..` of batch `bh / heads`, head `bh % heads`; `rows · parts` lanes, each holding
/// `d / parts` columns of its row.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn flash_attention_rows_vec<F: Float, N: Size>(
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
    // Vectors of a key row, and of this lane's columns.
    let dv = comptime!(d / RV);
    let lv = comptime!(d / parts / RV);
    let lane = UNIT_POS as usize;
    let bh = CUBE_POS_Y as usize;
    let batch = bh / heads;
    let col0 = (bh % heads) * d;
    let row = CUBE_POS_X as usize * rows + lane / parts;
    // This lane's first vector of the head.
    let v0 = (lane % parts) * lv;
    let live = row < n_q;

    let mut qr = Array::<Vector<f32, N>>::new(lv);
    let mut o = Array::<Vector<f32, N>>::new(lv);
    let q_base = q_at + batch * q_batch + row * q_row + col0 + v0 * RV;
    #[unroll]
    for c in 0..lv {
        let mut value = Vector::<f32, N>::new(0.0f32);
        if live {
            #[unroll]
            for e in 0..RV {
                value.insert(e, f32::cast_from(q[q_base + c * RV + e]) * scale);
            }
        }
        qr[c] = value;
        o[c] = Vector::<f32, N>::new(0.0f32);
    }
    let mut m = f32::cast_from(-1.0e30f32);
    let mut l = 0.0f32;
    let mut s = Array::<f32>::new(bk);
    let mut k_s = Shared::<[Vector<f32, N>]>::new_slice(comptime!(bk * d / RV));
    let mut v_s = Shared::<[Vector<f32, N>]>::new_slice(comptime!(bk * d / RV));
    // Partial scores, key-major so that neighbouring lanes write neighbouring banks.
    let mut partial =
        Shared::<[f32]>::new_slice(comptime!(if parts > 1 { bk * rows * parts } else { 1 }));

    let k_base = k_at + batch * k_batch + col0;
    let v_base = v_at + batch * v_batch + col0;
    let tiles = n_k.div_ceil(bk);
    for t in 0..tiles {
        let key0 = t * bk;
        let mut i = lane;
        while i < comptime!(bk * d / RV) {
            let key = key0 + i / dv;
            let c = (i % dv) * RV;
            let mut kv = Vector::<f32, N>::new(0.0f32);
            let mut vv = Vector::<f32, N>::new(0.0f32);
            if key < n_k {
                #[unroll]
                for e in 0..RV {
                    kv.insert(e, f32::cast_from(k[k_base + key * k_row + c + e]));
                    vv.insert(e, f32::cast_from(v[v_base + key * v_row + c + e]));
                }
            }
            k_s[i] = kv;
            v_s[i] = vv;
            i += rows * parts;
        }
        sync_cube();

        #[unroll]
        for j in 0..bk {
            let mut acc = Vector::<f32, N>::new(0.0f32);
            #[unroll]
            for c in 0..lv {
                acc += qr[c] * k_s[j * dv + v0 + c];
            }
            s[j] = acc.extract(0usize)
                + acc.extract(1usize)
                + acc.extract(2usize)
                + acc.extract(3usize);
        }
        let (valid, max) = row_scores(&mut s, &mut partial, lane, m, n_k, key0, rows, parts, bk);
        let alpha = f32::exp(m - max);
        l *= alpha;
        let alpha_v = Vector::<f32, N>::new(alpha);
        #[unroll]
        for c in 0..lv {
            o[c] *= alpha_v;
        }
        #[unroll]
        for j in 0..bk {
            let mut p = 0.0f32;
            if j < valid {
                p = f32::exp(s[j] - max);
            }
            l += p;
            let pv = Vector::<f32, N>::new(p);
            #[unroll]
            for c in 0..lv {
                o[c] += pv * v_s[j * dv + v0 + c];
            }
        }
        m = max;
        sync_cube();
    }

    if live {
        let o_base = (batch * n_q + row) * heads * d + col0 + v0 * RV;
        #[unroll]
        for c in 0..lv {
            let y = o[c];
            #[unroll]
            for e in 0..RV {
                out[o_base + c * RV + e] = F::cast_from(y.extract(e) / l);
            }
        }
    }
}
