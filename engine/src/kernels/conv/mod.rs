//! 2-D convolution as an implicit GEMM on plain lanes (no cooperative matrices): the portable
//! path for adapters without them (Iris Xe, Meteor Lake, every WGSL adapter), where burn's only
//! 3×3 candidate is `conv_direct` (one lane per output, no tiling; 1.1 s per SD 1.5 UNet step on
//! an H200 under WGSL, BENCHMARKS.md).
//!
//! The GEMM is `out[co, p] = Σ_k w[k, co] · im2col(x)[k, p]` with `k = (ci, ky, kx)` and `p` the
//! output pixels of the whole batch. A cube computes a 64 (output channels) × 64 (pixels) tile
//! with 256 lanes, each a 4 × 4 block in f32 registers; it walks `k` in steps of 16, staging the
//! weight slice and the gathered input slice (zero outside the image: the padding) in workgroup
//! memory, 8 KiB in all ([`kernel`]); where [`Prepared`] routes a layer (by default) the staged
//! operands are read as vectors of 4 and the next step's loads issued before this step's
//! products, or in f16 the reduction walked 32 a step ([`vector`]; [`conv2d`] itself runs the
//! scalar kernel, the bench's baseline).
//! Weights come packed `[c_in·kh·kw, c_out]` ([`pack`], once per model), so the staging reads
//! are coalesced. The epilogue adds the bias, a per-(image, channel) term (the UNet's time
//! embedding) and a residual (the resnet's shortcut) in f32 before the one cast and write,
//! `[b, c_out, oh, ow]` like burn's: no separate pass over the map.
//!
//! Small maps (8×8 and 16×16 latents: 40 to 160 tiles, most of a GPU idle) split the reduction
//! ([`splits`]): each slice writes f32 partial sums and a second kernel adds them and applies the
//! epilogue. The twin is burn's `conv2d` on the OIHW weights, plus the adds.
//!
//! `nn::Conv2d` runs it ([`Prepared`]) on devices without cooperative matrices for 3×3 layers
//! with at least 32 output channels: there it was 3–20× faster than burn's `conv_direct` on every
//! SD 1.5 UNet 3×3 shape (H200 and H100 under WGSL, BENCHMARKS.md). The 4- and 3-channel
//! outputs stay with burn on a card (`conv_direct`); the 1×1 layers take ours there too
//! ([`ConvRules`]: 6 % off an H100's f32 step, twenty-first session; 2.2–2.5 ms off an H200's
//! f16 step, thirty-fifth); on a software adapter every layer takes ours
//! ([`super::software`]): burn's convolution autotune compiles and times 13 candidates per
//! shape (the im2col matmul's dozens more), and on lavapipe those LLVM compiles were 290 of a cold
//! parity test's 360 s.
//!
//! Where the device has cooperative matrices (f16), every 3×3 layer of at least 32 output
//! channels and every 1×1 layer whose channels allow it runs channels-last on our large-tile
//! GEMM by default ([`channels_last`]: the input read in place as the product's rows, the
//! weights packed tap-major once at load, the output channels-last, which is what burn's
//! convolution and our GroupNorm keep, so the maps stay in one layout through the UNet and the
//! VAE). On an H200 (BENCHMARKS.md, forty-third session) that took SD 1.5's step from 29.5 to
//! 26.1 ms and the 512² VAE decode from 34.9 to 26.4. Under other [`ConvRules`] three kernels
//! share the layers: on the 8×8 maps a cooperative-matrix variant of ours ([`cmma`]) with the
//! reduction split, reading the weights as stored and the input unrolled by a first kernel
//! ([`kernel::im2col`], `[c_in·kh·kw, pixels]`: gathered inside the product, each value's index
//! arithmetic was repeated for every tile of output channels and cost more than the products);
//! on the 16×16 maps, the stride-2 layers and the widest outputs the weights times the input
//! unrolled batch-major on our GEMM ([`conv2d_unrolled_gemm`]); burn's cooperative-matrix
//! implicit GEMM on the wide maps of few channels (and, by default, on the layers channels-last
//! refuses: 4-channel inputs and outputs).

