//! Noticing a device that stops making progress after it opened. The watchdog in
//! `latent_engine::device` covers opening the device and its first kernels; kernels for new
//! shapes (the first UNet step at a size, the first decode) compile later, at first use, and a
//! driver can hang there just as well. The engine thread cannot be interrupted inside a driver
//! call, so the other side watches its heartbeat: the CLI gives up with a clear error, the
//! studio offers to restart its engine on the CPU.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A heartbeat from the engine thread and a watcher thread that calls `on_stall` once when no
/// beat came for `limit`. Dropping the watch stops the watcher.
pub struct StallWatch {
    origin: Instant,
    last_ms: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
}

impl StallWatch {
    pub fn start(limit: Duration, on_stall: impl FnOnce(Duration) + Send + 'static) -> Self {
        let origin = Instant::now();
        let last_ms = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let (last, finished) = (last_ms.clone(), done.clone());
        let tick = (limit / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let spawned = std::thread::Builder::new()
            .name("stall-watch".into())
            .spawn(move || {
                while !finished.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    let since = origin
                        .elapsed()
                        .saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)));
                    if since >= limit && !finished.load(Ordering::Relaxed) {
                        on_stall(since);
                        return;
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("no stall watch: {e}");
        }
        Self {
            origin,
            last_ms,
            done,
        }
    }

    /// The engine made progress.
    pub fn beat(&self) {
        self.last_ms
            .store(self.origin.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

impl Drop for StallWatch {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beats_keep_the_watch_quiet_and_silence_trips_it_once() {
        let (tx, rx) = crossbeam_channel::bounded(4);
        let watch = StallWatch::start(Duration::from_millis(300), move |since| {
            let _ = tx.send(since);
        });
        for _ in 0..10 {
            std::thread::sleep(Duration::from_millis(60));
            watch.beat();
        }
        assert!(
            rx.try_recv().is_err(),
            "beats every 60 ms never trip 300 ms"
        );
        let since = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("silence trips the watch");
        assert!(since >= Duration::from_millis(300), "{since:?}");
        assert!(
            rx.recv_timeout(Duration::from_millis(400)).is_err(),
            "only once"
        );
    }

    #[test]
    fn a_dropped_watch_never_trips() {
        let (tx, rx) = crossbeam_channel::bounded(4);
        drop(StallWatch::start(Duration::from_millis(50), move |s| {
            let _ = tx.send(s);
        }));
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    }
}
