//! Finding and opening checkpoints: single `.safetensors` files in the LDM layout and diffusers
//! folders, each memory-mapped once and shared by every component that reads from it.

mod config;
pub mod family;
pub mod few_step;
pub mod ldm;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::tensor::{DType, Device};
use serde::de::DeserializeOwned;

use crate::clip::ClipConfig;
use crate::error::{Error, Result};
use crate::schedulers::{Prediction, SchedulerConfig};
use crate::unet::UNetConfig;
pub use config::ModelConfig;
pub use family::Family;
pub use few_step::{FewStep, Preset};
// The tensors a checkpoint holds, and reading them, live in `crate::weights` (the models read
// them too, and the models' configs are what a checkpoint detects): re-exported for callers.
pub use crate::weights::{KeyMap, LoadReport, SafetensorsFile, Weights, controlled, sha256_file};
pub use crate::weights::{kept, safetensors};

/// How a checkpoint is laid out on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    SingleFile,
    Diffusers,
}

/// An opened checkpoint: its files mapped, its family checked, its configs resolved.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub path: PathBuf,
    pub layout: Layout,
    pub family: Family,
    pub config: ModelConfig,
    /// A few-step distillation recognised from the files ([`few_step::recognise`]).
    pub few_step: Option<FewStep>,
    /// The first text encoder (none in SDXL's refiner).
    text_encoder: Option<Arc<SafetensorsFile>>,
    /// SDXL's second text encoder (the same file as the others in a single file).
    text_encoder_2: Option<Arc<SafetensorsFile>>,
    unet: Arc<SafetensorsFile>,
    vae: Arc<SafetensorsFile>,
    clip_prefix: &'static str,
    /// transformers >= 5 (and some old exporters) store the text model without `text_model.`.
    clip_flat: bool,
}

