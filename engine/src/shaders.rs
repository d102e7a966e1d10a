//! Our own WGSL kernels (`shaders/`) launched on burn's wgpu device, with their host reference
//! twins, and the packed-RGBA8 image type the preview readback moves.
//!
//! A WGSL kernel runs where the wgpu runtime compiles WGSL (software adapters, non-Vulkan APIs,
//! `LATENT_STUDIO_COMPILER=wgsl`). A device that compiles SPIR-V cannot load WGSL text, so there
//! (and on the CPU backend) the same packed result comes from burn ops; a kernel that fails once
//! is not tried again.

use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::{DType, Int, Tensor, TensorData};

use crate::error::{Error, Result};
use crate::preview::Factors;

/// Every WGSL file in `shaders/`, by file name (validated with naga in the tests).
pub const WGSL_SOURCES: &[(&str, &str)] = &[
    (
        "latent2rgb.wgsl",
        include_str!("../../shaders/latent2rgb.wgsl"),
    ),
    (
        "group_norm_stats.wgsl",
        include_str!("../../shaders/group_norm_stats.wgsl"),
    ),
    (
        "group_norm_apply.wgsl",
        include_str!("../../shaders/group_norm_apply.wgsl"),
    ),
];

/// The element-type line of our typed kernels, and what replaces it for f16 tensors.
const ELEMENT_F32: &str = "alias T = f32;";
const ELEMENT_F16: &str = "enable f16;\nalias T = f16;";

/// A typed kernel's source for f16 tensors.
pub fn wgsl_for_f16(source: &str) -> String {
    source.replacen(ELEMENT_F32, ELEMENT_F16, 1)
}

/// Whether [`group_norm_fused`] can run on this device: a wgpu device whose runtime compiles WGSL
/// (not the CPU backend, not a device that compiles SPIR-V). Remembered per device.
pub fn fused_kernels_available(device: &burn::tensor::Device) -> bool {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static KNOWN: Mutex<Option<HashMap<String, bool>>> = Mutex::new(None);
    if crate::device::is_cpu(device) {
        return false;
    }
    let key = format!("{device:?}");
    if let Some(known) = KNOWN
        .lock()
        .ok()
        .and_then(|m| m.as_ref().and_then(|m| m.get(&key).copied()))
    {
        return known;
    }
    let wgsl = crate::compiler::of_device(device)
        .is_some_and(|c| c.compiler() == crate::compiler::ShaderCompiler::Wgsl);
    if let Ok(mut m) = KNOWN.lock() {
        m.get_or_insert_with(HashMap::new).insert(key, wgsl);
    }
    wgsl
}

/// GroupNorm (f32 statistics, affine with f32 `gamma`/`beta`) optionally followed by SiLU, in two
/// launches of our kernels (`group_norm_stats.wgsl`, `group_norm_apply.wgsl`) instead of burn's
/// chain of casts, reductions and element-wise ops. `None` where the kernels cannot run (see
/// [`fused_kernels_available`]) or for dtypes other than f32/f16; the caller then uses burn ops.
///
/// # Shapes
/// x `[b, c, h, w]`, gamma and beta `[c]` -> `[b, c, h, w]`
pub fn group_norm_fused(
    x: &Tensor<4>,
    gamma: &Tensor<1>,
    beta: &Tensor<1>,
    groups: usize,
    eps: f64,
    silu: bool,
) -> Option<Tensor<4>> {
    if fused_kernels_available(&x.device()) {
        return wgsl::group_norm(x, gamma, beta, groups, eps, silu);
    }
    None
}

/// Set after our WGSL latent2rgb kernel failed once; burn ops are used from then on.
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

