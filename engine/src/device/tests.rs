use super::*;
use crate::adapters::AdapterKind;

#[test]
fn parses_choices() {
    assert_eq!("auto".parse(), Ok(DeviceChoice::Auto));
    assert_eq!("cpu".parse(), Ok(DeviceChoice::Cpu));
    assert_eq!("gpu".parse(), Ok(DeviceChoice::Gpu(None)));
    assert_eq!("gpu:2".parse(), Ok(DeviceChoice::Gpu(Some(2))));
    assert_eq!("arc".parse(), Ok(DeviceChoice::Named("arc".into())));
    assert_eq!(DeviceChoice::Named("Iris Xe".into()).to_string(), "Iris Xe");
    assert!("gpu:x".parse::<DeviceChoice>().is_err());
    assert!("  ".parse::<DeviceChoice>().is_err());
}

#[test]
fn choices_resolve_against_adapter_lists() {
    use crate::adapters::VENDOR_INTEL;
    let arc = AdapterSummary {
        index: 0,
        name: "Intel(R) Arc(tm) A770 Graphics".into(),
        vendor: VENDOR_INTEL,
        kind: AdapterKind::Discrete,
        backend: "Vulkan".into(),
        driver: "Intel open-source Mesa driver 24.2".into(),
        max_buffer_size: 1 << 32,
        max_storage_binding: 1 << 31,
        shader_f16: true,
        device_memory: None,
    };
    let all = [arc.clone()];
    let named = DeviceChoice::Named("ARC".into());
    assert_eq!(resolve(&named, &all).unwrap(), Target::Adapter(arc.clone()));
    assert_eq!(
        resolve(&DeviceChoice::Auto, &all).unwrap(),
        Target::Adapter(arc)
    );
    assert_eq!(resolve(&DeviceChoice::Auto, &[]).unwrap(), Target::Cpu);
    let e = resolve(&DeviceChoice::Named("nosuchgpu".into()), &all).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("nosuchgpu") && text.contains("gpu:0 Intel(R) Arc"),
        "{text}"
    );
    assert!(resolve(&DeviceChoice::Gpu(Some(3)), &all).is_err());
}

#[test]
fn software_adapters_are_driven_through_wgsl() {
    use crate::compiler::{ShaderCompiler, for_adapter};
    let lavapipe = AdapterSummary {
        index: 0,
        name: "llvmpipe (LLVM 15.0.6, 256 bits)".into(),
        vendor: 0x10005,
        kind: AdapterKind::Software,
        backend: "Vulkan".into(),
        driver: "Mesa 22.3.6".into(),
        max_buffer_size: 1 << 31,
        max_storage_binding: 1 << 27,
        shader_f16: true,
        device_memory: None,
    };
    let only_software = [lavapipe.clone()];
    // Auto takes lavapipe (one binary: it gets WGSL, where SPIR-V would crash it).
    assert_eq!(
        resolve(&DeviceChoice::Auto, &only_software).unwrap(),
        Target::Adapter(lavapipe.clone())
    );
    assert_eq!(for_adapter(&lavapipe), ShaderCompiler::Wgsl);
    // With a real GPU beside it, Auto takes the GPU.
    let arc = AdapterSummary {
        index: 1,
        name: "Intel(R) Arc(tm) A770 Graphics".into(),
        vendor: crate::adapters::VENDOR_INTEL,
        kind: AdapterKind::Discrete,
        ..lavapipe.clone()
    };
    let both = [lavapipe, arc.clone()];
    assert_eq!(
        resolve(&DeviceChoice::Auto, &both).unwrap(),
        Target::Adapter(arc)
    );
}

