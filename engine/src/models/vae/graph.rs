//! The VAE decode replayed from a recorded graph: VAE compilation's launches resolved once.
//!
//! A 512² decode is ~200 kernel launches, and enqueued one by one they cost an H200 ~6 ms of host
//! time above its ~20 ms of kernels (BENCHMARKS.md, forty-third session): most of the gap to
//! PyTorch's decode. As the UNet's steps do ([`crate::unet::graph`]), a compiled decode is recorded
//! once per latent shape and replayed: the latents are copied into the graph's input buffer, the
//! graph replays, and the pixels are copied out of its output buffer, all in stream order.
//!
//! The first compiled decode of a shape prepares a capture, runs as usual (its kernels tuned, and
//! the pool then holding every buffer a decode needs; its pixels are the ones returned) and records
//! a second pass, which runs nothing. Later decodes of that shape on that thread replay. A capture
//! that fails costs nothing but the speed (tried once more at the next decode, then never for this
//! VAE). The recording keeps every pool page it touched for itself while it lives, so only decodes
//! whose largest buffer fits [`MAX_RECORDED_BUFFER_BYTES`] are recorded (SD's 512² image, not
//! SDXL's 1024² one, whose peak must fit 8 GiB), one shape at a time: a decode of any other shape
//! drops it first. The CPU backend and `LATENT_STUDIO_GRAPH=off` never record.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use burn::backend::wgpu::CubeTensor;
use burn::backend::{Backend, Dispatch, DispatchGraph};
use burn::tensor::{DType, Tensor};

use super::{AutoencoderKL, VaeConfig};
use crate::kernels::{self, copy::copy_into};
use crate::nn::Kernels;

/// The largest decoder buffer (as [`crate::vae_tiling::largest_decoder_buffer_bytes`] counts it)
/// of a decode that may be recorded: SD's 512² image (256 channels at full size, 256 MiB counted
/// in f32). Larger decodes run launch by launch, their pages free for the rest of the run.
pub const MAX_RECORDED_BUFFER_BYTES: u64 = 256 << 20;

/// Failed captures after which a VAE stops trying.
const MAX_FAILED_CAPTURES: usize = 2;

/// Whether a decode of latents of `dims` with `config`'s VAE is small enough to be recorded.
pub fn records(config: &VaeConfig, dims: [usize; 4]) -> bool {
    crate::vae_tiling::largest_decoder_buffer_bytes(config, dims) <= MAX_RECORDED_BUFFER_BYTES
}

/// A VAE's recorded decode, shared by its clones (they share its weights, which the graph reads).
#[derive(Clone, Default)]
pub struct DecodeRecording(Arc<Mutex<Slot>>);

#[derive(Default)]
struct Slot {
    recorded: Option<Recorded>,
    failures: usize,
    /// Decodes replayed so far.
    replays: usize,
}

impl std::fmt::Debug for DecodeRecording {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodeRecording")
            .field("recorded", &self.is_recorded())
            .finish()
    }
}

/// A recorded decode and the buffers it reads and writes (alive as long as the graph is).
struct Recorded {
    graph: DispatchGraph,
    dims: [usize; 4],
    dtype: DType,
    input: CubeTensor,
    output: CubeTensor,
    out_dims: [usize; 4],
    out_dtype: DType,
    /// The thread whose stream the graph was recorded on: replays are ordered against the copies
    /// in and out only there.
    thread: std::thread::ThreadId,
    // The tensors whose buffers the graph was recorded with: held so that nothing else is ever
    // placed there while the graph lives.
    _held: (Tensor<4>, Tensor<4>),
}

impl DecodeRecording {
    fn slot(&self) -> MutexGuard<'_, Slot> {
        // A panic elsewhere while it was held leaves nothing half-written in it.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a decode is recorded.
    pub fn is_recorded(&self) -> bool {
        self.slot().recorded.is_some()
    }

    /// How many decodes were replayed from a recording.
    pub fn replays(&self) -> usize {
        self.slot().replays
    }

    /// Drops the recorded decode, returning its pages to the pool.
    pub fn release(&self) {
        self.slot().recorded = None;
    }
}

