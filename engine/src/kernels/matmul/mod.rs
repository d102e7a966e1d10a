//! A linear layer's product on plain lanes (no cooperative matrices): `y = x · Wᵀ + b` as a
//! tiled GEMM, written when burn's matmul ran the UNet's fused q/k/v projections at 4–4.8 TFLOP/s
//! on an H100 under WGSL (tenth session); that turned out to be their `[in, out]` layout (see
//! `nn::Linear::concat`), not burn's kernels.
//!
//! The tiling is the convolution's ([`super::conv`]): a 64 (rows) × 64 (output features) tile per
//! 256-lane cube, 4 × 4 f32 accumulators per lane, the reduction staged 16 at a time in workgroup
//! memory (8.3 KiB), the bias added in f32 before the one cast. The weight is read in place in
//! either layout a layer holds ([`WeightLayout`]): nothing is packed or copied. Few row tiles
//! (the 8×8 level's 128 tokens, cross-attention's 154 context rows) split the reduction as the
//! convolution does ([`super::conv::splits`]). The twin is burn's `linear`.
//!
//! On an H100 under WGSL it reached 6–15 TFLOP/s on the UNet's linears but burn's matmul was
//! 1.3–1.6× faster on most of them once the weights lay as checkpoints store them (eleventh
//! session, BENCHMARKS.md). Since then it takes 8 × 8 lane blocks (128-square tiles, as the
//! convolution's) and the transformer block's epilogues (the residual, GEGLU's gate), which burn
//! fuses into its matmul. Where it runs is [`ProductRules`]: always on software adapters
//! ([`super::software`]), where burn's matmul autotune compiles and times up to 33 candidates
//! per shape through LLVM (290 of a cold lavapipe parity test's 360 s); on cards by rule.
//! `LATENT_STUDIO_MATMUL=burn` turns it off everywhere.

mod ceiling;
mod channels_last;
mod implicit;
mod kernel;
mod layout;
mod mma;
mod products;
mod route;
mod split_sum;
mod staging;
#[cfg(test)]
mod tests;
mod vector;
mod waves;
mod workgroup;

pub use route::{Place, ProductRules, product_rules, set_product_rules, wide_fits};

pub use ceiling::{Ceiling, CeilingShape, mma_ceiling_launch, reported_fragments};
pub use gemm::{GemmEpilogue, conv_gemm_into, conv_rows_gemm_into, gemm_into, mma_gemm_on};
pub use implicit::ConvInput;
pub use knobs::{
    GEMM_PLANES, GEMM_STEPS, GemmKnobs, gemm_knobs, mma_linears, reduction_step, set_gemm_knobs,
    set_mma_linears, split_slices,
};
pub use layout::{MMA_TILES, MmaGemm};
pub use linear_mma::{LinearEpilogue, linear_mma};
pub use workgroup::{
    WorkgroupGemm, WorkgroupTile, describe as describe_workgroup, linear_workgroup,
    workgroup_gemm_into, workgroup_gemm_on, workgroup_gemms,
};

mod gemm;
mod knobs;
mod linear_mma;

use burn::cubecl::prelude::*;
use burn::tensor::{DType, Tensor};

use super::{Element, buffer_arg, grid, output, resolve};
use kernel::{BK, LANES, matmul_nt, tile};
use vector::{SV, matmul_nt_vec};

/// How a linear layer's weight lies in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightLayout {
    /// `[out, in]` row-major, as checkpoints store it; the layer's `[in, out]` tensor is its
    /// transposed view.
    OutIn,
    /// `[in, out]` row-major (q, k and v concatenated along their outputs).
    InOut,
}

/// Whether ours is switched off for products (`LATENT_STUDIO_MATMUL=burn`): the SIMT product
/// and the cooperative-matrix GEMM's linears.
fn switched_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| {
        std::env::var("LATENT_STUDIO_MATMUL").is_ok_and(|v| v.trim().eq_ignore_ascii_case("burn"))
    })
}

/// Where a layer on `device` in `dtype` stands for ours (settled once per layer; makes a tensor).
pub fn place_of(device: &burn::tensor::Device, dtype: DType) -> Place {
    if !super::available(device) || switched_off() || Element::of(dtype).is_none() {
        Place::Off
    } else if super::software(device) {
        Place::Software
    } else {
        Place::Card {
            plain: super::plain_lanes(device, dtype),
        }
    }
}

/// How one product is launched: the reduction split (`None`: as the convolution's rule), the
/// lane block's side, 4 or 8 (64- or 128-square tiles), and whether the staging lies along the
/// reduction, read as vectors of 4 ([`vector`]), and if so whether the next step's global
/// loads are issued before this step's products (`prefetch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tiling {
    pub slices: Option<usize>,
    pub block: usize,
    pub vector: bool,
    pub prefetch: bool,
}

impl Default for Tiling {
    fn default() -> Self {
        Self {
            slices: None,
            block: 4,
            vector: false,
            prefetch: false,
        }
    }
}

