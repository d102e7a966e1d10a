//! GroupNorm(+SiLU) of a small channels-last map in one launch: a cube per (image, group) reads
//! its slab (the group's channels of every pixel) three times, for the mean, for the squared
//! deviations from it (two passes, exact), and to write the normalised values, the slab staying
//! in cache between them. [`super::channels_last`]'s three launches (statistics of chunks, their
//! pooling, the pass) spread a large map over the whole GPU; on the UNet's maps each of them is a
//! launch of a few microseconds' work, and on an H200 a launch costs ~10 µs of device time
//! whatever it does (BENCHMARKS.md, fifty-first session: 183 of SD 1.5's step's 577 launches were
//! GroupNorm's three, 1.9 ms of 24).
//!
//! A lane keeps one vector slot `j` of its group's channels and walks the pixels `p0, p0 + stride,
//! ..`, so its channels' affine terms are read once; `LANES % (vectors a pixel)` lanes idle.

use burn::backend::wgpu::CubeTensor;
use burn::cubecl;
use burn::cubecl::prelude::*;
use burn::tensor::Tensor;

use super::super::{Element, buffer_arg, cube_total, output, vector_arg};
use super::{Terms, channel_term};

const LANES: usize = 256;
const LOG2_LANES: usize = 8;
/// Pixels a lane loads at once, so that enough loads are in flight on one SM.
const UNROLL: usize = 4;

/// Most elements a slab may hold for [`group_norm`] to take the map, unless set otherwise
/// ([`set_slab_max`]): 64 Ki elements (128 KiB of f16) reads in a few microseconds on one SM and
/// holds SD 1.x's 64×64 maps of 320 channels, the VAE's of 512, and every smaller one. Larger
/// slabs, on as few cubes, lost on SDXL's step (BENCHMARKS.md, fifty-first session).
pub const SLAB_MAX: usize = 1 << 16;

static MAX: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(SLAB_MAX);

/// The largest slab (elements of one image's group) normalised in one launch; 0: never.
pub fn slab_max() -> usize {
    MAX.load(std::sync::atomic::Ordering::Relaxed)
}

/// Sets [`slab_max`] process-wide (the bench compares routes in one process).
pub fn set_slab_max(elements: usize) {
    MAX.store(elements, std::sync::atomic::Ordering::Relaxed);
}

/// Cube `(g, b)`: group `g` of image `b`. `cv` vectors a pixel, `pv` of them the group's; `x`
/// and `y` `[b, hw, c]` in vectors of `width`. The channel terms ([`super::ChannelTerms`]:
/// `bias`, and `columns` from `column` in rows of `row`) are added to every value first.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn slab<F: Float, N: Size>(
    x: &[Vector<F, N>],
    y: &mut [Vector<F, N>],
    bias: &[f32],
    columns: &[F],
    gamma: &[f32],
    beta: &[f32],
    hw: usize,
    cv: usize,
    pv: usize,
    row: usize,
    column: usize,
    eps: f32,
    #[comptime] width: usize,
    #[comptime] has_bias: bool,
    #[comptime] has_columns: bool,
    #[comptime] silu: bool,
) {
    let lane = UNIT_POS as usize;
    let g = CUBE_POS_X as usize;
    let b = CUBE_POS_Y as usize;
    let stride = LANES / pv;
    let p0 = lane / pv;
    let j = lane % pv;
    let base = b * hw * cv + g * pv + j;
    let first = (g * pv + j) * width;
    let shared = Shared::<[f32]>::new_slice(LANES);

    // This lane's channels' terms, read once.
    let mut shift = Array::<f32>::new(width);
    let mut scale = Array::<f32>::new(width);
    let mut offset = Array::<f32>::new(width);
    #[unroll]
    for e in 0..width {
        shift[e] = 0.0;
        scale[e] = 0.0;
        offset[e] = 0.0;
        if p0 < stride {
            let ch = first + e;
            shift[e] = channel_term::<F>(bias, columns, b, ch, row, column, has_bias, has_columns);
            scale[e] = gamma[first + e];
            offset[e] = beta[first + e];
        }
    }
    let live = p0 < stride;

    let mut sum = 0.0f32;
    if live {
        sum = lane_moment::<F, N>(x, &shift, base, p0, stride, hw, cv, 0.0, width, false);
    }
    let count = f32::cast_from((hw * pv * width) as u32);
    let mean = cube_total(shared.clone(), sum, LANES, LOG2_LANES) / count;

    let mut m2 = 0.0f32;
    if live {
        m2 = lane_moment::<F, N>(x, &shift, base, p0, stride, hw, cv, mean, width, true);
    }
    let inv_std = f32::inverse_sqrt(cube_total(shared, m2, LANES, LOG2_LANES) / count + eps);

    if live {
        // y = x·s + t with s = γ/σ, t = β + (shift − μ)·s.
        #[unroll]
        for e in 0..width {
            let s = scale[e] * inv_std;
            offset[e] += (shift[e] - mean) * s;
            scale[e] = s;
        }
        let mut p = p0;
        while p < hw {
            let at = base + p * cv;
            let xv = x[at];
            let mut yv = Vector::<F, N>::new(F::new(0.0));
            #[unroll]
            for e in 0..width {
                let mut v = f32::cast_from(xv.extract(e)) * scale[e] + offset[e];
                if silu {
                    v = v / (1.0 + f32::exp(-v));
                }
                yv.insert(e, F::cast_from(v));
            }
            y[at] = yv;
            p += stride;
        }
    }
}

