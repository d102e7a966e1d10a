//! The UNet's steps of one generation replayed from a captured graph.
//!
//! A step is ~400 kernel launches, and on wgpu each one pays for pipeline lookup, binding
//! resolution, a metadata upload and a bind group on cubecl's device thread: 40–45 ms of host work
//! per SD 1.5 step on an H200 (BENCHMARKS.md), more than PyTorch's whole step. cubecl records a
//! run's launches once (a software graph: everything resolved at record time) and re-encodes them
//! per replay. The graph replays against the buffers it was recorded with, so the step's inputs
//! (the latents and the timestep projection) are copied into fixed buffers before each replay and
//! the prediction copied out after it, all in stream order; the text conditioning is fixed for
//! the generation and held by the runner, and so are the keys and values every cross-attention
//! layer projects from it: [`UNetSteps`] projects them once
//! ([`UNet2DConditionModel::project_context`]) and its steps read them, recorded or not.
//!
//! The first [`WARMUP_RUNS`] steps run as usual (burn builds and tunes its fused kernels on the
//! first, and the pool then holds every buffer a step needs, since nothing may be allocated while
//! recording); the next step is recorded and replayed, and the rest replay. A capture that fails
//! costs nothing but the speed: that step runs as usual and so do the rest (one warning). The CPU
//! backend, and `LATENT_STUDIO_GRAPH=off`, run every step as usual.
//!
//! The graph reads the text conditioning from buffers of its own, filled before the recording
//! (the keys and values from the tensors the steps projected, which the recording then keeps),
//! so a recorded step can outlive its generation ([`UNetSteps::park`]): the next generation of
//! the same shapes on the same thread copies its conditioning in and replays from its first
//! step ([`UNetSteps::resume`]), skipping the ordinary step and the recording (one launch-by-
//! launch step and one capture, ~50–60 ms of host time on an H200 for SD 1.5).

use burn::backend::wgpu::CubeTensor;
use burn::backend::{Backend, Dispatch, DispatchGraph};
use burn::tensor::{DType, Device, Tensor};

use std::sync::atomic::{AtomicBool, Ordering};

use super::{Context, UNet2DConditionModel};
use crate::kernels::{self, copy::copy_into};

/// Ordinary steps before the recorded one.
pub const WARMUP_RUNS: usize = 2;
/// … where the step's kernels were tuned by an earlier pass of the same shapes ([`UNetSteps::tuned`]):
/// one step refills the pool the capture's preparation emptied.
pub const TUNED_WARMUP_RUNS: usize = 1;

/// Whether steps may replay from a graph on `device`: any wgpu device with our kernels on, unless
/// `LATENT_STUDIO_GRAPH=off`.
pub fn available(device: &Device) -> bool {
    let off = std::env::var("LATENT_STUDIO_GRAPH")
        .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "off" | "0" | "no"));
    !off && kernels::available(device)
}

/// Whether the steps take the prompt's keys and values projected once for the generation
/// ([`UNet2DConditionModel::project_context`]) instead of each cross-attention layer projecting
/// them at every step; on unless the bench compares.
static CONTEXT_ONCE: AtomicBool = AtomicBool::new(true);

/// Sets [`CONTEXT_ONCE`] for the steps made from now on (the bench's A/B).
pub fn set_context_once(on: bool) {
    CONTEXT_ONCE.store(on, Ordering::Relaxed);
}

/// Whether new steps project the prompt's keys and values once ([`set_context_once`]).
pub fn context_once() -> bool {
    CONTEXT_ONCE.load(Ordering::Relaxed)
}

/// The prompt's keys and values as a generation's steps take them: every cross-attention
/// layer's, projected from `context` once where [`context_once`], else none (each layer then
/// projects them at every step; [`Context::projected`] falls back to the tokens).
pub fn generation_kv(unet: &UNet2DConditionModel, context: &Tensor<3>) -> Vec<Tensor<3>> {
    match context_once() {
        true => unet.project_context(context),
        false => Vec::new(),
    }
}

/// Runs one generation's UNet steps (one latent shape, one text conditioning).
pub struct UNetSteps {
    /// The steps' own handle on the UNet (its weights' buffers are shared, not copied): the
    /// caller's may go, e.g. a model's UNet evicted while the refiner runs.
    unet: UNet2DConditionModel,
    context: Tensor<3>,
    /// Every cross-attention layer's keys and values from `context`, projected once (empty: each
    /// layer projects them at every step).
    kv: Vec<Tensor<3>>,
    /// SDXL's added conditioning, where the model has one.
    added: Option<Tensor<2>>,
    device: Device,
    state: State,
    /// Ordinary steps before recording.
    warmup: usize,
    /// Whether a failed recording was already retried.
    retried: bool,
}

