//! Settings saved off the UI thread. A drag changes a setting every frame and each save is an
//! fsync'd atomic write (tens of milliseconds on a slow disk), so the window only hands the
//! latest settings to a saver thread, which writes them once the changes pause for
//! [`DEBOUNCE`], and at once when the studio closes. Nothing is lost: the last change is always
//! written, and a failure comes back to the window as a message.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded};

use super::settings::Settings;

/// Quiet time after the last change before it is written.
pub const DEBOUNCE: Duration = Duration::from_millis(300);

#[derive(Default)]
struct Pending {
    latest: Option<Settings>,
    changed: Option<Instant>,
    closing: bool,
}

type Shared = Arc<(Mutex<Pending>, Condvar)>;

/// The window's end of the saver thread.
pub struct SettingsSaver {
    shared: Shared,
    path: PathBuf,
    errors: (Sender<String>, Receiver<String>),
    thread: Option<JoinHandle<()>>,
}

impl SettingsSaver {
    /// Starts the saver for `path`. Without a thread (the system refused one), saves happen on
    /// the caller's thread: slower, never lost.
    pub fn new(path: PathBuf) -> Self {
        let shared: Shared = Default::default();
        let errors = bounded(16);
        let (worker, file, tx) = (shared.clone(), path.clone(), errors.0.clone());
        let thread = std::thread::Builder::new()
            .name("settings-saver".into())
            .spawn(move || run(worker, file, tx))
            .map_err(|e| tracing::warn!("no settings-saver thread ({e}); saving inline"))
            .ok();
        Self {
            shared,
            path,
            errors,
            thread,
        }
    }

    /// Queues `settings` to be written (latest wins).
    pub fn save(&self, settings: &Settings) {
        if self.thread.is_none() {
            if let Err(e) = settings.save(&self.path) {
                let _ = self.errors.0.try_send(format!("settings not saved: {e:#}"));
            }
            return;
        }
        let (mutex, wake) = &*self.shared;
        let mut pending = mutex.lock().unwrap_or_else(|p| p.into_inner());
        pending.latest = Some(settings.clone());
        pending.changed = Some(Instant::now());
        wake.notify_one();
    }

    /// A failed save since the last call, in words.
    pub fn error(&self) -> Option<String> {
        self.errors.1.try_recv().ok()
    }

    /// Writes what is pending now and stops the thread (the studio is closing).
    pub fn flush(&mut self) {
        {
            let (mutex, wake) = &*self.shared;
            mutex.lock().unwrap_or_else(|p| p.into_inner()).closing = true;
            wake.notify_one();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for SettingsSaver {
    fn drop(&mut self) {
        self.flush();
    }
}

/// The saver thread: waits for a change, lets changes settle, writes the latest.
fn run(shared: Shared, path: PathBuf, errors: Sender<String>) {
    let (mutex, wake) = &*shared;
    let mut pending = mutex.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let due = pending
            .changed
            .map(|at| DEBOUNCE.saturating_sub(at.elapsed()));
        match (pending.latest.is_some(), due) {
            (true, Some(wait)) if !wait.is_zero() && !pending.closing => {
                pending = wake
                    .wait_timeout(pending, wait)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            (true, _) => {
                let settings = pending.latest.take();
                pending.changed = None;
                drop(pending);
                if let Some(settings) = settings
                    && let Err(e) = settings.save(&path)
                {
                    let _ = errors.try_send(format!("settings not saved: {e:#}"));
                }
                pending = mutex.lock().unwrap_or_else(|p| p.into_inner());
            }
            (false, _) if pending.closing => return,
            (false, _) => {
                pending = wake.wait(pending).unwrap_or_else(|p| p.into_inner());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("latent-saver-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch");
        dir.join("settings.json")
    }

    /// A drag of 200 changes: none waits for the disk, the file ends with the last one, and far
    /// fewer than 200 writes happened (the file's content changed once per settle).
    #[test]
    fn a_drag_is_written_once_it_settles_and_the_last_value_wins() {
        let path = scratch("drag");
        let saver = SettingsSaver::new(path.clone());
        let mut settings = Settings::default();
        let start = Instant::now();
        for i in 0..200 {
            settings.device_timeout_secs = 10.0 + i as f64;
            saver.save(&settings);
        }
        assert!(start.elapsed() < Duration::from_secs(2), "saving waited");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (saved, _) = Settings::load(&path);
            if saved.device_timeout_secs == 209.0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the last change never reached the file"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(saver.error().is_none());
    }

    /// Closing writes a change still inside its quiet time.
    #[test]
    fn closing_writes_what_is_pending() {
        let path = scratch("close");
        let mut saver = SettingsSaver::new(path.clone());
        let settings = Settings {
            device_timeout_secs: 77.0,
            ..Settings::default()
        };
        saver.save(&settings);
        saver.flush();
        assert_eq!(Settings::load(&path).0.device_timeout_secs, 77.0);
    }

    /// A folder that cannot be written: the window hears it.
    #[test]
    fn a_failed_save_comes_back_as_a_message() {
        let blocker = scratch("fail");
        std::fs::write(&blocker, b"a file where a folder should be").expect("write");
        let mut saver = SettingsSaver::new(blocker.join("settings.json"));
        saver.save(&Settings::default());
        saver.flush();
        let message = saver.error().expect("an error");
        assert!(message.contains("settings not saved"), "{message}");
    }
}
