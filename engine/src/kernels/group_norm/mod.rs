//! GroupNorm, optionally followed by SiLU, in two launches: per-chunk statistics, then one pass
//! that pools them and normalises. Statistics are f32 whatever the data type (f16 sums over tens of
//! thousands of values lose too much), computed as per-chunk mean and M2 (sum of squared deviations
//! from the chunk's own mean) and pooled by Chan's formula, so a large mean never cancels the
//! variance away. The twin is [`crate::nn::GroupNorm::forward`] (burn ops).

use burn::cubecl;
use burn::cubecl::client::Client;
use burn::cubecl::prelude::*;
use burn::tensor::Tensor;

use super::{Element, buffer_arg, cube_total, output, resolve, resolve_strided, span_moments};

mod channels_last;
mod slab;
mod statistics;

pub(crate) use channels_last::is_channels_last;
pub use slab::{SLAB_MAX, set_slab_max, slab_max};

/// Lanes per cube; the reductions below are written for this power of two.
const LANES: usize = 256;
const LOG2_LANES: usize = 8;
/// Elements per statistics chunk: one cube each.
const CHUNK: usize = 4096;
/// Elements each lane normalises: an apply cube covers `LANES * PER_LANE`.
const PER_LANE: usize = 16;
const TILE: usize = LANES * PER_LANE;

/// What [`ChannelTerms`] add to channel `ch` of image `b`: `bias[ch]` with `has_bias`, and
/// `columns[b·width + column + ch]` with `has_columns`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn channel_term<F: Float>(
    bias: &[f32],
    columns: &[F],
    b: usize,
    ch: usize,
    width: usize,
    column: usize,
    #[comptime] has_bias: bool,
    #[comptime] has_columns: bool,
) -> f32 {
    let mut term = 0.0f32;
    if has_bias {
        term += bias[ch];
    }
    if has_columns {
        term += f32::cast_from(columns[b * width + column + ch]);
    }
    term
}

/// The sum of `value` over the cube's lanes, returned to every lane.
#[cube]
fn total(shared: Shared<[f32]>, value: f32) -> f32 {
    cube_total(shared, value, LANES, LOG2_LANES)
}

/// Cube `(k, s)`: mean and M2 of chunk `k` of slice `s` (one `(batch, group)`, `n` elements).
#[cube(launch)]
fn stats<F: Float>(x: &[F], partial: &mut [f32], n: usize, chunk: usize, chunks: usize) {
    let lane = UNIT_POS as usize;
    let slice = CUBE_POS_Y as usize;
    let k = CUBE_POS_X as usize;
    let start = k * chunk;
    let mut len = n - start;
    if len > chunk {
        len = chunk;
    }
    let base = slice * n + start;
    let shared = Shared::<[f32]>::new_slice(LANES);
    let (mean, m2) = span_moments(x, base, len, shared, LANES, LOG2_LANES);
    if lane == 0 {
        let at = (slice * chunks + k) * 2;
        partial[at] = mean;
        partial[at + 1] = m2;
    }
}

