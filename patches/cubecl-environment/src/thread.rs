#[cfg(multi_threading)]
pub use std::thread::{JoinHandle, spawn};
