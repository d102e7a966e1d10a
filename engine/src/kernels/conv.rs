//! 2-D convolution as an implicit GEMM on plain lanes (no cooperative matrices): the portable
//! path for adapters without them (Iris Xe, Meteor Lake, every WGSL adapter), where burn's only
//! 3×3 candidate is `conv_direct` (one lane per output, no tiling; 1.1 s per SD 1.5 UNet step on
//! an H200 under WGSL, BENCHMARKS.md).
//!
//! The GEMM is `out[co, p] = Σ_k w[k, co] · im2col(x)[k, p]` with `k = (ci, ky, kx)` and `p` the
//! output pixels of the whole batch. A cube computes a 64 (output channels) × 64 (pixels) tile
//! with 256 lanes, each a 4 × 4 block in f32 registers; it walks `k` in steps of 16, staging the
//! weight slice and the gathered input slice (zero outside the image: the padding) in workgroup
//! memory, 8 KiB in all. Weights come packed `[c_in·kh·kw, c_out]` ([`pack`], once per model), so
//! the staging reads are coalesced; the bias is added in the epilogue, and the output is written
//! `[b, c_out, oh, ow]` like burn's. The twin is burn's `conv2d` on the OIHW weights.
//!
//! `nn::Conv2d` runs it ([`Prepared`]) for 3×3 kernels with at least 32 output channels on devices
//! without cooperative matrices: there it was 3–20× faster than burn's `conv_direct` on every SD
//! 1.5 UNet 3×3 shape (H200 under WGSL, BENCHMARKS.md). Where the device has cooperative
//! matrices, burn's cmma implicit GEMM is faster and runs; 1×1 kernels stay with burn's im2col
//! matmul (faster on every shape measured); so do the 4- and 3-channel output convolutions (a
//! 64-channel tile would be mostly idle).
//!
//! Not yet here (issue 13): split-K for the 8×8 maps, the time-embedding and residual adds in the
//! epilogue, a channels-last layout.

use std::sync::{Arc, OnceLock};

use burn::cubecl;
use burn::cubecl::prelude::*;
use burn::tensor::{DType, Tensor};

use super::{Element, buffer_arg, output, resolve};

/// Output channels per cube.
const BM: usize = 64;
/// Output pixels per cube.
const BN: usize = 64;
/// Reduction step staged in workgroup memory.
const BK: usize = 16;
/// Lanes per cube: 16 × 16, each a 4 × 4 block.
const LANES: usize = 256;

/// Cube `(pixel tile, channel tile)`. Lane `(tx, ty)` owns output channels `ty·4 .. ty·4 + 4`
/// and pixels `tx + 16·j`: neighbouring lanes touch neighbouring pixels, so the staged input is
/// read without bank conflicts and the output is written coalesced.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn conv2d_gemm<F: Float>(
    x: &[F],
    w: &[F],
    bias: &[F],
    out: &mut [F],
    c_in: usize,
    h: usize,
    wd: usize,
    c_out: usize,
    oh: usize,
    ow: usize,
    pixels: usize,
    stride: usize,
    pad: usize,
    #[comptime] kh: usize,
    #[comptime] kw: usize,
    #[comptime] has_bias: bool,
) {
    let lane = UNIT_POS as usize;
    let tx = lane % 16;
    let ty = lane / 16;
    let n0 = CUBE_POS_X as usize * BN;
    let m0 = CUBE_POS_Y as usize * BM;
    let taps = kh * kw;
    let k_total = c_in * taps;
    let plane = oh * ow;

    let mut a_s = Shared::<[f32]>::new_slice(BK * BM);
    let mut b_s = Shared::<[f32]>::new_slice(BK * BN);
    let mut acc = Array::<f32>::new(16usize);
    #[unroll]
    for i in 0..16usize {
        acc[i] = 0.0f32;
    }

    let steps = k_total.div_ceil(BK);
    for s in 0..steps {
        let k0 = s * BK;
        // Stage w[k0 .. k0 + 16, m0 .. m0 + 64] and the gathered input for pixels n0 .. n0 + 64.
        #[unroll]
        for r in 0..4usize {
            let idx = lane + r * LANES;
            let kk = idx / BM;
            let m = idx % BM;
            let k = k0 + kk;
            let co = m0 + m;
            let mut a = 0.0f32;
            if k < k_total && co < c_out {
                a = f32::cast_from(w[k * c_out + co]);
            }
            a_s[idx] = a;

            let n = idx % BN;
            let kb = idx / BN;
            let kx_ = k0 + kb;
            let p = n0 + n;
            let mut b = 0.0f32;
            if kx_ < k_total && p < pixels {
                let ci = kx_ / taps;
                let tap = kx_ % taps;
                let ky = tap / kw;
                let kx = tap % kw;
                let batch = p / plane;
                let rem = p % plane;
                let iy = (rem / ow) * stride + ky;
                let ix = (rem % ow) * stride + kx;
                // Unsigned: `iy - pad` is only formed inside the image.
                if iy >= pad && ix >= pad && iy - pad < h && ix - pad < wd {
                    b = f32::cast_from(x[((batch * c_in + ci) * h + iy - pad) * wd + ix - pad]);
                }
            }
            b_s[kb * BN + n] = b;
        }
        sync_cube();
        #[unroll]
        for kk in 0..BK {
            let a0 = a_s[kk * BM + ty * 4];
            let a1 = a_s[kk * BM + ty * 4 + 1];
            let a2 = a_s[kk * BM + ty * 4 + 2];
            let a3 = a_s[kk * BM + ty * 4 + 3];
            #[unroll]
            for j in 0..4usize {
                let b = b_s[kk * BN + tx + 16 * j];
                acc[j] += a0 * b;
                acc[4 + j] += a1 * b;
                acc[8 + j] += a2 * b;
                acc[12 + j] += a3 * b;
            }
        }
        sync_cube();
    }

    #[unroll]
    for i in 0..4usize {
        let co = m0 + ty * 4 + i;
        if co < c_out {
            let mut add = 0.0f32;
            if has_bias {
                add = f32::cast_from(bias[co]);
            }
            #[unroll]
            for j in 0..4usize {
                let p = n0 + tx + 16 * j;
                if p < pixels {
                    let batch = p / plane;
                    let rem = p % plane;
                    out[(batch * c_out + co) * plane + rem] = F::cast_from(acc[i * 4 + j] + add);
                }
            }
        }
    }
}

