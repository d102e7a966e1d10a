//! The engine's integration tests, one module per file beside this folder, linked into one test
//! binary: one link instead of eleven, and one kernel-compilation cache for all of them (lavapipe
//! JIT-compiles each kernel once per process).

#[path = "../common/mod.rs"]
mod common;

#[path = "../bad_checkpoints.rs"]
mod bad_checkpoints;
#[path = "../device_limits.rs"]
mod device_limits;
#[path = "../embeddings.rs"]
mod embeddings;
#[path = "../faults.rs"]
mod faults;
#[path = "../few_step.rs"]
mod few_step;
#[path = "../fuzz.rs"]
mod fuzz;
#[path = "../hires.rs"]
mod hires;
#[path = "../img2img.rs"]
mod img2img;
#[path = "../inpaint_model.rs"]
mod inpaint_model;
#[path = "../layout.rs"]
mod layout;
#[path = "../lora.rs"]
mod lora;
#[path = "../model_cache.rs"]
mod model_cache;
#[path = "../model_parity.rs"]
mod model_parity;
#[path = "../nan_guard.rs"]
mod nan_guard;
#[path = "../pipeline_parity.rs"]
mod pipeline_parity;
#[path = "../preview.rs"]
mod preview;
#[path = "../sd2.rs"]
mod sd2;
#[path = "../sdxl.rs"]
mod sdxl;
#[path = "../sdxl_refiner.rs"]
mod sdxl_refiner;
#[path = "../taesd.rs"]
mod taesd;
#[path = "../vae_tiling.rs"]
mod vae_tiling;
