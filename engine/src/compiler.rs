//! Which shader compiler each adapter gets, chosen at run time by one pure function.
//!
//! Every build carries cubecl's SPIR-V compiler (cooperative matrices, the fast path on real
//! GPUs) and its WGSL compiler. SPIR-V goes to hardware Vulkan adapters; WGSL to software
//! adapters (lavapipe/llvmpipe crash creating SPIR-V pipelines, SwiftShader, WARP) and to every
//! other graphics API. `LATENT_STUDIO_COMPILER=wgsl` forces WGSL everywhere (to measure the
//! portable SIMT path on a GPU that has cooperative matrices, or to work around a driver).
//! The choice reaches cubecl through our patch's `set_spirv_policy` (patches/README.md).

use std::fmt;
use std::sync::Once;

use burn::backend::wgpu::wgpu;

use crate::adapters::{AdapterKind, AdapterSummary};

/// The variable that overrides the automatic choice: `wgsl` or `auto`.
pub const COMPILER_ENV: &str = "LATENT_STUDIO_COMPILER";

/// The language cubecl compiles our and burn's kernels to on one adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShaderCompiler {
    /// SPIR-V passed to the Vulkan driver as is, with cooperative matrices where it has them.
    SpirV,
    /// WGSL translated by naga: every kernel, no cooperative matrices (the SIMT path).
    Wgsl,
}

impl fmt::Display for ShaderCompiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ShaderCompiler::SpirV => "SPIR-V",
            ShaderCompiler::Wgsl => "WGSL",
        })
    }
}

/// What the environment asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CompilerOverride {
    #[default]
    Auto,
    Wgsl,
}

impl CompilerOverride {
    /// Reads [`COMPILER_ENV`]; an unknown value is `Auto` with a warning.
    pub fn from_env() -> Self {
        match std::env::var(COMPILER_ENV) {
            Ok(v) => Self::parse(&v).unwrap_or_else(|| {
                tracing::warn!("{COMPILER_ENV}={v} is neither `auto` nor `wgsl`; using auto");
                Self::Auto
            }),
            Err(_) => Self::Auto,
        }
    }

    fn parse(value: &str) -> Option<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Some(Self::Auto),
            "wgsl" => Some(Self::Wgsl),
            _ => None,
        }
    }
}

/// Names software rasterisers report even where the device type says otherwise.
pub(crate) fn software_by_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "llvmpipe",
        "lavapipe",
        "swiftshader",
        "microsoft basic render",
    ]
    .iter()
    .any(|s| name.contains(s))
}

/// The choice (pure): SPIR-V for a hardware adapter on Vulkan unless WGSL is forced, WGSL
/// otherwise. `backend` is wgpu's backend name (`Vulkan`, `Metal`, `Dx12`, `Gl`).
pub fn choose(
    backend: &str,
    kind: AdapterKind,
    name: &str,
    over: CompilerOverride,
) -> ShaderCompiler {
    let software = kind == AdapterKind::Software || software_by_name(name);
    if over == CompilerOverride::Auto && backend.eq_ignore_ascii_case("vulkan") && !software {
        ShaderCompiler::SpirV
    } else {
        ShaderCompiler::Wgsl
    }
}

/// The compiler an adapter `latent-studio devices` lists will get in this process.
pub fn for_adapter(adapter: &AdapterSummary) -> ShaderCompiler {
    choose(
        &adapter.backend,
        adapter.kind,
        &adapter.name,
        CompilerOverride::from_env(),
    )
}

/// The cooperative-matrix shapes the adapter's driver reports (`m×n×k in→acc`, as
/// VK_KHR_cooperative_matrix lists them; Arc's differ from NVIDIA's), read without opening a
/// device. Empty where there are none (Iris Xe, Meteor Lake, software adapters).
pub fn cooperative_matrices(adapter: &AdapterSummary) -> Vec<String> {
    let Some((_instance, wgpu_adapter)) = crate::adapters::wgpu_adapter(adapter) else {
        return Vec::new();
    };
    if !wgpu_adapter
        .features()
        .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
    {
        return Vec::new();
    }
    let mut shapes: Vec<String> = wgpu_adapter
        .cooperative_matrix_properties()
        .iter()
        .map(|p| {
            format!(
                "{}x{}x{} {:?}->{:?}",
                p.m_size, p.n_size, p.k_size, p.ab_type, p.cr_type
            )
            .to_lowercase()
        })
        .collect();
    shapes.sort();
    shapes.dedup();
    shapes
}

