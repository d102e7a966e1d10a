//! Choosing the burn device the engine runs on, and opening it under a watchdog.
//!
//! burn's devices are lazy: the adapter is opened, and its first kernels JIT-compiled, at the
//! first tensor operation. On some drivers (Meteor Lake iGPUs without ahead-of-time kernels) that
//! takes minutes or never ends, so [`create_watched`] runs the opening and a tiny real computation
//! ([`warm_up`]) on a helper thread and gives up after a timeout with a message naming the adapter.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use burn::tensor::{DType, Device, Tensor, TensorData};

use crate::adapters::AdapterSummary;
use crate::error::{Error, Result};
use crate::limits::DeviceLimits;

mod memory;
pub mod tuning;
pub use memory::{device_memory, loaded, persistent, release_free};

/// How long opening a device and compiling its first kernels may take by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The engine's one test seam (the app has its own, `test_seam`): when this variable is set, the
/// watched sections of opening a device never finish, as a driver stuck compiling would. Unset
/// (every real run), [`hang_here_for_tests`] returns at once.
pub const TEST_HANG_ENV: &str = "LATENT_STUDIO_TEST_HANG_DEVICE";

/// Parks the calling thread forever when [`TEST_HANG_ENV`] is set.
fn hang_here_for_tests() {
    if std::env::var_os(TEST_HANG_ENV).is_some() {
        loop {
            std::thread::park();
        }
    }
}

/// What the artist asked for: `auto`, `cpu`, `gpu`, `gpu:N`, or part of an adapter's name
/// (`arc`, `iris`, `lavapipe`), matched case-insensitively.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    #[default]
    Auto,
    Cpu,
    Gpu(Option<usize>),
    /// Part of an adapter name, as typed; resolved by [`crate::adapters::choose_named`].
    Named(String),
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim() {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "gpu" => Ok(DeviceChoice::Gpu(None)),
            "" => Err("empty device (use auto, cpu, gpu, gpu:N or part of an adapter name)".into()),
            other => match other.strip_prefix("gpu:") {
                Some(n) => n
                    .parse::<usize>()
                    .map(|n| DeviceChoice::Gpu(Some(n)))
                    .map_err(|_| {
                        format!("unknown device `{other}` (gpu:N wants an adapter number)")
                    }),
                None => Ok(DeviceChoice::Named(other.to_string())),
            },
        }
    }
}

impl std::fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceChoice::Auto => f.write_str("auto"),
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Gpu(None) => f.write_str("gpu"),
            DeviceChoice::Gpu(Some(n)) => write!(f, "gpu:{n}"),
            DeviceChoice::Named(name) => f.write_str(name),
        }
    }
}

/// What a choice resolves to on this machine.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// burn's CPU backend.
    Cpu,
    /// wgpu's own default adapter (`--device gpu`).
    DefaultGpu,
    Adapter(AdapterSummary),
}

impl Target {
    /// How messages name it.
    pub fn label(&self) -> String {
        match self {
            Target::Cpu => "burn's CPU backend".into(),
            Target::DefaultGpu => "the default GPU adapter".into(),
            Target::Adapter(a) => format!("gpu:{} {}", a.index, a.name),
        }
    }
}

/// Resolves a choice against the adapters `latent-studio devices` lists (pure, for tests).
/// `Auto` picks by [`crate::adapters::choose_auto`] (Intel discrete first) and falls back to the
/// CPU backend without any usable adapter; explicit choices that match nothing are errors.
/// Software adapters are usable: they get WGSL ([`crate::compiler::choose`]).
pub fn resolve(choice: &DeviceChoice, all: &[AdapterSummary]) -> Result<Target> {
    use crate::adapters::{choose_auto, choose_named};
    match choice {
        DeviceChoice::Cpu => Ok(Target::Cpu),
        DeviceChoice::Gpu(None) => Ok(Target::DefaultGpu),
        DeviceChoice::Auto => {
            Ok(choose_auto(all).map_or(Target::Cpu, |a| Target::Adapter(a.clone())))
        }
        DeviceChoice::Gpu(Some(n)) => choose_named(all, &format!("gpu:{n}"))
            .map(|a| Target::Adapter(a.clone()))
            .map_err(|e| Error::Device(e.to_string())),
        DeviceChoice::Named(name) => choose_named(all, name)
            .map(|a| Target::Adapter(a.clone()))
            .map_err(|e| Error::Device(e.to_string())),
    }
}