/// Fewest output channels for which ours runs (a tile holds 64).
const MIN_OUT_CHANNELS: usize = 32;

/// One convolution layer's use of our kernel: whether it runs on the layer's device and its
/// packed weights, both settled at the first call (a layer's weights live on one device in one
/// dtype; a cast makes a new layer). Clones share it.
#[derive(Debug, Clone, Default)]
pub struct Prepared(Arc<OnceLock<Option<Tensor<2>>>>);

impl Prepared {
    /// `x` through our kernel with `weight` (OIHW) and `bias`, where it runs (see the module
    /// docs); `None` for burn's `conv2d`.
    pub fn forward(
        &self,
        x: &Tensor<4>,
        weight: &Tensor<4>,
        bias: Option<&Tensor<1>>,
        stride: usize,
        padding: usize,
    ) -> Option<Tensor<4>> {
        let device = x.device();
        let [c_out, _, kh, kw] = weight.dims();
        if !super::available(&device) || !suits(kh, kw, c_out) {
            return None;
        }
        let packed = self
            .0
            .get_or_init(|| without_cmma(&device, x.dtype()).then(|| pack(weight.clone())));
        conv2d(x.clone(), packed.as_ref()?, bias, kh, stride, padding)
    }
}

/// The layer shapes ours takes (module docs).
fn suits(kh: usize, kw: usize, c_out: usize) -> bool {
    kh == 3 && kw == 3 && c_out >= MIN_OUT_CHANNELS
}

/// Whether a `k`×`k` convolution to `c_out` channels in `dtype` runs through our kernel on
/// `device` (the bench's op report).
pub fn runs_for(device: &burn::tensor::Device, dtype: DType, k: usize, c_out: usize) -> bool {
    super::available(device) && suits(k, k, c_out) && without_cmma(device, dtype)
}