/// This lane's sum over pixels `p0, p0 + stride, .. < hw` of `x + shift − mean` (squared where
/// `squared`: the deviations' M2), `UNROLL` loads in flight at a time.
#[cube]
#[allow(clippy::too_many_arguments)]
fn lane_moment<F: Float, N: Size>(
    x: &[Vector<F, N>],
    shift: &Array<f32>,
    base: usize,
    p0: usize,
    stride: usize,
    hw: usize,
    cv: usize,
    mean: f32,
    #[comptime] width: usize,
    #[comptime] squared: bool,
) -> f32 {
    let mut acc = 0.0f32;
    let mut p = p0;
    while p + (UNROLL - 1) * stride < hw {
        #[unroll]
        for u in 0..UNROLL {
            let xv = x[base + (p + u * stride) * cv];
            acc = vector_moment::<F, N>(acc, xv, shift, mean, width, squared);
        }
        p += UNROLL * stride;
    }
    while p < hw {
        acc = vector_moment::<F, N>(acc, x[base + p * cv], shift, mean, width, squared);
        p += stride;
    }
    acc
}

/// `acc` plus `x + shift − mean` of each element of the vector `xv` in turn (squared where
/// `squared`).
#[cube]
fn vector_moment<F: Float, N: Size>(
    acc: f32,
    xv: Vector<F, N>,
    shift: &Array<f32>,
    mean: f32,
    #[comptime] width: usize,
    #[comptime] squared: bool,
) -> f32 {
    let mut acc = acc;
    #[unroll]
    for e in 0..width {
        let d = f32::cast_from(xv.extract(e)) + shift[e] - mean;
        if squared {
            acc += d * d;
        } else {
            acc += d;
        }
    }
    acc
}

/// Vector width for `per_group` channels: the widest of 4, 2, 1 dividing it (4 is the widest
/// every compiler takes), so a group's first channel starts a vector.
fn width_for(per_group: usize) -> usize {
    [4, 2, 1]
        .into_iter()
        .find(|w| per_group.is_multiple_of(*w))
        .unwrap_or(1)
}

/// Whether a map of `hw` pixels and `per_group` channels a group takes [`group_norm`] under a
/// slab limit of `max` elements: the slab within it, and a pixel's share of the group within
/// one cube's lanes.
pub(super) fn takes(hw: usize, per_group: usize, max: usize) -> bool {
    let slab = hw.saturating_mul(per_group);
    slab > 0 && slab <= max && per_group / width_for(per_group) <= LANES
}

/// GroupNorm(+SiLU) of the channels-last `xc` plus `terms` in one launch (see the module); the
/// caller checked the layout and [`takes`]. `None` where the grid cannot hold it.
#[allow(clippy::too_many_arguments)]
pub(super) fn group_norm(
    xc: &CubeTensor,
    gamma: &CubeTensor,
    beta: &CubeTensor,
    terms: &Terms,
    [b, c, h, w]: [usize; 4],
    groups: usize,
    eps: f32,
    silu: bool,
    device: &burn::tensor::Device,
) -> Option<Tensor<4>> {
    let element = Element::of(xc.dtype)?;
    let hw = h * w;
    let per_group = c / groups;
    let width = width_for(per_group);
    if b > 65_535 || groups > 65_535 || b * hw * c >= u32::MAX as usize {
        return None;
    }
    let (out, oc) = output([b, h, w, c], xc.dtype, device)?;
    let launch = match element {
        Element::F32 => slab::launch::<f32>,
        Element::F16 => slab::launch::<half::f16>,
    };
    launch(
        &xc.client,
        CubeCount::Static(groups as u32, b as u32, 1),
        CubeDim::new_1d(LANES as u32),
        width,
        vector_arg(xc, width),
        vector_arg(&oc, width),
        // An absent term binds a buffer of its type, never read (compiled out).
        buffer_arg(terms.bias.as_ref().unwrap_or(gamma)),
        buffer_arg(terms.columns.as_ref().map_or(xc, |t| &t.0)),
        buffer_arg(gamma),
        buffer_arg(beta),
        hw,
        c / width,
        per_group / width,
        terms.columns.as_ref().map_or(0, |t| t.1),
        terms.columns.as_ref().map_or(0, |t| t.2),
        eps,
        width,
        terms.bias.is_some(),
        terms.columns.is_some(),
        silu,
    );
    Some(out.permute([0, 3, 1, 2]))
}

#[cfg(test)]
mod tests {
    use super::{LANES, takes, width_for};

    #[test]
    fn widths_start_groups_on_vectors() {
        assert_eq!(width_for(10), 2, "SD 1.5's 320 channels");
        assert_eq!(width_for(40), 4);
        assert_eq!(width_for(30), 2);
        assert_eq!(width_for(3), 1);
    }

    #[test]
    fn slabs_within_the_limit_and_the_lanes() {
        assert!(takes(64 * 64, 10, 1 << 16), "SD 1.5's 64×64 × 320");
        assert!(!takes(128 * 128, 10, 1 << 16), "SDXL's 128×128 × 320");
        assert!(!takes(64, 10, 0), "off");
        assert!(!takes(0, 10, 1 << 16));
        assert!(takes(1, 4 * LANES, usize::MAX));
        assert!(
            !takes(1, 4 * LANES + 4, usize::MAX),
            "more vectors a pixel than lanes"
        );
    }
}
