//! GroupNorm's statistics over a channels-last map: per-channel moments of pixel chunks (lanes
//! over channels, so reads are coalesced; vectors of four channels where they come so, their
//! pixel streams pooled in the cube), and their pooling per (batch, group) into a scale and shift
//! per channel ([`super::channels_last`] launches them, then normalises). Statistics are f32,
//! pooled by Chan's formula as in the channels-first kernels.

use burn::cubecl;
use burn::cubecl::prelude::*;

use super::channel_term;
use super::channels_last::{LANES, VEC};
use crate::kernels::cube_total;

const LOG2_LANES: usize = 8;
/// Pixels a lane loads at once.
const UNROLL: usize = 8;

/// Cube `(k, b)`: for pixels `[k·pixels, (k+1)·pixels)` of image `b`, the count, mean and M2 of
/// every channel, one entry `(count, mean, M2)` per (stream, channel). Lane `l` reads channels
/// `l % width, + width, …` of every `streams`-th pixel (`width = min(c, LANES)`, `streams =
/// LANES / width`): a warp reads consecutive channels of one pixel, `UNROLL` pixels at a time so
/// that enough loads are in flight (one at a time, the first version read at 0.65 TB/s on an
/// H200). Sums are shifted by the lane's first value, so a large mean does not cancel the spread.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn stats<F: Float>(
    x: &[F],
    partial: &mut [f32],
    hw: usize,
    c: usize,
    pixels: usize,
    chunks: usize,
    width: usize,
    streams: usize,
) {
    let lane = UNIT_POS as usize;
    let k = CUBE_POS_X as usize;
    let b = CUBE_POS_Y as usize;
    let stream = lane / width;
    if stream < streams {
        let first = k * pixels + stream;
        let mut end = (k + 1) * pixels;
        if end > hw {
            end = hw;
        }
        let row = b * hw;
        let mut ch = lane % width;
        while ch < c {
            let mut shift = 0.0f32;
            if first < end {
                shift = f32::cast_from(x[(row + first) * c + ch]);
            }
            let mut s1 = 0.0f32;
            let mut s2 = 0.0f32;
            let mut p = first;
            while p + (UNROLL - 1) * streams < end {
                #[unroll]
                for u in 0..UNROLL {
                    let d = f32::cast_from(x[(row + p + u * streams) * c + ch]) - shift;
                    s1 += d;
                    s2 += d * d;
                }
                p += UNROLL * streams;
            }
            while p < end {
                let d = f32::cast_from(x[(row + p) * c + ch]) - shift;
                s1 += d;
                s2 += d * d;
                p += streams;
            }
            let mut count = 0usize;
            if first < end {
                count = (end - first).div_ceil(streams);
            }
            let at = (((b * chunks + k) * streams + stream) * c + ch) * 3;
            let n = f32::cast_from(count as u32);
            if count == 0 {
                partial[at] = 0.0;
                partial[at + 1] = 0.0;
                partial[at + 2] = 0.0;
            } else {
                partial[at] = n;
                partial[at + 1] = shift + s1 / n;
                partial[at + 2] = f32::max(s2 - s1 * s1 / n, 0.0);
            }
            ch += width;
        }
    }
}

