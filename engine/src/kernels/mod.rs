//! Our own CubeCL kernels. One `#[cube]` source compiles to SPIR-V on hardware Vulkan adapters and
//! to WGSL on software adapters and the other wgpu backends, so the same kernel runs on an H200,
//! an Arc card, an Iris Xe iGPU and lavapipe in CI. On the CPU backend (and wherever a launch is
//! refused) the caller's burn-op twin computes the same thing; each kernel's tests compare it with
//! that twin on the shapes that reach its edges.
//!
//! `LATENT_STUDIO_KERNELS=burn` turns them all off (burn ops everywhere), to measure what they
//! bring in one build.

// The `#[cube]` macros expand to paths under `cubecl::`.
use burn::cubecl;

pub mod attention;
pub mod concat;
pub mod conv;
pub mod copy;
pub mod group_norm;
pub mod latent2rgb;
pub mod layer_norm;
pub mod matmul;

use burn::backend::Wgpu;
use burn::backend::wgpu::{CubeBackend, CubeTensor, into_contiguous};
use burn::tensor::{DType, Tensor};

/// Whether our kernels run on `device`: any wgpu device (either compiler), unless they are switched
/// off ([`set_enabled`], `LATENT_STUDIO_KERNELS=burn`). The CPU backend uses the burn-op twins.
pub fn available(device: &burn::tensor::Device) -> bool {
    enabled() && !crate::device::is_cpu(device)
}

/// Whether our kernels are on (for every device); on unless `LATENT_STUDIO_KERNELS=burn`.
pub fn enabled() -> bool {
    use std::sync::atomic::Ordering;
    static FROM_ENV: std::sync::Once = std::sync::Once::new();
    FROM_ENV.call_once(|| {
        let off = std::env::var("LATENT_STUDIO_KERNELS")
            .is_ok_and(|v| v.trim().eq_ignore_ascii_case("burn"));
        if off {
            tracing::info!("LATENT_STUDIO_KERNELS=burn: our kernels are off, burn ops run instead");
            ENABLED.store(false, Ordering::Relaxed);
        }
    });
    ENABLED.load(Ordering::Relaxed)
}

/// Turns our kernels on or off process-wide (the bench compares both in one process; the
/// models' results agree within the parity tolerances either way).
pub fn set_enabled(on: bool) {
    let _ = enabled(); // the environment is read first, so it cannot undo this later
    ENABLED.store(on, std::sync::atomic::Ordering::Relaxed);
}

static ENABLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Whether our cooperative-matrix convolution loads the next reduction step while the current
/// step's products run; on unless [`set_conv_prefetch`] (the bench's comparison).
pub fn conv_prefetch() -> bool {
    CONV_PREFETCH.load(std::sync::atomic::Ordering::Relaxed)
}

/// Sets [`conv_prefetch`] process-wide (launches afterwards take it).
pub fn set_conv_prefetch(on: bool) {
    CONV_PREFETCH.store(on, std::sync::atomic::Ordering::Relaxed);
}

static CONV_PREFETCH: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Whether cooperative matrices are switched off (`LATENT_STUDIO_CMMA=off`): hidden from
/// cubecl's Vulkan devices too ([`crate::compiler::install`]), so every kernel, burn's
/// included, runs on plain lanes under SPIR-V, as on an Iris Xe or Meteor Lake iGPU; one GPU can
/// measure both routes, and a driver whose cooperative matrices misbehave can be worked around.
pub fn cooperative_matrices_off() -> bool {
    crate::compiler::cooperative_matrices_off()
}

/// Whether `device` (a wgpu device) computes `dtype` products on plain lanes: it has no cooperative
/// matrices, or they are switched off ([`cooperative_matrices_off`]). There burn's 3×3
/// convolution is `conv_direct` and our SIMT convolution and product run instead. A launch-free
/// query, but it makes a tensor: callers settle it once per layer.
pub(crate) fn plain_lanes(device: &burn::tensor::Device, dtype: DType) -> bool {
    resolve(Tensor::<1>::zeros([1], (device, dtype)))
        .is_some_and(|t| cooperative_matrices_off() || t.client.features().matmul.cmma.is_empty())
}

