//! The window's end of the engine: spawning the worker thread, sending commands (settings
//! coalesced, nothing else dropped), cancelling, and letting go of it.

use super::*;

/// The GUI's end of the worker.
pub struct EngineHandle {
    pub(super) tx: Sender<Command>,
    pub events: Receiver<Event>,
    pub(super) cancel: Arc<AtomicBool>,
    /// Set when the window lets go of the engine (see [`EventSender`]).
    pub(super) closing: Arc<AtomicBool>,
    /// The latest settings not yet read by the worker.
    pub(super) pending_config: Arc<std::sync::Mutex<Option<EngineConfig>>>,
    pub preview: Arc<PreviewSettings>,
    pub frames: Arc<FrameStore>,
    pub(super) thread: Option<JoinHandle<()>>,
}

impl EngineHandle {
    /// Starts the worker. `wake` is called after every event (the UI's `request_repaint`).
    pub fn spawn(
        config: EngineConfig,
        preview: Arc<PreviewSettings>,
        wake: Arc<dyn Fn() + Send + Sync>,
        shared: Option<SharedDevice>,
    ) -> Result<Self> {
        let (tx, commands) = bounded::<Command>(64);
        let slots = crate::test_seam::event_queue_slots().unwrap_or(EVENT_QUEUE);
        let (events_tx, events) = bounded::<Event>(slots);
        let cancel = Arc::new(AtomicBool::new(false));
        let closing = Arc::new(AtomicBool::new(false));
        let pending_config = Arc::new(std::sync::Mutex::new(None));
        let frames = FrameStore::new();
        let mut worker = Worker {
            cache: ModelCache::new(config.cache.clone()),
            loras: latent_engine::lora::LoraLibrary::new(config.loras.clone()),
            config,
            events: EventSender::new(events_tx, wake, closing.clone()),
            pending_config: pending_config.clone(),
            cancel: cancel.clone(),
            preview: preview.clone(),
            frames: frames.clone(),
            device: None,
            shared,
            model: None,
            selected: None,
            refiner: None,
            taesd: None,
            tokenizer: None,
            embedding_notes: Default::default(),
        };
        let thread = std::thread::Builder::new()
            .name("engine".into())
            // Model loading moves large structs by value; unoptimised builds need the room.
            .stack_size(32 << 20)
            .spawn(move || {
                worker.report_loras();
                worker.run(commands)
            })
            .context("starting the engine thread")?;
        Ok(Self {
            tx,
            events,
            cancel,
            closing,
            pending_config,
            preview,
            frames,
            thread: Some(thread),
        })
    }

    /// Queues `command`, or says why it was not (nothing is dropped silently: the caller shows
    /// the error and does not mark itself busy). A [`Command::Configure`] replaces one still
    /// waiting: a settings drag sends one per frame while the worker reads none during a
    /// generation, so they coalesce (latest wins) instead of filling the queue.
    pub fn send(&self, command: Command) -> Result<(), SendError> {
        if let Command::Configure(config) = command {
            // Held across the marker's send, so the worker takes the slot only once it is set.
            let mut pending = self
                .pending_config
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if pending.is_none() {
                self.queue(Command::ApplyConfig)?;
            }
            *pending = Some(config);
            return Ok(());
        }
        // Reset before the command is queued: reset after, a worker quick to take it could still
        // read the previous Cancel at its first check and cancel the new run (seen once in 15
        // runs of the studio's cancel test on a loaded machine).
        if matches!(command, Command::Generate(_) | Command::LoadModel(_)) {
            self.cancel.store(false, Ordering::SeqCst);
        }
        self.queue(command)
    }

    fn queue(&self, command: Command) -> Result<(), SendError> {
        self.tx.try_send(command).map_err(|e| match e {
            TrySendError::Full(_) => SendError::Full,
            TrySendError::Disconnected(_) => SendError::EngineStopped,
        })
    }

    /// Gives up on a worker stuck inside a driver call: asks it to stop, and detaches its thread
    /// instead of joining it (joining would hang the UI with it).
    pub fn abandon(mut self) {
        self.cancel.store(true, Ordering::SeqCst);
        self.closing.store(true, Ordering::SeqCst);
        let _ = self.tx.try_send(Command::Shutdown);
        drop(self.thread.take());
    }

    /// Stops the running generation at the next step.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::SeqCst);
        self.closing.store(true, Ordering::SeqCst);
        let _ = self.tx.try_send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            // A worker stuck in a driver call never finishes: closing the window must not hang
            // with it. A healthy one stops at its next step.
            let deadline = Instant::now() + Duration::from_secs(10);
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                tracing::warn!("the engine thread did not stop within 10 s; leaving it behind");
            }
        }
    }
}
