//! The window's state beside the form and the settings, in three parts: what the engine has told
//! it, the generations waiting for the engine, and what it shows.

use super::*;

/// What the engine (and the adapter enumeration) reported, as the panels show it.
#[derive(Default)]
pub(super) struct Reports {
    /// The engine's adapter list, filled by a background thread (enumeration can take a moment).
    pub adapters: Arc<std::sync::Mutex<Option<Vec<AdapterSummary>>>>,
    /// What the model cache holds.
    pub cache: CacheReport,
    /// The LoRA folder's names.
    pub lora_names: Vec<String>,
    /// The embeddings folder's library (the engine reads it), for the token counter.
    pub embeddings: Option<Arc<latent_engine::prompt::Embeddings>>,
    /// The last "Verify device" result: all agree, and one line per component.
    pub device_check: Option<(bool, Vec<String>)>,
    /// The engine's open device: its name, and whether it is the one shared with the window.
    pub engine_device: Option<(String, bool)>,
    /// The window renders with the device handed to the engine.
    pub window_shares_device: bool,
    /// SDXL's refiner as the engine chose it: its path and name (`name [hash]`).
    pub refiner: Option<(PathBuf, String)>,
}

/// Generations waiting for the engine.
#[derive(Default)]
pub(super) struct Jobs {
    /// First to run first.
    pub queue: Vec<queue_ui::Job>,
    /// The last job id given.
    pub next_id: u64,
    /// A Generate was sent and its `GenerateDone` has not come: the queue waits for it.
    pub running: bool,
    /// The last queued job could not be sent: the queue waits for the next Generate.
    pub held: bool,
}

/// What the window shows besides the form: the preview, the gallery, thumbnails and counts.
pub(super) struct View {
    pub preview: Option<(Arc<Frame>, TextureHandle)>,
    pub gallery: Vec<GalleryItem>,
    pub selected: Option<usize>,
    /// The init image's thumbnail, and the image it shows.
    pub init_texture: Option<(Arc<RgbImage>, TextureHandle)>,
    /// The prompt, emphasis and embeddings library last counted (the library by identity), and
    /// the count: tokens, chunks, truncation.
    pub token_count: ((String, Emphasis, usize), (usize, usize, bool)),
    /// Outpainting: pixels to add, and on which sides (left, right, up, down).
    pub outpaint: (usize, [bool; 4]),
    /// The last UI passes' durations (see `pass_clock`), for the responsiveness test.
    pub frame_times: Vec<super::PassTime>,
}

impl Default for View {
    fn default() -> Self {
        Self {
            preview: None,
            gallery: Vec::new(),
            selected: None,
            init_texture: None,
            token_count: ((String::new(), Emphasis::Original, 0), (0, 1, false)),
            outpaint: (64, [false, true, false, false]),
            frame_times: Vec::new(),
        }
    }
}
