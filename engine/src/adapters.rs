//! GPU adapters as wgpu reports them, and which one the studio picks.
//!
//! The automatic choice prefers Intel discrete, then other discrete, then Intel integrated, then
//! other integrated, then virtual, then software (lavapipe, WARP, llvmpipe). The choice is a pure
//! function over [`AdapterSummary`] lists so it is tested without hardware.

use std::fmt;

use burn::tensor::DeviceKind;

/// PCI vendor ids.
pub const VENDOR_INTEL: u32 = 0x8086;
pub const VENDOR_NVIDIA: u32 = 0x10de;
pub const VENDOR_AMD: u32 = 0x1002;
pub const VENDOR_APPLE: u32 = 0x106b;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterKind {
    Discrete,
    Integrated,
    Virtual,
    /// A software rasteriser (lavapipe, llvmpipe, WARP, SwiftShader).
    Software,
    Other,
}

impl AdapterKind {
    /// The kind wgpu reports.
    pub fn from_wgpu(device_type: burn::backend::wgpu::wgpu::DeviceType) -> Self {
        use burn::backend::wgpu::wgpu::DeviceType;
        match device_type {
            DeviceType::DiscreteGpu => AdapterKind::Discrete,
            DeviceType::IntegratedGpu => AdapterKind::Integrated,
            DeviceType::VirtualGpu => AdapterKind::Virtual,
            DeviceType::Cpu => AdapterKind::Software,
            DeviceType::Other => AdapterKind::Other,
        }
    }
}

impl fmt::Display for AdapterKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AdapterKind::Discrete => "discrete",
            AdapterKind::Integrated => "integrated",
            AdapterKind::Virtual => "virtual",
            AdapterKind::Software => "software",
            AdapterKind::Other => "other",
        })
    }
}

/// What the studio needs to know about one adapter.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterSummary {
    /// Position in the backend's enumeration order (what `gpu:N` names).
    pub index: usize,
    pub name: String,
    pub vendor: u32,
    pub kind: AdapterKind,
    /// Vulkan, Dx12, Metal or Gl.
    pub backend: String,
    pub driver: String,
    pub max_buffer_size: u64,
    pub max_storage_binding: u64,
    pub shader_f16: bool,
    /// Its largest device-local memory heap in bytes, where Vulkan reports heaps: a discrete
    /// card's VRAM; on an integrated GPU, the share of system memory its driver offers.
    pub device_memory: Option<u64>,
}

impl AdapterSummary {
    pub fn vendor_name(&self) -> &'static str {
        match self.vendor {
            VENDOR_INTEL => "Intel",
            VENDOR_NVIDIA => "NVIDIA",
            VENDOR_AMD => "AMD",
            VENDOR_APPLE => "Apple",
            _ => "other",
        }
    }

    /// Lower is preferred.
    pub fn preference_rank(&self) -> u8 {
        let intel = self.vendor == VENDOR_INTEL;
        match (self.kind, intel) {
            (AdapterKind::Discrete, true) => 0,
            (AdapterKind::Discrete, false) => 1,
            (AdapterKind::Integrated, true) => 2,
            (AdapterKind::Integrated, false) => 3,
            (AdapterKind::Virtual, _) => 4,
            (AdapterKind::Other, _) => 5,
            (AdapterKind::Software, _) => 6,
        }
    }

    /// The burn device kind that selects this adapter: cubecl counts each adapter type from zero
    /// in enumeration order, so the N-th discrete adapter is `DiscreteGpu(N)`.
    pub fn device_kind(&self, all: &[AdapterSummary]) -> DeviceKind {
        let nth = all
            .iter()
            .filter(|a| a.index < self.index && a.kind == self.kind)
            .count();
        match self.kind {
            AdapterKind::Discrete => DeviceKind::DiscreteGpu(nth),
            AdapterKind::Integrated => DeviceKind::IntegratedGpu(nth),
            AdapterKind::Virtual => DeviceKind::VirtualGpu(nth),
            AdapterKind::Software => DeviceKind::Cpu,
            AdapterKind::Other => DeviceKind::DefaultDevice,
        }
    }
}