/// Cube `(t, s)`: pools slice `s`'s chunk statistics, then normalises tile `t` of it with the
/// channel's affine parameters, and applies SiLU when `silu`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn apply<F: Float>(
    x: &[F],
    y: &mut [F],
    partial: &[f32],
    gamma: &[f32],
    beta: &[f32],
    n: usize,
    chunk: usize,
    chunks: usize,
    hw: usize,
    per_group: usize,
    groups: usize,
    eps: f32,
    #[comptime] silu: bool,
) {
    let lane = UNIT_POS as usize;
    let slice = CUBE_POS_Y as usize;
    let shared = Shared::<[f32]>::new_slice(LANES);
    let count = f32::cast_from(n as u32);

    // mean = Σ nₖ·meanₖ / n, then M2 = Σ M2ₖ + Σ nₖ·(meanₖ − mean)² (exact, no cancellation).
    let mut weighted = 0.0f32;
    let mut k = lane;
    while k < chunks {
        let mut len = n - k * chunk;
        if len > chunk {
            len = chunk;
        }
        weighted += f32::cast_from(len as u32) * partial[(slice * chunks + k) * 2];
        k += LANES;
    }
    let mean = total(shared.clone(), weighted) / count;

    let mut spread = 0.0f32;
    let mut q = lane;
    while q < chunks {
        let mut len = n - q * chunk;
        if len > chunk {
            len = chunk;
        }
        let at = (slice * chunks + q) * 2;
        let d = partial[at] - mean;
        spread += partial[at + 1] + f32::cast_from(len as u32) * d * d;
        q += LANES;
    }
    let m2 = total(shared.clone(), spread);
    let inv_std = f32::inverse_sqrt(m2 / count + eps);

    let first_channel = (slice % groups) * per_group;
    let base = slice * n;
    let tile = CUBE_POS_X as usize * (LANES * PER_LANE);
    #[unroll]
    for r in 0..PER_LANE {
        let i = tile + r * LANES + lane;
        if i < n {
            let c = first_channel + i / hw;
            let mut v = (f32::cast_from(x[base + i]) - mean) * inv_std * gamma[c] + beta[c];
            if silu {
                v = v / (1.0 + f32::exp(-v));
            }
            y[base + i] = F::cast_from(v);
        }
    }
}

/// GroupNorm of `x` with f32 affine `gamma`/`beta`, then SiLU when `silu`, by our kernels. `None`
/// where they do not run (CPU backend, dtype other than f32/f16, shapes past the grid limits); the
/// caller then uses the burn-op twin.
///
/// # Shapes
/// x `[b, c, h, w]`, gamma and beta `[c]` -> `[b, c, h, w]`
pub fn group_norm(
    x: &Tensor<4>,
    gamma: &Tensor<1>,
    beta: &Tensor<1>,
    groups: usize,
    eps: f64,
    silu: bool,
) -> Option<Tensor<4>> {
    run(x, gamma, beta, None, groups, eps, silu, slab_max())
}

/// What is added to a map per (image, channel) before its GroupNorm, each part optional: a
/// convolution's bias left to the norm (f32 `[c]`) and a term read as columns `column ..` of a
/// wider `[b, width]` tensor in the map's dtype (the UNet's projection of every resnet's time
/// embedding). Our kernels read both where they lie, so no launch sums them per resnet;
/// [`Self::sum`] does, for burn ops.
#[derive(Debug, Clone)]
pub struct ChannelTerms {
    pub bias: Option<Tensor<1>>,
    pub columns: Option<(Tensor<2>, usize)>,
}

impl ChannelTerms {
    /// The terms as one f32 `[b, c]` tensor; `None` where there are none.
    pub fn sum(&self, b: usize, c: usize) -> Option<Tensor<2>> {
        let bias = self.bias.as_ref().map(|bias| {
            bias.clone()
                .cast(burn::tensor::DType::F32)
                .reshape([1, c])
                .expand([b, c])
        });
        let columns = self.columns.as_ref().map(|(t, column)| {
            let [rows, width] = t.dims();
            let t = match (*column, width == c) {
                (0, true) => t.clone(),
                _ => t.clone().slice([0..rows, *column..*column + c]),
            };
            t.cast(burn::tensor::DType::F32)
        });
        match (bias, columns) {
            (Some(bias), Some(columns)) => Some(bias + columns),
            (one, None) | (None, one) => one,
        }
    }
}

/// [`group_norm`] of `x + terms` (see [`ChannelTerms`]). Only a channels-last `x` (what our
/// channels-last convolutions and burn's write) is taken; `None` otherwise (or where a term's
/// shape or dtype does not fit), and the caller adds the terms itself.
pub fn group_norm_shifted(
    x: &Tensor<4>,
    gamma: &Tensor<1>,
    beta: &Tensor<1>,
    terms: &ChannelTerms,
    groups: usize,
    eps: f64,
    silu: bool,
) -> Option<Tensor<4>> {
    run(x, gamma, beta, Some(terms), groups, eps, silu, slab_max())
}

