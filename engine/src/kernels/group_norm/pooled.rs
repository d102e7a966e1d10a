//! GroupNorm's normalising pass over a channels-last map that pools the statistics itself: the
//! statistics (`stats_vectors` with `grouped`) leave one entry per (chunk, group), few enough
//! that each normalising cube pools its image's groups in workgroup memory, so the pooling
//! launch between them (61 a SD 1.5 step, ~10 µs each on an H200) goes away. Taken where the
//! channels come in vectors and the entries are few ([`takes`]); elsewhere the three launches
//! of [`super::channels_last`] stay.

use burn::cubecl;
use burn::cubecl::prelude::*;

use super::channels_last::{GROUPED_MAX_C, LANES, VEC};
use super::statistics::merge_moments;

/// Most statistics chunks an image may have here: each normalising cube reads `chunks · groups`
/// entries, so this bounds that read to ~48 KiB (128 chunks, 32 groups), from cache.
pub(super) const MAX_CHUNKS: usize = 128;
/// Most chunks one lane pools (loaded at once, in registers).
const LANE_CHUNKS: usize = 16;
/// Vectors each lane normalises: as few as the pass without pooling takes, so that small maps
/// still give enough cubes (16 left SD 1.5's 8×8 maps 20 cubes and the pass at 20 µs, H200).
const PER_LANE: usize = 4;
/// Vectors a cube normalises.
pub(super) const TILE: usize = LANES * PER_LANE;

/// Whether the pass that pools for itself takes a map of `c` channels in `groups` groups cut
/// into `chunks` statistics chunks: channels in whole vectors and within the workgroup memory's
/// per-channel arrays, groups that share the cube's lanes evenly, few enough entries (and at
/// most [`LANE_CHUNKS`] a lane).
pub(super) fn takes(c: usize, groups: usize, chunks: usize) -> bool {
    c.is_multiple_of(VEC)
        && c <= GROUPED_MAX_C
        && groups > 0
        && c.is_multiple_of(groups)
        && LANES.is_multiple_of(groups)
        && chunks <= MAX_CHUNKS
        && chunks <= LANES / groups * LANE_CHUNKS
}

