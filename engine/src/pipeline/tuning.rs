//! Whether a pass is the first at its shapes on its device since the process started: there the
//! kernels' autotune times its candidates before the first step (minutes for SD 1.5 on a fresh
//! H100), and the artist should be told rather than left looking at a silent wait.
//!
//! cubecl keeps tuning results in memory only here: its persistent cache needs its `persistence`
//! feature, which pulls in `turso` (an SQLite engine in Rust, 390 000 lines) and took 11.7
//! minutes to compile on a two-core machine like CI's (sharing it with another build). So
//! "first" means first since launch.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use burn::tensor::{DType, Device};

use crate::unet::UNetConfig;

/// The shapes a UNet pass tunes kernels for.
#[derive(Debug, Clone, Copy)]
pub(super) struct PassShape<'a> {
    pub device: &'a Device,
    pub dtype: DType,
    pub unet: &'a UNetConfig,
    pub batch: usize,
    pub width: usize,
    pub height: usize,
}

impl PassShape<'_> {
    fn key(&self) -> u64 {
        let mut h = DefaultHasher::new();
        format!("{:?}|{:?}|{:?}", self.device, self.dtype, self.unet).hash(&mut h);
        (self.batch, self.width, self.height).hash(&mut h);
        h.finish()
    }
}

/// Claims `shape` for this process: true the first time it is asked on a GPU (the CPU backend
/// tunes nothing), false after.
pub(super) fn first_run(shape: PassShape<'_>) -> bool {
    static SEEN: Mutex<Option<HashSet<u64>>> = Mutex::new(None);
    if crate::device::is_cpu(shape.device) {
        return false;
    }
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    seen.get_or_insert_with(HashSet::new).insert(shape.key())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GPU pass is first once per shape; any other size, batch, precision or model is new
    /// again; the CPU backend never tunes.
    #[test]
    fn each_shape_is_first_once_on_a_gpu() {
        // Naming a wgpu device opens nothing: no adapter is needed.
        let gpu = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
        let unet = UNetConfig::default();
        let shape = PassShape {
            device: &gpu,
            dtype: DType::F16,
            unet: &unet,
            batch: 2,
            width: 8 * 4099,
            height: 8 * 4097,
        };
        assert!(first_run(shape));
        assert!(!first_run(shape));
        assert!(first_run(PassShape { batch: 1, ..shape }));
        assert!(first_run(PassShape {
            dtype: DType::F32,
            ..shape
        }));
        assert!(first_run(PassShape {
            width: 8 * 4101,
            ..shape
        }));
        let sdxl = UNetConfig::sdxl();
        assert!(first_run(PassShape {
            unet: &sdxl,
            ..shape
        }));
        let cpu = Device::flex();
        assert!(!first_run(PassShape {
            device: &cpu,
            ..shape
        }));
    }
}