/// [`ChannelTerms`] as the kernels bind them; an absent part binds another buffer of its type
/// (never read: its branch is compiled out).
pub(super) struct Terms {
    pub bias: Option<burn::backend::wgpu::CubeTensor>,
    /// The wide tensor, its row length and the first column.
    pub columns: Option<(burn::backend::wgpu::CubeTensor, usize, usize)>,
}

impl Terms {
    fn of(terms: &ChannelTerms, [b, c]: [usize; 2], dtype: burn::tensor::DType) -> Option<Self> {
        let bias = match &terms.bias {
            Some(bias) if bias.dims() == [c] => {
                Some(resolve(bias.clone().cast(burn::tensor::DType::F32))?)
            }
            Some(_) => return None,
            None => None,
        };
        let columns = match &terms.columns {
            Some((t, column)) => {
                let [rows, width] = t.dims();
                if rows != b || column + c > width || t.dtype() != dtype {
                    return None;
                }
                Some((resolve(t.clone())?, width, *column))
            }
            None => None,
        };
        Some(Self { bias, columns })
    }
}

/// The kernels for `x` (`+ terms`); a channels-last map whose slabs hold at most `slab_max`
/// elements takes the one-launch kernel ([`slab`]), a larger one three launches.
#[allow(clippy::too_many_arguments)]
fn run(
    x: &Tensor<4>,
    gamma: &Tensor<1>,
    beta: &Tensor<1>,
    terms: Option<&ChannelTerms>,
    groups: usize,
    eps: f64,
    silu: bool,
    slab_max: usize,
) -> Option<Tensor<4>> {
    let device = x.device();
    if !super::available(&device) {
        return None;
    }
    let dtype = x.dtype();
    let element = Element::of(dtype)?;
    let [b, c, h, w] = x.dims();
    if groups == 0 || c % groups != 0 || b * c * h * w == 0 {
        return None;
    }
    let n = (c / groups) * h * w;
    let slices = b * groups;
    let chunks = n.div_ceil(CHUNK);
    let tiles = n.div_ceil(TILE);
    if slices > 65_535 || chunks > 65_535 || tiles > 65_535 || n >= u32::MAX as usize {
        return None;
    }
    let gc = resolve(gamma.clone().cast(burn::tensor::DType::F32))?;
    let bc = resolve(beta.clone().cast(burn::tensor::DType::F32))?;
    // A map burn's convolution wrote is channels-last: normalised as it lies, it stays so for
    // the next convolution (no relayout on either side).
    let strided = resolve_strided(x.clone())?;
    if channels_last::is_channels_last(&strided) {
        let none = ChannelTerms {
            bias: None,
            columns: None,
        };
        let terms = Terms::of(terms.unwrap_or(&none), [b, c], dtype)?;
        let kernels = match slab::takes(h * w, c / groups, slab_max) {
            true => slab::group_norm,
            false => channels_last::group_norm,
        };
        return kernels(
            &strided,
            &gc,
            &bc,
            &terms,
            [b, c, h, w],
            groups,
            eps as f32,
            silu,
            &device,
        );
    }
    if terms.is_some() {
        return None;
    }
    // Already resolved above: copied only where it is neither layout.
    let xc = match strided.is_contiguous() {
        true => strided,
        false => resolve(x.clone())?,
    };
    let (out, oc) = output([b, c, h, w], dtype, &device)?;
    let client = xc.client.clone();
    let partial = client.empty(slices * chunks * 2 * size_of::<f32>());
    let partial = || unsafe { BufferArg::from_raw_parts(partial.clone(), slices * chunks * 2) };
    let launch = match element {
        Element::F32 => launch::<f32>,
        Element::F16 => launch::<half::f16>,
    };
    launch(
        &client,
        Args {
            x_stats: buffer_arg(&xc),
            x: buffer_arg(&xc),
            y: buffer_arg(&oc),
            gamma: buffer_arg(&gc),
            beta: buffer_arg(&bc),
            partial_out: partial(),
            partial_in: partial(),
        },
        Sizes {
            n,
            chunks,
            tiles,
            slices,
            hw: h * w,
            per_group: c / groups,
            groups,
        },
        eps as f32,
        silu,
    );
    Some(out)
}

