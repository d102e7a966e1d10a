//! Our own WGSL kernels (`shaders/`) launched on burn's wgpu device, with their host reference
//! twins, and the packed-RGBA8 image type the preview readback moves.
//!
//! A WGSL kernel runs where the wgpu runtime compiles WGSL. A build with the `vulkan` feature
//! compiles everything to SPIR-V and cannot load WGSL text, so there (and on the CPU backend) the
//! same packed result comes from burn ops; a kernel that fails once is not tried again.

#[cfg_attr(feature = "vulkan", allow(unused_imports))]
use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::{DType, Int, Tensor, TensorData};

use crate::error::{Error, Result};
use crate::preview::Factors;

/// Every WGSL file in `shaders/`, by file name (validated with naga in the tests).
pub const WGSL_SOURCES: &[(&str, &str)] = &[(
    "latent2rgb.wgsl",
    include_str!("../../shaders/latent2rgb.wgsl"),
)];

/// Set after our WGSL latent2rgb kernel failed once; burn ops are used from then on.
#[cfg_attr(feature = "vulkan", allow(dead_code))]
static LATENT2RGB_KERNEL_FAILED: AtomicBool = AtomicBool::new(false);

/// Which implementation produced a packed image (for benchmarks and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackedBy {
    /// One of our WGSL kernels.
    Kernel,
    /// burn tensor ops.
    BurnOps,
}

enum Pixels {
    /// `[h * w]` integers `r | g << 8 | b << 16`; alpha is added on the host.
    Tensor(Tensor<1, Int>),
    /// `h * w` little-endian `u32` RGBA8 words written by a kernel of ours.
    #[cfg(not(feature = "vulkan"))]
    Buffer {
        client: burn::cubecl::client::Client,
        handle: burn::cubecl::server::Handle,
    },
}

/// An RGBA8 image still on the device: 4 bytes per pixel to read back.
pub struct PackedImage {
    pub width: usize,
    pub height: usize,
    pixels: Pixels,
}

impl PackedImage {
    pub fn packed_by(&self) -> PackedBy {
        match self.pixels {
            Pixels::Tensor(_) => PackedBy::BurnOps,
            #[cfg(not(feature = "vulkan"))]
            Pixels::Buffer { .. } => PackedBy::Kernel,
        }
    }

    /// Bytes the readback moves from the device.
    pub fn readback_bytes(&self) -> usize {
        self.width * self.height * 4
    }

    /// Waits until the device has finished writing the image (the read maps the buffer only after
    /// the GPU work that writes it completed), then replaces `out` with its RGBA8 bytes.
    pub fn read_into(self, out: &mut Vec<u8>) -> Result<()> {
        let n = self.width * self.height;
        out.clear();
        out.reserve(n * 4);
        match self.pixels {
            Pixels::Tensor(t) => {
                let data = t.into_data();
                let words = data
                    .iter::<i64>()
                    .map(|v| (v as u32 & 0x00ff_ffff) | 0xff00_0000);
                for w in words {
                    out.extend_from_slice(&w.to_le_bytes());
                }
            }
            #[cfg(not(feature = "vulkan"))]
            Pixels::Buffer { client, handle } => match client.read_one(handle) {
                Ok(bytes) => out.extend_from_slice(&bytes[..n * 4]),
                Err(e) => {
                    LATENT2RGB_KERNEL_FAILED.store(true, Ordering::Relaxed);
                    return Err(Error::Device(format!("latent2rgb kernel: {e:?}")));
                }
            },
        }
        if out.len() != n * 4 {
            return Err(Error::Device(format!(
                "preview readback returned {} bytes for {n} pixels",
                out.len()
            )));
        }
        Ok(())
    }
}

/// Packs `[h, w, 3]` values in 0..=255 into RGBA8 words on the device with burn ops (rounded half
/// to even, like the image writer).
pub fn pack_rgb(rgb: Tensor<3>) -> PackedImage {
    let [h, w, _] = rgb.dims();
    let rgb = rgb
        .cast(DType::F32)
        .clamp(0.0, 255.0)
        .round()
        .reshape([h * w, 3]);
    let weights = Tensor::<2>::from_data(
        TensorData::new(vec![1.0f32, 256.0, 65536.0], [3, 1]),
        (&rgb.device(), DType::F32),
    );
    // At most 2^24 - 1: exact in f32.
    let packed = rgb.matmul(weights).reshape([h * w]).int();
    PackedImage {
        width: w,
        height: h,
        pixels: Pixels::Tensor(packed),
    }
}

