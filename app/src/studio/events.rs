//! The engine's end of the event channel. One bounded channel keeps every event in order; what
//! may be lost and what may not differs by kind. Progress and status lines are superseded by the
//! next one, so while the window is not draining (minimised during a long batch) they are dropped
//! once the queue is half full. Results and terminal events (`Finished`, `Idle`, `Failed`,
//! `ModelLoaded`, …) always have that free half to land in, and past it they wait for room rather
//! than vanish: a window that stops reading for a while still finds every image and clears
//! `busy` when it resumes. Only a window that is closing stops that wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crossbeam_channel::{SendTimeoutError, Sender};

use super::worker::Event;

/// Slots of the event channel.
pub const EVENT_QUEUE: usize = 1024;

/// How often a result waiting for room looks whether the window is closing.
const CLOSING_POLL: Duration = Duration::from_millis(100);

impl Event {
    /// Superseded by the next event of its kind (no loss in dropping it).
    fn is_transient(&self) -> bool {
        matches!(self, Event::Progress { .. } | Event::Status(_))
    }
}

/// Sends events to the window and wakes it (see the module docs).
#[derive(Clone)]
pub struct EventSender {
    tx: Sender<Event>,
    wake: Arc<dyn Fn() + Send + Sync>,
    /// Set when the window drops the engine: a result waiting for room gives up.
    closing: Arc<AtomicBool>,
}

impl EventSender {
    pub fn new(
        tx: Sender<Event>,
        wake: Arc<dyn Fn() + Send + Sync>,
        closing: Arc<AtomicBool>,
    ) -> Self {
        Self { tx, wake, closing }
    }

    pub fn send(&self, event: Event) {
        if event.is_transient() {
            let half = self.tx.capacity().unwrap_or(EVENT_QUEUE) / 2;
            if self.tx.len() < half {
                let _ = self.tx.try_send(event);
            }
        } else {
            let mut event = event;
            loop {
                match self.tx.send_timeout(event, CLOSING_POLL) {
                    Ok(()) => break,
                    Err(SendTimeoutError::Timeout(e)) if !self.closing.load(Ordering::SeqCst) => {
                        event = e
                    }
                    // Closing, or the window is gone: nobody will read it.
                    Err(_) => break,
                }
            }
        }
        (self.wake)();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::{Receiver, bounded};
    use std::time::Instant;

    fn progress(step: usize) -> Event {
        Event::Progress {
            image: 0,
            images: 1,
            step,
            total: 1000,
            elapsed: Duration::ZERO,
        }
    }

    fn channel(slots: usize) -> (EventSender, Receiver<Event>, Arc<AtomicBool>) {
        let (tx, rx) = bounded(slots);
        let closing = Arc::new(AtomicBool::new(false));
        (
            EventSender::new(tx, Arc::new(|| {}), closing.clone()),
            rx,
            closing,
        )
    }

    fn drain(rx: &Receiver<Event>) -> Vec<Event> {
        rx.try_iter().collect()
    }

    /// A window that reads nothing while a long run sends a thousand progress events and then
    /// its results: every result is there, in order, and the run never waited.
    #[test]
    fn results_survive_a_window_that_stops_reading() {
        let (events, rx, _) = channel(32);
        let start = Instant::now();
        for step in 0..1000 {
            events.send(progress(step));
            if step % 100 == 99 {
                events.send(Event::Notice(format!("image {}", step / 100)));
            }
        }
        events.send(Event::Idle);
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the sender waited"
        );
        let got = drain(&rx);
        let results: Vec<String> = got
            .iter()
            .filter_map(|e| match e {
                Event::Notice(n) => Some(n.clone()),
                Event::Idle => Some("idle".into()),
                _ => None,
            })
            .collect();
        let mut expected: Vec<String> = (0..10).map(|i| format!("image {i}")).collect();
        expected.push("idle".into());
        assert_eq!(results, expected);
        let progress = got.iter().filter(|e| e.is_transient()).count();
        assert!(
            progress <= 16,
            "{progress} progress events kept in 32 slots"
        );
    }

    /// More results than slots: the sender waits for room instead of dropping, and every one
    /// arrives once the window reads again.
    #[test]
    #[allow(clippy::disallowed_methods)] // a short-lived helper thread
    fn results_wait_for_room_and_arrive() {
        let (events, rx, _) = channel(4);
        let sender = std::thread::spawn(move || {
            for i in 0..20 {
                events.send(Event::Failed(format!("{i}")));
            }
        });
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while got.len() < 20 && Instant::now() < deadline {
            if let Ok(Event::Failed(s)) = rx.recv_timeout(Duration::from_millis(50)) {
                got.push(s);
            }
        }
        sender.join().expect("sender");
        let expected: Vec<String> = (0..20).map(|i| i.to_string()).collect();
        assert_eq!(got, expected);
    }

    /// A closing window releases a sender that waits for room.
    #[test]
    #[allow(clippy::disallowed_methods)] // a short-lived helper thread
    fn closing_releases_a_waiting_sender() {
        let (events, rx, closing) = channel(1);
        events.send(Event::Idle);
        let sender = std::thread::spawn(move || events.send(Event::Idle));
        std::thread::sleep(Duration::from_millis(50));
        closing.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !sender.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            sender.is_finished(),
            "still waiting after the window closed"
        );
        assert_eq!(drain(&rx).len(), 1);
    }
}