impl Checkpoint {
    /// Opens a single `.safetensors` file or a diffusers folder of a family a model can be
    /// (SD 1.x, 2.x, SDXL).
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_as(path, false)
    }

    /// Opens SDXL's refiner (a single file or a diffusers folder), the second stage of an SDXL
    /// run ([`crate::stable_diffusion::Refiner`]); any other family is refused in words.
    pub fn open_refiner(path: &Path) -> Result<Self> {
        Self::open_as(path, true)
    }

    fn open_as(path: &Path, refiner: bool) -> Result<Self> {
        if path.is_dir() {
            Self::open_diffusers(path, refiner)
        } else {
            Self::open_single_file(path, refiner)
        }
    }

    /// The family's short name, with "inpainting" for an inpainting UNet (as the studio and
    /// `generate` name the loaded model).
    pub fn model_name(&self) -> String {
        match self.config.unet.is_inpainting() {
            true => format!("{} inpainting", self.family.short_name()),
            false => self.family.short_name().to_string(),
        }
    }

    fn open_single_file(path: &Path, refiner: bool) -> Result<Self> {
        let mut file = SafetensorsFile::open(path)?;
        let family = family::detect_single_file(&file);
        admit(family, refiner, || family.describe().to_string(), path)?;
        // A file has no config: the family's standard one, with what a `<name>.json` beside it
        // sets (the role A1111's same-name `.yaml` plays).
        let sidecar_path = path.with_extension("json");
        let sidecar: serde_json::Value = if sidecar_path.is_file() {
            read_json(&sidecar_path)?
        } else {
            serde_json::Value::Object(Default::default())
        };
        let mut config = match family {
            Family::Sdxl => {
                ldm::split_openclip_under(&mut file, ldm::SDXL_OPENCLIP_PREFIX)?;
                ModelConfig::sdxl().overridden(&sidecar, &sidecar_path)?
            }
            Family::SdxlRefiner => {
                ldm::split_openclip_under(&mut file, ldm::SDXL_REFINER_OPENCLIP_PREFIX)?;
                ModelConfig::sdxl_refiner().overridden(&sidecar, &sidecar_path)?
            }
            Family::Sd2 => {
                ldm::split_openclip(&mut file)?;
                // 2.x base predicts ε, 2.x 768 v: the file's keys tell (ComfyUI's rule), unless
                // the sidecar says.
                let provisional = ModelConfig::sd2(false).overridden(&sidecar, &sidecar_path)?;
                let v = match sidecar.pointer("/scheduler/prediction_type") {
                    Some(_) => provisional.scheduler.prediction == Prediction::VPrediction,
                    None => predicts_velocity(&file, &provisional.unet),
                };
                ModelConfig::sd2(v).overridden(&sidecar, &sidecar_path)?
            }
            _ => ModelConfig::sd15().overridden(&sidecar, &sidecar_path)?,
        };
        // An inpainting checkpoint says so only by its first convolution's width.
        if let Some(channels) = family::single_file_unet_in_channels(&file) {
            config.unet.in_channels = channels;
        }
        let few_step =
            few_step::recognise(path, None, &sidecar).map_err(|reason| Error::InvalidConfig {
                reason,
                path: sidecar_path.clone(),
            })?;
        // A Turbo file steps trailing timesteps as its diffusers folder says (SD-Turbo's and
        // SDXL-Turbo's `scheduler_config.json`), unless the sidecar sets a spacing.
        if few_step == Some(FewStep::Turbo)
            && sidecar.pointer("/scheduler/timestep_spacing").is_none()
        {
            config.scheduler.timestep_spacing = Some(crate::schedulers::TimestepSpacing::Trailing);
        }
        let config = config.checked(&sidecar_path)?;
        let clip_prefix = match family {
            Family::Sd2 => ldm::OPENCLIP_PREFIX,
            Family::Sdxl => ldm::SDXL_CLIP_PREFIX,
            _ => ldm::CLIP_PREFIX,
        };
        let clip_flat = is_flat_clip(&file, clip_prefix);
        let file = Arc::new(file);
        let text_encoder_2 =
            matches!(family, Family::Sdxl | Family::SdxlRefiner).then(|| file.clone());
        Ok(Self {
            path: path.to_path_buf(),
            layout: Layout::SingleFile,
            family,
            config,
            few_step,
            text_encoder: (family != Family::SdxlRefiner).then(|| file.clone()),
            text_encoder_2,
            unet: file.clone(),
            vae: file,
            clip_prefix,
            clip_flat,
        })
    }

    fn open_diffusers(dir: &Path, refiner: bool) -> Result<Self> {
        let index = dir.join("model_index.json");
        if !index.is_file() {
            return Err(Error::InvalidConfig {
                reason: "a model folder needs a model_index.json (diffusers layout)".into(),
                path: dir.to_path_buf(),
            });
        }
        let index: serde_json::Value = read_json(&index)?;
        let class = index
            .get("_class_name")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string();
        let unet_config: UNetConfig = read_json(&dir.join("unet/config.json"))?;
        // SDXL's refiner has no first encoder; its family is named before anything is missed.
        let text_path = dir.join("text_encoder/config.json");
        let has_text_encoder = text_path.is_file() || !class.contains("XL");
        let mut text_config: ClipConfig = match has_text_encoder {
            true => read_json(&text_path)?,
            false => ClipConfig::default(),
        };
        let family = family::detect_diffusers(
            &class,
            unet_config.in_channels,
            unet_config.cross_attention_dim,
            text_config.hidden_act == crate::clip::Activation::Gelu,
            has_text_encoder,
        );
        admit(
            family,
            refiner,
            || format!("{} ({class})", family.describe()),
            dir,
        )?;
        text_config.pad_token = match family {
            Family::Sd2 => ClipConfig::sd2().pad_token,
            _ => ClipConfig::sd15().pad_token,
        };
        // SDXL's second encoder, with its projection; the folder's empty-negative rule (diffusers'
        // SDXL pipelines default to zeros where model_index.json does not say).
        let (text_config_2, force_zeros) = if matches!(family, Family::Sdxl | Family::SdxlRefiner) {
            let mut config: ClipConfig = read_json(&dir.join("text_encoder_2/config.json"))?;
            config.pad_token = ClipConfig::sdxl_g().pad_token;
            config.with_projection = true;
            let zeros = index
                .get("force_zeros_for_empty_prompt")
                .and_then(|v| v.as_bool())
                .unwrap_or(true);
            (Some(config), zeros)
        } else {
            (None, false)
        };
        // The folder's schedule as diffusers reads it; the family's where the file is missing.
        let scheduler_path = dir.join("scheduler/scheduler_config.json");
        let (scheduler, scheduler_class) = if scheduler_path.is_file() {
            let value: serde_json::Value = read_json(&scheduler_path)?;
            let invalid = |reason: String| Error::InvalidConfig {
                reason,
                path: scheduler_path.clone(),
            };
            check_scheduler(&value).map_err(invalid)?;
            let class = value
                .get("_class_name")
                .and_then(|c| c.as_str())
                .map(str::to_string);
            let config = serde_json::from_value(value).map_err(|e| invalid(e.to_string()))?;
            (config, class)
        } else {
            (SchedulerConfig::default(), None)
        };
        let no_sidecar = serde_json::Value::Object(Default::default());
        let few_step = few_step::recognise(dir, scheduler_class.as_deref(), &no_sidecar).map_err(
            |reason| Error::InvalidConfig {
                reason,
                path: dir.to_path_buf(),
            },
        )?;
        let config = ModelConfig {
            text_encoder: text_config,
            text_encoder_2: text_config_2,
            unet: unet_config,
            vae: read_json(&dir.join("vae/config.json"))?,
            scheduler,
            force_zeros_for_empty_prompt: force_zeros,
        }
        .checked(dir)?;
        let text_encoder = match has_text_encoder {
            true => Some(open_component(dir, "text_encoder", "model")?),
            false => None,
        };
        let clip_flat = text_encoder.as_ref().is_some_and(|te| is_flat_clip(te, ""));
        let text_encoder_2 = match family {
            Family::Sdxl | Family::SdxlRefiner => {
                Some(Arc::new(open_component(dir, "text_encoder_2", "model")?))
            }
            _ => None,
        };
        Ok(Self {
            path: dir.to_path_buf(),
            layout: Layout::Diffusers,
            family,
            config,
            few_step,
            text_encoder: text_encoder.map(Arc::new),
            text_encoder_2,
            unet: Arc::new(open_component(dir, "unet", "diffusion_pytorch_model")?),
            vae: Arc::new(open_component(dir, "vae", "diffusion_pytorch_model")?),
            clip_prefix: "",
            clip_flat,
        })
    }

    /// Weights of the text encoder, named as transformers' `CLIPTextModel`; an error for SDXL's
    /// refiner, which has none.
    pub fn text_encoder_weights(&self, device: &Device, dtype: DType) -> Result<Weights> {
        let file = self
            .text_encoder
            .clone()
            .ok_or_else(|| Error::UnsupportedFamily {
                found: self.family.describe().to_string(),
                path: self.path.clone(),
            })?;
        let prefix = self.clip_prefix;
        let map: KeyMap = if prefix == ldm::OPENCLIP_PREFIX {
            Arc::new(ldm::openclip_key)
        } else if self.clip_flat {
            Arc::new(move |n: &str| {
                format!("{prefix}{}", n.strip_prefix("text_model.").unwrap_or(n))
            })
        } else {
            Arc::new(move |n: &str| format!("{prefix}{n}"))
        };
        Ok(Weights::from_file("text encoder", file, map, device, dtype))
    }

    /// Weights of SDXL's second text encoder, named as transformers'
    /// `CLIPTextModelWithProjection`; `None` for the families with one encoder.
    pub fn text_encoder_2_weights(&self, device: &Device, dtype: DType) -> Option<Weights> {
        let file = self.text_encoder_2.clone()?;
        let map: KeyMap = match self.layout {
            Layout::SingleFile => {
                let prefix = self.stored_prefix(Component::TextEncoder2).to_string();
                Arc::new(move |n: &str| ldm::openclip_key_under(&prefix, n))
            }
            // transformers 5 saves a `CLIPTextModel` without its `text_model.` prefix (and some
            // exporters a `CLIPTextModelWithProjection` too).
            Layout::Diffusers if is_flat_clip(&file, "") => {
                Arc::new(|n: &str| n.strip_prefix("text_model.").unwrap_or(n).to_string())
            }
            Layout::Diffusers => Arc::new(|n: &str| n.to_string()),
        };
        Some(Weights::from_file(
            "text encoder 2",
            file,
            map,
            device,
            dtype,
        ))
    }

    pub fn unet_weights(&self, device: &Device, dtype: DType) -> Weights {
        let map: KeyMap = match self.layout {
            Layout::Diffusers => Arc::new(|n: &str| n.to_string()),
            Layout::SingleFile => {
                let config = self.config.unet.clone();
                Arc::new(move |n: &str| ldm::unet_key(n, &config))
            }
        };
        Weights::from_file("UNet", self.unet.clone(), map, device, dtype)
    }

    pub fn vae_weights(&self, device: &Device, dtype: DType) -> Weights {
        let map: KeyMap = match self.layout {
            Layout::Diffusers => Arc::new(|n: &str| n.to_string()),
            Layout::SingleFile => {
                let config = self.config.vae.clone();
                Arc::new(move |n: &str| ldm::vae_key(n, &config))
            }
        };
        Weights::from_file("VAE", self.vae.clone(), map, device, dtype)
    }

    /// The stored-key prefix each component's unused keys are reported under.
    pub fn stored_prefix(&self, component: Component) -> &str {
        match (self.layout, component) {
            (Layout::Diffusers, _) => "",
            (Layout::SingleFile, Component::TextEncoder) => self.clip_prefix,
            (Layout::SingleFile, Component::TextEncoder2) => match self.family {
                Family::SdxlRefiner => ldm::SDXL_REFINER_OPENCLIP_PREFIX,
                _ => ldm::SDXL_OPENCLIP_PREFIX,
            },
            (Layout::SingleFile, Component::Unet) => ldm::UNET_PREFIX,
            (Layout::SingleFile, Component::Vae) => ldm::VAE_PREFIX,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    TextEncoder,
    TextEncoder2,
    Unet,
    Vae,
}

/// Whether `family` may be opened as what is asked: a model (SD 1.x, 2.x, XL) or SDXL's refiner.
fn admit(family: Family, refiner: bool, found: impl FnOnce() -> String, path: &Path) -> Result<()> {
    let fits = match refiner {
        true => family == Family::SdxlRefiner,
        false => family.is_supported(),
    };
    if fits {
        return Ok(());
    }
    match refiner {
        true => Err(Error::NotARefiner {
            found: found(),
            path: path.to_path_buf(),
        }),
        false => Err(Error::UnsupportedFamily {
            found: found(),
            path: path.to_path_buf(),
        }),
    }
}

/// Whether an SD 2.x single file predicts velocity (the 768-v models) rather than noise: a
/// `v_pred` key says so, else the spread of the last output block's first transformer `norm1`
/// bias, above 0.09 in v models (ComfyUI's `SD20.model_type`; that block is
/// `output_blocks.11` in SD 2's layout).
fn predicts_velocity(file: &SafetensorsFile, unet: &UNetConfig) -> bool {
    if file.entry("v_pred").is_some() {
        return true;
    }
    let last = (unet.block_out_channels.len() * (unet.layers_per_block + 1)).saturating_sub(1);
    let key = format!(
        "{}output_blocks.{last}.1.transformer_blocks.0.norm1.bias",
        ldm::UNET_PREFIX
    );
    let Ok(bias) = file.read_f32(&key) else {
        return false;
    };
    if bias.is_empty() {
        return false;
    }
    let n = bias.len() as f64;
    let mean = bias.iter().map(|&b| f64::from(b)).sum::<f64>() / n;
    let var = bias
        .iter()
        .map(|&b| (f64::from(b) - mean).powi(2))
        .sum::<f64>()
        / n;
    var.sqrt() > 0.09
}

/// Refuses the `scheduler_config.json` settings the samplers would otherwise silently ignore.
fn check_scheduler(value: &serde_json::Value) -> std::result::Result<(), String> {
    if value.get("trained_betas").is_some_and(|v| !v.is_null()) {
        return Err("a scheduler with its own trained_betas table is not supported".into());
    }
    if value.get("clip_sample") == Some(&serde_json::Value::Bool(true)) {
        return Err("clip_sample is not supported (no Stable Diffusion model uses it)".into());
    }
    if let Some(schedule) = value.get("beta_schedule").and_then(|v| v.as_str())
        && !matches!(schedule, "linear" | "scaled_linear")
    {
        return Err(format!(
            "beta_schedule `{schedule}` is not supported (linear and scaled_linear are)"
        ));
    }
    Ok(())
}

fn is_flat_clip(file: &SafetensorsFile, prefix: &str) -> bool {
    let nested = format!("{prefix}text_model.embeddings.token_embedding.weight");
    let flat = format!("{prefix}embeddings.token_embedding.weight");
    file.entry(&nested).is_none() && file.entry(&flat).is_some()
}

/// `dir/<sub>/<stem>.safetensors`, else the `.fp16` variant diffusers writes.
fn open_component(dir: &Path, sub: &str, stem: &str) -> Result<SafetensorsFile> {
    let base = dir.join(sub);
    let candidates = [
        format!("{stem}.safetensors"),
        format!("{stem}.fp16.safetensors"),
    ];
    for name in &candidates {
        let p = base.join(name);
        if p.is_file() {
            return SafetensorsFile::open(&p);
        }
    }
    for pickle in [format!("{stem}.bin"), format!("{stem}.fp16.bin")] {
        let p = base.join(pickle);
        if p.is_file() {
            return Err(Error::PickleRefused { path: p });
        }
    }
    Err(Error::MissingTensor {
        component: "diffusers folder",
        name: format!("{sub}/{} (no weights file)", candidates[0]),
    })
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io("model config", path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::InvalidConfig {
        reason: e.to_string(),
        path: path.to_path_buf(),
    })
}

impl Checkpoint {
    /// The distinct weight files this checkpoint reads (one for a single file, up to four for a
    /// diffusers folder).
    pub fn files(&self) -> Vec<&Path> {
        let mut files: Vec<&Path> = Vec::new();
        for f in self.weight_files() {
            if !files.contains(&f.path()) {
                files.push(f.path());
            }
        }
        files
    }

    /// Every component's file, in order (a single file's more than once).
    fn weight_files(&self) -> impl Iterator<Item = &Arc<SafetensorsFile>> {
        self.text_encoder
            .iter()
            .chain(&self.text_encoder_2)
            .chain([&self.unet, &self.vae])
    }

    /// The UNet's weight file (the one A1111's short hash covers).
    pub fn unet_file(&self) -> &Path {
        self.unet.path()
    }

    /// Bytes of all weight tensors stored in the checkpoint's files.
    pub fn stored_bytes(&self) -> u64 {
        let mut seen: Vec<&Path> = Vec::new();
        let mut total = 0u64;
        for f in self.weight_files() {
            if seen.contains(&f.path()) {
                continue;
            }
            seen.push(f.path());
            total += f
                .entries()
                .values()
                .map(|e| e.shape.iter().product::<usize>() as u64 * e.dtype.bitsize() as u64 / 8)
                .sum::<u64>();
        }
        total
    }

    /// The name A1111 shows: the file stem, or the folder name.
    pub fn display_name(&self) -> String {
        let name = if self.layout == Layout::Diffusers {
            self.path.file_name()
        } else {
            self.path.file_stem()
        };
        name.map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    }
}
