//! Flash attention on cooperative matrices with each plane (warp/subgroup) owning its own query
//! rows and keeping their output in accumulator fragments for the whole walk over the keys, as
//! FlashAttention-2 keeps it in registers.
//!
//! The cube shares only the staged key and value tiles (one barrier pair per tile); a row's
//! scores and probabilities never leave its plane (plane barriers, row maxima and sums by lane
//! shuffles). The plane width is fixed at compile time, so this runs only where the device has
//! one width (every NVIDIA and AMD card; Intel's, which varies, keeps the per-row kernel).
//!
//! The twelfth session's version added each tile's p·v, computed on fresh accumulators, to each
//! lane's registers through workgroup memory: a store, a plane barrier and `dp / lanes-per-row`
//! reads per lane and key tile; it was 1.5–2.5× slower on an H100 (BENCHMARKS.md). A fragment's
//! elements cannot be scaled in place through cubecl's cooperative-matrix API, so this kernel
//! rescales lazily (as FlashAttention-4 does): a row's probabilities are taken against a reference maximum that
//! moves only when a score passes it by more than [`RESCALE_MARGIN`] (so p ≤ e^8 ≈ 2981, exact
//! enough in f16 and far from its range), and only then are the plane's accumulators stored,
//! scaled row by row and loaded back. After the first few tiles that is rare. The query fragments
//! are loaded once, the probability fragments once per tile, and with `prefetch` each lane loads
//! its share of the next key and value tile into registers while the plane multiplies this one.
//!
//! With `elementwise` (where the device has NVIDIA's per-element operations on cooperative
//! matrices) whole key tiles after the first take their probabilities in registers instead, with
//! no score round trip ([`super::elementwise`]); the first tile, a partial last one and a walk
//! whose probabilities left f16's range take the round trip above.
//!
//! q, k, v and the output move `vec` elements a load: 8 (16 bytes of f16, staged as such, so
//! fragment loads read 16-byte aligned rows) where the head width and every operand's offset
//! allow, else 1. With 8 and the prefetch, an SD 1.5 step replayed took 32.71 ms on an H200
//! against 33.75 with single elements and no prefetch, the kernel before (BENCHMARKS.md,
//! twenty-fifth session); single elements lost with the prefetch (35.40), and two other
//! changes lost everywhere: reading a tile's scores once (probabilities against the row's
//! current reference, again where it moved; 35.42 against 32.71 ms) and every staged row padded
//! by 16 bytes (34.93; 4 cubes an SM instead of 5 at 47 KiB). The staged key and value rows
//! alone padded ([`super::kv_tile::KV_PAD`]) won since: SDXL's step replayed 136.62 → 114.37 ms, its 10 × 64
//! heads over 4096 keys 1.93 → 0.71 ms a launch (H200, forty-eighth session), the same output.

use burn::cubecl;
use burn::cubecl::prelude::*;

use super::elementwise::elementwise_tile;
use super::kv_tile::{load_tile, stage_tile};
use super::round_trip::{add_probabilities, rescale_rows, scores_to_rows};

/// f32 words of padding per score row in workgroup memory: 16 bytes keeps fragment stores aligned
/// and spreads the rows a plane's lanes read over the banks.
pub(super) const SCORE_PAD: usize = 4;
/// Elements of padding per probability row (16 bytes of f16).
pub(super) const PROB_PAD: usize = 8;

/// How far (natural log) a score may pass a row's reference maximum before the reference moves.
pub(super) const RESCALE_MARGIN: f32 = 8.0;

/// Parts of the kernel [`flash_attention_planes`] leaves out when its `knock` has their bit, for
/// timing what each costs (`bench --attention-ceiling`); the output is then meaningless. 0 in
/// every real launch.
pub mod knock {
    /// No rescaling of the resident output where a row's reference moved.
    pub const RESCALE: u32 = 1;
    /// No scalar softmax: the scores are still stored, the probabilities not written (the
    /// product reads whatever the probability rows hold).
    pub const SOFTMAX: u32 = 2;
    /// No global loads of key and value tiles after the first.
    pub const GLOBAL: u32 = 4;
    /// No staging of key and value tiles and no cube barriers (implies no global loads).
    pub const STAGE: u32 = 8;
    /// The row-maximum pass skipped (the reference stays where the first tile put it).
    pub const MAX_PASS: u32 = 16;
    /// No plane barriers between the score stores, the scalar pass and the probability loads.
    pub const PLANE_SYNC: u32 = 32;
}

