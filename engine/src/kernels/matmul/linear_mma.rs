//! A linear layer on the cooperative-matrix GEMM ([`super::gemm_into`]): `x · W (+ b)` with
//! the residual or GEGLU gate in its epilogue, the weight read in either layout as it lies.

use burn::tensor::{DType, Tensor};

use super::super::{output, resolve};
use super::WeightLayout;
use super::gemm::{GemmEpilogue, gemm_into};
use super::layout::MmaGemm;

/// What a linear layer's product on the GEMM adds in its epilogue.
#[derive(Debug, Clone)]
// Built per call and passed down, never stored: boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub enum LinearEpilogue<const D: usize> {
    Plain,
    /// `+ residual`, shaped as the output.
    Residual(Tensor<D>),
    /// The layer's outputs are a GEGLU's values then gates: `value · gelu(gate)`, half as wide.
    Geglu,
}

/// `x` `[.., in]` times the layer's `weight` (`[in, out]`, laid out as `layout` says) plus
/// `bias` and the `epilogue`, on the GEMM; `None` where it does not run (see [`gemm_into`]).
pub fn linear_mma<const D: usize>(
    gemm: MmaGemm,
    x: Tensor<D>,
    weight: &Tensor<2>,
    layout: WeightLayout,
    bias: Option<&Tensor<1>>,
    tiles: Option<(usize, usize)>,
    epilogue: LinearEpilogue<D>,
) -> Option<Tensor<D>> {
    let device = x.device();
    let dtype = x.dtype();
    let dims = x.dims();
    let depth = dims[D - 1];
    let rows: usize = dims[..D - 1].iter().product();
    let [w_in, cols] = weight.dims();
    if dtype != DType::F16
        || w_in != depth
        || weight.dtype() != dtype
        || bias.is_some_and(|b| b.dims() != [cols] || b.dtype() != dtype)
    {
        return None;
    }
    let xc = resolve(x)?;
    // The buffer as it lies: `[out, in]` is the transposed view's source, contiguous.
    let wc = match layout {
        WeightLayout::OutIn => resolve(weight.clone().transpose())?,
        WeightLayout::InOut => resolve(weight.clone())?,
    };
    let bc = match bias {
        Some(b) => Some(resolve(b.clone())?),
        None => None,
    };
    let geglu = matches!(epilogue, LinearEpilogue::Geglu);
    if geglu && layout != WeightLayout::OutIn {
        return None;
    }
    let mut out_shape = dims;
    out_shape[D - 1] = if geglu { cols / 2 } else { cols };
    let residual = match epilogue {
        LinearEpilogue::Residual(r) if r.dims() == out_shape && r.dtype() == dtype => {
            Some(resolve(r)?)
        }
        LinearEpilogue::Residual(_) => return None,
        _ => None,
    };
    let kind = match (&residual, geglu) {
        (Some(r), _) => GemmEpilogue::Residual(r),
        (None, true) => GemmEpilogue::Geglu,
        (None, false) => GemmEpilogue::Plain,
    };
    let (out, oc) = output(out_shape, dtype, &device)?;
    gemm_into(
        gemm,
        &device,
        &xc,
        &wc,
        bc.as_ref(),
        &oc,
        [rows, cols, depth],
        1,
        [0, 0, 0],
        layout == WeightLayout::OutIn,
        false,
        tiles,
        kind,
    )?;
    Some(out)
}