/// [`stats`] a vector of [`VEC`] channels a lane, where the channels come in whole vectors: a
/// warp reads 32 vectors of one pixel (or of a few) at once instead of 32 values. `width` and
/// `streams` count vectors. With `combine` (a pixel's vectors fit the cube's lanes, so each lane
/// has one), the streams' moments are pooled in the cube and one entry per channel is written
/// (`(b·chunks + k)·c + ch`): more streams than [`stats`] has would otherwise multiply the
/// pooling's work. Without it there is one stream, written the same way.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn stats_vectors<F: Float, N: Size>(
    x: &[Vector<F, N>],
    partial: &mut [f32],
    hw: usize,
    c: usize,
    pixels: usize,
    chunks: usize,
    width: usize,
    streams: usize,
    #[comptime] combine: bool,
) {
    let lane = UNIT_POS as usize;
    let k = CUBE_POS_X as usize;
    let b = CUBE_POS_Y as usize;
    let stream = lane / width;
    let cv = c / VEC;
    // Every stream's entries, where they are pooled here (`streams · c ≤ LANES · VEC`).
    let mut shared =
        Shared::<[f32]>::new_slice(comptime!(if combine { 3 * LANES * VEC } else { 1 }));
    if stream < streams {
        let first = k * pixels + stream;
        let mut end = (k + 1) * pixels;
        if end > hw {
            end = hw;
        }
        let row = b * hw;
        let mut chv = lane % width;
        while chv < cv {
            let mut shift = Array::<f32>::new(VEC);
            let mut s1 = Array::<f32>::new(VEC);
            let mut s2 = Array::<f32>::new(VEC);
            let mut head = Vector::<F, N>::new(F::new(0.0));
            if first < end {
                head = x[(row + first) * cv + chv];
            }
            #[unroll]
            for e in 0..VEC {
                shift[e] = f32::cast_from(head.extract(e));
                s1[e] = 0.0;
                s2[e] = 0.0;
            }
            let mut p = first;
            while p + (UNROLL - 1) * streams < end {
                #[unroll]
                for u in 0..UNROLL {
                    let xv = x[(row + p + u * streams) * cv + chv];
                    #[unroll]
                    for e in 0..VEC {
                        let d = f32::cast_from(xv.extract(e)) - shift[e];
                        s1[e] += d;
                        s2[e] += d * d;
                    }
                }
                p += UNROLL * streams;
            }
            while p < end {
                let xv = x[(row + p) * cv + chv];
                #[unroll]
                for e in 0..VEC {
                    let d = f32::cast_from(xv.extract(e)) - shift[e];
                    s1[e] += d;
                    s2[e] += d * d;
                }
                p += streams;
            }
            let mut count = 0usize;
            if first < end {
                count = (end - first).div_ceil(streams);
            }
            let n = f32::cast_from(count as u32);
            #[unroll]
            for e in 0..VEC {
                let mut mean = 0.0f32;
                let mut m2 = 0.0f32;
                if count > 0 {
                    mean = shift[e] + s1[e] / n;
                    m2 = f32::max(s2[e] - s1[e] * s1[e] / n, 0.0);
                }
                let ch = chv * VEC + e;
                let mut at = ((b * chunks + k) * c + ch) * 3;
                if combine {
                    at = (stream * c + ch) * 3;
                    shared[at] = n;
                    shared[at + 1] = mean;
                    shared[at + 2] = m2;
                } else {
                    partial[at] = n;
                    partial[at + 1] = mean;
                    partial[at + 2] = m2;
                }
            }
            chv += width;
        }
    }
    if combine {
        sync_cube();
        // Each channel's streams pooled exactly (Chan): the mean first, then M2 with each
        // stream's offset from it. A chunk always holds a pixel, so the count is never 0.
        let mut ch = lane;
        while ch < c {
            let mut n = 0.0f32;
            let mut weighted = 0.0f32;
            for st in 0..streams {
                let at = (st * c + ch) * 3;
                n += shared[at];
                weighted += shared[at] * shared[at + 1];
            }
            let mean = weighted / n;
            let mut m2 = 0.0f32;
            for st in 0..streams {
                let at = (st * c + ch) * 3;
                let d = shared[at + 1] - mean;
                m2 += shared[at + 2] + shared[at] * d * d;
            }
            let at = ((b * chunks + k) * c + ch) * 3;
            partial[at] = n;
            partial[at + 1] = mean;
            partial[at + 2] = m2;
            ch += LANES;
        }
    }
}

/// Cube `(g, b)`: pools group `g`'s entries of image `b` (exactly: mean first, then M2 with each
/// entry's offset from it) and writes each of its channels' scale `γ/σ` and shift `β − μ·γ/σ`.
/// The map is normalised as if its channel terms ([`super::ChannelTerms`]: `bias`, `columns`
/// from `column` in rows of `row`) were added to it first: each entry's mean moves by them, its
/// M2 does not.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn pool<F: Float>(
    partial: &[f32],
    bias: &[f32],
    columns: &[F],
    row: usize,
    column: usize,
    gamma: &[f32],
    beta: &[f32],
    scale: &mut [f32],
    offset: &mut [f32],
    c: usize,
    per_group: usize,
    entries: usize,
    eps: f32,
    #[comptime] has_bias: bool,
    #[comptime] has_columns: bool,
) {
    let shifted = comptime!(has_bias || has_columns);
    let lane = UNIT_POS as usize;
    let g = CUBE_POS_X as usize;
    let b = CUBE_POS_Y as usize;
    let first_channel = g * per_group;
    let shared = Shared::<[f32]>::new_slice(LANES);

    let mut n = 0.0f32;
    let mut weighted = 0.0f32;
    let mut e = lane;
    while e < entries {
        let at =
            ((b * (entries / per_group) + e / per_group) * c + first_channel + e % per_group) * 3;
        let mut mean = partial[at + 1];
        if shifted {
            let ch = first_channel + e % per_group;
            mean += channel_term::<F>(bias, columns, b, ch, row, column, has_bias, has_columns);
        }
        n += partial[at];
        weighted += partial[at] * mean;
        e += LANES;
    }
    let count = cube_total(shared.clone(), n, LANES, LOG2_LANES);
    let mean = cube_total(shared.clone(), weighted, LANES, LOG2_LANES) / count;

    let mut spread = 0.0f32;
    let mut q = lane;
    while q < entries {
        let at =
            ((b * (entries / per_group) + q / per_group) * c + first_channel + q % per_group) * 3;
        let mut d = partial[at + 1] - mean;
        if shifted {
            let ch = first_channel + q % per_group;
            d += channel_term::<F>(bias, columns, b, ch, row, column, has_bias, has_columns);
        }
        spread += partial[at + 2] + partial[at] * d * d;
        q += LANES;
    }
    let m2 = cube_total(shared, spread, LANES, LOG2_LANES);
    let inv_std = f32::inverse_sqrt(m2 / count + eps);

    let mut j = lane;
    while j < per_group {
        let ch = first_channel + j;
        let s = gamma[ch] * inv_std;
        scale[b * c + ch] = s;
        let mut centre = mean;
        if shifted {
            centre -= channel_term::<F>(bias, columns, b, ch, row, column, has_bias, has_columns);
        }
        offset[b * c + ch] = beta[ch] - centre * s;
        j += LANES;
    }
}
