pub use parking_lot::{ReentrantMutex, ReentrantMutexGuard};
