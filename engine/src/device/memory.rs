//! Where a model's weights live in the device's memory.
//!
//! cubecl's default pool carves every allocation from pages that grow with the largest
//! allocation served, and weights share those pages with the activations. Its persistent pool
//! gives each tensor a buffer of its own that nothing relocates. Both were measured for SDXL at
//! 1024² on an H200 (BENCHMARKS.md, twenty-fourth session): persistent weights lower the load's
//! peak and raise the generation's, so they are opt-in ([`persistent_weights`]).

use std::cell::RefCell;

use burn::tensor::Device;

/// `build` with every device allocation it makes (the weights it loads, and the temporaries
/// on the way, which [`release_free`] returns after) in cubecl's persistent pool where
/// [`persistent_weights`] says so; elsewhere, and on the CPU, it is just `build`.
pub fn persistent<T>(device: &Device, build: impl FnOnce() -> T) -> T {
    if crate::device::is_cpu(device) || !persistent_weights() {
        return build();
    }
    in_window(device, build)
}

/// `build` inside cubecl's persistent-allocation window on `device`.
fn in_window<T>(device: &Device, build: impl FnOnce() -> T) -> T {
    let task = OnThisThread(RefCell::new(Some(build)));
    let out = device.memory_persistent_allocations((), move |()| OnThisThread(task.run()));
    match out.0 {
        Some(value) => value,
        // The closure is called once by every implementation in burn 0.22.
        None => unreachable!("burn ran the persistent-allocation window without its task"),
    }
}

/// Whether weights go to the persistent pool: only with `LATENT_STUDIO_WEIGHT_POOL=persistent`.
/// Measured on an H200 (BENCHMARKS.md, twenty-fourth session), it lowers an SDXL load's peak
/// (10.2 → 8.7 GiB) but raises the 1024² txt2img's steady peak (8.2 → 9.2 GiB: the pool then
/// reserves 0.9 GiB more for the activations, for reasons not yet found), so the shared pages
/// stay the default.
pub fn persistent_weights() -> bool {
    std::env::var("LATENT_STUDIO_WEIGHT_POOL")
        .is_ok_and(|v| v.trim().eq_ignore_ascii_case("persistent"))
}

/// Weights built by `build` ([`persistent`]), then the pools' free memory released
/// ([`release_free`]): the temporaries of a load (casts, concatenations) do not stay reserved.
pub fn loaded<T>(device: &Device, build: impl FnOnce() -> T) -> T {
    let built = persistent(device, build);
    release_free(device);
    built
}

/// Returns the pools' free memory to the driver (the persistent pool's freed slices too, which
/// nothing else reuses but a tensor of the very same size).
pub fn release_free(device: &Device) {
    if !crate::device::is_cpu(device) {
        device.memory_cleanup();
    }
}

/// The device-local memory of the devices opened from a known adapter, by device (few per
/// process, so a list).
static SIZES: std::sync::Mutex<Vec<(Device, u64)>> = std::sync::Mutex::new(Vec::new());

/// Remembers `device`'s memory size ([`device_memory`]); `None` (its adapter reports none)
/// forgets any size remembered for it.
pub(super) fn remember_size(device: &Device, bytes: Option<u64>) {
    let mut sizes = SIZES.lock().unwrap_or_else(|e| e.into_inner());
    sizes.retain(|(d, _)| d != device);
    if let Some(bytes) = bytes {
        sizes.push((device.clone(), bytes));
    }
}

/// The device-local memory of `device`'s adapter in bytes, where the device was opened from an
/// adapter that reports it ([`crate::adapters::AdapterSummary::device_memory`]: Vulkan's
/// largest device-local heap); `None` for the CPU, the default GPU and other backends.
pub fn device_memory(device: &Device) -> Option<u64> {
    let sizes = SIZES.lock().unwrap_or_else(|e| e.into_inner());
    sizes.iter().find(|(d, _)| d == device).map(|(_, b)| *b)
}

/// burn asks for a `Fn + Send` closure with `Send` input and output, yet every implementation
/// in burn 0.22 (the default, burn-fusion's, cubecl's window) calls it once, on the calling
/// thread: burn-fusion records on it and cubecl opens the window around it. So a one-shot task
/// and its result, which may hold `Rc`s (a checkpoint's weight recorder), never cross threads.
struct OnThisThread<T>(T);

// SAFETY: see the type's docs: the value is created, used and dropped on one thread.
unsafe impl<T> Send for OnThisThread<T> {}

impl<T, F: FnOnce() -> T> OnThisThread<RefCell<Option<F>>> {
    fn run(&self) -> Option<T> {
        let task = self.0.borrow_mut().take();
        task.map(|task| task())
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{DType, Tensor, TensorData};

    use super::*;

    /// Weights made in the window (with a temporary on the way, as a checkpoint's cast is) keep
    /// their values through a release of the free memory that follows, on lavapipe (CI) and the
    /// CPU; the task runs once and its non-`Send` result comes back.
    #[test]
    fn weights_made_in_the_window_survive_the_release_of_what_is_free() {
        let values: Vec<f32> = (0..(1 << 20)).map(|i| (i % 251) as f32).collect();
        for device in [crate::kernels::testing::wgpu(), Device::flex()] {
            let runs = std::rc::Rc::new(std::cell::Cell::new(0));
            let build = || {
                runs.set(runs.get() + 1);
                let t = Tensor::<1>::from_data(
                    TensorData::new(values.clone(), [values.len()]),
                    &device,
                );
                let t = (t * 2.0).cast(DType::F16).cast(DType::F32) / 2.0;
                (t, runs.clone())
            };
            // The window itself, whatever the environment says (the CPU has none).
            let (weight, marker) = match crate::device::is_cpu(&device) {
                true => persistent(&device, build),
                false => in_window(&device, build),
            };
            release_free(&device);
            // Other work after the window reuses what was released; the weight is intact.
            let shifted = (weight.clone() + Tensor::<1>::ones([values.len()], &device))
                .into_data()
                .convert::<f32>()
                .try_to_vec::<f32>()
                .expect("f32 values");
            assert!(shifted.iter().zip(&values).all(|(s, v)| *s == v + 1.0));
            assert_eq!(marker.get(), 1, "the task ran once");
            let read = weight.into_data().try_to_vec::<f32>().expect("f32 values");
            assert_eq!(read, values);
        }
    }
}
