//! [`super::kernel::flash_attention_rows`] with the staged keys and values, the query row and
//! the output held as vectors of 4 f32.
//!
//! Every lane of the per-row kernel reads the same staged key (a broadcast) one f32 at a time:
//! one workgroup-memory load per product, in both the scores and the weighted sum of values,
//! so on a card the kernel is bound by those loads (~7 TFLOP/s on an H200 under WGSL,
//! BENCHMARKS.md thirty-fourth session). Read as vectors of 4 it is one load per 4 products;
//! each score is the sum of its vector's four partial sums (another order of the same f32
//! additions). With one row a lane: the scalar kernel's cubes, lanes, online softmax and
//! partial-score exchange; head widths are multiples of 4 (40, 64, 80, 128, 160, 512), as are a
//! lane's columns.
//!
//! A lane may own two query rows ([`super::Plan::paired`]; cubes twice as tall, the same lanes):
//! each staged key and value vector it reads then serves two rows' products (one load per 8),
//! and the partial scores of both rows are pooled behind one barrier (`partial` holds both
//! rows' tiles). The arithmetic of each row is the one-row kernel's.

use burn::cubecl;
use burn::cubecl::prelude::*;

/// Values per vector.
pub(super) const RV: usize = 4;

/// See the module docs and [`super::kernel::flash_attention_rows`]: cube `(t, bh)`, query rows
/// `t·rows·lr ..` of batch `bh / heads`, head `bh % heads`; `rows · parts` lanes, each holding
/// `d / parts` columns of `lr` rows (`r` and `r + rows`: [`super::Plan::paired`]). With two rows
/// every staged vector a lane reads serves both: half the workgroup-memory loads a product.
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
    #[comptime] lr: usize,
) {
    // Vectors of a key row, and of this lane's columns.
    let dv = comptime!(d / RV);
    let lv = comptime!(d / parts / RV);
    let lanes = comptime!(rows * parts);
    let lane = UNIT_POS as usize;
    let bh = CUBE_POS_Y as usize;
    let batch = bh / heads;
    let col0 = (bh % heads) * d;
    let row0 = CUBE_POS_X as usize * rows * lr + lane / parts;
    // This lane's first vector of the head.
    let v0 = (lane % parts) * lv;

    let mut qr = Array::<Vector<f32, N>>::new(comptime!(lr * lv));
    let mut o = Array::<Vector<f32, N>>::new(comptime!(lr * lv));
    let mut m = Array::<f32>::new(lr);
    let mut l = Array::<f32>::new(lr);
    #[unroll]
    for r in 0..lr {
        let row = row0 + r * rows;
        let q_base = q_at + batch * q_batch + row * q_row + col0 + v0 * RV;
        #[unroll]
        for c in 0..lv {
            let mut value = Vector::<f32, N>::new(0.0f32);
            if row < n_q {
                #[unroll]
                for e in 0..RV {
                    value.insert(e, f32::cast_from(q[q_base + c * RV + e]) * scale);
                }
            }
            qr[r * lv + c] = value;
            o[r * lv + c] = Vector::<f32, N>::new(0.0f32);
        }
        m[r] = f32::cast_from(-1.0e30f32);
        l[r] = 0.0f32;
    }
    // Scores (then probabilities) of the tile, row-major by the lane's rows.
    let mut s = Array::<f32>::new(comptime!(lr * bk));
    let mut acc = Array::<Vector<f32, N>>::new(lr);
    let mut k_s = Shared::<[Vector<f32, N>]>::new_slice(comptime!(bk * d / RV));
    let mut v_s = Shared::<[Vector<f32, N>]>::new_slice(comptime!(bk * d / RV));
    // Partial scores, key-major so that neighbouring lanes write neighbouring banks.
    let mut partial =
        Shared::<[f32]>::new_slice(comptime!(if parts > 1 { lr * bk * lanes } else { 1 }));

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
            i += lanes;
        }
        sync_cube();

        #[unroll]
        for j in 0..bk {
            #[unroll]
            for r in 0..lr {
                acc[r] = Vector::<f32, N>::new(0.0f32);
            }
            #[unroll]
            for c in 0..lv {
                let kv = k_s[j * dv + v0 + c];
                #[unroll]
                for r in 0..lr {
                    acc[r] += qr[r * lv + c] * kv;
                }
            }
            #[unroll]
            for r in 0..lr {
                let a = acc[r];
                s[r * bk + j] =
                    a.extract(0usize) + a.extract(1usize) + a.extract(2usize) + a.extract(3usize);
            }
        }
        if parts > 1 {
            // The row's lanes pool their partial scores (one barrier for every row).
            #[unroll]
            for x in 0..comptime!(lr * bk) {
                partial[x * lanes + lane] = s[x];
            }
            sync_cube();
            let first = lane - lane % parts;
            #[unroll]
            for x in 0..comptime!(lr * bk) {
                let mut sum = 0.0f32;
                #[unroll]
                for p in 0..parts {
                    sum += partial[x * lanes + first + p];
                }
                s[x] = sum;
            }
        }
        let mut valid = n_k - key0;
        if valid > bk {
            valid = bk;
        }
        #[unroll]
        for r in 0..lr {
            let mut max = m[r];
            #[unroll]
            for j in 0..bk {
                if j < valid && s[r * bk + j] > max {
                    max = s[r * bk + j];
                }
            }
            let alpha = f32::exp(m[r] - max);
            let alpha_v = Vector::<f32, N>::new(alpha);
            #[unroll]
            for c in 0..lv {
                o[r * lv + c] *= alpha_v;
            }
            let mut sum = l[r] * alpha;
            #[unroll]
            for j in 0..bk {
                let mut p = 0.0f32;
                if j < valid {
                    p = f32::exp(s[r * bk + j] - max);
                }
                s[r * bk + j] = p;
                sum += p;
            }
            l[r] = sum;
            m[r] = max;
        }
        #[unroll]
        for j in 0..bk {
            #[unroll]
            for c in 0..lv {
                let vv = v_s[j * dv + v0 + c];
                #[unroll]
                for r in 0..lr {
                    o[r * lv + c] += Vector::<f32, N>::new(s[r * bk + j]) * vv;
                }
            }
        }
        sync_cube();
    }

    #[unroll]
    for r in 0..lr {
        let row = row0 + r * rows;
        if row < n_q {
            let o_base = (batch * n_q + row) * heads * d + col0 + v0 * RV;
            #[unroll]
            for c in 0..lv {
                let y = o[r * lv + c];
                #[unroll]
                for e in 0..RV {
                    out[o_base + c * RV + e] = F::cast_from(y.extract(e) / l[r]);
                }
            }
        }
    }
}