/// Whether `device` is a software adapter (lavapipe/llvmpipe, SwiftShader: no card behind it, or
/// named as one). There a kernel's first launch is an LLVM compile of seconds, so burn's
/// autotune (13–33 candidates compiled and timed per shape) costs minutes, and our one kernel per
/// op runs instead even where burn's tuned choice is faster on a card (linears, 1×1 and narrow
/// convolutions; BENCHMARKS.md, eleventh session). Makes a tensor: callers settle it once.
pub(crate) fn software(device: &burn::tensor::Device) -> bool {
    resolve(Tensor::<1>::zeros([1], device)).is_some_and(|t| {
        let identity = &t.client.properties().identity;
        identity.physical.is_none() || crate::compiler::software_by_name(&identity.name)
    })
}

/// The sum of `value` over a cube of `lanes` (= 2^`log2_lanes`) lanes, returned to every lane;
/// `shared` holds `lanes` f32.
#[cubecl::cube]
pub(crate) fn cube_total(
    mut shared: cubecl::prelude::Shared<[f32]>,
    value: f32,
    #[comptime] lanes: usize,
    #[comptime] log2_lanes: usize,
) -> f32 {
    use cubecl::prelude::*;
    let lane = UNIT_POS as usize;
    shared[lane] = value;
    sync_cube();
    // Unrolled with constant strides: a runtime-halved stride miscompiles in CubeCL 0.11.3.
    #[unroll]
    for k in 1..log2_lanes + 1 {
        let stride = lanes >> k;
        if lane < stride {
            shared[lane] += shared[lane + stride];
        }
        sync_cube();
    }
    let total = shared[0];
    sync_cube();
    total
}

/// One staged reduction step of a 64 × 64 output tile on 256 lanes (the SIMT convolution's and
/// product's): lane `(tx, ty)` adds `a[q, ty·4 + i] · b[q, tx + lanes_x·j]` for the `bk` staged
/// rows `q` to its 4 × 4 f32 accumulators (`acc[i·4 + j]`). Row `q` of `a` starts at
/// `q·a_stride`, of `b` at `q·b_stride`; `lanes_x` lanes share a `ty`.
#[cubecl::cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn accumulate_4x4(
    a_s: cubecl::prelude::Shared<[f32]>,
    b_s: cubecl::prelude::Shared<[f32]>,
    acc: &mut cubecl::prelude::Array<f32>,
    tx: usize,
    ty: usize,
    #[comptime] bk: usize,
    #[comptime] a_stride: usize,
    #[comptime] b_stride: usize,
    #[comptime] lanes_x: usize,
) {
    // Used by the expansion (the plain build calls it unused).
    #[allow(unused_imports)]
    use cubecl::prelude::*;
    #[unroll]
    for q in 0..bk {
        let a0 = a_s[q * a_stride + ty * 4];
        let a1 = a_s[q * a_stride + ty * 4 + 1];
        let a2 = a_s[q * a_stride + ty * 4 + 2];
        let a3 = a_s[q * a_stride + ty * 4 + 3];
        #[unroll]
        for j in 0..4usize {
            let b = b_s[q * b_stride + tx + lanes_x * j];
            acc[j] += a0 * b;
            acc[4 + j] += a1 * b;
            acc[8 + j] += a2 * b;
            acc[12 + j] += a3 * b;
        }
    }
}

/// [`accumulate_4x4`] for a lane block of `block` × `block` (the SIMT convolution's wide tiles):
/// lane `(tx, ty)` adds `a[q, ty·block + i] · b[q, tx + lanes_x·j]` to `acc[i·block + j]`. Twice
/// the side is four times the products per staged value read: the narrow block reads workgroup
/// memory once per product pair (BENCHMARKS.md, twentieth session).
#[cubecl::cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn accumulate_block(
    a_s: cubecl::prelude::Shared<[f32]>,
    b_s: cubecl::prelude::Shared<[f32]>,
    acc: &mut cubecl::prelude::Array<f32>,
    tx: usize,
    ty: usize,
    #[comptime] bk: usize,
    #[comptime] a_stride: usize,
    #[comptime] b_stride: usize,
    #[comptime] lanes_x: usize,
    #[comptime] block: usize,
) {
    // Used by the expansion (the plain build calls it unused).
    #[allow(unused_imports)]
    use cubecl::prelude::*;
    let mut a = Array::<f32>::new(block);
    #[unroll]
    for q in 0..bk {
        #[unroll]
        for i in 0..block {
            a[i] = a_s[q * a_stride + ty * block + i];
        }
        #[unroll]
        for j in 0..block {
            let b = b_s[q * b_stride + tx + lanes_x * j];
            #[unroll]
            for i in 0..block {
                acc[i * block + j] += a[i] * b;
            }
        }
    }
}