/// The (lazy) burn device for a resolved target.
pub fn open(target: &Target, all: &[AdapterSummary]) -> Device {
    use burn::tensor::DeviceKind;
    crate::compiler::install();
    restore_tuning(target);
    match target {
        Target::Cpu => Device::flex(),
        Target::DefaultGpu => Device::wgpu(DeviceKind::DefaultDevice),
        Target::Adapter(a) => {
            let device = Device::wgpu(a.device_kind(all));
            memory::remember_size(&device, a.device_memory);
            device
        }
    }
}

/// Puts back the kernel tuning a previous launch saved for `target` ([`tuning`]), before its
/// first kernel runs.
fn restore_tuning(target: &Target) {
    if let Some(identity) = tuning_identity(target, crate::compiler::cooperative_matrices_off()) {
        tuning::restore(&identity);
    }
}

/// What kernel tuning is kept per: the adapter, its driver, the compiler and whether cooperative
/// matrices are hidden (`LATENT_STUDIO_CMMA=off`). A result tuned with them names a kernel that
/// cannot launch without them: restored into a process that hides them, burn's attention
/// failed at its first step (BENCHMARKS.md, fifty-first session). `None` on the CPU.
fn tuning_identity(target: &Target, cmma_off: bool) -> Option<String> {
    let identity = match target {
        Target::Cpu => return None,
        Target::DefaultGpu => format!(
            "default-gpu|{:?}",
            crate::compiler::CompilerOverride::from_env()
        ),
        Target::Adapter(a) => format!(
            "{}|{}|{}|{}",
            a.name,
            a.backend,
            a.driver,
            crate::compiler::for_adapter(a)
        ),
    };
    Some(match cmma_off {
        true => format!("{identity}|cooperative matrices off"),
        false => identity,
    })
}