/// latent2rgb of the first batch item of `x0` (`[b, c, h, w]`) as packed RGBA8: our WGSL kernel
/// where the device runs WGSL, burn ops elsewhere. Both round half to even after
/// `clamp((x0ᵀ·F + bias + 1) / 2, 0, 1) · 255`.
pub fn latent2rgb_packed(x0: &Tensor<4>, factors: &Factors) -> PackedImage {
    #[cfg(not(feature = "vulkan"))]
    if !crate::device::is_cpu(&x0.device()) && !LATENT2RGB_KERNEL_FAILED.load(Ordering::Relaxed) {
        if let Some(img) = wgsl::latent2rgb(x0, factors) {
            return img;
        }
    }
    pack_rgb(crate::preview::latent2rgb(
        x0.clone().slice([0..1]),
        factors,
    ))
}

/// The host reference of [`latent2rgb_packed`]: `x0` is one `[c, h, w]` latent, row-major.
pub fn latent2rgb_reference_rgba8(
    x0: &[f32],
    c: usize,
    h: usize,
    w: usize,
    factors: &Factors,
) -> Vec<u8> {
    let byte = |v: f32| (((v + 1.0) / 2.0).clamp(0.0, 1.0) * 255.0).round_ties_even() as u8;
    let mut out = Vec::with_capacity(h * w * 4);
    for i in 0..h * w {
        for (ch, &bias) in factors.bias.iter().enumerate() {
            let v = (0..c)
                .map(|k| x0[k * h * w + i] * factors.factors[k][ch])
                .fold(bias, |acc, t| acc + t);
            out.push(byte(v));
        }
        out.push(255);
    }
    out
}

#[cfg(not(feature = "vulkan"))]
mod wgsl {
    use burn::backend::Wgpu;
    use burn::backend::wgpu::{
        CubeBackend, CubeDim, KernelSource, SourceKernel, SourceTemplate, into_contiguous,
    };
    use burn::cubecl::CubeCount;
    use burn::cubecl::prelude::KernelId;
    use burn::cubecl::server::KernelArguments;
    use burn::tensor::{DType, Tensor};

    use super::{PackedImage, Pixels};
    use crate::preview::Factors;

    const GROUP: u32 = 256;

    struct Latent2Rgb;

    impl KernelSource for Latent2Rgb {
        fn source(&self) -> SourceTemplate {
            SourceTemplate::new(include_str!("../../shaders/latent2rgb.wgsl"))
        }

        fn id(&self) -> KernelId {
            KernelId::new::<Self>()
        }