impl fmt::Display for AdapterSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gpu:{} {} ({}, {}, {}) driver {} | max buffer {} MiB, max storage binding {} MiB, f16 {}, \
             memory {}",
            self.index,
            self.name,
            self.vendor_name(),
            self.kind,
            self.backend,
            if self.driver.is_empty() {
                "?"
            } else {
                &self.driver
            },
            self.max_buffer_size >> 20,
            self.max_storage_binding >> 20,
            if self.shader_f16 { "yes" } else { "no" },
            self.device_memory
                .map_or("unknown".to_string(), |b| format!(
                    "{:.1} GiB",
                    b as f64 / (1u64 << 30) as f64
                )),
        )
    }
}

/// The automatic choice: best rank, first in enumeration order among equals.
pub fn choose_auto(adapters: &[AdapterSummary]) -> Option<&AdapterSummary> {
    adapters
        .iter()
        .min_by_key(|a| (a.preference_rank(), a.index))
}

/// Why an explicit adapter choice (`gpu:N` or a name) matched no single adapter. Each message
/// lists the adapters, so the artist can pick one without running `latent-studio devices`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChooseError {
    #[error("there is no adapter gpu:{index}; adapters: {listing}")]
    NoSuchIndex { index: usize, listing: String },
    #[error("no adapter name contains `{wanted}`; adapters: {listing}")]
    NoMatch { wanted: String, listing: String },
    #[error(
        "`{wanted}` matches several adapters ({candidates}); use a longer part of the name or gpu:N"
    )]
    Ambiguous { wanted: String, candidates: String },
}

/// `gpu:0 Intel(R) Arc(tm) A770, gpu:1 llvmpipe`, or a note that there is none.
fn listing<'a>(adapters: impl IntoIterator<Item = &'a AdapterSummary>) -> String {
    let names: Vec<String> = adapters
        .into_iter()
        .map(|a| format!("gpu:{} {}", a.index, a.name))
        .collect();
    if names.is_empty() {
        "none found (the CPU backend still runs)".into()
    } else {
        names.join(", ")
    }
}

/// `gpu:N` → the adapter with that index; any other text → the one adapter whose name contains
/// it (case-insensitive), e.g. `arc` or `iris`. A name equal to a whole adapter name wins over
/// longer names containing it. `lavapipe` also finds Mesa's software Vulkan, which reports itself
/// as `llvmpipe (LLVM …)`: artists know it by the driver's name.
pub fn choose_named<'a>(
    adapters: &'a [AdapterSummary],
    wanted: &str,
) -> Result<&'a AdapterSummary, ChooseError> {
    if let Some(n) = wanted
        .strip_prefix("gpu:")
        .and_then(|n| n.parse::<usize>().ok())
    {
        return adapters
            .iter()
            .find(|a| a.index == n)
            .ok_or_else(|| ChooseError::NoSuchIndex {
                index: n,
                listing: listing(adapters),
            });
    }
    let needle = wanted.trim().to_lowercase();
    let matching = |needle: &str| -> Vec<&'a AdapterSummary> {
        adapters
            .iter()
            .filter(|a| !needle.is_empty() && a.name.to_lowercase().contains(needle))
            .collect()
    };
    let mut found = matching(&needle);
    if found.is_empty() && needle == "lavapipe" {
        found = matching("llvmpipe");
    }
    if found.len() > 1 {
        let exact: Vec<_> = found
            .iter()
            .filter(|a| a.name.to_lowercase() == needle)
            .collect();
        if let [one] = exact.as_slice() {
            return Ok(one);
        }
    }
    match found.as_slice() {
        [one] => Ok(one),
        [] => Err(ChooseError::NoMatch {
            wanted: wanted.to_string(),
            listing: listing(adapters),
        }),
        several => Err(ChooseError::Ambiguous {
            wanted: wanted.to_string(),
            candidates: listing(several.iter().copied()),
        }),
    }
}

/// `adapter`'s largest device-local memory heap in bytes, where it is a Vulkan adapter.
#[cfg(not(any(target_os = "macos", target_family = "wasm")))]
fn device_memory(adapter: &burn::backend::wgpu::wgpu::Adapter) -> Option<u64> {
    use burn::backend::wgpu::wgpu::hal;
    // SAFETY: the hal adapter is only read, while `adapter` (which owns it) lives.
    let vulkan = unsafe { adapter.as_hal::<hal::api::Vulkan>() }?;
    let instance = vulkan.shared_instance().raw_instance();
    // SAFETY: a physical device of the instance it was enumerated from; a query, no state.
    let properties =
        unsafe { instance.get_physical_device_memory_properties(vulkan.raw_physical_device()) };
    properties
        .memory_heaps_as_slice()
        .iter()
        .filter(|heap| heap.flags.contains(ash::vk::MemoryHeapFlags::DEVICE_LOCAL))
        .map(|heap| heap.size)
        .max()
}

