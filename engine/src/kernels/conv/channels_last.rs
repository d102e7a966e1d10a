//! Convolutions on our cooperative-matrix GEMM, channels-last: the input read in place as the
//! product's rows (output pixels) by tap-major columns
//! ([`crate::kernels::matmul::conv_rows_gemm_into`]), the weights packed once `[c_out, ky, kx,
//! c_in]`, the output written `[b, oh, ow, c_out]` in memory (a `[b, c_out, oh, ow]` tensor):
//! the layout burn's convolution and our channels-last GroupNorm keep, so a chain of them
//! copies nothing. Nothing is unrolled into memory, and a 1×1 layer over tokens `[b, h·w, c]`
//! reads them as they lie (they are the map, channels-last).

use std::sync::{Arc, OnceLock};

use burn::backend::wgpu::CubeTensor;
use burn::tensor::{DType, Tensor};

use super::super::group_norm::is_channels_last;
use super::super::{output, resolve, resolve_strided};
use super::route::{MIN_OUT_CHANNELS, mma_on};
use super::rules::conv_rules;
use super::{Epilogue, Geometry};
use crate::kernels::matmul::{ConvInput, MmaGemm, conv_rows_gemm_into};

/// OIHW weights as the channels-last GEMM reads them: `[c_out, kh·kw·c_in]`, tap-major.
pub fn pack_taps(weight: &Tensor<4>) -> Tensor<2> {
    let [c_out, c_in, kh, kw] = weight.dims();
    weight
        .clone()
        .permute([0, 2, 3, 1])
        .reshape([c_out, kh * kw * c_in])
}

/// Whether the channels-last GEMM can take a layer before anything is copied: channels in
/// whole reduction steps of its longest step (64, what it takes with a `[n, k]` weight:
/// `matmul::reduction_step`), so that no step straddles two taps; outputs in whole vectors.
pub fn takes(c_in: usize, c_out: usize) -> bool {
    let step = crate::kernels::matmul::GEMM_STEPS
        .into_iter()
        .max()
        .unwrap_or(64);
    c_in > 0 && c_in.is_multiple_of(step) && c_out > 0 && c_out.is_multiple_of(8)
}

/// An OIHW `weight` as its layer keeps it: where every layer runs channels-last on our GEMM
/// (cooperative matrices, f16, [`ConvRules::channels_last_min_tiles`] 0) and this 3×3 layer's
/// channels let it, packed tap-major once ([`pack_taps`]) and returned both as that
/// matrix and as an OIHW view of the same buffer (for burn's convolution, which reads any
/// layout), so the weights are held once; otherwise as it is.
pub fn stored_weight(weight: Tensor<4>) -> (Tensor<4>, Option<Tensor<2>>) {
    let [c_out, c_in, kh, kw] = weight.dims();
    let takes = kh == 3
        && kw == 3
        && c_out >= MIN_OUT_CHANNELS
        && takes(c_in, c_out)
        && conv_rules().channels_last_min_tiles == 0;
    if !takes || mma_on(&weight.device(), weight.dtype()).is_none() {
        return (weight, None);
    }
    let packed = pack_taps(&weight);
    drop(weight);
    // Materialised now: the view below and every launch read this one buffer.
    let _ = resolve(packed.clone());
    let view = packed
        .clone()
        .reshape([c_out, kh, kw, c_in])
        .permute([0, 3, 1, 2]);
    (view, Some(packed))
}

/// Whether a model keeps its maps channels-last where it chooses a layout itself (the skip
/// connections' concatenation, a transformer's tokens back to a map): where its convolutions
/// run channels-last on our GEMM ([`ConvRules::channels_last_min_tiles`], cooperative matrices).
/// The device's side is settled at the first call whatever the rule (a probe that makes a
/// tensor, so never first inside a graph's recording, which follows ordinary steps); the rule
/// is read at each. Under a rule that takes only some layers (the bench's), the blocks keep
/// their maps channels-last all the same.
#[derive(Debug, Clone, Default)]
pub struct ChannelsLast(Arc<OnceLock<bool>>);

impl ChannelsLast {
    /// Whether maps like `t` (its device and dtype) are kept channels-last.
    pub fn keeps<const D: usize>(&self, t: &Tensor<D>) -> bool {
        let on_mma = *self
            .0
            .get_or_init(|| mma_on(&t.device(), t.dtype()).is_some());
        on_mma && conv_rules().channels_last_min_tiles != usize::MAX
    }
}

