//! How large one buffer may be on a device, and what the engine splits to stay under it.
//!
//! A wgpu device refuses a buffer above `max_buffer_size` and a storage binding above
//! `max_storage_buffer_binding_size` (WebGPU's defaults: 256 MiB and 128 MiB). cubecl keeps every
//! tensor in one page no larger than the smaller of the two and binds it whole, so for the engine
//! the limit that matters is [`DeviceLimits::max_tensor_bytes`]: a tensor above it cannot exist on
//! the device. What would exceed it is split: the token embedding into row chunks
//! ([`crate::nn::Embedding`]), attention into query slices ([`crate::nn::multi_head_attention`]),
//! the VAE decode into tiles ([`crate::vae_tiling::TilingConfig::fit_to`]). A weight that cannot
//! be split and does not fit is an error at load ([`crate::error::Error::TensorTooLarge`]).

use std::sync::Mutex;

use burn::tensor::Device;

/// The two wgpu limits that bound one buffer, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLimits {
    /// wgpu's `max_buffer_size`.
    pub max_buffer_bytes: u64,
    /// wgpu's `max_storage_buffer_binding_size`.
    pub max_binding_bytes: u64,
}

impl DeviceLimits {
    /// What every WebGPU implementation grants without asking (the spec's defaults), and what a
    /// browser gives a page that asks for nothing more.
    pub const WEBGPU_DEFAULT: Self = Self {
        max_buffer_bytes: 256 << 20,
        max_binding_bytes: 128 << 20,
    };

    /// The CPU backend: tensors live in host memory, with no per-buffer limit.
    pub const HOST: Self = Self {
        max_buffer_bytes: u64::MAX,
        max_binding_bytes: u64::MAX,
    };

    /// The largest tensor the device holds: cubecl puts each tensor in one buffer and binds it
    /// whole, so both limits apply to it.
    pub fn max_tensor_bytes(&self) -> u64 {
        self.max_buffer_bytes.min(self.max_binding_bytes)
    }

    /// Both limits divided by `factor`, rounded down to 256 bytes (wgpu's buffer offset
    /// alignment), for scaled-down models in tests.
    pub fn scaled_down(self, factor: u64) -> Self {
        let scale = |bytes: u64| (bytes / factor.max(1)) / 256 * 256;
        Self {
            max_buffer_bytes: scale(self.max_buffer_bytes),
            max_binding_bytes: scale(self.max_binding_bytes),
        }
    }

    /// The limits of `device`, asked once per device and remembered. The CPU backend has none
    /// ([`Self::HOST`]). A wgpu device the engine opened with [`crate::device::open_limited`] has
    /// the limits it was opened with; for any other cubecl device only the smaller limit is
    /// known (cubecl keeps its largest page, not the two limits), and it stands for both.
    pub fn of(device: &Device) -> Self {
        let known = |device: &Device| {
            let known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
            known.iter().find(|(d, _)| d == device).map(|(_, l)| *l)
        };
        if let Some(limits) = known(device) {
            return limits;
        }
        // Asked without the lock held: opening a device can take long (see crate::device).
        let limits = match largest_page(device) {
            Some(bytes) => Self {
                max_buffer_bytes: bytes,
                max_binding_bytes: bytes,
            },
            None => Self::HOST,
        };
        if known(device).is_none() {
            let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
            known.push((device.clone(), limits));
        }
        limits
    }

    /// Remembers the limits a device was created with (see [`Self::of`]).
    pub(crate) fn remember(device: &Device, limits: Self) {
        let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
        known.retain(|(d, _)| d != device);
        known.push((device.clone(), limits));
    }

    /// How many rows of `row_bytes` each fit in one tensor (at least one).
    pub fn rows_per_tensor(&self, row_bytes: u64) -> usize {
        let rows = self.max_tensor_bytes() / row_bytes.max(1);
        usize::try_from(rows).unwrap_or(usize::MAX).max(1)
    }
}

impl std::fmt::Display for DeviceLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| {
            if b == u64::MAX {
                "unlimited".to_string()
            } else {
                format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64)
            }
        };
        write!(
            f,
            "buffer {}, storage binding {}",
            mib(self.max_buffer_bytes),
            mib(self.max_binding_bytes)
        )
    }
}

/// Devices whose limits were asked or set: few per process, so a list.
static KNOWN: Mutex<Vec<(Device, DeviceLimits)>> = Mutex::new(Vec::new());

/// cubecl's largest page on a cubecl device (the smaller of the two wgpu limits); `None` for
/// other backends. Opens a lazy device.
fn largest_page(device: &Device) -> Option<u64> {
    match device.as_dispatch() {
        burn::backend::DispatchDevice::Cube(cube) => {
            Some(cube.client().properties().memory.max_page_size)
        }
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smaller_limit_bounds_a_tensor() {
        assert_eq!(DeviceLimits::WEBGPU_DEFAULT.max_tensor_bytes(), 128 << 20);
        assert_eq!(DeviceLimits::HOST.max_tensor_bytes(), u64::MAX);
        let small = DeviceLimits::WEBGPU_DEFAULT.scaled_down(48);
        assert_eq!(small.max_binding_bytes, 2_796_032);
        assert_eq!(small.max_buffer_bytes % 256, 0);
        assert!(small.max_buffer_bytes > small.max_binding_bytes);
        assert_eq!(small.rows_per_tensor(64), 2_796_032 / 64);
        assert_eq!(small.rows_per_tensor(u64::MAX), 1, "at least one row");
        assert_eq!(DeviceLimits::HOST.rows_per_tensor(4) as u64, u64::MAX / 4);
    }

    /// SD 1.5's f32 token embedding (49408 × 768, 145 MiB) needs two tensors under WebGPU's
    /// defaults; in f16 (72 MiB) it fits in one.
    #[test]
    fn sd15_token_embedding_splits_in_f32_under_webgpu_defaults() {
        let rows = |bytes_per_value: u64| {
            DeviceLimits::WEBGPU_DEFAULT.rows_per_tensor(768 * bytes_per_value)
        };
        assert_eq!(49408usize.div_ceil(rows(4)), 2);
        assert_eq!(49408usize.div_ceil(rows(2)), 1);
    }

    #[test]
    fn the_cpu_backend_has_no_limit() {
        assert_eq!(DeviceLimits::of(&Device::flex()), DeviceLimits::HOST);
    }
}