struct Args {
    x_stats: BufferArg,
    x: BufferArg,
    y: BufferArg,
    gamma: BufferArg,
    beta: BufferArg,
    partial_out: BufferArg,
    partial_in: BufferArg,
}

struct Sizes {
    n: usize,
    chunks: usize,
    tiles: usize,
    slices: usize,
    hw: usize,
    per_group: usize,
    groups: usize,
}

fn launch<F: Float + CubeElement>(client: &Client, args: Args, s: Sizes, eps: f32, silu: bool) {
    stats::launch::<F>(
        client,
        CubeCount::Static(s.chunks as u32, s.slices as u32, 1),
        CubeDim::new_1d(LANES as u32),
        args.x_stats,
        args.partial_out,
        s.n,
        CHUNK,
        s.chunks,
    );
    apply::launch::<F>(
        client,
        CubeCount::Static(s.tiles as u32, s.slices as u32, 1),
        CubeDim::new_1d(LANES as u32),
        args.x,
        args.y,
        args.partial_in,
        args.gamma,
        args.beta,
        s.n,
        CHUNK,
        s.chunks,
        s.hw,
        s.per_group,
        s.groups,
        eps,
        silu,
    );
}

#[cfg(test)]
mod tests {
    use burn::tensor::{DType, Device};

    use super::super::testing::{on_cpu, read, relative, tensor, values, wgpu};
    use crate::nn::GroupNorm;

    /// Affine parameters for `c` channels (neither ones nor zeros) on `device`, and the burn-op
    /// twin with them on the CPU backend (burn's reductions would tune on lavapipe).
    pub(super) fn affine(
        c: usize,
        groups: usize,
        device: &Device,
    ) -> (burn::tensor::Tensor<1>, burn::tensor::Tensor<1>, GroupNorm) {
        let gamma: Vec<f32> = (0..c).map(|i| 0.5 + i as f32 / c as f32).collect();
        let beta: Vec<f32> = (0..c).map(|i| (i as f32 - 3.0) / 10.0).collect();
        let gamma = tensor(gamma, [c], device, DType::F32);
        let beta = tensor(beta, [c], device, DType::F32);
        let norm = GroupNorm::from_tensors(on_cpu(&gamma), on_cpu(&beta), groups, 1e-5);
        (gamma, beta, norm)
    }

    /// The kernels against their burn-op twin, in f32 and f16, with and without SiLU: a slice in
    /// one partial chunk, channels per group not a power of two, an 8×8 map, batch 2, odd sizes,
    /// several chunks and tiles per slice, and a large mean.
    #[test]
    fn group_norm_kernels_match_burn_ops() {
        let device = wgpu();
        assert!(!super::super::available(&Device::flex()));
        for (b, c, h, w, groups, offset) in [
            (2, 8, 3, 5, 4, 3.0),
            (2, 96, 8, 8, 32, -1.0),
            (1, 64, 70, 70, 32, 3.0),
            (1, 6, 9, 7, 2, 500.0),
        ] {
            let n = b * c * h * w;
            let (gamma, beta, norm) = affine(c, groups, &device);
            for dtype in [DType::F32, DType::F16] {
                let x = tensor(values(n, offset), [b, c, h, w], &device, dtype);
                for silu in [false, true] {
                    let mut twin = norm.forward(on_cpu(&x));
                    if silu {
                        twin = burn::tensor::activation::silu(twin);
                    }
                    let ours = super::group_norm(&x, &gamma, &beta, groups, 1e-5, silu)
                        .expect("our kernels run on wgpu");
                    assert_eq!(ours.dtype(), dtype);
                    let rel = relative(&read(ours), &read(twin));
                    let tol = if dtype == DType::F32 { 1e-4 } else { 1e-2 };
                    assert!(
                        rel <= tol,
                        "{b}x{c}x{h}x{w}/{groups} {dtype:?} silu={silu}: rel {rel}"
                    );
                }
            }
        }
    }
}