mod channels_last;
mod cmma;
mod epilogue;
mod kernel;
mod route;
mod rules;
#[cfg(test)]
mod tests;
mod unrolled;
mod vector;

use burn::cubecl::prelude::*;
use burn::tensor::{DType, Tensor};

pub use super::Geometry;
use super::{Element, buffer_arg, grid, output, resolve};
pub use channels_last::{ChannelsLast, conv2d_channels_last, pack_taps, stored_weight};
use cmma::{BK_MMA, conv2d_gemm_mma};
pub use epilogue::{Columns, Epilogue};
use kernel::{BK, BM, LANES, conv2d_gemm, conv2d_split_sum, tile_block, tile_pixels, tile_rows};
pub use route::{Mma, Prepared, mma_on, runs_for};
pub use rules::{ConvRules, conv_rules, set_conv_rules};
#[cfg(test)]
pub(in crate::kernels) use unrolled::unroll;
use unrolled::unroll_into;
pub use unrolled::{conv2d_unrolled_gemm, one_by_one_from_tokens};
use vector::{SV, conv2d_gemm_vec, step_depth, tile_cols};

/// The most workgroup memory the SIMT kernel's deep step may stage.
const DEEP_STAGING_BYTES: usize = 32 * 1024;

/// Cubes a launch should have before the reduction is split: a few per compute unit on the
/// GPUs we target (an H200 has 132 SMs, an A770 32 Xe-cores, Iris Xe 6 subslices).
const TARGET_CUBES: usize = 256;
/// Fewest reduction steps (of 16) per slice: shorter slices cost more in partial sums than
/// they gain in parallelism.
const MIN_STEPS_PER_SLICE: usize = 32;
/// Most slices: the partial sums are `slices · c_out · pixels` f32 values.
const MAX_SLICES: usize = 16;

/// How many slices the reduction of `steps` steps is split into for a grid of `tiles` cubes:
/// 1 (no split) when the grid already fills the GPU or the reduction is short; no slice empty.
pub fn splits(tiles: usize, steps: usize) -> usize {
    if tiles == 0 || tiles >= TARGET_CUBES {
        return 1;
    }
    let wanted = TARGET_CUBES.div_ceil(tiles);
    let most = (steps / MIN_STEPS_PER_SLICE).clamp(1, MAX_SLICES);
    let n = wanted.min(most);
    // Equal slices, none empty.
    steps.div_ceil(steps.div_ceil(n).max(1)).max(1)
}

/// OIHW weights `[c_out, c_in, kh, kw]` as the kernel reads them: `[c_in·kh·kw, c_out]`,
/// contiguous (a round trip through the host, so once per model at load, never per call).
pub fn pack(weight: Tensor<4>) -> Tensor<2> {
    let [c_out, c_in, kh, kw] = weight.dims();
    let (device, dtype) = (weight.device(), weight.dtype());
    let data = weight
        .reshape([c_out, c_in * kh * kw])
        .transpose()
        .into_data();
    Tensor::from_data(data, (&device, dtype))
}

/// Square-kernel convolution of `x` `[b, c_in, h, w]` with packed weights ([`pack`]) of a
/// `k`×`k` kernel, `stride` and zero `padding`, plus `bias` `[c_out]`. `None` where it does not
/// run (CPU backend, dtype, shapes past the grid); the caller then uses burn's `conv2d`.
///
/// # Shapes
/// -> `[b, c_out, (h + 2·padding − k) / stride + 1, (w + 2·padding − k) / stride + 1]`
pub fn conv2d(
    x: Tensor<4>,
    packed: &Tensor<2>,
    bias: Option<&Tensor<1>>,
    k: usize,
    stride: usize,
    padding: usize,
) -> Option<Tensor<4>> {
    let epilogue = Epilogue {
        bias,
        ..Default::default()
    };
    let geometry = Geometry {
        k,
        stride,
        padding,
        upsample: false,
    };
    conv2d_with(x, packed, geometry, &epilogue, None, Simt::default())
}