enum State {
    /// Every step runs as usual.
    Plain,
    /// The allocator is prepared for a capture; `runs` ordinary steps have run.
    Warming {
        runs: usize,
    },
    Ready(Box<Captured>),
}

/// A recorded step and the buffers it reads and writes (alive as long as the graph is).
struct Captured {
    graph: DispatchGraph,
    shape: [usize; 4],
    dtype: DType,
    x: CubeTensor,
    t: CubeTensor,
    out: CubeTensor,
    /// The conditioning the graph reads (and SDXL's added conditioning), copied in before it was
    /// recorded and again by each generation that resumes it.
    context: CubeTensor,
    context_dims: [usize; 3],
    /// The projected keys and values the graph reads, likewise, and their tensors.
    kv: Vec<(CubeTensor, [usize; 3])>,
    kv_held: Vec<Tensor<3>>,
    added: Option<(CubeTensor, [usize; 2])>,
    /// The thread whose stream the graph was recorded on: replays are ordered against the copies
    /// in and out only there.
    thread: std::thread::ThreadId,
    // The tensors whose buffers the graph was recorded with: held so that nothing else is ever
    // placed there while the graph lives.
    _held: (
        Tensor<4>,
        Tensor<2>,
        Tensor<4>,
        Tensor<3>,
        Option<Tensor<2>>,
    ),
}

/// A recorded step kept after its generation ([`UNetSteps::park`]), with the pool pages it
/// recorded with (they serve nothing else meanwhile).
pub struct Recording(Box<Captured>);

/// Where a model keeps the recorded step of its last generation between generations.
#[derive(Default)]
pub struct ParkedSteps(std::sync::Mutex<Option<Recording>>);

impl ParkedSteps {
    /// The slot; a panic elsewhere while it was held leaves nothing half-written in it.
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Recording>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The parked recording, if any (it is no longer parked).
    pub fn take(&self) -> Option<Recording> {
        self.slot().take()
    }

    /// Parks `recording`, dropping any other.
    pub fn put(&self, recording: Recording) {
        *self.slot() = Some(recording);
    }

    /// Drops the parked recording, returning its pages to the pool.
    pub fn clear(&self) {
        drop(self.take());
    }

    /// Whether a recording is parked.
    pub fn is_parked(&self) -> bool {
        self.slot().is_some()
    }
}

impl UNetSteps {
    /// Steps of `unet` conditioned on `context` `[b, 77, d]`.
    pub fn new(unet: &UNet2DConditionModel, context: Tensor<3>) -> Self {
        let device = context.device();
        let state = if available(&device) && Dispatch::graph_prepare(device.as_dispatch()).is_ok() {
            State::Warming { runs: 0 }
        } else {
            State::Plain
        };
        let kv = generation_kv(unet, &context);
        // Materialised now, before the warm-up steps, never first inside a recording (where
        // no buffer may be allocated).
        for k in &kv {
            let _ = kernels::resolve(k.clone());
        }
        Self {
            unet: unet.clone(),
            context,
            kv,
            added: None,
            device,
            state,
            warmup: WARMUP_RUNS,
            retried: false,
        }
    }

    /// The same steps for a shape an earlier pass in this process already ran (its kernels are
    /// tuned): recorded after [`TUNED_WARMUP_RUNS`] ordinary steps instead of [`WARMUP_RUNS`].
    pub fn tuned(mut self) -> Self {
        self.warmup = TUNED_WARMUP_RUNS;
        self
    }

    /// The same steps with SDXL's added conditioning `[b, 4·c0]`
    /// ([`UNet2DConditionModel::added_conditioning`]), constant over the steps like the context.
    pub fn with_added(mut self, added: Tensor<2>) -> Self {
        self.added = Some(added);
        self
    }

    /// Drops the recorded step (and the pool pages it keeps for itself) or the prepared capture,
    /// and the projected keys and values (their memory serves the decode that follows); later
    /// steps run launch by launch, their layers projecting the keys and values.
    pub fn release(&mut self) {
        // A prepared capture that never recorded holds the stream apart: close it.
        if matches!(self.state, State::Warming { .. }) {
            let _ = Dispatch::graph_stop_capture(self.device.as_dispatch());
        }
        self.state = State::Plain;
        self.kv = Vec::new();
    }