impl AutoencoderKL {
    /// [`Self::decode_with`] through our fused kernels, replayed from a recorded graph where the
    /// device and the decode's size allow (see the module's documentation); the same pixels as
    /// launch by launch.
    pub fn decode_compiled(&self, latents: Tensor<4>) -> Tensor<4> {
        let device = latents.device();
        let dims = latents.dims();
        if !crate::unet::graph::available(&device) || !records(self.config(), dims) {
            return self.decode_with(latents, Kernels::Fused);
        }
        let mut slot = self.recording.slot();
        let thread = std::thread::current().id();
        if let Some(r) = &slot.recorded {
            if r.dims == dims && r.dtype == latents.dtype() && r.thread == thread {
                match r.replay(latents.clone(), &device) {
                    Some(pixels) => {
                        slot.replays += 1;
                        return pixels;
                    }
                    None => {
                        tracing::warn!(
                            "the recorded VAE decode failed to replay; decoding launch by launch"
                        );
                        slot.failures = MAX_FAILED_CAPTURES;
                    }
                }
            }
            // Another shape, dtype or thread (or a failed replay): its pages go first.
            slot.recorded = None;
        }
        if slot.failures >= MAX_FAILED_CAPTURES
            || Dispatch::graph_prepare(device.as_dispatch()).is_err()
        {
            // (A capture prepared elsewhere on this stream, e.g. UNet steps still warming up,
            // refuses a second: this decode runs as usual.)
            return self.decode_with(latents, Kernels::Fused);
        }
        let ordinary = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.decode_with(latents.clone(), Kernels::Fused)
        }));
        let pixels = match ordinary {
            Ok(pixels) => pixels,
            Err(panic) => {
                // The prepared capture closed before unwinding on, or it would hold the stream.
                let _ = Dispatch::graph_stop_capture(device.as_dispatch());
                std::panic::resume_unwind(panic)
            }
        };
        match self.capture(&latents, &pixels) {
            Ok(recorded) => slot.recorded = Some(recorded),
            Err(reason) => {
                slot.failures += 1;
                if slot.failures >= MAX_FAILED_CAPTURES {
                    tracing::warn!(
                        "the VAE decode could not be recorded as a graph ({reason}); \
                         decodes run launch by launch"
                    );
                } else {
                    tracing::debug!("the VAE decode could not be recorded ({reason})");
                }
            }
        }
        pixels
    }

    /// Records one decode of latents shaped as `latents` on fresh buffers, after the prepared
    /// capture's ordinary decode gave `pixels`; nothing recorded runs until a replay.
    fn capture(&self, latents: &Tensor<4>, pixels: &Tensor<4>) -> Result<Recorded, String> {
        let device = latents.device();
        let dispatch = device.as_dispatch();
        let opened = (|| {
            // The ordinary decode's lazy ops drained now: none may run inside the window.
            kernels::resolve(pixels.clone()).ok_or("no device buffers")?;
            // An own input buffer, written by our copy kernel only: an op that reuses a unique
            // input in place would otherwise write into the graph's input.
            let input = Tensor::<4>::empty(latents.dims(), (&device, latents.dtype()));
            let input_b = kernels::resolve(input.clone()).ok_or("no device buffers")?;
            Ok::<_, String>((input, input_b))
        })();
        let (input, input_b) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                let _ = Dispatch::graph_stop_capture(dispatch);
                return Err(e);
            }
        };
        if let Err(e) = Dispatch::graph_start_capture(dispatch) {
            let _ = Dispatch::graph_stop_capture(dispatch);
            return Err(e.to_string());
        }
        // A panic inside the window closes it before unwinding on: an open window would refuse
        // every later read.
        let recorded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let out = self.decode_with(input.clone(), Kernels::Fused);
            let out_b = kernels::resolve(out.clone());
            (out, out_b)
        }));
        let closed = Dispatch::graph_stop_capture(dispatch);
        let (out, out_b) = match recorded {
            Ok(recorded) => recorded,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        let graph = closed.map_err(|e| e.to_string())?;
        let output = out_b.ok_or("no output buffer")?;
        Ok(Recorded {
            graph,
            dims: latents.dims(),
            dtype: latents.dtype(),
            input: input_b,
            output,
            out_dims: out.dims(),
            out_dtype: out.dtype(),
            thread: std::thread::current().id(),
            _held: (input, out),
        })
    }
}

impl Recorded {
    /// Latents in, the recorded decode, the pixels out into a tensor of their own (the next replay
    /// overwrites the graph's output buffer). `None` where a copy or the replay failed.
    fn replay(&self, latents: Tensor<4>, device: &burn::tensor::Device) -> Option<Tensor<4>> {
        copy_into(&kernels::resolve(latents)?, &self.input)?;
        // SAFETY: every buffer the graph reads or writes is held by `self` (input, output) or by
        // the VAE whose slot holds `self` (weights), all outliving the replay; the copies in and
        // out are launched on this thread's stream, the one it was recorded on (the caller checks
        // the thread), so they are ordered against it; nothing else writes those buffers.
        unsafe { Dispatch::graph_replay(device.as_dispatch(), &self.graph) }.ok()?;
        let (pixels, buffer) = kernels::output(self.out_dims, self.out_dtype, device)?;
        copy_into(&self.output, &buffer)?;
        Some(pixels)
    }
}

#[cfg(test)]
mod tests;