/// Opens `adapter` as a wgpu device whose buffer and storage-binding limits are lowered to
/// `limits` (never raised above the adapter's), registers it with burn and remembers its limits
/// for [`DeviceLimits::of`]. It behaves like a device with smaller limits would: wgpu refuses any
/// buffer above them. Tests use it to check the engine stays under WebGPU's defaults.
///
/// The device asks for the features cubecl's WGSL runtime asks for, so only adapters that get
/// WGSL can be opened this way: cubecl's SPIR-V runtime creates its Vulkan device itself, with
/// extensions an imported device would lack.
pub fn open_limited(adapter: &AdapterSummary, limits: DeviceLimits) -> Result<Device> {
    crate::compiler::install();
    if crate::compiler::for_adapter(adapter) != crate::compiler::ShaderCompiler::Wgsl {
        return Err(Error::Device(format!(
            "{} compiles SPIR-V; a device with lowered limits needs a WGSL adapter \
             (set {}=wgsl)",
            adapter.name,
            crate::compiler::COMPILER_ENV
        )));
    }
    use burn::tensor::wgpu::{MemoryConfiguration, WgpuSetup, wgpu};
    let (instance, wgpu_adapter) = crate::adapters::wgpu_adapter(adapter)
        .ok_or_else(|| Error::Device(format!("adapter gpu:{} is gone", adapter.index)))?;
    let mut required = wgpu_adapter.limits();
    required.max_buffer_size = required.max_buffer_size.min(limits.max_buffer_bytes);
    required.max_storage_buffer_binding_size = required
        .max_storage_buffer_binding_size
        .min(limits.max_binding_bytes);
    let granted = DeviceLimits {
        max_buffer_bytes: required.max_buffer_size,
        max_binding_bytes: required.max_storage_buffer_binding_size,
    };
    let descriptor = wgpu::DeviceDescriptor {
        label: Some("latent-studio (lowered limits)"),
        // As cubecl's WGSL runtime: everything but mappable primary buffers.
        required_features: wgpu_adapter
            .features()
            .difference(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS),
        required_limits: required,
        memory_hints: wgpu::MemoryHints::MemoryUsage,
        trace: wgpu::Trace::Off,
        experimental_features: wgpu::ExperimentalFeatures::disabled(),
    };
    let (device, queue) =
        crate::adapters::pollster_block_on(wgpu_adapter.request_device(&descriptor))
            .map_err(|e| Error::Device(format!("{}: {e}", adapter.name)))?;
    let backend = wgpu_adapter.get_info().backend;
    let options = Device::wgpu_options().setup(WgpuSetup {
        instance,
        adapter: wgpu_adapter,
        device,
        queue,
        backend,
    });
    // cubecl's default layout keeps small allocations on a fixed 8 MiB page whatever the
    // device's limits; below that, one page per allocation is the layout that fits.
    let options = if granted.max_buffer_bytes < CUBECL_SMALL_PAGE {
        options.memory_config(MemoryConfiguration::ExclusivePages)
    } else {
        options
    };
    let device = options
        .init()
        .map_err(|e| Error::Device(format!("{}: {e}", adapter.name)))?;
    DeviceLimits::remember(&device, granted);
    Ok(device)
}

/// The page cubecl's adaptive memory layout puts small allocations on (cubecl-server's
/// `SMALL_PAGE`), whatever the device's largest buffer.
const CUBECL_SMALL_PAGE: u64 = 8 << 20;

/// Makes the burn device for a choice without opening it (see [`create_watched`] for the
/// opening under a watchdog). `gpu:N` is the N-th adapter `latent-studio devices` lists.
pub fn create(choice: &DeviceChoice) -> Result<Device> {
    let all = needs_adapters(choice)
        .then(crate::adapters::enumerate)
        .unwrap_or_default();
    Ok(open(&resolve(choice, &all)?, &all))
}

/// `cpu` needs no adapter list (enumerating Vulkan costs time and can itself misbehave).
fn needs_adapters(choice: &DeviceChoice) -> bool {
    !matches!(choice, DeviceChoice::Cpu | DeviceChoice::Gpu(None))
}

/// A tiny real computation: a matmul and a 3x3 convolution, read back to the host. It makes a
/// lazy device open its adapter and JIT-compile (and cache) a few kernels, so a driver that hangs
/// or fails there does so inside the watched section. Returns one output value.
pub fn warm_up(device: &Device) -> Result<f32> {
    use burn::tensor::module::conv2d;
    use burn::tensor::ops::ConvOptions;
    let ramp = |n: usize| -> Vec<f32> { (0..n).map(|i| (i % 7) as f32 * 0.25 - 0.5).collect() };
    let a = Tensor::<2>::from_data(TensorData::new(ramp(64), [8, 8]), (device, DType::F32));
    let b = Tensor::<2>::from_data(TensorData::new(ramp(64), [8, 8]), (device, DType::F32));
    let x = a.matmul(b).reshape([1, 1, 8, 8]); // [1, 1, 8, 8]
    let w = Tensor::<4>::from_data(
        TensorData::new(ramp(18), [2, 1, 3, 3]),
        (device, DType::F32),
    );
    let y = conv2d(x, w, None, ConvOptions::new([1, 1], [1, 1], [1, 1], 1)); // [1, 2, 8, 8]
    let v = y
        .sum()
        .into_data()
        .try_to_vec::<f32>()
        .map_err(|e| Error::Device(format!("cannot read a result back: {e:?}")))?;
    match v.first() {
        Some(v) if v.is_finite() => Ok(*v),
        other => Err(Error::Device(format!(
            "the first computation returned {other:?} instead of a finite number"
        ))),
    }
}

