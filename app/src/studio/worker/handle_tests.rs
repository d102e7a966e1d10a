//! The handle's side of the command channel, with no worker reading it: what a settings drag
//! during a generation does to the queue.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crossbeam_channel::{Receiver, bounded};
use latent_engine::preview::{FrameStore, PreviewMethod, PreviewSettings};

use super::{Command, EngineHandle, SendError};
use crate::studio::app::engine_config;
use crate::studio::settings::Settings;

/// A handle over a command queue of `slots` that nobody reads (a worker busy generating).
fn idle_handle(slots: usize) -> (EngineHandle, Receiver<Command>) {
    let (tx, commands) = bounded(slots);
    let (_, events) = bounded(1);
    let handle = EngineHandle {
        tx,
        events,
        cancel: Arc::new(AtomicBool::new(false)),
        closing: Arc::new(AtomicBool::new(false)),
        pending_config: Default::default(),
        preview: PreviewSettings::new(PreviewMethod::default(), 1),
        frames: FrameStore::new(),
        thread: None,
    };
    (handle, commands)
}

/// 200 frames of dragging a setting between two Generates: the settings coalesce into one
/// queued command holding the latest, and neither Generate is lost.
#[test]
fn a_settings_drag_never_crowds_out_a_generate() {
    let (handle, commands) = idle_handle(8);
    let generate = || Command::Generate(Box::default());
    assert_eq!(handle.send(generate()), Ok(()));
    let mut settings = Settings::default();
    for frame in 0..200 {
        settings.device_timeout_secs = 10.0 + frame as f64;
        assert_eq!(
            handle.send(Command::Configure(engine_config(&settings))),
            Ok(())
        );
    }
    assert_eq!(handle.send(generate()), Ok(()));

    let queued: Vec<Command> = commands.try_iter().collect();
    let kinds: Vec<&str> = queued
        .iter()
        .map(|c| match c {
            Command::Generate(_) => "generate",
            Command::ApplyConfig => "config",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["generate", "config", "generate"]);
    let latest = handle.pending_config.lock().expect("lock").take();
    assert_eq!(latest, Some(engine_config(&settings)));
}

/// A full queue refuses a Generate out loud (the window then stays idle and shows why).
#[test]
fn a_full_queue_refuses_instead_of_dropping() {
    let (handle, commands) = idle_handle(2);
    let generate = || Command::Generate(Box::default());
    assert_eq!(handle.send(generate()), Ok(()));
    assert_eq!(handle.send(generate()), Ok(()));
    assert_eq!(handle.send(generate()), Err(SendError::Full));
    assert_eq!(commands.try_iter().count(), 2);
    drop(commands);
    assert_eq!(handle.send(generate()), Err(SendError::EngineStopped));
}
