//! The input unrolled (`im2col`) and the convolutions that read it: the weights times the
//! unrolled input on our cooperative-matrix GEMM ([`conv2d_unrolled_gemm`]); the split
//! cooperative-matrix kernel reads the same layout through [`unroll_into`].

use burn::backend::wgpu::CubeTensor;
use burn::cubecl::prelude::*;
use burn::tensor::{DType, Tensor};

use super::super::{Element, buffer_arg, grid, output, resolve};
use super::kernel::{LANES, im2col};
use super::{Epilogue, Geometry};

/// `x` (`[b, c_in, h, w]`) unrolled as the convolution reads it: `[c_in·k·k, b·oh·ow]`, or
/// `[b, c_in·k·k, oh·ow]` flattened to `[b·c_in·k·k, oh·ow]` with `batch_major`
/// ([`im2col`]). `None` where our kernels do not run.
#[cfg(test)]
pub(in crate::kernels) fn unroll(
    x: Tensor<4>,
    geometry: Geometry,
    batch_major: bool,
) -> Option<Tensor<2>> {
    let (device, dtype) = (x.device(), x.dtype());
    if !super::super::available(&device) {
        return None;
    }
    let element = Element::of(dtype)?;
    let dims = x.dims();
    let [oh, ow] = geometry.output(dims[2], dims[3])?;
    let k_total = dims[1] * geometry.k * geometry.k;
    let xc = resolve(x)?;
    let shape = if batch_major {
        [dims[0] * k_total, oh * ow]
    } else {
        [k_total, dims[0] * oh * ow]
    };
    let (out, oc) = output(shape, dtype, &device)?;
    launch_im2col(&xc, &oc, element, dims, geometry, batch_major)?;
    Some(out)
}

/// Most elements of an unrolled input [`conv2d_unrolled_gemm`] makes (128 MiB in f16): the
/// UNet's maps at 512² need at most 24 M; a VAE's full-size maps would need hundreds.
const MAX_UNROLLED: usize = 64 << 20;

/// The convolution as the weights (`[c_out, c_in·k·k]`, as stored) times the input unrolled
/// batch-major on our cooperative-matrix GEMM ([`crate::kernels::matmul::gemm_into`]), one
/// product per image with the bias added per output channel, the output already `[b, c_out, oh,
/// ow]`; a 1×1 layer of stride 1 reads its input as it lies, unrolled by definition. The other
/// epilogue terms are added with burn ops. With `implicit` the GEMM reads the input in place
/// instead where its alignment allows ([`crate::kernels::matmul::conv_gemm_into`]): nothing is
/// unrolled. `None` where it does not run (f16, shapes the GEMM's alignment refuses,
/// [`MAX_UNROLLED`] unrolled).
pub fn conv2d_unrolled_gemm(
    x: Tensor<4>,
    weight: &Tensor<4>,
    geometry: Geometry,
    epilogue: &Epilogue<'_>,
    gemm: crate::kernels::matmul::MmaGemm,
    tiles: Option<(usize, usize)>,
    implicit: bool,
) -> Option<Tensor<4>> {
    let (device, dtype) = (x.device(), x.dtype());
    if !super::super::available(&device) || dtype != DType::F16 || weight.dtype() != dtype {
        return None;
    }
    let dims @ [b, c_in, h, w] = x.dims();
    let [c_out, wc_in, kh, kw] = weight.dims();
    if wc_in != c_in || kh != geometry.k || kw != geometry.k {
        return None;
    }
    let [oh, ow] = geometry.output(h, w)?;
    let (k_total, map) = (c_in * kh * kw, oh * ow);
    if epilogue
        .bias
        .is_some_and(|t| t.dtype() != dtype || t.dims() != [c_out])
    {
        return None;
    }
    let direct = kh == 1 && geometry.stride == 1 && geometry.padding == 0 && !geometry.upsample;
    let input = crate::kernels::matmul::ConvInput {
        channels: c_in,
        h,
        w,
        geometry,
    };
    let in_place = implicit && !direct && input.fits(8);
    // (A 1×1 layer unrolls nothing; without `implicit` the VAE's full-size ones stay with burn's,
    // as measured.)
    if !in_place && k_total * b * map > MAX_UNROLLED && !(implicit && direct) {
        return None;
    }
    let xc = resolve(x)?;
    let wc = resolve(weight.clone())?;
    let bias = match epilogue.bias {
        Some(t) => Some(resolve(t.clone())?),
        None => None,
    };
    let (out, oc) = output([b, c_out, oh, ow], dtype, &device)?;
    if in_place {
        crate::kernels::matmul::conv_gemm_into(
            gemm,
            &device,
            &wc,
            &xc,
            bias.as_ref(),
            &oc,
            c_out,
            b,
            input,
            tiles,
        )?;
    } else {
        let col = if direct {
            None
        } else {
            let (t, c) = output([b, k_total, map], dtype, &device)?;
            launch_im2col(&xc, &c, element_f16(), dims, geometry, true)?;
            Some((t, c))
        };
        let operand = col.as_ref().map_or(&xc, |(_, c)| c);
        crate::kernels::matmul::gemm_into(
            gemm,
            &device,
            &wc,
            operand,
            bias.as_ref(),
            &oc,
            [c_out, map, k_total],
            b,
            [0, k_total * map, c_out * map],
            false,
            true,
            tiles,
            crate::kernels::matmul::GemmEpilogue::Plain,
        )?;
    }
    Some(
        Epilogue {
            bias: None,
            ..*epilogue
        }
        .apply(out),
    )
}

