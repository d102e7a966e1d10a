//! Whether a pass is the first at its shapes on its device since the process started: there the
//! kernels' autotune times its candidates before the first step (minutes for SD 1.5 on a fresh
//! H100), and the artist should be told rather than left looking at a silent wait.
//!
//! "First" means first since launch: the recorded step waits longer before recording there. Whether
//! the artist is told depends on [`crate::device::tuning`], which keeps tuning across launches.

use std::collections::HashSet;
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
    /// Stable across launches (a tuning file names shapes by it): a hash of what decides the
    /// kernels' shapes.
    fn key(&self) -> String {
        use sha2::{Digest, Sha256};
        let text = format!(
            "{:?}|{:?}|{:?}|{}x{}x{}",
            self.device, self.dtype, self.unet, self.batch, self.width, self.height
        );
        Sha256::digest(text.as_bytes())[..12]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// Whether the artist should be told that a pass first in this process ([`first_run`]) waits for
/// tuning: not when a previous launch saved this shape's tuning ([`crate::device::tuning`]).
/// Notes the shape for the next save either way.
pub(super) fn announce(shape: PassShape<'_>) -> bool {
    let key = shape.key();
    let tuned = crate::device::tuning::shape_is_tuned(&key);
    crate::device::tuning::shape_tuned(&key);
    !tuned
}

/// Claims `shape` for this process: true the first time it is asked on a GPU (the CPU backend
/// tunes nothing), false after.
pub(super) fn first_run(shape: PassShape<'_>) -> bool {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
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