/// Cube `(t, b)`: pools image `b`'s per-(chunk, group) entries into each group's mean and
/// 1/σ (Chan's formula; `LANES / groups` lanes a group, each over every `L`-th chunk, then
/// merged), forms every channel's scale and shift in workgroup memory, then normalises tile `t`
/// of the image's `vectors` vectors (SiLU after with `silu`). With `shifted` the entries'
/// means include `pre[b, ch]` (the statistics added it), and so does the normalised value.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn apply_pooled<F: Float, N: Size>(
    x: &[Vector<F, N>],
    y: &mut [Vector<F, N>],
    partial: &[f32],
    pre: &[f32],
    gamma: &[f32],
    beta: &[f32],
    vectors: usize,
    c: usize,
    chunks: usize,
    groups: usize,
    eps: f32,
    #[comptime] silu: bool,
    #[comptime] shifted: bool,
) {
    let lane = UNIT_POS as usize;
    let b = CUBE_POS_Y as usize;
    // Each lane's pooled (count, mean, M2), then each group's (mean, 1/σ), then the channels'
    // scales and shifts.
    let mut merged = Shared::<[f32]>::new_slice(comptime!(3 * LANES));
    let mut group_stats = Shared::<[f32]>::new_slice(comptime!(2 * LANES));
    let mut scale = Shared::<[f32]>::new_slice(GROUPED_MAX_C);
    let mut shift = Shared::<[f32]>::new_slice(GROUPED_MAX_C);

    let lanes_per_group = LANES / groups;
    let g = lane / lanes_per_group;
    let part = lane % lanes_per_group;
    // This lane's chunks loaded at once (one memory latency, not one a chunk: a loop over them
    // took the pass from 8.6 to 19.3 µs on SD 1.5's maps, H200), then pooled.
    let mut ns = Array::<f32>::new(LANE_CHUNKS);
    let mut means = Array::<f32>::new(LANE_CHUNKS);
    let mut m2s = Array::<f32>::new(LANE_CHUNKS);
    #[unroll]
    for q in 0..LANE_CHUNKS {
        let j = part + q * lanes_per_group;
        ns[q] = 0.0;
        means[q] = 0.0;
        m2s[q] = 0.0;
        if j < chunks {
            let at = ((b * chunks + j) * groups + g) * 3;
            ns[q] = partial[at];
            means[q] = partial[at + 1];
            m2s[q] = partial[at + 2];
        }
    }
    let mut n = 0.0f32;
    let mut mean = 0.0f32;
    let mut m2 = 0.0f32;
    #[unroll]
    for q in 0..LANE_CHUNKS {
        let (n1, mean1, m21) = merge_moments(n, mean, m2, ns[q], means[q], m2s[q]);
        n = n1;
        mean = mean1;
        m2 = m21;
    }
    merged[lane * 3] = n;
    merged[lane * 3 + 1] = mean;
    merged[lane * 3 + 2] = m2;
    sync_cube();

    if part == 0 {
        let mut n = 0.0f32;
        let mut mean = 0.0f32;
        let mut m2 = 0.0f32;
        for q in 0..lanes_per_group {
            let at = (lane + q) * 3;
            let (n1, mean1, m21) =
                merge_moments(n, mean, m2, merged[at], merged[at + 1], merged[at + 2]);
            n = n1;
            mean = mean1;
            m2 = m21;
        }
        group_stats[g * 2] = mean;
        group_stats[g * 2 + 1] = f32::inverse_sqrt(m2 / n + eps);
    }
    sync_cube();

    // Unrolled so that every channel's loads are in flight at once (a loop waited for each).
    let per_group = c / groups;
    #[unroll]
    for q in 0..comptime!(GROUPED_MAX_C / LANES) {
        let ch = lane + q * LANES;
        if ch < c {
            let group = ch / per_group;
            let s = gamma[ch] * group_stats[group * 2 + 1];
            let mut centre = group_stats[group * 2];
            if shifted {
                centre -= pre[b * c + ch];
            }
            scale[ch] = s;
            shift[ch] = beta[ch] - centre * s;
        }
    }
    sync_cube();

    let tile = CUBE_POS_X as usize * TILE;
    #[unroll]
    for r in 0..PER_LANE {
        let i = tile + r * LANES + lane;
        if i < vectors {
            let ch = (i * VEC) % c;
            let xv = x[b * vectors + i];
            let mut yv = Vector::<F, N>::new(F::new(0.0));
            #[unroll]
            for e in 0..VEC {
                let mut v = f32::cast_from(xv.extract(e)) * scale[ch + e] + shift[ch + e];
                if silu {
                    v = v / (1.0 + f32::exp(-v));
                }
                yv.insert(e, F::cast_from(v));
            }
            y[b * vectors + i] = yv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{LANES, MAX_CHUNKS, takes};

    /// Every SD map's norm is taken (32 groups, up to 2560 channels); channels not in vectors,
    /// groups that do not share the lanes evenly, too many channels or chunks are not.
    #[test]
    fn takes_sd_maps_only_where_the_entries_fit() {
        for c in [128, 256, 320, 512, 640, 960, 1280, 1920, 2560] {
            assert!(takes(c, 32, 79), "{c}");
        }
        assert!(takes(12, 4, 1));
        assert!(!takes(6, 3, 1));
        assert!(!takes(12, 3, 1));
        assert!(!takes(2564, 4, 1));
        assert!(!takes(320, 32, MAX_CHUNKS + 1));
        assert!(!takes(LANES * 8, LANES * 2, 1));
        assert!(!takes(320, 0, 1));
        // 64 groups: four lanes a group, at most 64 chunks.
        assert!(takes(256, 64, 64));
        assert!(!takes(256, 64, 65));
    }
}