/// Without wgpu's Vulkan backend there are no heaps to read.
#[cfg(any(target_os = "macos", target_family = "wasm"))]
fn device_memory(_adapter: &burn::backend::wgpu::wgpu::Adapter) -> Option<u64> {
    None
}

/// Every adapter of the graphics API the engine runs on (Vulkan where present, then Metal, DX12,
/// GL), in wgpu's enumeration order.
pub fn enumerate() -> Vec<AdapterSummary> {
    use burn::backend::wgpu::wgpu;
    for backend in [
        wgpu::Backends::VULKAN,
        wgpu::Backends::METAL,
        wgpu::Backends::DX12,
        wgpu::Backends::GL,
    ] {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: backend,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapters = pollster_block_on(instance.enumerate_adapters(backend));
        if adapters.is_empty() {
            continue;
        }
        return adapters
            .iter()
            .enumerate()
            .map(|(index, adapter)| {
                let info = adapter.get_info();
                let limits = adapter.limits();
                AdapterSummary {
                    index,
                    name: info.name.clone(),
                    vendor: info.vendor,
                    kind: AdapterKind::from_wgpu(info.device_type),
                    backend: format!("{:?}", info.backend),
                    driver: format!("{} {}", info.driver, info.driver_info)
                        .trim()
                        .to_string(),
                    max_buffer_size: limits.max_buffer_size,
                    max_storage_binding: limits.max_storage_buffer_binding_size,
                    shader_f16: adapter.features().contains(wgpu::Features::SHADER_F16),
                    device_memory: device_memory(adapter),
                }
            })
            .collect();
    }
    Vec::new()
}

/// The wgpu instance and adapter behind a summary [`enumerate`] made (same backend, same index),
/// for opening a device of our own on it (see [`crate::device::open_limited`]).
pub(crate) fn wgpu_adapter(
    summary: &AdapterSummary,
) -> Option<(
    burn::backend::wgpu::wgpu::Instance,
    burn::backend::wgpu::wgpu::Adapter,
)> {
    use burn::backend::wgpu::wgpu;
    let backend = [
        wgpu::Backend::Vulkan,
        wgpu::Backend::Metal,
        wgpu::Backend::Dx12,
        wgpu::Backend::Gl,
    ]
    .into_iter()
    .find(|b| format!("{b:?}") == summary.backend)?;
    let backend = wgpu::Backends::from(backend);
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: backend,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let adapter = pollster_block_on(instance.enumerate_adapters(backend))
        .into_iter()
        .nth(summary.index)?;
    (adapter.get_info().name == summary.name).then_some((instance, adapter))
}