/// latent2rgb of the first batch item of `x0` (`[b, c, h, w]`) as packed RGBA8: our WGSL kernel
/// where the device runs WGSL, burn ops elsewhere. Both round half to even after
/// `clamp((x0ᵀ·F + bias + 1) / 2, 0, 1) · 255`.
pub fn latent2rgb_packed(x0: &Tensor<4>, factors: &Factors) -> PackedImage {
    if fused_kernels_available(&x0.device()) && !LATENT2RGB_KERNEL_FAILED.load(Ordering::Relaxed) {
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

    /// Our two GroupNorm kernels, typed by the tensor's element type.
    struct GroupNormKernel {
        source: &'static str,
        f16: bool,
    }

    impl KernelSource for GroupNormKernel {
        fn source(&self) -> SourceTemplate {
            if self.f16 {
                SourceTemplate::new(super::wgsl_for_f16(self.source))
            } else {
                SourceTemplate::new(self.source)
            }
        }

        fn id(&self) -> KernelId {
            KernelId::new::<Self>().info((self.source.len(), self.f16))
        }

        fn lang(&self) -> &'static str {
            "wgsl"
        }
    }

    const STATS: &str = include_str!("../../shaders/group_norm_stats.wgsl");
    const APPLY: &str = include_str!("../../shaders/group_norm_apply.wgsl");
    /// Elements per statistics chunk, and per apply tile (256 lanes x 16, as in the WGSL).
    const CHUNK: usize = 4096;
    const TILE: usize = 4096;

    fn resolve(t: Tensor<1>) -> Option<burn::backend::wgpu::CubeTensor> {
        let fusion = t.try_into_primitive::<Wgpu>().ok()?;
        let client = fusion.client.clone();
        Some(into_contiguous(
            client.resolve_tensor_float::<CubeBackend>(fusion),
        ))
    }

    pub(super) fn group_norm(
        x: &Tensor<4>,
        gamma: &Tensor<1>,
        beta: &Tensor<1>,
        groups: usize,
        eps: f64,
        silu: bool,
    ) -> Option<Tensor<4>> {
        let dtype = x.dtype();
        let f16 = match dtype {
            DType::F32 => false,
            DType::F16 => true,
            _ => return None,
        };
        let [b, c, h, w] = x.dims();
        if groups == 0 || c % groups != 0 || b * c * h * w == 0 {
            return None;
        }
        let n = (c / groups) * h * w;
        let slices = b * groups;
        let chunks = n.div_ceil(CHUNK);
        let tiles = n.div_ceil(TILE);
        if slices > 65_535 || chunks > 65_535 || tiles > 65_535 || b * c * h * w > u32::MAX as usize
        {
            return None;
        }
        let device = x.device();
        let xc = resolve(x.clone().reshape([b * c * h * w]))?;
        let gc = resolve(gamma.clone().cast(DType::F32))?;
        let bc = resolve(beta.clone().cast(DType::F32))?;
        // burn allocates the output; our kernel fills the same buffer through a resolved view.
        let out = Tensor::<4>::empty([b, c, h, w], (&device, dtype));
        let oc = resolve(out.clone().reshape([b * c * h * w]))?;
        let client = xc.client.clone();

        let partial = client.empty(slices * chunks * 2 * 4);
        let stats_params = client.create_from_slice(&to_bytes(
            &[n as u32, CHUNK as u32, chunks as u32],
            u32::to_le_bytes,
        ));
        let apply_params = client.create_from_slice(&to_bytes(
            &[
                n as u32,
                CHUNK as u32,
                chunks as u32,
                (h * w) as u32,
                (c / groups) as u32,
                groups as u32,
                silu as u32,
                (eps as f32).to_bits(),
            ],
            u32::to_le_bytes,
        ));
        client.launch(
            Box::new(SourceKernel::new(
                GroupNormKernel { source: STATS, f16 },
                CubeDim::new_1d(GROUP),
            )),
            CubeCount::Static(chunks as u32, slices as u32, 1),
            KernelArguments::new()
                .with_buffer(xc.handle.clone().binding())
                .with_buffer(partial.clone().binding())
                .with_buffer(stats_params.binding()),
        );
        client.launch(
            Box::new(SourceKernel::new(
                GroupNormKernel { source: APPLY, f16 },
                CubeDim::new_1d(GROUP),
            )),
            CubeCount::Static(tiles as u32, slices as u32, 1),
            KernelArguments::new()
                .with_buffer(xc.handle.clone().binding())
                .with_buffer(oc.handle.clone().binding())
                .with_buffer(partial.binding())
                .with_buffer(gc.handle.clone().binding())
                .with_buffer(bc.handle.clone().binding())
                .with_buffer(apply_params.binding()),
        );
        Some(out)
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
        // The f16 variants of our typed kernels validate too.
        for (name, source) in WGSL_SOURCES {
            if source.contains(ELEMENT_F32) {
                let f16 = wgsl_for_f16(source);
                let module = naga::front::wgsl::parse_str(&f16)
                    .unwrap_or_else(|e| panic!("{name} (f16): {}", e.emit_to_string(&f16)));
                naga::valid::Validator::new(
                    naga::valid::ValidationFlags::all(),
                    naga::valid::Capabilities::SHADER_FLOAT16,
                )
                .validate(&module)
                .unwrap_or_else(|e| panic!("{name} (f16): {e:?}"));
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
                    // lavapipe (CI) compiles WGSL; a SPIR-V GPU packs with burn ops.
                    if fused_kernels_available(&burn::tensor::Device::wgpu(
                        burn::tensor::DeviceKind::DefaultDevice,
                    )) {
                        PackedBy::Kernel
                    } else {
                        PackedBy::BurnOps
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

    /// Our fused GroupNorm(+SiLU) kernels against burn's op chain, in f32 and f16, for shapes with
    /// one partial chunk and with several chunks and tiles per slice, batch > 1 and a nonzero mean.
    #[test]
    fn fused_group_norm_matches_burn_ops() {
        use crate::nn::{GroupNorm, Kernels};
        let wgpu = burn::tensor::Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
        assert!(!fused_kernels_available(&burn::tensor::Device::flex()));
        if !fused_kernels_available(&wgpu) {
            return; // a SPIR-V device: burn ops only, covered by the plain path's tests
        }
        for (b, c, h, w, groups) in [(2, 8, 3, 5, 4), (1, 64, 70, 70, 32)] {
            let n = b * c * h * w;
            let values: Vec<f32> = (0..n)
                .map(|i| 3.0 + ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * 4.0)
                .collect();
            let gamma: Vec<f32> = (0..c).map(|i| 0.5 + i as f32 / c as f32).collect();
            let beta: Vec<f32> = (0..c).map(|i| (i as f32 - 3.0) / 10.0).collect();
            let vector = |v: &Vec<f32>| {
                Tensor::<1>::from_data(TensorData::new(v.clone(), [c]), (&wgpu, DType::F32))
            };
            let (gamma_t, beta_t) = (vector(&gamma), vector(&beta));
            let mut store = std::collections::HashMap::new();
            store.insert("weight".to_string(), (gamma, vec![c]));
            store.insert("bias".to_string(), (beta, vec![c]));
            for dtype in [DType::F32, DType::F16] {
                let weights = crate::checkpoint::Weights::from_values(store.clone(), &wgpu, dtype);
                let norm = GroupNorm::load(&weights, groups, c, 1e-6).unwrap();
                let x = Tensor::<4>::from_data(
                    TensorData::new(values.clone(), [b, c, h, w]),
                    (&wgpu, dtype),
                );
                for silu in [false, true] {
                    let read = |t: Tensor<4>| {
                        assert_eq!(t.dtype(), dtype);
                        t.cast(DType::F32).into_data().try_to_vec::<f32>().unwrap()
                    };
                    let plain = read(norm.forward_with(x.clone(), silu, Kernels::Plain));
                    let fused = read(
                        group_norm_fused(&x, &gamma_t, &beta_t, groups, 1e-6, silu)
                            .expect("the fused kernels run on wgpu"),
                    );
                    let rel = crate::vae_compile::relative_difference(&fused, &plain);
                    let tol = if dtype == DType::F32 { 1e-4 } else { 1e-2 };
                    assert!(
                        rel <= tol,
                        "{b}x{c}x{h}x{w} {dtype:?} silu={silu}: rel {rel}"
                    );
                }
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
