//! What the window and the engine say to each other: the settings the engine needs, commands
//! (window → engine) and events (engine → window).

use super::*;

/// What the engine needs to know from the settings.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    pub device: DeviceChoice,
    /// `None`: the device's preference (f16 where supported).
    pub precision: Option<Precision>,
    /// Where the loaded model's text encoders wait between prompts.
    pub text_encoders: TextEncoders,
    pub outputs: PathBuf,
    /// The TAESD decoder the artist chose for SD 1.x/2.x latents; without one, and for SDXL's,
    /// the decoder is looked for as [`crate::paths::taesd_for`] says, `models_dir` first.
    pub taesd: Option<PathBuf>,
    pub models_dir: Option<PathBuf>,
    /// Textual-inversion embeddings folder, read at each generation's start.
    pub embeddings: Option<PathBuf>,
    /// LoRA folder: `<lora:name:w>` in a prompt merges `name.safetensors` from it.
    pub loras: Option<PathBuf>,
    /// Model cache on: models stay resident (within the budget) and converted weights go to the
    /// disk cache; off: the model is released after each generation and reloaded for the next,
    /// and nothing is written to the cache folder.
    pub cache: CacheSettings,
    /// Watchdog for opening the device and compiling its first kernels.
    pub device_timeout: Duration,
}

/// GUI → engine.
#[derive(Debug)]
pub enum Command {
    LoadModel(PathBuf),
    /// SDXL's refiner for the generations that turn it on (`None`: none); checked now, loaded
    /// when first used.
    ChooseRefiner(Option<PathBuf>),
    Generate(Box<Txt2ImgRequest>),
    /// New settings; [`EngineHandle::send`] keeps only the latest until the worker reads it.
    Configure(EngineConfig),
    /// The worker's side of `Configure`: take the latest settings from the pending slot.
    ApplyConfig,
    /// Delete every disk-cache entry.
    ClearDiskCache,
    /// Run the demo model on the device and on the CPU backend and compare (`doctor`).
    VerifyDevice,
    Shutdown,
}

/// What the model cache holds, for the settings window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CacheReport {
    /// Resident models, least recently used first: (name, bytes).
    pub resident: Vec<(String, u64)>,
    /// Disk-cache entries, least recently used first: (name, bytes).
    pub disk: Vec<(String, u64)>,
}

/// A finished, saved image.
#[derive(Debug, Clone)]
pub struct Finished {
    pub image: Arc<RgbImage>,
    pub parameters: Parameters,
    pub path: PathBuf,
}

/// A model the engine has loaded, as the window shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedModel {
    pub name: String,
    pub path: PathBuf,
    /// Family and prediction type, e.g. "SD 2.x, v_prediction".
    pub kind: String,
    /// The size it was trained at (each side, pixels): the form's default for it.
    pub native: usize,
    /// SDXL (not inpainting): a refiner can take over its runs.
    pub refinable: bool,
    /// A few-step model (Turbo, LCM) and the settings the model panel offers for it.
    pub few_step: Option<(
        latent_engine::checkpoint::FewStep,
        latent_engine::checkpoint::Preset,
    )>,
}

/// Engine → GUI.
#[derive(Debug, Clone)]
pub enum Event {
    Status(String),
    ModelLoaded(LoadedModel),
    /// The refiner now chosen: its path and name (`name [hash]`), or none.
    Refiner(Option<(PathBuf, String)>),
    Progress {
        image: usize,
        images: usize,
        step: usize,
        total: usize,
        elapsed: Duration,
    },
    Finished(Finished),
    /// A Generate command is over (finished, cancelled or failed), just before its `Idle`: the
    /// window's queue sends its next job on this, not on any `Idle` (a model load or a settings
    /// reload end with one too).
    GenerateDone,
    /// The whole request is done (all images, or cancelled, or failed).
    Idle,
    Cancelled,
    Failed(String),
    /// A command panicked; the engine recovered (see `Worker::recover`). The panic's message.
    Crashed(String),
    Notice(String),
    Cache(CacheReport),
    /// The LoRA folder's names, after the folder is set.
    Loras(Vec<String>),
    /// The embeddings folder's library for the loaded model (`None`: no folder or no model).
    Embeddings(Option<Arc<latent_engine::prompt::Embeddings>>),
    /// The engine's device is open and its first kernels compiled.
    DeviceReady {
        label: String,
        /// It is the [`SharedDevice`] the window renders with.
        shared: bool,
    },
    /// The result of [`Command::VerifyDevice`]: one line per component, and whether all agree.
    DeviceCheck {
        passed: bool,
        lines: Vec<String>,
    },
}

/// Why [`EngineHandle::send`] did not queue a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    Full,
    EngineStopped,
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SendError::Full => {
                "the engine has too many commands waiting; try again when it is done"
            }
            SendError::EngineStopped => "the engine has stopped",
        })
    }
}

impl std::error::Error for SendError {}