/// One staged reduction step in lane blocks of `block` × `block`: the measured scalar form for
/// 4 × 4 ([`accumulate_4x4`]), [`accumulate_block`] otherwise. The SIMT convolution and product
/// both step through it.
#[cubecl::cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn accumulate(
    a_s: cubecl::prelude::Shared<[f32]>,
    b_s: cubecl::prelude::Shared<[f32]>,
    acc: &mut cubecl::prelude::Array<f32>,
    tx: usize,
    ty: usize,
    #[comptime] bk: usize,
    #[comptime] a_stride: usize,
    #[comptime] b_stride: usize,
    #[comptime] lanes_x: usize,
    #[comptime] block: usize,
) {
    #[allow(unused_imports)]
    use cubecl::prelude::*;
    if comptime!(block == 4) {
        accumulate_4x4(a_s, b_s, acc, tx, ty, bk, a_stride, b_stride, lanes_x);
    } else {
        accumulate_block(
            a_s, b_s, acc, tx, ty, bk, a_stride, b_stride, lanes_x, block,
        );
    }
}

/// Mean and M2 (sum of squared deviations from the mean) of `x[base..base + len]` in f32, over a
/// cube of `lanes` lanes, returned to every lane. Two passes: the span stays in cache.
#[cubecl::cube]
pub(crate) fn span_moments<F: cubecl::prelude::Float>(
    x: &[F],
    base: usize,
    len: usize,
    shared: cubecl::prelude::Shared<[f32]>,
    #[comptime] lanes: usize,
    #[comptime] log2_lanes: usize,
) -> (f32, f32) {
    use cubecl::prelude::*;
    let lane = UNIT_POS as usize;
    let mut sum = 0.0f32;
    let mut i = lane;
    while i < len {
        sum += f32::cast_from(x[base + i]);
        i += lanes;
    }
    let mean = cube_total(shared.clone(), sum, lanes, log2_lanes) / f32::cast_from(len as u32);
    let mut m2 = 0.0f32;
    let mut j = lane;
    while j < len {
        let d = f32::cast_from(x[base + j]) - mean;
        m2 += d * d;
        j += lanes;
    }
    (mean, cube_total(shared, m2, lanes, log2_lanes))
}

/// The element types our kernels are written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Element {
    F32,
    F16,
}

impl Element {
    pub(crate) fn of(dtype: DType) -> Option<Self> {
        match dtype {
            DType::F32 => Some(Self::F32),
            DType::F16 => Some(Self::F16),
            _ => None,
        }
    }
}

/// The device buffer behind a tensor, flattened and contiguous; `None` off wgpu.
pub(crate) fn resolve<const D: usize>(t: Tensor<D>) -> Option<CubeTensor> {
    let n = t.shape().num_elements();
    let fusion = t.reshape([n]).try_into_primitive::<Wgpu>().ok()?;
    let client = fusion.client.clone();
    Some(into_contiguous(
        client.resolve_tensor_float::<CubeBackend>(fusion),
    ))
}

/// The device tensor behind `t` as it lies: its strides kept, nothing copied; `None` off wgpu.
pub(crate) fn resolve_strided<const D: usize>(t: Tensor<D>) -> Option<CubeTensor> {
    let fusion = t.try_into_primitive::<Wgpu>().ok()?;
    let client = fusion.client.clone();
    Some(client.resolve_tensor_float::<CubeBackend>(fusion))
}

/// A new tensor of `shape` and `dtype` on `device`, with its (flattened) buffer for a kernel to
/// fill: burn owns the allocation, the kernel writes through the resolved view.
pub(crate) fn output<const D: usize>(
    shape: [usize; D],
    dtype: DType,
    device: &burn::tensor::Device,
) -> Option<(Tensor<D>, CubeTensor)> {
    let out = Tensor::<D>::empty(shape, (device, dtype));
    let buffer = resolve(out.clone())?;
    Some((out, buffer))
}

