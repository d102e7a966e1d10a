//! The packed-RGBA8 preview image the readback moves (4 bytes per pixel, whichever path packed
//! it), packed on the device by our latent2rgb kernel ([`crate::kernels::latent2rgb`]) or by burn
//! ops, with the host reference both are tested against.

use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::{DType, Int, Tensor, TensorData};

use super::Factors;
use crate::error::{Error, Result};

/// Set after our latent2rgb kernel failed once; burn ops are used from then on.
static LATENT2RGB_KERNEL_FAILED: AtomicBool = AtomicBool::new(false);

/// Which implementation produced a packed image (for benchmarks and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackedBy {
    /// Our latent2rgb kernel.
    Kernel,
    /// burn tensor ops.
    BurnOps,
}

enum Pixels {
    /// `[h * w]` integers `r | g << 8 | b << 16`; alpha is added on the host.
    Tensor(Tensor<1, Int>),
    /// `h * w` little-endian `u32` RGBA8 words written by a kernel of ours.
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

/// latent2rgb of the first batch item of `x0` (`[b, c, h, w]`) as packed RGBA8: our kernel on a
/// wgpu device, burn ops elsewhere. Both round after `clamp((x0ᵀ·F + bias + 1) / 2, 0, 1) · 255`.
pub fn latent2rgb_packed(x0: &Tensor<4>, factors: &Factors) -> PackedImage {
    if !LATENT2RGB_KERNEL_FAILED.load(Ordering::Relaxed)
        && let Some((client, handle)) =
            crate::kernels::latent2rgb::latent2rgb(x0, &factors.factors, factors.bias)
    {
        return PackedImage {
            width: x0.dims()[3],
            height: x0.dims()[2],
            pixels: Pixels::Buffer { client, handle },
        };
    }
    pack_rgb(super::latent2rgb(x0.clone().narrow(0, 0, 1), factors))
}

/// The host reference of [`latent2rgb_packed`]: `x0` is one `[c, h, w]` latent, row-major.
/// [`crate::preview::latent2rgb_reference`]'s values, rounded to bytes, with opaque alpha.
pub fn latent2rgb_reference_rgba8(
    x0: &[f32],
    c: usize,
    h: usize,
    w: usize,
    factors: &Factors,
) -> Vec<u8> {
    super::latent2rgb_reference(x0, c, h, w, factors)
        .chunks_exact(3)
        .flat_map(|p| {
            let byte = |v: f32| v.round_ties_even() as u8;
            [byte(p[0]), byte(p[1]), byte(p[2]), 255]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Our kernel (wgpu) and the burn-op packing (CPU) agree with the host reference, also for
    /// a batch where only item 0 is shown, a size spanning several workgroups, and SDXL's
    /// factors with their bias.
    #[test]
    fn latent2rgb_kernel_matches_its_reference() {
        for (factors, (c, h, w)) in [
            (Factors::sd1().unwrap(), (4, 5, 7)),
            (Factors::sd1().unwrap(), (4, 40, 24)),
            (Factors::sdxl().unwrap(), (4, 9, 6)),
        ] {
            let x0 = sample_latent(c, h, w);
            let want = latent2rgb_reference_rgba8(&x0, c, h, w, &factors);
            let mut batch = x0.clone();
            batch.extend(x0.iter().map(|v| -v)); // item 1 must not leak into the preview
            for (device, expect) in [
                (burn::tensor::Device::flex(), PackedBy::BurnOps),
                (
                    burn::tensor::Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
                    PackedBy::Kernel,
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