/// Whether cooperative matrices are switched off (`LATENT_STUDIO_CMMA=off`): [`install`] hides
/// them from cubecl's Vulkan (SPIR-V) devices, and our kernels route as on a device without
/// them everywhere.
pub fn cooperative_matrices_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| {
        std::env::var("LATENT_STUDIO_CMMA").is_ok_and(|v| v.trim().eq_ignore_ascii_case("off"))
    })
}

/// The policy handed to cubecl: whether this Vulkan adapter uses SPIR-V.
fn policy(info: &wgpu::AdapterInfo) -> bool {
    let backend = format!("{:?}", info.backend);
    let kind = AdapterKind::from_wgpu(info.device_type);
    choose(&backend, kind, &info.name, CompilerOverride::from_env()) == ShaderCompiler::SpirV
}

/// Installs [`policy`] in cubecl, once per process. Every function of the engine that opens a
/// device calls it first; code that opens one earlier gets the patch's default, which only
/// differs in the name check and the override.
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if !burn::cubecl::wgpu::set_spirv_policy(policy) {
            tracing::warn!("a shader compiler policy was already installed");
        }
        // Hidden from cubecl too, so burn's autotune offers no cooperative-matrix kernel either.
        burn::cubecl::wgpu::set_cooperative_matrices_off(cooperative_matrices_off());
        // Debug builds (the tests) compile our kernels to SPIR-V as well where they run as WGSL:
        // lavapipe cannot run SPIR-V, so a kernel only the SPIR-V compiler rejects (the route
        // of every hardware Vulkan adapter) would otherwise pass CI (BENCHMARKS.md, thirty-sixth
        // session, call 4).
        if cfg!(debug_assertions) {
            burn::cubecl::wgpu::set_spirv_shadow(ours);
        }
        if pipeline_statistics_wanted() {
            burn::cubecl::wgpu::set_pipeline_statistics(print_statistics);
        }
    });
}

/// Whether `LATENT_STUDIO_PIPELINE_STATS=1` asks for every SPIR-V kernel's compile statistics
/// (registers, spills… as the driver names them; `VK_KHR_pipeline_executable_properties`): a
/// diagnostic for kernel work, since how many registers a kernel holds decides how many of its
/// cubes an SM keeps resident, and no timing shows it.
fn pipeline_statistics_wanted() -> bool {
    std::env::var("LATENT_STUDIO_PIPELINE_STATS").is_ok_and(|v| v.trim() == "1")
}

/// Prints one line a kernel to stderr, where the bench's log collects it.
fn print_statistics(entry: &str, stats: &[(String, String)]) {
    let stats: Vec<String> = stats.iter().map(|(k, v)| format!("{k}={v}")).collect();
    eprintln!("pipeline statistics {entry}: {}", stats.join(", "));
}

/// Whether a kernel (by its type name) is one of the engine's own.
fn ours(kernel: &str) -> bool {
    kernel.starts_with("latent_engine::")
}

/// What a device really compiles to, read from its runtime after it opened: the runtime's name
/// (`wgpu<spirv>` / `wgpu<wgsl>`) and the cooperative-matrix shapes it will use (m×n×k per
/// input type), empty where there are none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceCompiler {
    pub runtime: String,
    pub cmma: Vec<String>,
}

impl DeviceCompiler {
    pub fn compiler(&self) -> ShaderCompiler {
        if self.runtime.contains("spirv") {
            ShaderCompiler::SpirV
        } else {
            ShaderCompiler::Wgsl
        }
    }
}

impl fmt::Display for DeviceCompiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.compiler())?;
        if self.cmma.is_empty() {
            f.write_str(", no cooperative matrices (SIMT kernels)")
        } else {
            write!(f, ", cooperative matrices {}", self.cmma.join(" "))
        }
    }
}