    /// Steps of `unet` conditioned on `context` (and SDXL's `added`) replaying `recording`, a
    /// step recorded by an earlier generation of `unet` at the same shapes on this thread, from
    /// the first step on. `None` (the recording dropped) where it does not fit them or the
    /// conditioning cannot be copied in.
    pub fn resume(
        unet: &UNet2DConditionModel,
        context: Tensor<3>,
        added: Option<Tensor<2>>,
        recording: Recording,
    ) -> Option<Self> {
        let captured = recording.0;
        let same_added = match (&added, &captured.added) {
            (None, None) => true,
            (Some(a), Some((_, dims))) => a.dims() == *dims,
            _ => false,
        };
        // (The copies below check the dtypes.)
        if captured.thread != std::thread::current().id()
            || context.dims() != captured.context_dims
            || !same_added
        {
            return None;
        }
        let kv = generation_kv(unet, &context);
        let same_kv = kv.len() == captured.kv.len()
            && kv
                .iter()
                .zip(&captured.kv)
                .all(|(k, (_, dims))| k.dims() == *dims);
        if !same_kv {
            return None;
        }
        copy_into(&kernels::resolve(context.clone())?, &captured.context)?;
        for (k, (buffer, _)) in kv.iter().zip(&captured.kv) {
            copy_into(&kernels::resolve(k.clone())?, buffer)?;
        }
        if let (Some(a), Some((buffer, _))) = (&added, &captured.added) {
            copy_into(&kernels::resolve(a.clone())?, buffer)?;
        }
        // The recording's tensors, now holding these keys and values, serve plain steps too.
        let kv = captured.kv_held.clone();
        Some(Self {
            unet: unet.clone(),
            device: context.device(),
            context,
            kv,
            added,
            state: State::Ready(captured),
            warmup: WARMUP_RUNS,
            retried: false,
        })
    }

    /// The recorded step, taken out to outlive this generation ([`Self::resume`]); later steps
    /// here run launch by launch. `None` (after [`Self::release`]) where nothing was recorded.
    pub fn park(&mut self) -> Option<Recording> {
        match std::mem::replace(&mut self.state, State::Plain) {
            State::Ready(captured) => {
                self.kv = Vec::new();
                Some(Recording(captured))
            }
            other => {
                self.state = other;
                self.release();
                None
            }
        }
    }

    /// One step launch by launch.
    fn plain(&self, x: Tensor<4>, t: Tensor<2>) -> Tensor<4> {
        let context = Context::projected(&self.context, &self.kv);
        self.unet
            .forward_projected(x, t, context, self.added.as_ref())
    }

    /// Whether the steps now replay a recorded graph.
    pub fn is_replaying(&self) -> bool {
        matches!(self.state, State::Ready(_))
    }

    /// The UNet's prediction for `x` `[b, c, h, w]` at `timestep` (one for the whole batch).
    pub fn forward(&mut self, x: Tensor<4>, timestep: f32) -> Tensor<4> {
        let b = x.dims()[0];
        let t = self.unet.timestep_input(&vec![timestep; b], &self.device);
        let record = match &mut self.state {
            State::Plain => false,
            State::Warming { runs } if *runs < self.warmup => {
                *runs += 1;
                false
            }
            State::Warming { .. } => true,
            State::Ready(_) => return self.replay(x, t),
        };
        if !record {
            return self.plain(x, t);
        }
        match self.capture(&x, &t) {
            Ok(captured) => {
                self.state = State::Ready(Box::new(captured));
                self.replay(x, t)
            }
            Err(reason)
                if !self.retried && Dispatch::graph_prepare(self.device.as_dispatch()).is_ok() =>
            {
                // Once more after the full warm-up (the pool may not have held every buffer).
                tracing::debug!("the UNet step could not be recorded ({reason}); trying again");
                self.retried = true;
                self.warmup = WARMUP_RUNS;
                self.state = State::Warming { runs: 1 };
                self.plain(x, t)
            }
            Err(reason) => {
                tracing::warn!(
                    "the UNet step could not be recorded as a graph ({reason}); \
                     every step runs launch by launch"
                );
                self.state = State::Plain;
                self.plain(x, t)
            }
        }
    }