/// A 1×1 convolution (stride 1, no padding) of a map held as tokens `[b, h·w, c_in]` — a
/// transformer's output — on our GEMM, written as the map `[b, c_out, h, w]` with the bias and
/// `residual` in its epilogue: the tokens are the product's `[n, k]` operand as they lie, so
/// they are never transposed back into a map first. `None` where the GEMM does not take it.
pub fn one_by_one_from_tokens(
    tokens: &Tensor<3>,
    weight: &Tensor<4>,
    bias: Option<&Tensor<1>>,
    residual: Option<&Tensor<4>>,
    [h, w]: [usize; 2],
    gemm: crate::kernels::matmul::MmaGemm,
) -> Option<Tensor<4>> {
    let (device, dtype) = (tokens.device(), tokens.dtype());
    let [b, map, c_in] = tokens.dims();
    let [c_out, wc_in, kh, kw] = weight.dims();
    if !super::super::available(&device)
        || dtype != DType::F16
        || weight.dtype() != dtype
        || (wc_in, kh, kw) != (c_in, 1, 1)
        || map != h * w
        || bias.is_some_and(|t| t.dtype() != dtype || t.dims() != [c_out])
        || residual.is_some_and(|r| r.dtype() != dtype || r.dims() != [b, c_out, h, w])
    {
        return None;
    }
    let tc = resolve(tokens.clone())?;
    let wc = resolve(weight.clone())?;
    let bc = match bias {
        Some(t) => Some(resolve(t.clone())?),
        None => None,
    };
    let rc = match residual {
        Some(r) => Some(resolve(r.clone())?),
        None => None,
    };
    let epilogue = match &rc {
        Some(r) => crate::kernels::matmul::GemmEpilogue::Residual(r),
        None => crate::kernels::matmul::GemmEpilogue::Plain,
    };
    let (out, oc) = output([b, c_out, h, w], dtype, &device)?;
    crate::kernels::matmul::gemm_into(
        gemm,
        &device,
        &wc,
        &tc,
        bc.as_ref(),
        &oc,
        [c_out, map, c_in],
        b,
        [0, map * c_in, c_out * map],
        true,
        true,
        None,
        epilogue,
    )?;
    Some(out)
}

fn element_f16() -> Element {
    Element::F16
}

/// Launches [`im2col`] from `xc` (`dims`) into `colc`, `[c_in·k·k, b·oh·ow]`.
pub(super) fn unroll_into(
    xc: &CubeTensor,
    colc: &CubeTensor,
    element: Element,
    dims: [usize; 4],
    geometry: Geometry,
) -> Option<()> {
    launch_im2col(xc, colc, element, dims, geometry, false)
}

/// [`im2col`], `batch_major` or not.
fn launch_im2col(
    xc: &CubeTensor,
    colc: &CubeTensor,
    element: Element,
    [b, c_in, h, w]: [usize; 4],
    geometry: Geometry,
    batch_major: bool,
) -> Option<()> {
    let Geometry {
        k,
        stride,
        padding,
        upsample,
    } = geometry;
    let [oh, ow] = geometry.output(h, w)?;
    let (k_total, pixels) = (c_in * k * k, b * oh * ow);
    let (cx, cy) = grid((k_total * pixels).div_ceil(LANES))?;
    let up = if upsample { 2 } else { 1 };
    macro_rules! launch {
        ($t:ty) => {
            im2col::launch::<$t>(
                &xc.client,
                CubeCount::Static(cx, cy, 1),
                CubeDim::new_1d(LANES as u32),
                buffer_arg(xc),
                buffer_arg(colc),
                c_in,
                h,
                w,
                oh,
                ow,
                pixels,
                stride,
                padding,
                k_total,
                k,
                k,
                up,
                batch_major,
            )
        };
    }
    match element {
        Element::F32 => launch!(f32),
        Element::F16 => launch!(half::f16),
    }
    Some(())
}
