//! The VAE decode replayed from a recorded graph: VAE compilation's launches resolved once.
//!
//! A 512² decode is ~200 kernel launches, and enqueued one by one they cost an H200 ~6 ms of host
//! time above its ~20 ms of kernels (BENCHMARKS.md, forty-third session): most of the gap to
//! PyTorch's decode. As the UNet's steps do ([`crate::unet::graph`]), a compiled decode is recorded
//! once per latent shape and replayed: the latents are copied into the graph's input buffer, the
//! graph replays, and the pixels are copied out of its output buffer, all in stream order.
//!
//! The second compiled decode in a row of a shape on a thread prepares a capture, runs as usual
//! (its pixels are the ones returned) and records a second pass, which runs nothing; the next
//! decodes of that shape there replay. (Not the first: its kernels may still be tuning, and
//! shapes taking turns would otherwise record at every decode and never replay.) A capture that
//! fails costs nothing but the speed; after [`MAX_FAILED_CAPTURES`] failures in a row, or a
//! failed replay, this VAE decodes launch by launch (one warning). The recording keeps every
//! pool page it touched for itself while it lives, so only decodes whose largest buffer fits
//! [`MAX_RECORDED_BUFFER_BYTES`] are recorded (SD's 512² image, not SDXL's 1024² one, whose peak
//! must fit 8 GiB), one shape at a time: any other compiled decode drops it first, as the
//! pipeline does before a tiled or plain one. The CPU backend and `LATENT_STUDIO_GRAPH=off` never
//! record.

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

/// Failed captures in a row after which a VAE stops trying.
pub const MAX_FAILED_CAPTURES: usize = 2;

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
    /// The previous compiled decode's shape, dtype and thread: a shape records at its second
    /// decode in a row.
    last: Option<Key>,
    /// Failed captures in a row.
    failures: usize,
    /// Set by a failed replay: no more recordings for this VAE.
    given_up: bool,
    /// Decodes replayed so far.
    replays: usize,
}

type Key = ([usize; 4], DType, std::thread::ThreadId);

impl std::fmt::Debug for DecodeRecording {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never waits: a decode under way holds the slot.
        let recorded = self.0.try_lock().ok().map(|s| s.recorded.is_some());
        f.debug_struct("DecodeRecording")
            .field("recorded", &recorded)
            .finish()
    }
}

/// A prepared capture, closed when dropped unless the window it opened was closed already:
/// every way out of a recording attempt (an error, a panic) leaves the stream as it was.
struct Prepared<'a> {
    device: &'a burn::tensor::Device,
    open: bool,
}

impl Drop for Prepared<'_> {
    fn drop(&mut self) {
        if self.open {
            // From the prepared state this aborts it; after a failed start it is a no-op error.
            let _ = Dispatch::graph_stop_capture(self.device.as_dispatch());
        }
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
            // A recording of another size would hold its pages through this larger decode.
            self.recording.release();
            return self.decode_with(latents, Kernels::Fused);
        }
        let mut slot = self.recording.slot();
        let key = (dims, latents.dtype(), std::thread::current().id());
        let again = slot.last.replace(key) == Some(key);
        if let Some(r) = &slot.recorded {
            if (r.dims, r.dtype, r.thread) == key {
                match r.replay(latents.clone(), &device) {
                    Some(pixels) => {
                        slot.replays += 1;
                        return pixels;
                    }
                    None => {
                        tracing::warn!(
                            "the recorded VAE decode failed to replay; decodes run launch by launch"
                        );
                        slot.given_up = true;
                    }
                }
            }
            // Another shape, dtype or thread (or a failed replay): its pages go first.
            slot.recorded = None;
        }
        if !again || slot.given_up || slot.failures >= MAX_FAILED_CAPTURES {
            return self.decode_with(latents, Kernels::Fused);
        }
        if Dispatch::graph_prepare(device.as_dispatch()).is_err() {
            // A capture prepared elsewhere on this stream (UNet steps still warming up) refuses
            // a second: this decode runs as usual.
            return self.decode_with(latents, Kernels::Fused);
        }
        let mut prepared = Prepared {
            device: &device,
            open: true,
        };
        let pixels = self.decode_with(latents.clone(), Kernels::Fused);
        match self.capture(&latents, &pixels, &mut prepared) {
            Ok(recorded) => {
                slot.recorded = Some(recorded);
                slot.failures = 0;
            }
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

    /// Records one decode of latents shaped as `latents` on fresh buffers, in the capture
    /// `prepared` before the ordinary decode that gave `pixels`; nothing recorded runs until a
    /// replay. The window is closed on every path (`prepared` closes what is left open).
    fn capture(
        &self,
        latents: &Tensor<4>,
        pixels: &Tensor<4>,
        prepared: &mut Prepared<'_>,
    ) -> Result<Recorded, String> {
        let device = latents.device();
        let dispatch = device.as_dispatch();
        // The ordinary decode's lazy ops drained now: none may run inside the window.
        kernels::resolve(pixels.clone()).ok_or("no device buffers")?;
        // An own input buffer, written by our copy kernel only: an op that reuses a unique input
        // in place would otherwise write into the graph's input.
        let input = Tensor::<4>::empty(latents.dims(), (&device, latents.dtype()));
        let input_b = kernels::resolve(input.clone()).ok_or("no device buffers")?;
        Dispatch::graph_start_capture(dispatch).map_err(|e| e.to_string())?;
        // A panic inside the window closes it before unwinding on: an open window would refuse
        // every later read.
        let recorded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let out = self.decode_with(input.clone(), Kernels::Fused);
            let out_b = kernels::resolve(out.clone());
            (out, out_b)
        }));
        let closed = Dispatch::graph_stop_capture(dispatch);
        prepared.open = false;
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