#[test]
fn watchdog_returns_the_value_or_times_out() {
    let t = std::time::Instant::now();
    assert_eq!(watchdog(Duration::from_secs(10), || 42), Ok(42));
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "no waiting for the timeout"
    );

    let t = std::time::Instant::now();
    let stuck = watchdog(Duration::from_millis(200), || {
        std::thread::sleep(Duration::from_secs(3600));
    });
    assert_eq!(stuck, Err(WatchdogError::TimedOut));
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(5),
        "{waited:?}"
    );

    let panicked = watchdog(Duration::from_secs(10), || -> u8 { panic!("driver bug") });
    assert_eq!(panicked, Err(WatchdogError::Panicked));
}

#[test]
fn cpu_warm_up_runs_under_the_watchdog() {
    let device = create_watched(&DeviceChoice::Cpu, Duration::from_secs(60)).unwrap();
    assert!(is_cpu(&device));
    // The same computation on the host: sum(conv3x3(A·B)) with zero padding.
    let ramp = |n: usize| -> Vec<f32> { (0..n).map(|i| (i % 7) as f32 * 0.25 - 0.5).collect() };
    let (a, w) = (ramp(64), ramp(18));
    let mut x = [[0f32; 8]; 8];
    for i in 0..8 {
        for j in 0..8 {
            x[i][j] = (0..8).map(|k| a[i * 8 + k] * a[k * 8 + j]).sum();
        }
    }
    let mut want = 0f32;
    for o in 0..2 {
        for i in 0..8i32 {
            for j in 0..8i32 {
                for di in 0..3i32 {
                    for dj in 0..3i32 {
                        let (y, z) = (i + di - 1, j + dj - 1);
                        if (0..8).contains(&y) && (0..8).contains(&z) {
                            want += w[o * 9 + (di * 3 + dj) as usize] * x[y as usize][z as usize];
                        }
                    }
                }
            }
        }
    }
    let got = warm_up(&device).unwrap();
    assert!(
        (got - want).abs() <= 1e-3 * want.abs().max(1.0),
        "{got} vs {want}"
    );
}

#[test]
fn cpu_is_recognised_and_runs_f32() {
    let cpu = Device::flex();
    assert!(is_cpu(&cpu), "{cpu:?}");
    assert_eq!(preferred_precision(&cpu), crate::precision::Precision::F32);
}

/// A Vulkan adapter reports its device-local memory (lavapipe in CI: a heap of system memory),
/// and a device registered with it as [`open`] registers one answers [`device_memory`] with that
/// size until forgotten. (Registered on the CPU device, whose placement never asks: a second
/// lavapipe device in this binary made its other tests ~2.5× slower, 295 s against 129 in CI;
/// and not through `open`, which binds the process's kernel-tuning file the tuning tests set.)
#[test]
fn a_vulkan_adapter_reports_its_memory_to_its_device() {
    let all = crate::adapters::enumerate();
    let lavapipe = all
        .iter()
        .find(|a| a.kind == AdapterKind::Software && a.backend == "Vulkan")
        .expect("lavapipe (mesa-vulkan-drivers) for the wgpu tests");
    let bytes = lavapipe.device_memory.expect("Vulkan reports its heaps");
    assert!(bytes >= 256 << 20, "{bytes} bytes");
    assert!(lavapipe.to_string().contains(" GiB"), "{lavapipe}");
    let device = Device::flex();
    assert_eq!(device_memory(&device), None);
    memory::remember_size(&device, lavapipe.device_memory);
    assert_eq!(device_memory(&device), Some(bytes));
    memory::remember_size(&device, None);
    assert_eq!(device_memory(&device), None);
}

/// Tuning kept with cooperative matrices is never restored where they are hidden, nor the
/// reverse; the CPU keeps none.
#[test]
fn tuning_is_kept_per_cooperative_matrix_switch() {
    let on = tuning_identity(&Target::DefaultGpu, false).expect("a GPU keeps tuning");
    let off = tuning_identity(&Target::DefaultGpu, true).expect("a GPU keeps tuning");
    assert_ne!(on, off);
    assert!(off.starts_with(&on), "{off}");
    assert_eq!(tuning_identity(&Target::Cpu, false), None);
}
