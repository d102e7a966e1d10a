//! Latent Studio's application: the desktop studio ([`studio`]) that the `latent-studio` binary
//! opens, as a library so tests can drive it.

pub mod demo;
pub mod paths;
pub mod probe;
pub mod run;
pub mod stall;
pub mod studio;
pub mod test_seam;