/// Cube `(t, bh)`: query rows `t·planes·rows·fm ..` of batch `bh / heads`, head `bh % heads`;
/// `planes · plane` lanes, each plane owning `rows` fragments of `fm` query rows (two share
/// each key and value fragment it loads between two products).
#[cube(launch)]
// The knocked-out parts are comptime branches, kept apart from the runtime ones they wrap; a row
// sum that is not below f16's range counts as spilled, NaN included (`!(l < ..)`).
#[allow(
    clippy::too_many_arguments,
    clippy::collapsible_if,
    clippy::neg_cmp_op_on_partial_ord
)]
pub(super) fn flash_attention_planes<F: Float, N: Size>(
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
    #[comptime] bk: usize,
    #[comptime] fm: usize,
    #[comptime] fn_: usize,
    #[comptime] fk: usize,
    #[comptime] prefetch: bool,
    #[comptime] vec: usize,
    #[comptime] rows: usize,
    #[comptime] knock: u32,
    #[comptime] elementwise: bool,
    #[comptime] kv_pad: usize,
    #[comptime] hold_refs: bool,
) {
    let lanes = comptime!(planes * plane);
    // Vectors per staged row, and those that carry the head (the rest pad it to `dp`).
    let dpv = comptime!(dp / vec);
    let dv = comptime!(d / vec);
    // A staged key/value row: the padded head plus `kv_pad` elements, so that the rows a
    // fragment load reads fall on different banks ([`super::kv_tile::KV_PAD`]).
    let kv_row = comptime!(dp + kv_pad);
    let kvv = comptime!(kv_row / vec);
    // Query rows a plane owns.
    let pr = comptime!(rows * fm);
    let bq = comptime!(planes * pr);
    let lpr = comptime!(plane / pr);
    let s_row = comptime!(bk.max(dp) + SCORE_PAD);
    let p_row = comptime!(bk + PROB_PAD);
    // Key/value elements each lane stages per tile.
    let per_lane = comptime!((bk * dpv).div_ceil(planes * plane));

    let lane = UNIT_POS as usize;
    let pi = lane / plane;
    let in_plane = lane % plane;
    let r = in_plane / lpr;
    let part = in_plane % lpr;
    let bh = CUBE_POS_Y as usize;
    let batch = bh / heads;
    let col0 = (bh % heads) * d;
    let row0 = CUBE_POS_X as usize * bq;

    let mut q_s = Shared::<[Vector<F, N>]>::new_slice(comptime!(bq * dpv));
    let mut k_s = Shared::<[Vector<F, N>]>::new_slice(comptime!(bk * kvv));
    let mut v_s = Shared::<[Vector<F, N>]>::new_slice(comptime!(bk * kvv));
    let mut s_s = Shared::<[f32]>::new_slice(comptime!(bq * s_row));
    let mut p_s = Shared::<[F]>::new_slice(comptime!(bq * p_row));

    let q_base = q_at + batch * q_batch + col0;
    let mut i = lane;
    while i < comptime!(bq * dpv) {
        let row = row0 + i / dpv;
        let c = i % dpv;
        let mut value = Vector::<F, N>::new(F::new(0.0));
        if row < n_q && c < dv {
            value = q[(q_base + row * q_row) / vec + c];
        }
        q_s[i] = value;
        i += lanes;
    }
    sync_cube();

    let q_at_plane = pi * pr * dp;
    let s_at_plane = pi * pr * s_row;
    let p_at_plane = pi * pr * p_row;
    let s_at_row = s_at_plane + r * s_row;
    let p_at_row = p_at_plane + r * p_row;

    // The plane's query fragments, once.
    let mut qf = Sequence::<cmma::Matrix<F>>::new();
    #[unroll]
    for rb in 0..rows {
        #[unroll]
        for kk in 0..dp / fk {
            let mut f = unsafe {
                cmma::Matrix::<F>::uninitialized(
                    cmma::MatrixIdent::A,
                    fm,
                    fn_,
                    fk,
                    cmma::MatrixLayout::RowMajor,
                )
            };
            cmma::load(
                &mut f,
                &q_s[(q_at_plane + rb * fm * dp + kk * fk) / vec..comptime!(bq * dpv)],
                dp as u32,
            );
            qf.push(f);
        }
    }
    // The plane's output rows, resident for the whole walk; with `elementwise`, also their row
    // sums (each tile's probabilities times a fragment of ones: every column is the sum).
    let mut acc = Sequence::<cmma::Matrix<f32>>::new();
    #[unroll]
    for _ in 0..comptime!(rows * (dp / fn_)) {
        acc.push(cmma::Matrix::<f32>::from_value(
            cmma::MatrixIdent::Accumulator,
            fm,
            fn_,
            fk,
            cmma::MatrixLayout::Undefined,
            0.0f32,
        ));
    }
    let mut sums = Sequence::<cmma::Matrix<f32>>::new();
    let mut ones = Sequence::<cmma::Matrix<F>>::new();
    // With `elementwise`, also each row fragment's references (negated, over the scale) as the
    // accumulator a tile in registers starts its scores from; with `hold_refs` loaded once after
    // each round trip (the only place they move) instead of before every tile.
    let mut refs = Sequence::<cmma::Matrix<f32>>::new();
    if comptime!(elementwise) {
        #[unroll]
        for _ in 0..rows {
            refs.push(cmma::Matrix::<f32>::from_value(
                cmma::MatrixIdent::Accumulator,
                fm,
                fn_,
                fk,
                cmma::MatrixLayout::RowMajor,
                0.0f32,
            ));
            sums.push(cmma::Matrix::<f32>::from_value(
                cmma::MatrixIdent::Accumulator,
                fm,
                fn_,
                fk,
                cmma::MatrixLayout::Undefined,
                0.0f32,
            ));
        }
        ones.push(cmma::Matrix::<F>::from_value(
            cmma::MatrixIdent::B,
            fm,
            fn_,
            fk,
            cmma::MatrixLayout::RowMajor,
            F::new(1.0),
        ));
    }
    let mut m = f32::cast_from(-1.0e30f32);
    let mut l = 0.0f32;

    let k_base = k_at + batch * k_batch + col0;
    let v_base = v_at + batch * v_batch + col0;
    let tiles = n_k.div_ceil(bk);
    // This lane's share of a key/value tile, on its way to workgroup memory.
    let mut kr = Array::<Vector<F, N>>::new(per_lane);
    let mut vr = Array::<Vector<F, N>>::new(per_lane);
    let staged = comptime!(knock & knock::STAGE == 0);
    let loads = comptime!(staged && knock & knock::GLOBAL == 0);
    // With `elementwise`, a walk whose probabilities left f16's range somewhere in the cube is
    // walked again with every tile's scores through workgroup memory (the second attempt). The
    // attempts are unrolled: in a `loop`, cubecl 0.11.3 counted the workgroup memory used
    // inside it twice and refused the launch (57 344 bytes for 32 768).
    let mut done = false;
    #[unroll]
    for attempt in 0..comptime!(if elementwise { 2usize } else { 1usize }) {
        if !done {
            if comptime!(attempt > 0) {
                #[unroll]
                for i in 0..comptime!(rows * (dp / fn_)) {
                    cmma::fill(acc.index_mut(i), 0.0f32);
                }
                #[unroll]
                for i in 0..comptime!(if elementwise { rows } else { 0 }) {
                    cmma::fill(sums.index_mut(i), 0.0f32);
                }
                m = f32::cast_from(-1.0e30f32);
                l = 0.0f32;
            }
            if comptime!(prefetch) {
                load_tile::<F, N>(
                    k, v, &mut kr, &mut vr, k_base, k_row, v_base, v_row, 0usize, n_k, lane, dv,
                    dpv, bk, lanes, vec,
                );
            }
            for t in 0..tiles {
                let key0 = t * bk;
                if comptime!(staged) {
                    // Every lane is done with the previous tile.
                    sync_cube();
                    // Without prefetch, this tile is loaded now; with it, it was loaded during the last.
                    if comptime!(!prefetch && loads) {
                        load_tile::<F, N>(
                            k, v, &mut kr, &mut vr, k_base, k_row, v_base, v_row, key0, n_k, lane,
                            dv, dpv, bk, lanes, vec,
                        );
                    }
                    stage_tile::<F, N>(&mut k_s, &mut v_s, &kr, &vr, lane, dpv, kvv, bk, lanes);
                    sync_cube();
                }
                if comptime!(prefetch && loads) {
                    // The next tile's loads are in flight while this one is multiplied.
                    if t + 1 < tiles {
                        load_tile::<F, N>(
                            k,
                            v,
                            &mut kr,
                            &mut vr,
                            k_base,
                            k_row,
                            v_base,
                            v_row,
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
                }
                // A whole tile after the first, on the first attempt, takes its probabilities in
                // registers against the references the last round trip left.
                let in_registers =
                    comptime!(elementwise && attempt == 0) && t > 0 && key0 + bk <= n_k;
                if in_registers {
                    if comptime!(!hold_refs) {
                        load_refs(&s_s, &mut refs, s_at_plane, fm, rows, s_row, bq * s_row);
                    }
                    elementwise_tile::<F, N>(
                        &k_s,
                        &v_s,
                        &qf,
                        &mut acc,
                        &mut sums,
                        &ones,
                        &refs,
                        scale,
                        dp,
                        bk,
                        fm,
                        fn_,
                        fk,
                        rows,
                        vec,
                        kv_row,
                        bk * kvv,
                    );
                } else {
                    scores_to_rows::<F, N>(
                        &k_s, &mut s_s, &qf, s_at_plane, dp, bk, bq, fm, fn_, fk, rows, vec, s_row,
                        kv_row,
                    );
                    if comptime!(knock & knock::PLANE_SYNC == 0) {
                        sync_plane();
                    }

                    // The tile's row maximum, its keys spread over the row's `lpr` lanes.
                    let mut valid = n_k - key0;
                    if valid > bk {
                        valid = bk;
                    }
                    let mut local = f32::cast_from(-1.0e30f32);
                    if comptime!(knock & (knock::MAX_PASS | knock::SOFTMAX) == 0) {
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
                    } else {
                        local = 0.0f32;
                    }
                    // The reference moves only past the margin (always on the first tile).
                    let grow = local > m + RESCALE_MARGIN;
                    let mut reference = m;
                    if grow {
                        reference = local;
                    }
                    let alpha = f32::exp(m - reference);
                    let mut sum = 0.0f32;
                    if comptime!(knock & knock::SOFTMAX == 0) {
                        #[unroll]
                        for jj in 0..bk / lpr {
                            let j = part + jj * lpr;
                            let mut p = 0.0f32;
                            if j < valid {
                                p = f32::exp(s_s[s_at_row + j] * scale - reference);
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
                    }
                    l = l * alpha + sum;
                    m = reference;
                    if comptime!(knock & knock::PLANE_SYNC == 0) {
                        sync_plane();
                    }

                    // Where a row's reference moved, its accumulated output is scaled to the new one: the
                    // plane's fragments go through its (now free) score rows. Nothing to scale at first.
                    let moved = plane_any(grow);
                    if comptime!(knock & knock::RESCALE == 0) {
                        if t > 0 && moved {
                            rescale_rows(
                                &mut s_s,
                                &mut acc,
                                alpha,
                                s_at_plane,
                                s_at_row,
                                part,
                                comptime!(dp / fn_),
                                fm,
                                fn_,
                                rows,
                                lpr,
                                s_row,
                                bq * s_row,
                            );
                        }
                    }
                    if comptime!(elementwise) {
                        if t > 0 && moved {
                            rescale_rows(
                                &mut s_s,
                                &mut sums,
                                alpha,
                                s_at_plane,
                                s_at_row,
                                part,
                                1usize,
                                fm,
                                fn_,
                                rows,
                                lpr,
                                s_row,
                                bq * s_row,
                            );
                        }
                        // The rows' references, negated and over the scale, for the tiles taken
                        // in registers (their scores' first value).
                        sync_plane();
                        #[unroll]
                        for c in 0..comptime!(fn_ / lpr) {
                            s_s[s_at_row + part + c * lpr] = -m / scale;
                        }
                        sync_plane();
                        if comptime!(hold_refs) {
                            load_refs(&s_s, &mut refs, s_at_plane, fm, rows, s_row, bq * s_row);
                        }
                    }

                    add_probabilities::<F, N>(
                        &p_s,
                        &v_s,
                        &mut acc,
                        &mut sums,
                        &ones,
                        p_at_plane,
                        dp,
                        bk,
                        bq,
                        fm,
                        fn_,
                        fk,
                        rows,
                        vec,
                        p_row,
                        kv_row,
                        elementwise,
                    );
                }
            }
            if comptime!(elementwise) {
                // The row sums, through the plane's score rows; a row whose sum is not finite passed
                // f16's range in some tile (or its inputs hold NaN, which a second walk keeps).
                sync_plane();
                #[unroll]
                for rb in 0..rows {
                    cmma::store(
                        &mut s_s[s_at_plane + rb * comptime!(fm * s_row)..bq * s_row],
                        sums.index(rb),
                        s_row as u32,
                        cmma::MatrixLayout::RowMajor,
                    );
                }
                sync_plane();
                l = s_s[s_at_row];
                let spilled = plane_any(!(l < 3.0e38f32));
                // One flag for the cube (its key tiles are shared): the first probability row's first
                // element, free between walks.
                sync_cube();
                if lane == 0 {
                    p_s[0] = F::new(0.0);
                }
                sync_cube();
                if spilled && in_plane == 0 {
                    p_s[0] = F::new(1.0);
                }
                sync_cube();
                done = p_s[0] == F::new(0.0);
            }
        }
    }

    // The output rows through the plane's score rows, divided by the row sums.
    sync_plane();
    #[unroll]
    for rb in 0..rows {
        #[unroll]
        for fc in 0..dp / fn_ {
            cmma::store(
                &mut s_s[s_at_plane + rb * comptime!(fm * s_row) + fc * fn_..bq * s_row],
                acc.index(rb * comptime!(dp / fn_) + fc),
                s_row as u32,
                cmma::MatrixLayout::RowMajor,
            );
        }
    }
    sync_plane();
    let row = row0 + pi * pr + r;
    if row < n_q {
        // The row's head vectors, spread over its lanes.
        let o_base = ((batch * n_q + row) * heads * d + col0) / vec;
        #[unroll]
        for c in 0..comptime!(dv.div_ceil(lpr)) {
            let cv = part + c * lpr;
            if cv < dv {
                let mut o = Vector::<F, N>::new(F::new(0.0));
                #[unroll]
                for e in 0..vec {
                    o.insert(e, F::cast_from(s_s[s_at_row + cv * vec + e] / l));
                }
                out[o_base + cv] = o;
            }
        }
    }
}

/// The plane's row references from its score rows (each row's first `fn_` values, written by
/// the round trip) into `refs`, one accumulator fragment per row fragment.
#[cube]
fn load_refs(
    s_s: &Shared<[f32]>,
    refs: &mut Sequence<cmma::Matrix<f32>>,
    s_at_plane: usize,
    #[comptime] fm: usize,
    #[comptime] rows: usize,
    #[comptime] s_row: usize,
    #[comptime] s_end: usize,
) {
    #[unroll]
    for rb in 0..rows {
        cmma::load_with_layout(
            refs.index_mut(rb),
            &s_s[s_at_plane + rb * comptime!(fm * s_row)..s_end],
            s_row as u32,
            cmma::MatrixLayout::RowMajor,
        );
    }
}
