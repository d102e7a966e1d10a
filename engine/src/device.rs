//! Choosing the burn device the engine runs on.

use burn::tensor::Device;

use crate::error::Result;

/// What the artist asked for: `auto`, `cpu`, `gpu` or `gpu:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    #[default]
    Auto,
    Cpu,
    Gpu(Option<usize>),
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "gpu" => Ok(DeviceChoice::Gpu(None)),
            other => match other.strip_prefix("gpu:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(DeviceChoice::Gpu(Some(n))),
                _ => Err(format!(
                    "unknown device `{other}` (use auto, cpu, gpu or gpu:N)"
                )),
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
        }
    }
}

/// Makes the burn device for a choice. `Auto` picks by [`crate::adapters::choose_auto`] (Intel
/// discrete first); `gpu:N` is the N-th adapter `latent-studio devices` lists. Without any adapter,
/// `Auto` uses burn's CPU backend. Builds with the `vulkan` feature (SPIR-V) route software
/// adapters to the CPU backend too: lavapipe crashes creating SPIR-V compute pipelines.
pub fn create(choice: DeviceChoice) -> Result<Device> {
    use crate::adapters::{AdapterKind, choose_auto, enumerate};
    use burn::tensor::DeviceKind;
    Ok(match choice {
        DeviceChoice::Cpu => Device::flex(),
        DeviceChoice::Auto => {
            let all = enumerate();
            match choose_auto(&all) {
                None => Device::flex(),
                Some(a) if a.kind == AdapterKind::Software && cfg!(feature = "vulkan") => {
                    tracing::warn!(
                        "only a software adapter ({}); using the CPU backend",
                        a.name
                    );
                    Device::flex()
                }
                Some(a) => Device::wgpu(a.device_kind(&all)),
            }
        }
        DeviceChoice::Gpu(None) => Device::wgpu(DeviceKind::DefaultDevice),
        DeviceChoice::Gpu(Some(n)) => {
            let all = enumerate();
            let Some(a) = all.iter().find(|a| a.index == n) else {
                return Err(crate::Error::Device(format!(
                    "there is no adapter gpu:{n} ({} found; see `latent-studio devices`)",
                    all.len()
                )));
            };
            if a.kind == AdapterKind::Software && cfg!(feature = "vulkan") {
                return Err(crate::Error::Device(format!(
                    "{} is a software adapter, which this SPIR-V build cannot drive; use --device cpu",
                    a.name
                )));
            }
            Device::wgpu(a.device_kind(&all))
        }
    })
}

/// f16 where the device computes it natively (wgpu with `shader-f16`), f32 on the CPU backend.
pub fn preferred_precision(device: &Device) -> crate::model::Precision {
    let is_cpu = is_cpu(device);
    if !is_cpu && device.supports_dtype(burn::tensor::DType::F16) {
        crate::model::Precision::F16
    } else {
        crate::model::Precision::F32
    }
}

/// Whether the device is burn's CPU backend.
pub fn is_cpu(device: &Device) -> bool {
    format!("{device:?}").to_lowercase().contains("flex")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_choices() {
        assert_eq!("auto".parse(), Ok(DeviceChoice::Auto));
        assert_eq!("cpu".parse(), Ok(DeviceChoice::Cpu));
        assert_eq!("gpu".parse(), Ok(DeviceChoice::Gpu(None)));
        assert_eq!("gpu:2".parse(), Ok(DeviceChoice::Gpu(Some(2))));
        assert!("gpu:x".parse::<DeviceChoice>().is_err());
        assert!("tpu".parse::<DeviceChoice>().is_err());
    }

    #[test]
    fn cpu_is_recognised_and_runs_f32() {
        let cpu = Device::flex();
        assert!(is_cpu(&cpu), "{cpu:?}");
        assert_eq!(preferred_precision(&cpu), crate::model::Precision::F32);
    }
}
