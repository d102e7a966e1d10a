//! Live previews. A preview is computed on the device from the step's predicted x0 (a new tensor:
//! the latent the sampler continues from is never touched) and handed to a named readback thread
//! through a latest-wins channel. That thread reads it back — burn's read returns only once the
//! device's copy is complete, the fence — into the back buffer of two CPU frames and then publishes
//! it as the front frame by swapping one pointer under a lock. Consumers only ever hold complete,
//! immutable frames; the sampler never waits.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use burn::tensor::{DType, Tensor};
use crossbeam_channel::{Receiver, Sender, TrySendError};

use crate::error::{Error, Result};
use crate::pipeline::{Notice, Observer, StepState};
use crate::stable_diffusion::StableDiffusion;
use crate::taesd::TaesdDecoder;
use packed::{PackedImage, latent2rgb_packed, pack_rgb};

mod latent2rgb;
pub mod packed;
pub use latent2rgb::{Factors, latent2rgb, latent2rgb_reference};

/// How previews are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum PreviewMethod {
    None = 0,
    /// Linear latent→RGB projection of x0 (ComfyUI's factors).
    #[default]
    Latent2Rgb = 1,
    /// TAESD tiny decoder (falls back to latent2rgb without weights).
    Taesd = 2,
    /// The real VAE decoder on x0.
    Full = 3,
    /// TAESD if its weights are present, else latent2rgb.
    Auto = 4,
}

impl PreviewMethod {
    const ALL: [PreviewMethod; 5] = [
        Self::None,
        Self::Latent2Rgb,
        Self::Taesd,
        Self::Full,
        Self::Auto,
    ];

    pub fn id(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Latent2Rgb => "latent2rgb",
            Self::Taesd => "taesd",
            Self::Full => "full",
            Self::Auto => "auto",
        }
    }

    fn from_u8(v: u8) -> Self {
        Self::ALL.get(v as usize).copied().unwrap_or_default()
    }
}

impl std::str::FromStr for PreviewMethod {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Self::ALL.into_iter().find(|m| m.id() == s).ok_or_else(|| {
            format!("unknown preview method `{s}` (use none, latent2rgb, taesd, full or auto)")
        })
    }
}

/// Preview settings shared between the UI and a running generation: changes take effect at the
/// next preview step, without a restart.
#[derive(Debug)]
pub struct PreviewSettings {
    method: AtomicU8,
    interval_steps: AtomicUsize,
}

impl PreviewSettings {
    pub fn new(method: PreviewMethod, interval_steps: usize) -> Arc<Self> {
        Arc::new(Self {
            method: AtomicU8::new(method as u8),
            interval_steps: AtomicUsize::new(interval_steps.max(1)),
        })
    }

    pub fn set_method(&self, method: PreviewMethod) {
        self.method.store(method as u8, Ordering::Relaxed);
    }

    pub fn method(&self) -> PreviewMethod {
        PreviewMethod::from_u8(self.method.load(Ordering::Relaxed))
    }

    pub fn set_interval(&self, steps: usize) {
        self.interval_steps.store(steps.max(1), Ordering::Relaxed);
    }

    pub fn interval(&self) -> usize {
        self.interval_steps.load(Ordering::Relaxed).max(1)
    }
}

/// One complete preview image, RGBA8.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Frame {
    pub step: usize,
    pub total: usize,
    pub method: Option<PreviewMethod>,
    pub width: usize,
    pub height: usize,
    pub rgba: Vec<u8>,
    /// From the sampler handing the preview over to its publication.
    pub latency: Duration,
}

/// The front/back pair. The writer fills the back frame (reusing its allocation when no reader
/// still holds it) and swaps it to the front; readers clone the front `Arc` and keep a frame that
/// can no longer change.
#[derive(Debug, Default)]
pub struct FrameStore {
    front: Mutex<Arc<Frame>>,
}