/// Whether `device` lacks cooperative matrices (where burn's 3×3 convolution is `conv_direct`).
fn without_cmma(device: &burn::tensor::Device, dtype: DType) -> bool {
    resolve(Tensor::<1>::zeros([1], (device, dtype)))
        .is_some_and(|t| t.client.features().matmul.cmma.is_empty())
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
    let device = x.device();
    if !super::available(&device) || k == 0 || stride == 0 {
        return None;
    }
    let dtype = x.dtype();
    let element = Element::of(dtype)?;
    let [b, c_in, h, w] = x.dims();
    let [k_total, c_out] = packed.dims();
    if k_total != c_in * k * k
        || packed.dtype() != dtype
        || bias.is_some_and(|t| t.dtype() != dtype)
    {
        return None;
    }
    if h + 2 * padding < k || w + 2 * padding < k {
        return None;
    }
    let oh = (h + 2 * padding - k) / stride + 1;
    let ow = (w + 2 * padding - k) / stride + 1;
    let pixels = b * oh * ow;
    let (nx, ny) = (pixels.div_ceil(BN), c_out.div_ceil(BM));
    if pixels == 0 || c_out == 0 || nx > 65_535 || ny > 65_535 {
        return None;
    }
    let xc = resolve(x)?;
    let wc = resolve(packed.clone())?;
    let bias_tensor = match bias {
        Some(t) => t.clone(),
        None => Tensor::<1>::zeros([1], (&device, dtype)),
    };
    let bc = resolve(bias_tensor)?;
    let client = xc.client.clone();
    let (out, oc) = output([b, c_out, oh, ow], dtype, &device)?;
    let count = CubeCount::Static(nx as u32, ny as u32, 1);
    let cube = CubeDim::new_1d(LANES as u32);
    macro_rules! launch {
        ($t:ty) => {
            conv2d_gemm::launch::<$t>(
                &client,
                count,
                cube,
                buffer_arg(&xc),
                buffer_arg(&wc),
                buffer_arg(&bc),
                buffer_arg(&oc),
                c_in,
                h,
                w,
                c_out,
                oh,
                ow,
                pixels,
                stride,
                padding,
                k,
                k,
                bias.is_some(),
            )
        };
    }
    match element {
        Element::F32 => launch!(f32),
        Element::F16 => launch!(half::f16),
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use burn::tensor::module::conv2d;
    use burn::tensor::ops::ConvOptions;
    use burn::tensor::{DType, Tensor};

    use super::super::testing::{read, relative, tensor, values, wgpu};

    /// Against burn's `conv2d` (in f32) where the tiles do not divide the shape: channels off 64
    /// and off 16 in the reduction, an 8×8 map, batch 2, stride 2, a 1×1 kernel, an odd map, with
    /// and without bias, in f32 and f16.
    #[test]
    fn implicit_gemm_matches_burn_conv2d() {
        let device = wgpu();
        for (b, c_in, c_out, h, w, k, stride, pad, bias) in [
            (2, 20, 70, 8, 8, 3, 1, 1, true),
            (1, 4, 8, 9, 7, 3, 2, 1, true),
            (2, 33, 65, 5, 6, 1, 1, 0, false),
            (1, 64, 64, 16, 16, 3, 1, 1, false),
        ] {
            for dtype in [DType::F32, DType::F16] {
                let tol = if dtype == DType::F32 { 1e-4 } else { 1e-2 };
                let x = tensor(
                    values(b * c_in * h * w, 0.1),
                    [b, c_in, h, w],
                    &device,
                    dtype,
                );
                let wt = tensor(
                    values(c_out * c_in * k * k, -0.3)
                        .into_iter()
                        .map(|v| v * 0.2)
                        .collect(),
                    [c_out, c_in, k, k],
                    &device,
                    dtype,
                );
                let bt: Tensor<1> = tensor(values(c_out, 0.5), [c_out], &device, dtype);
                let f32 = |t: Tensor<4>| t.cast(DType::F32);
                let twin = conv2d(
                    f32(x.clone()),
                    f32(wt.clone()),
                    bias.then(|| bt.clone().cast(DType::F32)),
                    ConvOptions::new([stride, stride], [pad, pad], [1, 1], 1),
                );
                let packed = super::pack(wt);
                let ours =
                    super::conv2d(x, &packed, bias.then_some(&bt), k, stride, pad).expect("runs");
                assert_eq!(ours.dims(), twin.dims());
                assert_eq!(ours.dtype(), dtype);
                let rel = relative(&read(ours), &read(twin));
                let case = format!("b{b} {c_in}->{c_out} {h}x{w} k{k}/{stride} {dtype:?}");
                assert!(rel <= tol, "{case}: rel {rel}");
            }
        }
    }

    /// `nn::Conv2d`'s route on lavapipe (no cooperative matrices): ours for a 3×3 layer with 32 or
    /// more output channels (packed once, shared by clones), burn for 1×1 and narrow outputs.
    #[test]
    fn prepared_routes_by_shape_and_device() {
        let device = wgpu();
        let dtype = DType::F32;
        let x = tensor(values(2 * 8 * 6 * 6, 0.2), [2, 8, 6, 6], &device, dtype);
        let weight = |c_out: usize, k: usize| {
            tensor(
                values(c_out * 8 * k * k, -0.1),
                [c_out, 8, k, k],
                &device,
                dtype,
            )
        };
        let bias: Tensor<1> = tensor(values(40, 0.3), [40], &device, dtype);
        let prepared = super::Prepared::default();
        let w3 = weight(40, 3);
        let ours = prepared
            .forward(&x, &w3, Some(&bias), 1, 1)
            .expect("ours runs");
        assert!(super::runs_for(&device, dtype, 3, 40));
        let twin = conv2d(
            x.clone(),
            w3.clone(),
            Some(bias.clone()),
            ConvOptions::new([1, 1], [1, 1], [1, 1], 1),
        );
        assert!(relative(&read(ours), &read(twin)) <= 1e-4);
        let shared = prepared.clone();
        assert!(
            shared.0.get().is_some_and(|p| p.is_some()),
            "packed once, shared"
        );
        let narrow = weight(4, 3);
        assert!(
            super::Prepared::default()
                .forward(&x, &narrow, None, 1, 1)
                .is_none()
        );
        assert!(!super::runs_for(&device, dtype, 3, 4));
        let pointwise = weight(40, 1);
        assert!(
            super::Prepared::default()
                .forward(&x, &pointwise, None, 1, 0)
                .is_none()
        );
        assert!(!super::runs_for(&device, dtype, 1, 40));
    }
}