/// How the SIMT kernel runs a layer (the route's rules, or the bench's and tests' choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Simt {
    /// 8 × 8 lane blocks where 128 channels divide the layer ([`ConvRules::simt_wide`]).
    pub wide: bool,
    /// The staged operands read as vectors of 4 ([`vector`], [`ConvRules::simt_vector`]).
    pub vector: bool,
    /// With `vector`, the next step's global loads issued before this step's products.
    pub prefetch: bool,
    /// With `vector`, 32 reduction indices staged a step instead of 16.
    pub deep: bool,
    /// With `vector`, 4 × 8 lane blocks (4 channels by 8 pixels, 64 × 128 tiles) where the
    /// layer's tile is 64 channels of 4 × 4 blocks.
    pub pixels8: bool,
}

/// [`conv2d`] with any [`Geometry`] and every epilogue term, the reduction split into `slices`
/// (`None`: as [`splits`] chooses; the bench compares), the SIMT kernel as `simt` says.
pub fn conv2d_with(
    x: Tensor<4>,
    packed: &Tensor<2>,
    geometry: Geometry,
    epilogue: &Epilogue<'_>,
    slices: Option<usize>,
    simt: Simt,
) -> Option<Tensor<4>> {
    run(x, Weights::Packed(packed, simt), geometry, epilogue, slices)
}

/// [`conv2d_with`] on cooperative matrices ([`mma_on`]), with the OIHW weights as stored.
pub fn conv2d_mma(
    x: Tensor<4>,
    weight: &Tensor<4>,
    mma: Mma,
    geometry: Geometry,
    epilogue: &Epilogue<'_>,
    slices: Option<usize>,
) -> Option<Tensor<4>> {
    run(x, Weights::Stored(weight, mma), geometry, epilogue, slices)
}