/// A `&[E]` / `&mut [E]` kernel argument over a contiguous tensor's buffer.
pub(crate) fn buffer_arg(t: &CubeTensor) -> cubecl::prelude::BufferArg {
    let len = t.meta.num_elements();
    // SAFETY: `len` elements of the tensor's dtype are what its handle holds (contiguous).
    unsafe { cubecl::prelude::BufferArg::from_raw_parts(t.handle.clone(), len) }
}

/// A `&[Vector<E, width>]` kernel argument over a contiguous tensor's buffer, whose length the
/// caller has checked is a multiple of `width`.
pub(crate) fn vector_arg(t: &CubeTensor, width: usize) -> cubecl::prelude::BufferArg {
    let len = t.meta.num_elements() / width;
    // SAFETY: the buffer holds `len · width` elements of the tensor's dtype (contiguous).
    unsafe { cubecl::prelude::BufferArg::from_raw_parts(t.handle.clone(), len) }
}

/// A square-kernel convolution's geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Kernel side.
    pub k: usize,
    pub stride: usize,
    /// Zero padding on every side.
    pub padding: usize,
    /// Whether the input is first upsampled ×2 by nearest neighbour (read in place, never
    /// materialised: the UNet's and VAE's upsamplers).
    pub upsample: bool,
}

impl Geometry {
    /// The output's `[h, w]` for an input map of `[h, w]`, `None` where the kernel does not fit.
    pub fn output(&self, h: usize, w: usize) -> Option<[usize; 2]> {
        let up = if self.upsample { 2 } else { 1 };
        let (h, w) = (h * up + 2 * self.padding, w * up + 2 * self.padding);
        if self.k == 0 || self.stride == 0 || h < self.k || w < self.k {
            return None;
        }
        Some([
            (h - self.k) / self.stride + 1,
            (w - self.k) / self.stride + 1,
        ])
    }
}

/// A 2-D grid of `count` cubes (a dimension holds at most 65 535): `(x, y)` with `x * y >= count`.
pub(crate) fn grid(count: usize) -> Option<(u32, u32)> {
    let x = count.clamp(1, 65_535);
    let y = count.div_ceil(x).max(1);
    (y <= 65_535).then_some((x as u32, y as u32))
}

#[cfg(test)]
pub(crate) mod testing {
    use burn::tensor::{DType, Device, DeviceKind, Tensor, TensorData};

    /// The wgpu device the tests run on (lavapipe in CI), with the engine's compiler policy
    /// (and, in these debug builds, our kernels compiled to SPIR-V too: [`crate::compiler`]).
    pub fn wgpu() -> Device {
        crate::compiler::install();
        Device::wgpu(DeviceKind::DefaultDevice)
    }

    /// Deterministic values with a nonzero mean and spread (catches a missing mean subtraction).
    pub fn values(n: usize, offset: f32) -> Vec<f32> {
        (0..n)
            .map(|i| offset + ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * 4.0)
            .collect()
    }

    pub fn tensor<const D: usize>(
        values: Vec<f32>,
        shape: [usize; D],
        device: &Device,
        dtype: DType,
    ) -> Tensor<D> {
        Tensor::from_data(TensorData::new(values, shape), (device, dtype))
    }

    /// `t` in f32 on the CPU backend: where a kernel's burn-op twin runs, so the twin's
    /// autotune does not compile and time burn's candidates on lavapipe for every shape (most of
    /// a kernel test's time there).
    pub fn on_cpu<const D: usize>(t: &Tensor<D>) -> Tensor<D> {
        let shape: [usize; D] = t.dims();
        tensor(read(t.clone()), shape, &Device::flex(), DType::F32)
    }

    pub fn read<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.cast(DType::F32).into_data().try_to_vec::<f32>().unwrap()
    }

    /// `max |a - b| / max(max |b|, 1e-6)`.
    pub fn relative(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        let scale = b.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
        a.iter()
            .zip(b)
            .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
            / scale
    }
}
