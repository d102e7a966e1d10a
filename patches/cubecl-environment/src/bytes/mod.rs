pub(crate) mod default_controller;
#[cfg(feature = "std")]
pub(crate) mod file;
#[cfg(feature = "shared-bytes")]
mod shared;
mod shared_arc;

mod access;
mod base;

pub use access::*;
pub use base::*;
#[cfg(feature = "shared-bytes")]
pub use shared::SharedBytesAllocationController;
pub use shared_arc::SharedAllocationController;