/// The compiler and cooperative-matrix shapes of an opened wgpu device; `None` on the CPU
/// backend. Opens the device if it is not open yet (a tiny upload).
pub fn of_device(device: &burn::tensor::Device) -> Option<DeviceCompiler> {
    use burn::backend::Wgpu;
    use burn::backend::wgpu::CubeBackend;
    use burn::tensor::Tensor;
    // On the CPU backend the tensor below is no wgpu tensor: `None`.
    install();
    let probe = Tensor::<1>::zeros([1], device);
    let fusion = probe.try_into_primitive::<Wgpu>().ok()?;
    let fusion_client = fusion.client.clone();
    let tensor = fusion_client.resolve_tensor_float::<CubeBackend>(fusion);
    let client = &tensor.client;
    let mut cmma: Vec<String> = client
        .features()
        .matmul
        .cmma
        .iter()
        .map(|c| format!("{}x{}x{} {:?}->{:?}", c.m, c.n, c.k, c.a_type, c.cd_type).to_lowercase())
        .collect();
    cmma.sort();
    cmma.dedup();
    Some(DeviceCompiler {
        runtime: client.name().to_string(),
        cmma,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hardware_vulkan_gets_spirv_and_everything_else_wgsl() {
        use AdapterKind::*;
        use CompilerOverride::Auto;
        let arc = "Intel(R) Arc(tm) A770 Graphics (DG2)";
        assert_eq!(choose("Vulkan", Discrete, arc, Auto), ShaderCompiler::SpirV);
        assert_eq!(
            choose("Vulkan", Integrated, "Intel(R) Iris(R) Xe Graphics", Auto),
            ShaderCompiler::SpirV
        );
        assert_eq!(
            choose("Vulkan", Discrete, "NVIDIA H200", Auto),
            ShaderCompiler::SpirV
        );
        // Software adapters, by type or by name whatever type they claim.
        let lavapipe = "llvmpipe (LLVM 15.0.6, 256 bits)";
        assert_eq!(
            choose("Vulkan", Software, lavapipe, Auto),
            ShaderCompiler::Wgsl
        );
        assert_eq!(
            choose("Vulkan", Other, lavapipe, Auto),
            ShaderCompiler::Wgsl
        );
        assert_eq!(
            choose("Vulkan", Other, "SwiftShader Device (Subzero)", Auto),
            ShaderCompiler::Wgsl
        );
        // Other graphics APIs have no SPIR-V path in cubecl-wgpu.
        for backend in ["Metal", "Dx12", "Gl"] {
            assert_eq!(choose(backend, Discrete, arc, Auto), ShaderCompiler::Wgsl);
        }
        // The override forces the portable path on hardware too.
        assert_eq!(
            choose("Vulkan", Discrete, arc, CompilerOverride::Wgsl),
            ShaderCompiler::Wgsl
        );
    }

    #[test]
    fn override_values_parse() {
        assert_eq!(
            CompilerOverride::parse("WGSL"),
            Some(CompilerOverride::Wgsl)
        );
        assert_eq!(
            CompilerOverride::parse(" auto "),
            Some(CompilerOverride::Auto)
        );
        assert_eq!(CompilerOverride::parse(""), Some(CompilerOverride::Auto));
        assert_eq!(CompilerOverride::parse("spirv"), None);
    }

    /// The same binary that compiles SPIR-V for GPUs drives lavapipe through WGSL (CI has it).
    #[test]
    fn lavapipe_opens_with_wgsl_and_computes() {
        use crate::device::DeviceChoice;
        let all = crate::adapters::enumerate();
        let Some(lavapipe) = all.iter().find(|a| a.kind == AdapterKind::Software) else {
            eprintln!("no software adapter here; skipped");
            return;
        };
        assert_eq!(for_adapter(lavapipe), ShaderCompiler::Wgsl);
        let device = crate::device::create(&DeviceChoice::Gpu(Some(lavapipe.index))).unwrap();
        let compiler = of_device(&device).expect("a wgpu device");
        assert_eq!(compiler.compiler(), ShaderCompiler::Wgsl, "{compiler:?}");
        assert!(compiler.cmma.is_empty(), "{compiler:?}");
        assert!(crate::device::warm_up(&device).unwrap().is_finite());
    }

    #[test]
    fn runtime_names_map_to_compilers() {
        let spirv = DeviceCompiler {
            runtime: "wgpu<spirv>".into(),
            cmma: vec!["16x16x16 f16->f32".into()],
        };
        assert_eq!(spirv.compiler(), ShaderCompiler::SpirV);
        assert_eq!(
            spirv.to_string(),
            "SPIR-V, cooperative matrices 16x16x16 f16->f32"
        );
        let wgsl = DeviceCompiler {
            runtime: "wgpu<wgsl>".into(),
            cmma: vec![],
        };
        assert_eq!(wgsl.compiler(), ShaderCompiler::Wgsl);
        assert!(wgsl.to_string().contains("no cooperative matrices"));
    }
}
