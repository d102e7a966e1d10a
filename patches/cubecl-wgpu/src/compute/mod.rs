pub(crate) mod controller;
pub(crate) mod copies;
pub(crate) mod device_poison;

mod graph;
mod storage;

pub(super) mod mem_manager;
pub(super) mod poll;
pub(super) mod schedule;
mod server;
pub(super) mod stream;
pub(super) mod timings;

pub use server::*;
pub use storage::*;