/// The weights one launch reads, and so its kernel.
#[derive(Clone, Copy)]
enum Weights<'a> {
    /// `[c_in·kh·kw, c_out]` ([`pack`]): the SIMT kernel, in wide lane blocks where asked
    /// ([`tile_block`]), its staging read as vectors where asked.
    Packed(&'a Tensor<2>, Simt),
    /// OIHW `[c_out, c_in, kh, kw]`: the cooperative-matrix kernel.
    Stored(&'a Tensor<4>, Mma),
}

/// [`conv2d_mma`] with the kernel gathering its input through the geometry instead of reading it
/// unrolled (the route's choice): the bench's comparison.
pub fn conv2d_mma_gathered(
    x: Tensor<4>,
    weight: &Tensor<4>,
    mma: Mma,
    geometry: Geometry,
    epilogue: &Epilogue<'_>,
    slices: Option<usize>,
) -> Option<Tensor<4>> {
    run_with(
        x,
        Weights::Stored(weight, mma),
        geometry,
        epilogue,
        slices,
        false,
    )
}

fn run(
    x: Tensor<4>,
    weights: Weights<'_>,
    geometry: Geometry,
    epilogue: &Epilogue<'_>,
    slices: Option<usize>,
) -> Option<Tensor<4>> {
    // The cooperative-matrix kernel reads the input unrolled: gathered in the product, each
    // value's index arithmetic was repeated for every tile of output channels, and cost more
    // than the products (BENCHMARKS.md, sixteenth session: 0.41 → 0.28 ms at 8×8).
    let from_col = matches!(weights, Weights::Stored(..));
    run_with(x, weights, geometry, epilogue, slices, from_col)
}

fn run_with(
    x: Tensor<4>,
    weights: Weights<'_>,
    geometry: Geometry,
    epilogue: &Epilogue<'_>,
    slices: Option<usize>,
    from_col: bool,
) -> Option<Tensor<4>> {
    let device = x.device();
    if !super::available(&device) {
        return None;
    }
    let Geometry {
        k,
        stride,
        padding,
        upsample,
    } = geometry;
    let dtype = x.dtype();
    let element = Element::of(dtype)?;
    let [b, c_in, h, w] = x.dims();
    let k_total = c_in * k * k;
    let (c_out, step, weight_dtype) = match weights {
        Weights::Packed(p, _) => {
            let [rows, c_out] = p.dims();
            (rows == k_total).then_some(())?;
            (c_out, BK, p.dtype())
        }
        Weights::Stored(wt, mma) => {
            let [c_out, wc_in, kh, kw] = wt.dims();
            let ok = wc_in == c_in && kh == k && kw == k && dtype == DType::F16 && mma.fits();
            if !ok {
                return None;
            }
            (c_out, BK_MMA, wt.dtype())
        }
    };
    if weight_dtype != dtype {
        return None;
    }
    let [oh, ow] = geometry.output(h, w)?;
    let pixels = b * oh * ow;
    // Each term in the output's dtype and shape, or burn adds them.
    let fits = epilogue
        .bias
        .is_none_or(|t| t.dtype() == dtype && t.dims() == [c_out])
        && epilogue.channel.is_none_or(|t| {
            let [rows, width] = t.tensor.dims();
            t.tensor.dtype() == dtype && rows == b && t.column + c_out <= width
        })
        && epilogue
            .residual
            .is_none_or(|t| t.dtype() == dtype && t.dims() == [b, c_out, oh, ow]);
    // The SIMT kernel narrows its tile to few output channels; the cooperative-matrix one's is
    // fixed.
    // The SIMT kernel's options (`None`: the cooperative-matrix kernel).
    let simt = match weights {
        Weights::Packed(_, simt) => Some(simt),
        Weights::Stored(..) => None,
    };
    let block = simt.map_or(4, |s| tile_block(c_out, s.wide));
    let rows = if simt.is_some() {
        tile_rows(c_out, block)
    } else {
        BM
    };
    let vector = simt.is_some_and(|s| s.vector);
    // Pixel vectors a lane: `block / 4` (square blocks), or 2 for 4 × 8 blocks.
    let pv = match simt {
        Some(s) if s.vector && s.pixels8 && block == 4 && rows == BM => 2,
        _ => block / SV,
    };
    let cols = if vector {
        tile_cols(rows, block, pv)
    } else {
        tile_pixels(rows, block)
    };
    // The deep step where its staging fits 32 KiB (lavapipe's limit, and some iGPUs'): not the
    // 16-channel tiles, whose 256 pixels would take 34 KiB.
    let deep = simt.is_some_and(|s| s.vector && s.deep)
        && step_depth(true) * (rows + cols) * 4 <= DEEP_STAGING_BYTES;
    let step = if deep { step_depth(true) } else { step };
    let (nx, ny) = (pixels.div_ceil(cols), c_out.div_ceil(rows));
    if !fits || pixels == 0 || c_out == 0 || nx > 65_535 || ny > 65_535 {
        return None;
    }
    // The split is chosen in steps of 16 whatever the kernel's step, so both kernels split a
    // layer alike.
    let slices = slices.unwrap_or_else(|| splits(nx * ny, k_total.div_ceil(BK)));
    let steps = k_total.div_ceil(step);
    let slices = slices.clamp(1, steps.max(1));
    let per_slice = steps.div_ceil(slices);
    let slices = steps.div_ceil(per_slice).max(1);
    let split = slices > 1;

    let xc = resolve(x)?;
    let wc = match weights {
        Weights::Packed(p, _) => resolve(p.clone())?,
        Weights::Stored(wt, _) => resolve(wt.clone())?,
    };
    // Absent terms are bound to a one-value placeholder the kernel never reads.
    let placeholder = || resolve(Tensor::<1>::zeros([1], (&device, dtype)));
    let bc = match epilogue.bias {
        Some(t) => resolve(t.clone())?,
        None => placeholder()?,
    };
    let (tc, channel_row, channel_col) = match epilogue.channel {
        Some(t) => (resolve(t.tensor.clone())?, t.tensor.dims()[1], t.column),
        None => (placeholder()?, 0, 0),
    };
    let rc = match epilogue.residual {
        Some(t) => resolve(t.clone())?,
        None => placeholder()?,
    };
    let partial_len = if split { slices * c_out * pixels } else { 1 };
    let (_partial, pc) = output([partial_len], DType::F32, &device)?;
    let client = xc.client.clone();
    let (out, oc) = output([b, c_out, oh, ow], dtype, &device)?;
    let (add_bias, add_channel, add_residual) = (
        epilogue.bias.is_some(),
        epilogue.channel.is_some(),
        epilogue.residual.is_some(),
    );
    let (gx, gy) = grid((pixels * c_out).div_ceil(LANES))?;
    // The unrolled input, for the cooperative-matrix kernel when `from_col`.
    let col = if from_col {
        let (t, c) = output([k_total, pixels], dtype, &device)?;
        unroll_into(&xc, &c, element, [b, c_in, h, w], geometry)?;
        Some((t, c))
    } else {
        None
    };
    macro_rules! launch {
        ($t:ty) => {{
            let count = CubeCount::Static(nx as u32, ny as u32, slices as u32);
            let up = if upsample { 2 } else { 1 };
            match weights {
                Weights::Packed(_, simt) if simt.vector => conv2d_gemm_vec::launch::<$t>(
                    &client,
                    count,
                    CubeDim::new_1d(LANES as u32),
                    SV,
                    buffer_arg(&xc),
                    buffer_arg(&wc),
                    buffer_arg(&bc),
                    buffer_arg(&tc),
                    buffer_arg(&rc),
                    buffer_arg(&oc),
                    buffer_arg(&pc),
                    c_in,
                    h,
                    w,
                    c_out,
                    oh,
                    ow,
                    pixels,
                    stride,
                    padding,
                    per_slice,
                    channel_row,
                    channel_col,
                    k,
                    k,
                    up,
                    add_bias,
                    add_channel,
                    add_residual,
                    split,
                    rows,
                    block,
                    pv,
                    simt.prefetch,
                    deep,
                ),
                Weights::Packed(..) => conv2d_gemm::launch::<$t>(
                    &client,
                    count,
                    CubeDim::new_1d(LANES as u32),
                    buffer_arg(&xc),
                    buffer_arg(&wc),
                    buffer_arg(&bc),
                    buffer_arg(&tc),
                    buffer_arg(&rc),
                    buffer_arg(&oc),
                    buffer_arg(&pc),
                    c_in,
                    h,
                    w,
                    c_out,
                    oh,
                    ow,
                    pixels,
                    stride,
                    padding,
                    per_slice,
                    channel_row,
                    channel_col,
                    k,
                    k,
                    up,
                    add_bias,
                    add_channel,
                    add_residual,
                    split,
                    rows,
                    block,
                ),
                Weights::Stored(_, mma) => {
                    let input = col.as_ref().map_or(&xc, |(_, c)| c);
                    conv2d_gemm_mma::launch::<$t>(
                        &client,
                        count,
                        CubeDim::new_1d(LANES as u32),
                        buffer_arg(input),
                        buffer_arg(&wc),
                        buffer_arg(&bc),
                        buffer_arg(&tc),
                        buffer_arg(&rc),
                        buffer_arg(&oc),
                        buffer_arg(&pc),
                        c_in,
                        h,
                        w,
                        c_out,
                        oh,
                        ow,
                        pixels,
                        stride,
                        padding,
                        per_slice,
                        channel_row,
                        channel_col,
                        k,
                        k,
                        up,
                        add_bias,
                        add_channel,
                        add_residual,
                        split,
                        mma.plane,
                        mma.fragment.m,
                        mma.fragment.n,
                        mma.fragment.k,
                        from_col,
                        super::conv_prefetch(),
                    )
                }
            }
            if split {
                conv2d_split_sum::launch::<$t>(
                    &client,
                    CubeCount::Static(gx, gy, 1),
                    CubeDim::new_1d(LANES as u32),
                    buffer_arg(&pc),
                    buffer_arg(&bc),
                    buffer_arg(&tc),
                    buffer_arg(&rc),
                    buffer_arg(&oc),
                    c_out,
                    oh,
                    ow,
                    pixels,
                    slices,
                    channel_row,
                    channel_col,
                    add_bias,
                    add_channel,
                    add_residual,
                );
            }
        }};
    }
    match element {
        Element::F32 => launch!(f32),
        Element::F16 => launch!(half::f16),
    }
    Some(out)
}