    /// Records one step on fresh input buffers; nothing recorded runs until a replay.
    fn capture(&self, x: &Tensor<4>, t: &Tensor<2>) -> Result<Captured, String> {
        let dispatch = self.device.as_dispatch();
        // Own buffers, written by our copy kernel, never by burn: an op that may reuse a unique
        // input buffer in place would otherwise write into the graph's input.
        let x_in = Tensor::<4>::empty(x.dims(), (&self.device, x.dtype()));
        let t_in = Tensor::<2>::empty(t.dims(), (&self.device, t.dtype()));
        let (xb, tb) = match (
            kernels::resolve(x_in.clone()),
            kernels::resolve(t_in.clone()),
        ) {
            (Some(xb), Some(tb)) => (xb, tb),
            _ => return Err("no device buffers".into()),
        };
        // The conditioning in buffers of the graph's own, so that a later generation can copy
        // its own in ([`Self::resume`]).
        let own = |t: Tensor<3>| {
            let copy = Tensor::<3>::empty(t.dims(), (&self.device, t.dtype()));
            let buffer = kernels::resolve(copy.clone())?;
            copy_into(&kernels::resolve(t)?, &buffer)?;
            Some((copy, buffer))
        };
        let (context_in, context_b) = own(self.context.clone()).ok_or("no context buffer")?;
        // The projected keys and values as they are: they were allocated before the warm-up
        // steps, whereas copies taken here would claim pool slices the recorded step needs
        // (a new page is refused while recording: the capture failed on the H200 that way).
        // Only the attention kernels read them, and the steps hold them, so no op takes their
        // buffers over.
        let kv_in = self.kv.clone();
        let kv_b = kv_in
            .iter()
            .map(|k| kernels::resolve(k.clone()))
            .collect::<Option<Vec<_>>>()
            .ok_or("no key and value buffers")?;
        let added = match &self.added {
            Some(a) => {
                let [b, n] = a.dims();
                let (copy, buffer) = own(a.clone().reshape([b, 1, n])).ok_or("no added buffer")?;
                Some((copy.reshape([b, n]), buffer, [b, n]))
            }
            None => None,
        };
        let added_in = added.as_ref().map(|(t, _, _)| t.clone());
        Dispatch::graph_start_capture(dispatch).map_err(|e| e.to_string())?;
        // The lazy fused ops drain into the recording on `resolve`. A panic inside the window
        // closes it before unwinding on: an open window would refuse every later read.
        let recorded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let context = Context::projected(&context_in, &kv_in);
            let out =
                self.unet
                    .forward_projected(x_in.clone(), t_in.clone(), context, added_in.as_ref());
            let outb = kernels::resolve(out.clone());
            (out, outb)
        }));
        let closed = Dispatch::graph_stop_capture(dispatch);
        let (out, outb) = match recorded {
            Ok(recorded) => recorded,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        let graph = closed.map_err(|e| e.to_string())?;
        let outb = outb.ok_or("no output buffer")?;
        Ok(Captured {
            graph,
            shape: x.dims(),
            dtype: x.dtype(),
            x: xb,
            t: tb,
            out: outb,
            context_dims: context_in.dims(),
            context: context_b,
            kv: kv_b
                .into_iter()
                .zip(&kv_in)
                .map(|(b, k)| (b, k.dims()))
                .collect(),
            kv_held: kv_in,
            added: added.map(|(_, buffer, dims)| (buffer, dims)),
            thread: std::thread::current().id(),
            _held: (x_in, t_in, out, context_in, added_in),
        })
    }

    /// Inputs in, the recorded step, the prediction out into a tensor of its own (the next replay
    /// overwrites the graph's output buffer).
    fn replay(&mut self, x: Tensor<4>, t: Tensor<2>) -> Tensor<4> {
        let State::Ready(captured) = &self.state else {
            return self.plain(x, t);
        };
        if x.dims() != captured.shape || x.dtype() != captured.dtype {
            // Another latent shape (a resumed recording of another size): recorded afresh.
            self.state = match Dispatch::graph_prepare(self.device.as_dispatch()) {
                Ok(_) => State::Warming { runs: 0 },
                Err(_) => State::Plain,
            };
            self.warmup = WARMUP_RUNS;
            return self.plain(x, t);
        }
        let copied_in = kernels::resolve(x.clone())
            .zip(kernels::resolve(t.clone()))
            .and_then(|(xs, ts)| {
                copy_into(&xs, &captured.x)?;
                copy_into(&ts, &captured.t)
            });
        let Some(()) = copied_in else {
            return self.plain(x, t);
        };
        // SAFETY: every buffer the graph reads or writes is held by `captured` (inputs, output,
        // conditioning) or by the model (weights), all outliving the replay; the copies in and
        // out are launched on this thread's stream, the one it was recorded on (`resume` checks
        // the thread), so they are ordered against it; nothing else writes those buffers.
        let replayed =
            unsafe { Dispatch::graph_replay(self.device.as_dispatch(), &captured.graph) };
        if let Err(e) = replayed {
            tracing::warn!("a recorded UNet step failed to replay ({e}); running steps as usual");
            self.state = State::Plain;
            return self.plain(x, t);
        }
        match kernels::output(captured.shape, captured.dtype, &self.device) {
            Some((out, buffer)) if copy_into(&captured.out, &buffer).is_some() => out,
            _ => {
                tracing::warn!("the recorded UNet step's output could not be copied out");
                self.state = State::Plain;
                self.plain(x, t)
            }
        }
    }
}

impl Drop for UNetSteps {
    fn drop(&mut self) {
        // A prepared capture that never recorded still holds the stream apart: closed here.
        self.release();
    }
}

#[cfg(test)]
mod tests;