impl FrameStore {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The newest complete frame (step 0 and empty before the first).
    pub fn latest(&self) -> Arc<Frame> {
        match self.front.lock() {
            Ok(front) => front.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Fills `back` with `fill`, then makes it the front frame and hands the old front back for
    /// reuse as the next back buffer.
    pub fn publish(&self, mut back: Arc<Frame>, fill: impl FnOnce(&mut Frame)) -> Arc<Frame> {
        let frame = match Arc::get_mut(&mut back) {
            Some(frame) => frame,
            None => {
                back = Arc::new(Frame::default()); // a reader still holds it: never write into it
                Arc::get_mut(&mut back).expect("fresh Arc is unique")
            }
        };
        fill(frame);
        let mut front = match self.front.lock() {
            Ok(f) => f,
            Err(poisoned) => poisoned.into_inner(),
        };
        std::mem::replace(&mut *front, back)
    }
}

/// A preview computed on the device, waiting to be read back.
pub struct ReadbackRequest {
    pub step: usize,
    pub total: usize,
    pub method: PreviewMethod,
    pub image: PackedImage,
    pub submitted: Instant,
}

impl ReadbackRequest {
    pub fn new(step: usize, total: usize, method: PreviewMethod, image: PackedImage) -> Self {
        Self {
            step,
            total,
            method,
            image,
            submitted: Instant::now(),
        }
    }
}

/// Sees every published frame, on the readback thread (e.g. to write `step_NNN.png` files).
pub type FrameSink = Box<dyn FnMut(&Frame) + Send>;

/// The sampler's end of the readback thread.
pub struct Readback {
    tx: Option<Sender<ReadbackRequest>>,
    drain: Receiver<ReadbackRequest>,
    thread: Option<JoinHandle<()>>,
}

impl Readback {
    /// Starts the named readback thread publishing into `store`.
    pub fn spawn(store: Arc<FrameStore>) -> Result<Self> {
        Self::spawn_with_sink(store, None)
    }

    /// Like [`Readback::spawn`]; `sink` also sees every published frame, on the readback thread.
    pub fn spawn_with_sink(store: Arc<FrameStore>, mut sink: Option<FrameSink>) -> Result<Self> {
        let (tx, rx) = crossbeam_channel::bounded::<ReadbackRequest>(1);
        let drain = rx.clone();
        let thread = std::thread::Builder::new()
            .name("readback".into())
            .spawn(move || {
                let mut back = Arc::new(Frame::default());
                let mut scratch = Vec::new();
                for req in rx {
                    let (w, h) = (req.image.width, req.image.height);
                    // The fence: this returns only after the device finished writing the image;
                    // only then do the bytes go into the back frame.
                    if let Err(e) = req.image.read_into(&mut scratch) {
                        tracing::warn!("preview readback failed: {e}");
                        continue;
                    }
                    back = store.publish(back, |f| {
                        f.step = req.step;
                        f.total = req.total;
                        f.method = Some(req.method);
                        f.width = w;
                        f.height = h;
                        std::mem::swap(&mut f.rgba, &mut scratch);
                        f.latency = req.submitted.elapsed();
                    });
                    if let Some(sink) = sink.as_mut() {
                        sink(&store.latest());
                    }
                }
            })
            .map_err(|e| Error::Device(format!("cannot start the readback thread: {e}")))?;
        Ok(Self {
            tx: Some(tx),
            drain,
            thread: Some(thread),
        })
    }

    /// Hands a preview over without ever waiting: an unread older request is replaced.
    pub fn submit(&self, mut req: ReadbackRequest) {
        let Some(tx) = &self.tx else { return };
        loop {
            match tx.try_send(req) {
                Ok(()) => return,
                Err(TrySendError::Full(r)) => {
                    let _ = self.drain.try_recv(); // latest wins
                    req = r;
                }
                Err(TrySendError::Disconnected(_)) => return,
            }
        }
    }

    /// Waits for the last submitted preview to be published (end of a generation).
    pub fn finish(mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Readback {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An [`Observer`] that turns steps into previews and passes everything on to `inner`.
pub struct Previewer<'a> {
    model: &'a StableDiffusion,
    settings: Arc<PreviewSettings>,
    readback: Readback,
    factors: Factors,
    inner: &'a mut dyn Observer,
    taesd: Option<&'a TaesdDecoder>,
    taesd_notice_sent: bool,
}

impl<'a> Previewer<'a> {
    /// Previews without a TAESD decoder (`taesd` falls back to latent2rgb with a notice).
    pub fn new(
        model: &'a StableDiffusion,
        settings: Arc<PreviewSettings>,
        store: Arc<FrameStore>,
        inner: &'a mut dyn Observer,
    ) -> Result<Self> {
        Self::with(model, settings, store, None, None, inner)
    }

    /// Previews with an optional TAESD decoder and an optional sink for published frames.
    pub fn with(
        model: &'a StableDiffusion,
        settings: Arc<PreviewSettings>,
        store: Arc<FrameStore>,
        taesd: Option<&'a TaesdDecoder>,
        sink: Option<FrameSink>,
        inner: &'a mut dyn Observer,
    ) -> Result<Self> {
        Ok(Self {
            model,
            settings,
            readback: Readback::spawn_with_sink(store, sink)?,
            factors: Factors::for_model(&model.config)?,
            inner,
            taesd,
            taesd_notice_sent: false,
        })
    }

    /// Waits until the last preview is published.
    pub fn finish(self) {
        self.readback.finish();
    }

    /// The preview of x0's first image, packed RGBA8 on the device; `None` for no preview.
    fn render(
        &mut self,
        method: PreviewMethod,
        x0: &Tensor<4>,
    ) -> Option<(PreviewMethod, PackedImage)> {
        match method {
            PreviewMethod::None => None,
            PreviewMethod::Latent2Rgb => Some((method, latent2rgb_packed(x0, &self.factors))),
            PreviewMethod::Taesd | PreviewMethod::Auto => match self.taesd {
                Some(taesd) => {
                    let pixels = taesd.decode(x0.clone().narrow(0, 0, 1));
                    Some((PreviewMethod::Taesd, pack_rgb(pixels_to_rgb(pixels))))
                }
                None => {
                    // auto means TAESD when it is there; asking for TAESD without it gets a notice, once.
                    if method == PreviewMethod::Taesd && !self.taesd_notice_sent {
                        self.taesd_notice_sent = true;
                        self.inner.notice(&Notice::PreviewFallback {
                            wanted: "taesd",
                            used: "latent2rgb",
                            reason: "no TAESD decoder weights are loaded",
                        });
                    }
                    Some((
                        PreviewMethod::Latent2Rgb,
                        latent2rgb_packed(x0, &self.factors),
                    ))
                }
            },
            PreviewMethod::Full => {
                let dtype = self.model.precision.dtype();
                let pixels = self
                    .model
                    .vae
                    .decode(x0.clone().narrow(0, 0, 1).cast(dtype));
                Some((method, pack_rgb(pixels_to_rgb(pixels))))
            }
        }
    }
}

/// Decoder output `[1, 3, H, W]` in [-1, 1] to `[H, W, 3]` in 0..=255 (f32), as the image writer maps it.
fn pixels_to_rgb(pixels: Tensor<4>) -> Tensor<3> {
    let [_, _, h, w] = pixels.dims();
    let rgb = pixels
        .cast(DType::F32)
        .reshape([3, h, w])
        .permute([1, 2, 0]);
    ((rgb + 1.0) / 2.0).clamp(0.0, 1.0) * 255.0
}

impl Observer for Previewer<'_> {
    fn notice(&mut self, notice: &Notice) {
        self.inner.notice(notice);
    }

    fn step(&mut self, state: &StepState<'_>) {
        let interval = self.settings.interval();
        let due = state.step.is_multiple_of(interval) || state.step == state.total;
        if due && let Some((method, image)) = self.render(self.settings.method(), state.denoised) {
            self.readback
                .submit(ReadbackRequest::new(state.step, state.total, method, image));
        }
        self.inner.step(state);
    }

    fn image(&mut self, generated: &crate::pipeline::Generated) {
        self.inner.image(generated);
    }

    fn decoding(&mut self, tiles: usize) {
        self.inner.decoding(tiles);
    }

    fn tuning(&mut self, width: usize, height: usize) {
        self.inner.tuning(width, height);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    /// A frame whose every byte depends on its step, plus a checksum over them.
    fn fill_pattern(f: &mut Frame, step: usize) {
        f.step = step;
        f.width = 64;
        f.height = 48;
        f.rgba.clear();
        f.rgba
            .extend((0..64 * 48 * 4 - 4).map(|i| ((i * 31 + step * 7) % 251) as u8));
        let sum: u32 = f.rgba.iter().map(|&b| b as u32).sum();
        f.rgba.extend_from_slice(&sum.to_le_bytes());
    }

    fn check(f: &Frame) {
        let (body, tail) = f.rgba.split_at(f.rgba.len() - 4);
        let sum: u32 = body.iter().map(|&b| b as u32).sum();
        assert_eq!(sum.to_le_bytes(), tail, "torn frame at step {}", f.step);
        for (i, &b) in body.iter().enumerate() {
            assert_eq!(
                b as usize,
                (i * 31 + f.step * 7) % 251,
                "mixed frame at step {}",
                f.step
            );
        }
    }

    #[test]
    fn thousands_of_frames_are_never_torn_and_never_go_back() {
        let store = FrameStore::new();
        let done = Arc::new(AtomicBool::new(false));
        let reader = {
            let (store, done) = (store.clone(), done.clone());
            std::thread::Builder::new()
                .name("consumer".into())
                .spawn(move || {
                    let (mut last, mut seen, mut rng) = (0usize, 0usize, 12345u64);
                    while !done.load(Ordering::Relaxed) {
                        let frame = store.latest();
                        if frame.step > 0 {
                            check(&frame);
                            assert!(
                                frame.step >= last,
                                "went back from {last} to {}",
                                frame.step
                            );
                            last = frame.step;
                            seen += 1;
                        }
                        rng = rng
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        std::thread::sleep(Duration::from_micros(rng >> 54)); // 0..1 ms
                    }
                    seen
                })
                .unwrap()
        };
        let mut back = Arc::new(Frame::default());
        for step in 1..=2000 {
            back = store.publish(back, |f| fill_pattern(f, step));
        }
        std::thread::sleep(Duration::from_millis(5));
        done.store(true, Ordering::Relaxed);
        let seen = reader.join().expect("no torn frames");
        assert!(seen > 0);
        assert_eq!(store.latest().step, 2000);
    }

    #[test]
    fn readback_publishes_the_latest_and_never_blocks() {
        let device = burn::tensor::Device::flex();
        let store = FrameStore::new();
        let readback = Readback::spawn(store.clone()).unwrap();
        for step in 1..=50 {
            let rgb = Tensor::<3>::full([4, 5, 3], step as f32, &device);
            readback.submit(ReadbackRequest::new(
                step,
                50,
                PreviewMethod::Latent2Rgb,
                pack_rgb(rgb),
            ));
        }
        readback.finish();
        let frame = store.latest();
        assert_eq!((frame.step, frame.width, frame.height), (50, 5, 4));
        assert!(frame.rgba.chunks(4).all(|p| p == [50, 50, 50, 255]));
    }

    #[test]
    fn settings_change_live_and_parse() {
        let s = PreviewSettings::new(PreviewMethod::None, 0);
        assert_eq!(s.interval(), 1);
        s.set_method(PreviewMethod::Full);
        s.set_interval(3);
        assert_eq!((s.method(), s.interval()), (PreviewMethod::Full, 3));
        assert_eq!("taesd".parse(), Ok(PreviewMethod::Taesd));
        assert!("vae".parse::<PreviewMethod>().is_err());
    }
}
