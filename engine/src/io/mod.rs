//! What the engine reads and writes besides checkpoints: images in and out (`image`), A1111's
//! `parameters` text (`parameters`), and atomic file writes (`atomic`).

pub mod atomic;
pub mod image;
pub mod parameters;