/// `x` `[.., in]` times the layer's `weight` (`[in, out]`, laid out as `layout` says) plus
/// `bias` `[out]` and the `epilogue`, through our kernel; `None` where it does not run here
/// (CPU backend, dtype, a residual not shaped as the output, shapes past the grid).
///
/// # Shapes
/// `[.., in] -> [.., out]` (`[.., out / 2]` for a GEGLU)
pub fn linear<const D: usize>(
    x: Tensor<D>,
    weight: &Tensor<2>,
    layout: WeightLayout,
    bias: Option<&Tensor<1>>,
    epilogue: LinearEpilogue<D>,
    tiling: Tiling,
) -> Option<Tensor<D>> {
    let device = x.device();
    if !super::available(&device) || !matches!(tiling.block, 4 | 8) {
        return None;
    }
    let dtype = x.dtype();
    let element = Element::of(dtype)?;
    let dims = x.dims();
    let depth = dims[D - 1];
    let rows: usize = dims[..D - 1].iter().product();
    let [w_in, cols] = weight.dims();
    if w_in != depth
        || weight.dtype() != dtype
        || bias.is_some_and(|b| b.dims() != [cols] || b.dtype() != dtype)
    {
        return None;
    }
    let geglu = matches!(epilogue, LinearEpilogue::Geglu);
    if geglu && !cols.is_multiple_of(2) {
        return None;
    }
    let half = cols / 2;
    let out_cols = if geglu { half } else { cols };
    let mut out_shape = dims;
    out_shape[D - 1] = out_cols;
    let residual = match epilogue {
        LinearEpilogue::Residual(r) if r.dims() == out_shape && r.dtype() == dtype => Some(r),
        LinearEpilogue::Residual(_) => return None,
        _ => None,
    };
    let block = tiling.block;
    let t = tile(block);
    // A GEGLU's tile holds `t / 2` outputs: their values and their gates.
    let nx = if geglu {
        half.div_ceil(t / 2)
    } else {
        cols.div_ceil(t)
    };
    let ny = rows.div_ceil(t);
    if rows == 0 || cols == 0 || depth == 0 || nx > 65_535 || ny > 65_535 {
        return None;
    }
    let steps = depth.div_ceil(BK);
    let slices = tiling
        .slices
        .unwrap_or_else(|| super::conv::splits(nx * ny, steps))
        .clamp(1, steps);
    let per_slice = steps.div_ceil(slices);
    let slices = steps.div_ceil(per_slice).max(1);
    let split = slices > 1;

    let xc = resolve(x)?;
    // The buffer as it lies: `[out, in]` is the transposed view's source, contiguous.
    let wc = match layout {
        WeightLayout::OutIn => resolve(weight.clone().transpose())?,
        WeightLayout::InOut => resolve(weight.clone())?,
    };
    let placeholder = || resolve(Tensor::<1>::zeros([1], (&device, dtype)));
    let bc = match bias {
        Some(b) => resolve(b.clone())?,
        None => placeholder()?,
    };
    let add_residual = residual.is_some();
    let rc = match residual {
        Some(r) => resolve(r)?,
        None => placeholder()?,
    };
    let partial_len = if split { slices * rows * cols } else { 1 };
    let (_partial, pc) = output([partial_len], DType::F32, &device)?;
    let (out, oc) = output(out_shape, dtype, &device)?;
    let client = xc.client.clone();
    let add_bias = bias.is_some();
    let w_out_in = layout == WeightLayout::OutIn;
    let (gx, gy) = grid((rows * out_cols).div_ceil(LANES))?;
    macro_rules! launch {
        ($t:ty) => {{
            let count = CubeCount::Static(nx as u32, ny as u32, slices as u32);
            if tiling.vector {
                matmul_nt_vec::launch::<$t>(
                    &client,
                    count,
                    CubeDim::new_1d(LANES as u32),
                    SV,
                    buffer_arg(&xc),
                    buffer_arg(&wc),
                    buffer_arg(&bc),
                    buffer_arg(&rc),
                    buffer_arg(&oc),
                    buffer_arg(&pc),
                    rows,
                    cols,
                    depth,
                    half,
                    per_slice,
                    w_out_in,
                    add_bias,
                    add_residual,
                    geglu,
                    split,
                    block,
                    tiling.prefetch,
                );
            } else {
                matmul_nt::launch::<$t>(
                    &client,
                    count,
                    CubeDim::new_1d(LANES as u32),
                    buffer_arg(&xc),
                    buffer_arg(&wc),
                    buffer_arg(&bc),
                    buffer_arg(&rc),
                    buffer_arg(&oc),
                    buffer_arg(&pc),
                    rows,
                    cols,
                    depth,
                    half,
                    per_slice,
                    w_out_in,
                    add_bias,
                    add_residual,
                    geglu,
                    split,
                    block,
                );
            }
            if split {
                // One output a lane, as this path was measured.
                split_sum::split_sum::launch::<$t>(
                    &client,
                    CubeCount::Static(gx, gy, 1),
                    CubeDim::new_1d(LANES as u32),
                    1,
                    buffer_arg(&pc),
                    buffer_arg(&bc),
                    buffer_arg(&rc),
                    buffer_arg(&oc),
                    rows,
                    cols,
                    half,
                    slices,
                    rows,
                    add_bias,
                    false,
                    add_residual,
                    geglu,
                    1,
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
