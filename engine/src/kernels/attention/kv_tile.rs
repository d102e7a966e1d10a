//! The planes kernel's key and value tiles ([`super::planes`]): each lane's share loaded from
//! global memory into registers, then staged into workgroup rows padded against bank conflicts.

use burn::cubecl;
use burn::cubecl::prelude::*;

/// Elements of padding per staged key/value row. Unpadded, a 64-wide head's rows (SDXL's, SD
/// 2.x's) lie 128 bytes apart, so the 8 rows a fragment load reads 16 bytes of at a time all
/// start on the same bank (an 8-way conflict; 2-way at SD 1.x's 48 and 80). With 16 bytes more
/// a row, any width that is a multiple of 16 puts those rows on 8 different 16-byte bank groups.
/// (The twenty-fifth session padded every staged row, q's too, and lost on SD 1.5 at 47 KiB a
/// cube; this pads k and v only, 32 · `bk` bytes.) [`super::knobs::set_planes_kv_pad`]
/// switches it for the bench.
pub(super) const KV_PAD: usize = 8;

/// This lane's share of a loaded tile (`kr`, `vr`: vector `lane + e · lanes` of the tile's `bk`
/// rows of `dpv` vectors) into the staged rows `k_s`, `v_s` of `kvv` vectors each (the rows'
/// padding past `dpv` is never read).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn stage_tile<F: Float, N: Size>(
    k_s: &mut Shared<[Vector<F, N>]>,
    v_s: &mut Shared<[Vector<F, N>]>,
    kr: &Array<Vector<F, N>>,
    vr: &Array<Vector<F, N>>,
    lane: usize,
    #[comptime] dpv: usize,
    #[comptime] kvv: usize,
    #[comptime] bk: usize,
    #[comptime] lanes: usize,
) {
    let per_lane = comptime!((bk * dpv).div_ceil(lanes));
    #[unroll]
    for e in 0..per_lane {
        let i = lane + e * lanes;
        if i < comptime!(bk * dpv) {
            let mut at = i;
            if comptime!(kvv > dpv) {
                at = (i / dpv) * kvv + i % dpv;
            }
            k_s[at] = kr[e];
            v_s[at] = vr[e];
        }
    }
}

/// This lane's share of the key and value tile from `key0`, zero past the last key and the head
/// width: vector `lane + e · lanes` of the tile's `bk` rows of `dpv` vectors (`dv` of them the
/// head's) into `kr[e]`, `vr[e]`. The bases and row strides are in elements, multiples of `vec`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn load_tile<F: Float, N: Size>(
    k: &[Vector<F, N>],
    v: &[Vector<F, N>],
    kr: &mut Array<Vector<F, N>>,
    vr: &mut Array<Vector<F, N>>,
    k_base: usize,
    k_row: usize,
    v_base: usize,
    v_row: usize,
    key0: usize,
    n_k: usize,
    lane: usize,
    #[comptime] dv: usize,
    #[comptime] dpv: usize,
    #[comptime] bk: usize,
    #[comptime] lanes: usize,
    #[comptime] vec: usize,
) {
    let per_lane = comptime!((bk * dpv).div_ceil(lanes));
    #[unroll]
    for e in 0..per_lane {
        let i = lane + e * lanes;
        let key = key0 + i / dpv;
        let c = i % dpv;
        let mut kv = Vector::<F, N>::new(F::new(0.0));
        let mut vv = Vector::<F, N>::new(F::new(0.0));
        if i < comptime!(bk * dpv) && key < n_k && c < dv {
            kv = k[(k_base + key * k_row) / vec + c];
            vv = v[(v_base + key * v_row) / vec + c];
        }
        kr[e] = kv;
        vr[e] = vv;
    }
}