        fn lang(&self) -> &'static str {
            "wgsl"
        }
    }

    fn to_bytes<T: Copy, const N: usize>(values: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        values.iter().flat_map(|v| f(*v)).collect()
    }

    /// `None` when `x0` does not live on a wgpu device.
    pub(super) fn latent2rgb(x0: &Tensor<4>, factors: &Factors) -> Option<PackedImage> {
        let [_, c, h, w] = x0.dims();
        let c = c.min(factors.factors.len());
        let pixels = h * w;
        let x = x0
            .clone()
            .slice([0..1, 0..c])
            .cast(DType::F32)
            .reshape([c * pixels]);
        let fusion = x.try_into_primitive::<Wgpu>().ok()?;
        let client = fusion.client.clone();
        let x = into_contiguous(client.resolve_tensor_float::<CubeBackend>(fusion));
        let device_client = x.client.clone();

        let dims = to_bytes(&[pixels as u32, c as u32], u32::to_le_bytes);
        let mut coeffs: Vec<f32> = factors.factors[..c].iter().flatten().copied().collect();
        coeffs.extend(factors.bias);
        let dims = device_client.create_from_slice(&dims);
        let coeffs = device_client.create_from_slice(&to_bytes(&coeffs, f32::to_le_bytes));
        let out = device_client.empty(pixels * 4);

        let groups = (pixels as u32).div_ceil(GROUP).max(1);
        let gx = groups.min(65_535);
        let gy = groups.div_ceil(gx);
        device_client.launch(
            Box::new(SourceKernel::new(Latent2Rgb, CubeDim::new_1d(GROUP))),
            CubeCount::Static(gx, gy, 1),
            KernelArguments::new()
                .with_buffer(x.handle.clone().binding())
                .with_buffer(out.clone().binding())
                .with_buffer(dims.binding())
                .with_buffer(coeffs.binding()),
        );
        Some(PackedImage {
            width: w,
            height: h,
            pixels: Pixels::Buffer {
                client: device_client,
                handle: out,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `.wgsl` in `shaders/` parses and validates with naga, and is listed in
    /// [`WGSL_SOURCES`] so it ships.
    #[test]
    fn every_wgsl_file_validates_with_naga() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shaders");
        let mut on_disk = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "wgsl") {
                on_disk.push(path.file_name().unwrap().to_string_lossy().into_owned());
                let source = std::fs::read_to_string(&path).unwrap();
                let module = naga::front::wgsl::parse_str(&source).unwrap_or_else(|e| {
                    panic!("{}: {}", path.display(), e.emit_to_string(&source))
                });
                naga::valid::Validator::new(
                    naga::valid::ValidationFlags::all(),
                    naga::valid::Capabilities::empty(),
                )
                .validate(&module)
                .unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
            }
        }
        on_disk.sort();
        let mut listed: Vec<String> = WGSL_SOURCES.iter().map(|(n, _)| n.to_string()).collect();
        listed.sort();
        assert_eq!(on_disk, listed, "shaders/ and WGSL_SOURCES differ");
        assert!(!on_disk.is_empty());
    }

    fn sample_latent(c: usize, h: usize, w: usize) -> Vec<f32> {
        // Covers the clamp on both ends and values near rounding boundaries.
        (0..c * h * w)
            .map(|i| ((i * 37 % 101) as f32 / 25.0) - 2.0)
            .collect()
    }

    fn assert_close_rgba(got: &[u8], want: &[u8], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        let off: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
        // Different summation order can move a value across a rounding boundary: ±1 at most, rarely.
        assert!(
            off.iter().all(|&i| got[i].abs_diff(want[i]) <= 1) && off.len() * 100 <= got.len(),
            "{what}: {} of {} bytes differ",
            off.len(),
            got.len()
        );
    }

    /// The WGSL kernel (wgpu) and the burn-op packing (CPU) agree with the host reference, also for
    /// a batch where only item 0 is shown and a size spanning several workgroups.
    #[test]
    fn latent2rgb_kernel_matches_its_reference() {
        let factors = Factors::sd1().unwrap();
        for (c, h, w) in [(4, 5, 7), (4, 40, 24)] {
            let x0 = sample_latent(c, h, w);
            let want = latent2rgb_reference_rgba8(&x0, c, h, w, &factors);
            let mut batch = x0.clone();
            batch.extend(x0.iter().map(|v| -v)); // item 1 must not leak into the preview
            for (device, expect) in [
                (burn::tensor::Device::flex(), PackedBy::BurnOps),
                (
                    burn::tensor::Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
                    if cfg!(feature = "vulkan") {
                        PackedBy::BurnOps
                    } else {
                        PackedBy::Kernel
                    },
                ),
            ] {
                let t =
                    Tensor::<4>::from_data(TensorData::new(batch.clone(), [2, c, h, w]), &device);
                let img = latent2rgb_packed(&t, &factors);
                assert_eq!(img.packed_by(), expect, "{device:?}");
                assert_eq!(
                    (img.width, img.height, img.readback_bytes()),
                    (w, h, w * h * 4)
                );
                let mut got = Vec::new();
                img.read_into(&mut got).unwrap();
                assert_close_rgba(&got, &want, &format!("{device:?} {c}x{h}x{w}"));
            }
        }
    }

    #[test]
    fn pack_rgb_rounds_and_adds_alpha() {
        let rgb = vec![0.0f32, 127.5, 255.0, 300.0, -4.0, 128.5];
        let t = Tensor::<3>::from_data(
            TensorData::new(rgb, [1, 2, 3]),
            &burn::tensor::Device::flex(),
        );
        let mut out = Vec::new();
        pack_rgb(t).read_into(&mut out).unwrap();
        assert_eq!(out, [0, 128, 255, 255, 255, 0, 128, 255]);
    }
}