/// `x` (`[b, c_in, h, w]`, any layout: copied channels-last where it is not) through the
/// channels-last GEMM with `packed` weights ([`pack_taps`]) and the epilogue's bias; the
/// residual in the GEMM's epilogue where it lies channels-last, else added after, and the
/// per-image channel term added after. The result is channels-last. `None` where the GEMM
/// refuses the shapes (nothing has been written).
pub fn conv2d_channels_last(
    x: Tensor<4>,
    packed: &Tensor<2>,
    geometry: Geometry,
    epilogue: &Epilogue<'_>,
    gemm: MmaGemm,
) -> Option<Tensor<4>> {
    let [b, c_in, h, w] = x.dims();
    // Refused before the input is copied.
    if !checks(&x, [b, c_in, h, w], packed, geometry, epilogue) {
        return None;
    }
    let xc = match resolve_strided(x.clone()) {
        Some(s) if is_channels_last(&s) => s,
        _ => resolve(x.permute([0, 2, 3, 1]))?,
    };
    run(&xc, [b, c_in, h, w], packed, geometry, epilogue, gemm)
}

/// A 1×1 layer over a map held as tokens `[b, h·w, c_in]` (contiguous: the map channels-last),
/// as [`conv2d_channels_last`].
pub fn tokens_channels_last(
    tokens: &Tensor<3>,
    [h, w]: [usize; 2],
    packed: &Tensor<2>,
    epilogue: &Epilogue<'_>,
    gemm: MmaGemm,
) -> Option<Tensor<4>> {
    let [b, hw, c_in] = tokens.dims();
    if hw != h * w {
        return None;
    }
    let xc = resolve(tokens.clone())?;
    let geometry = Geometry {
        k: 1,
        stride: 1,
        padding: 0,
        upsample: false,
    };
    run(&xc, [b, c_in, h, w], packed, geometry, epilogue, gemm)
}

/// Whether [`run`] takes these shapes and dtypes (bias and residual as the output has them).
fn checks(
    x: &Tensor<4>,
    [b, c_in, h, w]: [usize; 4],
    packed: &Tensor<2>,
    geometry: Geometry,
    epilogue: &Epilogue<'_>,
) -> bool {
    let [c_out, k_total] = packed.dims();
    let dtype = packed.dtype();
    dtype == DType::F16
        && x.dtype() == dtype
        && k_total == c_in * geometry.k * geometry.k
        && takes(c_in, c_out)
        && epilogue
            .bias
            .is_none_or(|t| t.dtype() == dtype && t.dims() == [c_out])
        && geometry.output(h, w).is_some_and(|[oh, ow]| {
            epilogue
                .residual
                .is_none_or(|r| r.dims() == [b, c_out, oh, ow] && r.dtype() == dtype)
        })
}

fn run(
    xc: &CubeTensor,
    [b, c_in, h, w]: [usize; 4],
    packed: &Tensor<2>,
    geometry: Geometry,
    epilogue: &Epilogue<'_>,
    gemm: MmaGemm,
) -> Option<Tensor<4>> {
    let device = packed.device();
    let [c_out, k_total] = packed.dims();
    let dtype = packed.dtype();
    if dtype != DType::F16
        || xc.dtype != dtype
        || k_total != c_in * geometry.k * geometry.k
        || !takes(c_in, c_out)
        || epilogue
            .bias
            .is_some_and(|t| t.dtype() != dtype || t.dims() != [c_out])
    {
        return None;
    }
    let [oh, ow] = geometry.output(h, w)?;
    if epilogue
        .residual
        .is_some_and(|r| r.dims() != [b, c_out, oh, ow] || r.dtype() != dtype)
    {
        return None;
    }
    let wc = resolve(packed.clone())?;
    let bias = match epilogue.bias {
        Some(t) => Some(resolve(t.clone())?),
        None => None,
    };
    // The residual in the epilogue only where it lies as the output does.
    let residual = epilogue
        .residual
        .and_then(|r| resolve_strided(r.clone()))
        .filter(is_channels_last);
    let (out, oc) = output([b, oh, ow, c_out], dtype, &device)?;
    let input = ConvInput {
        channels: c_in,
        h,
        w,
        geometry,
    };
    conv_rows_gemm_into(
        gemm,
        &device,
        xc,
        &wc,
        bias.as_ref(),
        residual.as_ref(),
        &oc,
        c_out,
        b,
        input,
        super::conv_rules().channels_last_tile,
    )?;
    let mut y = out.permute([0, 3, 1, 2]);
    if let Some(t) = epilogue.channel {
        y = y + t.take(c_out).reshape([b, c_out, 1, 1]);
    }
    if let (Some(r), None) = (epilogue.residual, &residual) {
        y = y + r.clone();
    }
    Some(y)
}