/// Drives a wgpu future that completes without a runtime (native enumeration is synchronous).
pub(crate) fn pollster_block_on<F: std::future::Future>(future: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Noop;
    impl Wake for Noop {
        fn wake(self: std::sync::Arc<Self>) {}
    }
    let waker = Waker::from(std::sync::Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(v) = future.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter(index: usize, name: &str, vendor: u32, kind: AdapterKind) -> AdapterSummary {
        AdapterSummary {
            index,
            name: name.into(),
            vendor,
            kind,
            backend: "Vulkan".into(),
            driver: String::new(),
            max_buffer_size: 1 << 30,
            max_storage_binding: 1 << 27,
            shader_f16: true,
            device_memory: None,
        }
    }

    #[test]
    fn intel_discrete_first_then_discrete_then_intel_integrated() {
        use AdapterKind::*;
        let laptop = [
            adapter(0, "llvmpipe (LLVM 15.0.6, 256 bits)", 0x10005, Software),
            adapter(
                1,
                "NVIDIA GeForce RTX 3050 Laptop GPU",
                VENDOR_NVIDIA,
                Discrete,
            ),
            adapter(2, "Intel(R) Iris(R) Xe Graphics", VENDOR_INTEL, Integrated),
            adapter(3, "Intel(R) Arc(tm) A770 Graphics", VENDOR_INTEL, Discrete),
        ];
        assert_eq!(choose_auto(&laptop).unwrap().index, 3);
        assert_eq!(choose_auto(&laptop[..3]).unwrap().index, 1);
        let no_discrete = [laptop[0].clone(), laptop[2].clone()];
        assert_eq!(choose_auto(&no_discrete).unwrap().index, 2);
        let amd_igpu = [
            adapter(0, "AMD Radeon 780M", VENDOR_AMD, Integrated),
            adapter(1, "Intel(R) Graphics (MTL)", VENDOR_INTEL, Integrated),
        ];
        assert_eq!(
            choose_auto(&amd_igpu).unwrap().index,
            1,
            "Intel integrated before others"
        );
        assert_eq!(
            choose_auto(&laptop[..1]).unwrap().kind,
            Software,
            "software last, but used"
        );
        assert!(choose_auto(&[]).is_none());
    }

    #[test]
    fn explicit_choices_and_device_kinds() {
        use AdapterKind::*;
        let all = [
            adapter(0, "NVIDIA H200", VENDOR_NVIDIA, Discrete),
            adapter(1, "Intel(R) Arc(tm) B580 Graphics", VENDOR_INTEL, Discrete),
            adapter(2, "Intel(R) Iris(R) Xe Graphics", VENDOR_INTEL, Integrated),
            adapter(3, "llvmpipe", 0x10005, Software),
        ];
        assert_eq!(choose_named(&all, "gpu:2").unwrap().index, 2);
        assert_eq!(choose_named(&all, "ARC").unwrap().index, 1);
        assert_eq!(choose_named(&all, "iris").unwrap().index, 2);
        assert_eq!(choose_named(&all, " Iris ").unwrap().index, 2);
        // cubecl counts each kind from zero.
        assert_eq!(all[1].device_kind(&all), DeviceKind::DiscreteGpu(1));
        assert_eq!(all[2].device_kind(&all), DeviceKind::IntegratedGpu(0));
        assert_eq!(all[3].device_kind(&all), DeviceKind::Cpu);
        assert!(all[1].to_string().contains("Intel, discrete, Vulkan"));
    }

    #[test]
    fn names_resolve_to_one_adapter_or_a_clear_error() {
        use AdapterKind::*;
        let all = [
            adapter(0, "NVIDIA H200", VENDOR_NVIDIA, Discrete),
            adapter(1, "Intel(R) Arc(tm) B580 Graphics", VENDOR_INTEL, Discrete),
            adapter(2, "Intel(R) Iris(R) Xe Graphics", VENDOR_INTEL, Integrated),
            adapter(3, "llvmpipe (LLVM 15.0.6, 256 bits)", 0x10005, Software),
        ];
        // Mesa's software Vulkan by either of its names.
        assert_eq!(choose_named(&all, "llvmpipe").unwrap().index, 3);
        assert_eq!(choose_named(&all, "LavaPipe").unwrap().index, 3);

        let e = choose_named(&all, "radeon").unwrap_err();
        assert!(matches!(e, ChooseError::NoMatch { .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("`radeon`"), "{text}");
        for a in &all {
            assert!(text.contains(&a.name), "lists every adapter: {text}");
        }

        let e = choose_named(&all, "intel").unwrap_err();
        assert!(matches!(e, ChooseError::Ambiguous { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("gpu:1 Intel(R) Arc") && text.contains("gpu:2 Intel(R) Iris"),
            "names the candidates: {text}"
        );
        assert!(!text.contains("NVIDIA"), "only the candidates: {text}");

        let e = choose_named(&all, "gpu:9").unwrap_err();
        assert!(e.to_string().contains("no adapter gpu:9"), "{e}");
        assert!(
            choose_named(&all, "").is_err(),
            "an empty name matches nothing"
        );
        assert!(
            choose_named(&[], "arc")
                .unwrap_err()
                .to_string()
                .contains("none found")
        );

        // Two cards with one name: a whole-name match is still ambiguous, gpu:N is not.
        let twins = [
            adapter(0, "Intel(R) Arc(tm) A770 Graphics", VENDOR_INTEL, Discrete),
            adapter(1, "Intel(R) Arc(tm) A770 Graphics", VENDOR_INTEL, Discrete),
        ];
        assert!(choose_named(&twins, "a770").is_err());
        assert!(choose_named(&twins, "Intel(R) Arc(tm) A770 Graphics").is_err());
        assert_eq!(choose_named(&twins, "gpu:1").unwrap().index, 1);
        // A whole name wins over a longer name containing it.
        let prefix = [
            adapter(0, "Intel(R) Graphics", VENDOR_INTEL, Integrated),
            adapter(1, "Intel(R) Graphics (MTL)", VENDOR_INTEL, Integrated),
        ];
        assert_eq!(choose_named(&prefix, "intel(r) graphics").unwrap().index, 0);
    }
}
