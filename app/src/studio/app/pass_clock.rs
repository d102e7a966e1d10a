//! How long a UI pass took of its own: the wall time less the time the OS kept the thread
//! runnable but off every CPU (Linux's per-thread run-queue delay, `/proc/thread-self/schedstat`).
//! What remains is the pass's work plus every blocking wait (a file, a lock, a channel): the two
//! things a pass must never spend a 60 Hz frame on. A pass preempted on a loaded machine (CI's two
//! cores beside the engine's threads and lavapipe's) did not make the window slow; one that waited
//! on a file did. Elsewhere the run-queue delay is not known and the whole wall time counts.

use std::time::{Duration, Instant};

/// One UI pass's durations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassTime {
    /// From the pass's start to its end.
    pub wall: Duration,
    /// `wall` less the time spent waiting for a CPU (equal to `wall` where that is unknown).
    pub own: Duration,
    /// Whether the OS told the run-queue delay (Linux with scheduler statistics), so `own`
    /// excludes preemption.
    pub exact: bool,
}

/// Started at a pass's beginning, read at its end.
pub(super) struct PassClock {
    started: Instant,
    queued: Option<Duration>,
}

impl PassClock {
    pub fn start() -> Self {
        Self {
            queued: run_queue_delay(),
            started: Instant::now(),
        }
    }

    pub fn stop(self) -> PassTime {
        let wall = self.started.elapsed();
        let waited = match (self.queued, run_queue_delay()) {
            (Some(before), Some(after)) => Some(after.saturating_sub(before)),
            _ => None,
        };
        PassTime {
            wall,
            own: wall.saturating_sub(waited.unwrap_or_default()),
            exact: waited.is_some(),
        }
    }
}

/// This thread's total time spent runnable but not running, where the OS says.
fn run_queue_delay() -> Option<Duration> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .as_deref()
        .and_then(parse_schedstat)
}

/// The second field of `schedstat` ("run time, run-queue delay, time slices", nanoseconds).
fn parse_schedstat(text: &str) -> Option<Duration> {
    let delay = text.split_whitespace().nth(1)?.parse().ok()?;
    Some(Duration::from_nanos(delay))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_run_queue_delay_field() {
        assert_eq!(
            parse_schedstat("914675 2044464 3\n"),
            Some(Duration::from_nanos(2_044_464))
        );
        assert_eq!(parse_schedstat("914675"), None);
        assert_eq!(parse_schedstat("a b c"), None);
    }

    #[test]
    fn a_blocking_wait_counts_as_the_pass_s_own_time() {
        let clock = PassClock::start();
        std::thread::sleep(Duration::from_millis(30));
        let pass = clock.stop();
        // Sleeping is not waiting for a CPU: all of it is the pass's.
        assert!(pass.own >= Duration::from_millis(30), "{pass:?}");
        assert!(pass.own <= pass.wall, "{pass:?}");
        assert_eq!(pass.exact, run_queue_delay().is_some());
    }

    #[test]
    fn time_spent_preempted_is_not_the_pass_s() {
        // More spinning threads than CPUs, so the measured thread waits for one at times.
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let stop = std::sync::atomic::AtomicBool::new(false);
        let pass = std::thread::scope(|scope| {
            for _ in 0..2 * cpus {
                scope.spawn(|| {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                });
            }
            let clock = PassClock::start();
            let spin = Instant::now();
            while spin.elapsed() < Duration::from_millis(200) {
                std::hint::spin_loop();
            }
            let pass = clock.stop();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            pass
        });
        assert!(pass.own <= pass.wall, "{pass:?}");
        if pass.exact {
            // With 2× as many busy threads as CPUs the scheduler hands this one roughly a third
            // of the time; a strict bound would depend on the scheduler, so only "some" is asked.
            assert!(
                pass.own < pass.wall,
                "no run-queue delay measured: {pass:?}"
            );
        }
    }
}