/// Runs `work` on a named helper thread and waits for it at most `timeout`. `Err(())` means it
/// did not finish (or panicked). A thread cannot be killed: on timeout it is left running,
/// detached; it ends with the process. That is the price of never blocking the caller on a stuck
/// driver call.
pub fn watchdog<T: Send + 'static>(
    timeout: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> std::result::Result<T, WatchdogError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("device-watchdog".into())
        .spawn(move || {
            // The receiver may be gone after a timeout; nobody wants the result then.
            let _ = tx.send(work());
        })
        .map_err(|e| WatchdogError::Spawn(e.to_string()))?;
    rx.recv_timeout(timeout).map_err(|e| match e {
        std::sync::mpsc::RecvTimeoutError::Timeout => WatchdogError::TimedOut,
        std::sync::mpsc::RecvTimeoutError::Disconnected => WatchdogError::Panicked,
    })
}

/// Why [`watchdog`] returned no value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchdogError {
    TimedOut,
    Panicked,
    Spawn(String),
}

/// Resolves `choice`, opens the device and runs [`warm_up`] on it, all under [`watchdog`]: an
/// adapter that does not finish within `timeout` becomes [`Error::DeviceTimeout`] naming it (the
/// stuck thread stays behind, detached). Enumeration is inside the watched section too: it
/// talks to the drivers.
pub fn create_watched(choice: &DeviceChoice, timeout: Duration) -> Result<Device> {
    // The helper thread names the adapter here once it knows it, for the timeout message.
    let label = Arc::new(Mutex::new(format!("the adapter chosen as `{choice}`")));
    let shared = label.clone();
    let owned = choice.clone();
    let result = watchdog(timeout, move || -> Result<Device> {
        let all = needs_adapters(&owned)
            .then(crate::adapters::enumerate)
            .unwrap_or_default();
        let target = resolve(&owned, &all)?;
        if let Ok(mut l) = shared.lock() {
            *l = target.label();
        }
        hang_here_for_tests();
        let device = open(&target, &all);
        warm_up(&device)?;
        Ok(device)
    });
    let adapter = label.lock().map(|l| l.clone()).unwrap_or_default();
    watched_result(result, &adapter, timeout)
}

/// Turns a watchdog outcome into the engine's errors, naming the adapter.
fn watched_result<T>(
    result: std::result::Result<Result<T>, WatchdogError>,
    adapter: &str,
    timeout: Duration,
) -> Result<T> {
    match result {
        Ok(r) => r,
        Err(WatchdogError::TimedOut) => Err(Error::DeviceTimeout {
            adapter: adapter.to_string(),
            secs: timeout.as_secs_f64(),
        }),
        Err(WatchdogError::Panicked) => Err(Error::DevicePanicked {
            adapter: adapter.to_string(),
        }),
        Err(WatchdogError::Spawn(e)) => Err(Error::Device(format!(
            "cannot start the device thread: {e}"
        ))),
    }
}

/// Runs [`warm_up`] on an already opened device under [`watchdog`]: the first kernels of a
/// device opened elsewhere (see [`open_shared`]) are compiled here, and a driver stuck doing so
/// becomes [`Error::DeviceTimeout`] naming `label`.
pub fn warm_up_watched(device: &Device, label: &str, timeout: Duration) -> Result<()> {
    let owned = device.clone();
    let result = watchdog(timeout, move || {
        hang_here_for_tests();
        warm_up(&owned).map(|_| ())
    });
    watched_result(result, label, timeout)
}

