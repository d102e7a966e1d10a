pub use cubecl_server::device::{WgpuBackend, WgpuDevice, WgpuDeviceKind};
