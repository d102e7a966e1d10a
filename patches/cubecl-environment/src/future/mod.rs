mod base;

pub use base::*;

/// Channel types shared across environments.
pub mod channel;

/// Read async data without having to decorate each function with async notation.
pub mod reader;
