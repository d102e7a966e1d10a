//! Launching the workgroup-scope GEMM ([`super`]) on buffers and on a linear layer's tensors.

use burn::backend::wgpu::CubeTensor;
use burn::cubecl::prelude::*;
use burn::tensor::{DType, Tensor};

use super::super::super::{buffer_arg, output, resolve};
use super::super::gemm::GemmEpilogue;
use super::super::split_sum::{Finish, finish_split};
use super::kernel::gemm_workgroup;
use super::{WorkgroupGemm, WorkgroupTile};

/// `out[z] = a[z] · b[z] (+ bias) (+ epilogue)` over `batch` matrices on workgroup-scope
/// matrices, f16 (shapes, strides and epilogues as [`super::super::gemm_into`]'s; a GEGLU's product is
/// written in f32 and finished by the split product's pass, which adds the bias and the gate).
/// `None` where the shapes are not whole tiles, the tile is not the device's, the residual needs
/// an f16 accumulator the device lacks, a buffer is shorter than the shapes say, or the grid is
/// too large.
#[allow(clippy::too_many_arguments)]
pub fn workgroup_gemm_into(
    wg: WorkgroupGemm,
    device: &burn::tensor::Device,
    [a, b, out]: [&CubeTensor; 3],
    bias: Option<&CubeTensor>,
    epilogue: GemmEpilogue<'_>,
    [m, n, k]: [usize; 3],
    batch: usize,
    [a_batch, b_batch, c_batch]: [usize; 3],
    b_nk: bool,
    bias_per_row: bool,
    tile: WorkgroupTile,
) -> Option<()> {
    let WorkgroupTile { bm, bn, bk, tensor } = tile;
    let kg = wg.granularity[2];
    let residual = match epilogue {
        GemmEpilogue::Residual(r) => Some(r),
        _ => None,
    };
    let geglu = matches!(epilogue, GemmEpilogue::Geglu);
    // A GEGLU's values and gates are the weight's two halves of rows.
    if geglu && !(b_nk && !bias_per_row && n.is_multiple_of(2)) {
        return None;
    }
    let out_cols = if geglu { n / 2 } else { n };
    // Whole tiles only (the device's granularity, the bias product's depth included, is
    // `allows`'s).
    let whole = wg.allows(tile)
        && m > 0
        && batch > 0
        && m.is_multiple_of(bm)
        && n.is_multiple_of(bn)
        && k.is_multiple_of(bk);
    if !whole || (residual.is_some() && !wg.f16_accumulator) {
        return None;
    }
    let holds = |t: &CubeTensor, stride: usize, len: usize| {
        (batch - 1)
            .checked_mul(stride)
            .and_then(|s| s.checked_add(len))
            .is_some_and(|end| end <= t.meta.num_elements())
    };
    let bias_len = if bias_per_row { m } else { n };
    if !(holds(a, a_batch, m * k)
        && holds(b, b_batch, n * k)
        && holds(out, c_batch, m * out_cols)
        && (!geglu || c_batch == m * out_cols || batch == 1)
        && bias.is_none_or(|t| t.meta.num_elements() >= bias_len)
        && residual.is_none_or(|r| holds(r, c_batch, m * n)))
    {
        return None;
    }
    let (nx, ny) = (n / bn, m / bm);
    if nx > 65_535 || ny > 65_535 || batch > 65_535 {
        return None;
    }
    // Never read where the flags say so; any f16 buffer stands in.
    let bias_c = bias.unwrap_or(out);
    let residual_c = residual.unwrap_or(out);
    // A GEGLU's f32 product, `[batch, m, n]`, for the finishing pass.
    let (_partial, partial) = if geglu {
        output([batch * m * n], DType::F32, device)?
    } else {
        output([1], DType::F32, device)?
    };
    let c_batch = if geglu { m * n } else { c_batch };
    // SAFETY: whole tiles only (checked above), so every matrix the kernel loads or stores lies
    // inside its buffer's checked length; the bias is read at `row0 .. row0 + bm` or
    // `col0 .. col0 + bn`, inside `bias_len`.
    unsafe {
        gemm_workgroup::launch_unchecked::<half::f16>(
            &a.client,
            CubeCount::Static(nx as u32, ny as u32, batch as u32),
            CubeDim::new_1d(wg.lanes as u32),
            buffer_arg(a),
            buffer_arg(b),
            buffer_arg(bias_c),
            buffer_arg(residual_c),
            buffer_arg(out),
            buffer_arg(&partial),
            m,
            n,
            k,
            a_batch,
            b_batch,
            c_batch,
            bm,
            bn,
            bk,
            kg,
            b_nk,
            bias.is_some() && !geglu,
            bias_per_row,
            residual.is_some(),
            geglu,
            tensor,
        );
    }
    if geglu {
        finish_split(
            &partial,
            bias_c,
            residual_c,
            out,
            [m, n],
            [1, batch],
            Finish {
                bias: bias.is_some(),
                bias_per_row,
                residual: false,
                geglu: true,
            },
        )?;
    }
    Some(())
}

/// A linear layer on the workgroup-scope GEMM: `x` `[.., in]` times `weight` (`[in, out]`, laid
/// out as `layout` says) plus `bias` and `residual` (shaped as the output); `None` where it does
/// not run (see [`workgroup_gemm_into`]).
pub fn linear_workgroup<const D: usize>(
    wg: WorkgroupGemm,
    x: Tensor<D>,
    weight: &Tensor<2>,
    layout: super::super::WeightLayout,
    bias: Option<&Tensor<1>>,
    epilogue: super::super::LinearEpilogue<D>,
    tile: WorkgroupTile,
) -> Option<Tensor<D>> {
    let device = x.device();
    let dims = x.dims();
    let depth = dims[D - 1];
    let rows: usize = dims[..D - 1].iter().product();
    let [w_in, cols] = weight.dims();
    if x.dtype() != DType::F16 || weight.dtype() != DType::F16 || w_in != depth {
        return None;
    }
    let geglu = matches!(epilogue, super::super::LinearEpilogue::Geglu);
    let mut out_shape = dims;
    out_shape[D - 1] = if geglu { cols / 2 } else { cols };
    let residual = match epilogue {
        super::super::LinearEpilogue::Residual(r)
            if r.dims() == out_shape && r.dtype() == DType::F16 =>
        {
            Some(r)
        }
        super::super::LinearEpilogue::Residual(_) => return None,
        _ => None,
    };
    if bias.is_some_and(|b| b.dims() != [cols] || b.dtype() != DType::F16) {
        return None;
    }
    let xc = resolve(x)?;
    let wc = match layout {
        super::super::WeightLayout::OutIn => resolve(weight.clone().transpose())?,
        super::super::WeightLayout::InOut => resolve(weight.clone())?,
    };
    let bc = match bias {
        Some(b) => Some(resolve(b.clone())?),
        None => None,
    };
    let rc = match residual {
        Some(r) => Some(resolve(r)?),
        None => None,
    };
    let kind = match (&rc, geglu) {
        (Some(r), _) => GemmEpilogue::Residual(r),
        (None, true) => GemmEpilogue::Geglu,
        (None, false) => GemmEpilogue::Plain,
    };
    let (out, oc) = output(out_shape, DType::F16, &device)?;
    workgroup_gemm_into(
        wg,
        &device,
        [&xc, &wc, &oc],
        bc.as_ref(),
        kind,
        [rows, cols, depth],
        1,
        [0, 0, 0],
        layout == super::super::WeightLayout::OutIn,
        false,
        tile,
    )?;
    Some(out)
}