/// A GPU device the engine opened together with its wgpu handles, so that another wgpu user
/// (the studio's window, through `egui_wgpu::WgpuSetup::Existing`) renders with the same device
/// and queue instead of opening a second one: one driver context, one memory pool (which matters
/// on integrated GPUs that share the system's memory), one adapter chosen by the engine's rules.
#[derive(Clone)]
pub struct SharedGpu {
    /// What was opened, as resolved (never `Auto`).
    pub choice: DeviceChoice,
    /// How messages name the adapter.
    pub label: String,
    pub device: Device,
    /// The exact handles burn's runtime uses for `device`.
    pub setup: burn::tensor::wgpu::WgpuSetup,
}

impl std::fmt::Debug for SharedGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedGpu")
            .field("choice", &self.choice)
            .field("label", &self.label)
            .field("device", &self.device)
            .field("backend", &self.setup.backend)
            .finish()
    }
}

/// Opens the GPU device for `choice` eagerly and returns it with its wgpu handles for sharing,
/// under [`watchdog`] (adapter and device creation talk to the driver). `Ok(None)` when the
/// choice resolves to the CPU backend: there is nothing to share. A runtime registers a device
/// kind once per process, so opening the same adapter again returns the first registration.
/// The first kernels are not compiled here: see [`warm_up_watched`].
pub fn open_shared(choice: &DeviceChoice, timeout: Duration) -> Result<Option<SharedGpu>> {
    use burn::tensor::DeviceKind;
    static OPENED: Mutex<Vec<(String, SharedGpu)>> = Mutex::new(Vec::new());
    let label = Arc::new(Mutex::new(format!("the adapter chosen as `{choice}`")));
    let shared_label = label.clone();
    let owned = choice.clone();
    crate::compiler::install();
    let result = watchdog(timeout, move || -> Result<Option<SharedGpu>> {
        let all = needs_adapters(&owned)
            .then(crate::adapters::enumerate)
            .unwrap_or_default();
        let target = resolve(&owned, &all)?;
        if let Ok(mut l) = shared_label.lock() {
            *l = target.label();
        }
        let kind = match &target {
            Target::Cpu => return Ok(None),
            Target::DefaultGpu => DeviceKind::DefaultDevice,
            Target::Adapter(a) => a.device_kind(&all),
        };
        let key = format!("{kind:?}");
        let mut opened = OPENED
            .lock()
            .map_err(|_| Error::Device("the shared device registry is poisoned".into()))?;
        if let Some((_, gpu)) = opened.iter().find(|(k, _)| *k == key) {
            return Ok(Some(gpu.clone()));
        }
        hang_here_for_tests();
        restore_tuning(&target);
        let (device, setup) = Device::wgpu_options()
            .device_kind(kind)
            .init_with_setup()
            .map_err(|e| Error::Device(format!("cannot open {}: {e}", target.label())))?;
        if let Target::Adapter(a) = &target {
            memory::remember_size(&device, a.device_memory);
        }
        let gpu = SharedGpu {
            choice: match &target {
                Target::Adapter(a) => DeviceChoice::Gpu(Some(a.index)),
                _ => DeviceChoice::Gpu(None),
            },
            label: target.label(),
            device,
            setup,
        };
        opened.push((key, gpu.clone()));
        Ok(Some(gpu))
    });
    let adapter = label.lock().map(|l| l.clone()).unwrap_or_default();
    watched_result(result, &adapter, timeout)
}

/// f16 where the device computes it natively (wgpu with `shader-f16`), f32 on the CPU backend.
pub fn preferred_precision(device: &Device) -> crate::precision::Precision {
    let is_cpu = is_cpu(device);
    if !is_cpu && device.supports_dtype(burn::tensor::DType::F16) {
        crate::precision::Precision::F16
    } else {
        crate::precision::Precision::F32
    }
}

/// Whether the device is burn's CPU backend.
pub fn is_cpu(device: &Device) -> bool {
    format!("{device:?}").to_lowercase().contains("flex")
}

#[cfg(test)]
mod tests;
