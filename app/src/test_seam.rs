//! The one seam through which tests inject faults into real runs. The CLI and studio tests
//! drive the real binary and the real engine thread, where no mock reaches, so the faults come
//! in through environment variables, all named `LATENT_STUDIO_TEST_*` and all read here; no
//! other code in the app reads them, and unset (every real run) each hook is a no-op. (The
//! engine's device watchdog has its own, `latent_engine::device::TEST_HANG_ENV`: the engine
//! does not depend on the app.)

/// `IMAGE:STEP` (both 1-based) parks the engine thread forever right after that sampling step,
/// as a driver stuck compiling a kernel would leave it; `panic:IMAGE:STEP` panics there
/// instead, as a bug would; `end:IMAGE:STEP` ends the engine thread there (its events channel
/// closes, as after a panic the engine could not recover from).
pub const STALL_AT: &str = "LATENT_STUDIO_TEST_STALL_AT";

/// Set (any value): every VAE compilation check fails, as a kernel that does not compile would
/// (the fallback's drill: `--vae-compile on` must still give the plain decoder's image).
pub const FAIL_VAE_COMPILE: &str = "LATENT_STUDIO_TEST_FAIL_VAE_COMPILE";

/// A number of slots for the studio's event queue instead of its 1024, so a test can fill it
/// (a window that stops reading during a batch) with a few images.
pub const EVENT_QUEUE: &str = "LATENT_STUDIO_TEST_EVENT_QUEUE";

/// [`EVENT_QUEUE`]'s slots, when set to a number of at least 2.
pub fn event_queue_slots() -> Option<usize> {
    std::env::var(EVENT_QUEUE)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n: &usize| n >= 2)
}

/// Set (any value): the `probe` subcommand aborts at once, as a driver crash would.
pub const PROBE_CRASH: &str = "LATENT_STUDIO_TEST_PROBE_CRASH";

/// Set (any value): the `probe` subcommand never finishes, as a driver stuck compiling would.
pub const PROBE_HANG: &str = "LATENT_STUDIO_TEST_PROBE_HANG";

/// Parks the calling thread forever (or panics) when [`STALL_AT`] names this point. Read at
/// each call, so a test can clear it before the next engine starts.
pub fn stall_here(image: usize, step: usize) {
    if let Ok(point) = std::env::var(STALL_AT) {
        let here = format!("{}:{step}", image + 1);
        if point.trim().strip_prefix("panic:") == Some(here.as_str()) {
            panic!("test hook: a panic at image {}, step {step}", image + 1);
        }
        if point.trim().strip_prefix("end:") == Some(here.as_str()) {
            panic!("{ENGINE_ENDS} at image {}, step {step}", image + 1);
        }
        if point.trim() == here {
            tracing::warn!(
                "test hook: stalling the engine at image {}, step {step}",
                image + 1
            );
            loop {
                std::thread::park();
            }
        }
    }
}

/// What [`STALL_AT`]'s `end:` panics with; the engine thread returns on it ([`ends_engine`]).
const ENGINE_ENDS: &str = "test hook: the engine thread ends";

/// Whether a caught panic is [`STALL_AT`]'s `end:`: the engine thread then returns instead of
/// recovering.
pub fn ends_engine(panic_message: &str) -> bool {
    panic_message.starts_with(ENGINE_ENDS)
}

/// Whether [`STALL_AT`] is set (a CLI run on the CPU backend then watches for stalls too, so
/// the hook is testable without a GPU).
pub fn stall_set() -> bool {
    std::env::var_os(STALL_AT).is_some()
}

/// Whether [`FAIL_VAE_COMPILE`] is set.
pub fn vae_compile_fails() -> bool {
    std::env::var_os(FAIL_VAE_COMPILE).is_some()
}

/// Whether [`PROBE_CRASH`] is set.
pub fn probe_crashes() -> bool {
    std::env::var_os(PROBE_CRASH).is_some()
}

/// Whether [`PROBE_HANG`] is set.
pub fn probe_hangs() -> bool {
    std::env::var_os(PROBE_HANG).is_some()
}
