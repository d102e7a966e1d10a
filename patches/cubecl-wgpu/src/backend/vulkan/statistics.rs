//! Latent Studio patch: the driver's compile statistics of each SPIR-V kernel
//! (`VK_KHR_pipeline_executable_properties`: registers, spills, shared memory where the driver
//! reports them), for `set_pipeline_statistics`. wgpu keeps its pipelines' handles to itself, so
//! each kernel is compiled a second time here, through the raw device, with the
//! capture-statistics flag, and that copy destroyed once read.

use std::ffi::CString;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use ash::vk;
use wgpu::hal;

/// Receives a kernel's entry point name and its statistics, `(name, value)`.
pub type StatisticsHook = fn(&str, &[(String, String)]);

static HOOK: OnceLock<StatisticsHook> = OnceLock::new();
/// Whether a device was created with the extension enabled (one per process in practice).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Installs, once per process and before the first Vulkan device is created, a hook that
/// receives every SPIR-V kernel's compile statistics. Devices created afterwards enable
/// `VK_KHR_pipeline_executable_properties` where the driver has it; each kernel then compiles
/// twice (a diagnostic, off unless installed). Returns whether this call installed it.
pub fn set_pipeline_statistics(hook: StatisticsHook) -> bool {
    HOOK.set(hook).is_ok()
}

pub(crate) fn wanted() -> bool {
    HOOK.get().is_some()
}

pub(crate) fn mark_enabled() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Compiles `spirv` again with statistics captured and hands them to the hook; failures are
/// logged, never raised (the real pipeline is wgpu's, already created).
pub(crate) fn report(
    device: &wgpu::Device,
    spirv: &[u32],
    entry: &str,
    immediate_size: Option<usize>,
) {
    let Some(hook) = HOOK.get() else { return };
    // Failures go to the hook as an `error` entry: whoever asked for statistics sees why none
    // came, whatever the log level.
    if !ENABLED.load(Ordering::Relaxed) {
        static TOLD: AtomicBool = AtomicBool::new(false);
        if !TOLD.swap(true, Ordering::Relaxed) {
            let why = "the device has no VK_KHR_pipeline_executable_properties".to_string();
            hook(entry, &[("error".to_string(), why)]);
        }
        return;
    }
    match unsafe { capture(device, spirv, entry, immediate_size) } {
        Ok(stats) => hook(entry, &stats),
        Err(err) => hook(entry, &[("error".to_string(), err)]),
    }
}

unsafe fn capture(
    device: &wgpu::Device,
    spirv: &[u32],
    entry: &str,
    immediate_size: Option<usize>,
) -> Result<Vec<(String, String)>, String> {
    let Some(hal_device) = (unsafe { device.as_hal::<hal::api::Vulkan>() }) else {
        return Err("not a Vulkan device".into());
    };
    let raw = hal_device.raw_device();
    let instance = hal_device.shared_instance().raw_instance();
    let ext = ash::khr::pipeline_executable_properties::Device::new(instance, raw);
    let name = CString::new(entry).map_err(|e| e.to_string())?;
    let err = |what: &str, e: vk::Result| format!("{what}: {e}");

    unsafe {
        let module = raw
            .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(spirv), None)
            .map_err(|e| err("shader module", e))?;
        // The layout cubecl's kernels declare: their parameters as immediates (buffer
        // addresses), or one uniform buffer at set 0, binding 0.
        let mut set_layouts = Vec::new();
        let mut ranges = Vec::new();
        match immediate_size {
            Some(size) if size > 0 => ranges.push(
                vk::PushConstantRange::default()
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
                    .size(size as u32),
            ),
            Some(_) => {}
            None => {
                let binding = [vk::DescriptorSetLayoutBinding::default()
                    .binding(0)
                    .descriptor_type(vk::DescriptorType::UNIFORM_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)];
                let set = raw
                    .create_descriptor_set_layout(
                        &vk::DescriptorSetLayoutCreateInfo::default().bindings(&binding),
                        None,
                    )
                    .map_err(|e| err("set layout", e))?;
                set_layouts.push(set);
            }
        }
        let layout = raw
            .create_pipeline_layout(
                &vk::PipelineLayoutCreateInfo::default()
                    .set_layouts(&set_layouts)
                    .push_constant_ranges(&ranges),
                None,
            )
            .map_err(|e| err("pipeline layout", e));
        let result = layout.and_then(|layout| {
            let stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(module)
                .name(&name);
            let info = vk::ComputePipelineCreateInfo::default()
                .stage(stage)
                .layout(layout)
                .flags(vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR);
            let made = raw
                .create_compute_pipelines(vk::PipelineCache::null(), &[info], None)
                .map_err(|(_, e)| err("pipeline", e));
            let stats = made.and_then(|pipelines| {
                let pipeline = pipelines[0];
                let read = read(&ext, pipeline);
                raw.destroy_pipeline(pipeline, None);
                read
            });
            raw.destroy_pipeline_layout(layout, None);
            stats
        });
        for set in set_layouts {
            raw.destroy_descriptor_set_layout(set, None);
        }
        raw.destroy_shader_module(module, None);
        result
    }
}

unsafe fn read(
    ext: &ash::khr::pipeline_executable_properties::Device,
    pipeline: vk::Pipeline,
) -> Result<Vec<(String, String)>, String> {
    let executables = unsafe {
        ext.get_pipeline_executable_properties(&vk::PipelineInfoKHR::default().pipeline(pipeline))
    }
    .map_err(|e| format!("executables: {e}"))?;
    let mut out = Vec::new();
    for index in 0..executables.len() {
        let info = vk::PipelineExecutableInfoKHR::default()
            .pipeline(pipeline)
            .executable_index(index as u32);
        let stats = unsafe { ext.get_pipeline_executable_statistics(&info) }
            .map_err(|e| format!("statistics: {e}"))?;
        for stat in stats {
            let name = stat
                .name_as_c_str()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            // SAFETY: `format` says which member of the union the driver wrote.
            let value = unsafe {
                match stat.format {
                    vk::PipelineExecutableStatisticFormatKHR::BOOL32 => {
                        (stat.value.b32 != 0).to_string()
                    }
                    vk::PipelineExecutableStatisticFormatKHR::INT64 => stat.value.i64.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::UINT64 => stat.value.u64.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => {
                        format!("{:.3}", stat.value.f64)
                    }
                    _ => "?".to_string(),
                }
            };
            out.push((name, value));
        }
    }
    Ok(out)
}
