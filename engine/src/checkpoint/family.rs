//! Which model family a checkpoint holds, decided from its keys and shapes.

use super::ldm::{CLIP_PREFIX, UNET_PREFIX};
use super::safetensors::SafetensorsFile;

/// The families a checkpoint can be recognised as; `Sd1`, `Sd2` and `Sdxl` are supported as
/// models, `SdxlRefiner` as an SDXL model's refiner ([`super::Checkpoint::open_refiner`]).
/// Inpainting checkpoints (a 9-channel UNet) are their base family: the UNet's config says
/// ([`crate::unet::UNetConfig::is_inpainting`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Sd1,
    Sd1InstructPix2Pix,
    Sd2,
    Sdxl,
    /// SDXL's refiner (OpenCLIP bigG only, aesthetic-score conditioning): another UNet.
    SdxlRefiner,
    Sd3,
    Flux,
    /// A file with no UNet at all (a VAE, LoRA, embedding, …).
    NotACheckpoint,
    Unknown,
}

impl Family {
    pub fn describe(self) -> &'static str {
        match self {
            Family::Sd1 => "Stable Diffusion 1.x",
            Family::Sd1InstructPix2Pix => "InstructPix2Pix (8 input channels)",
            Family::Sd2 => "Stable Diffusion 2.x (OpenCLIP ViT-H text encoder)",
            Family::Sdxl => "Stable Diffusion XL",
            Family::SdxlRefiner => {
                "the SDXL refiner (a second-stage model: load an SDXL base model and pick this \
                 one as its refiner)"
            }
            Family::Sd3 => "Stable Diffusion 3 (MMDiT)",
            Family::Flux => "Flux",
            Family::NotACheckpoint => {
                "not a full checkpoint (no UNet weights: a VAE, LoRA or embedding?)"
            }
            Family::Unknown => "an unrecognised model layout",
        }
    }

    pub fn is_supported(self) -> bool {
        matches!(self, Family::Sd1 | Family::Sd2 | Family::Sdxl)
    }

    /// The short name the studio and `inspect` show.
    pub fn short_name(self) -> &'static str {
        match self {
            Family::Sd1 => "SD 1.x",
            Family::Sd2 => "SD 2.x",
            Family::Sdxl => "SDXL",
            Family::SdxlRefiner => "SDXL refiner",
            _ => self.describe(),
        }
    }
}

/// Classifies a single-file (LDM layout) checkpoint.
pub fn detect_single_file(file: &SafetensorsFile) -> Family {
    let has_prefix = |p: &str| {
        file.entries()
            .range(p.to_string()..)
            .next()
            .is_some_and(|(k, _)| k.starts_with(p))
    };
    if has_prefix("conditioner.embedders.") {
        // The refiner's only encoder is bigG, at index 0; the base has CLIP-L there.
        return match has_prefix("conditioner.embedders.0.model.")
            && !has_prefix("conditioner.embedders.1.")
        {
            true => Family::SdxlRefiner,
            false => Family::Sdxl,
        };
    }
    if has_prefix("model.diffusion_model.joint_blocks.") {
        return Family::Sd3;
    }
    if has_prefix("double_blocks.") || has_prefix("model.diffusion_model.double_blocks.") {
        return Family::Flux;
    }
    if !has_prefix(UNET_PREFIX) {
        return Family::NotACheckpoint;
    }
    let sd2 = has_prefix(super::ldm::OPENCLIP_PREFIX);
    match file
        .entry(&format!("{UNET_PREFIX}input_blocks.0.0.weight"))
        .map(|e| e.shape.as_slice())
    {
        Some([_, 4 | 9, _, _]) if sd2 => return Family::Sd2,
        Some([_, 8, _, _]) => return Family::Sd1InstructPix2Pix,
        Some([_, 4 | 9, _, _]) => {}
        _ => return Family::Unknown,
    }
    if has_prefix(CLIP_PREFIX) {
        Family::Sd1
    } else {
        Family::Unknown
    }
}

/// A single file's UNet input channels, from its first convolution's weight: 4, or 9 for an
/// inpainting checkpoint (which carries no config saying so).
pub fn single_file_unet_in_channels(file: &SafetensorsFile) -> Option<usize> {
    match file
        .entry(&format!("{UNET_PREFIX}input_blocks.0.0.weight"))
        .map(|e| e.shape.as_slice())
    {
        Some(&[_, c, _, _]) => Some(c),
        _ => None,
    }
}

/// Classifies a diffusers folder from its pipeline class, UNet config, whether its text encoder
/// uses GELU (OpenCLIP, SD 2.x) rather than CLIP's quick GELU (SD 1.x), and whether it has a first
/// text encoder at all (SDXL's refiner has only the second).
pub fn detect_diffusers(
    pipeline_class: &str,
    unet_in_channels: usize,
    cross_attention_dim: usize,
    text_gelu: bool,
    has_text_encoder: bool,
) -> Family {
    match pipeline_class {
        c if c.contains("XL") && !has_text_encoder => Family::SdxlRefiner,
        c if c.contains("XL") => Family::Sdxl,
        c if c.contains("StableDiffusion3") => Family::Sd3,
        c if c.contains("Flux") => Family::Flux,
        c if c.contains("InstructPix2Pix") => Family::Sd1InstructPix2Pix,
        _ if unet_in_channels == 8 => Family::Sd1InstructPix2Pix,
        _ if cross_attention_dim == 1024 || text_gelu => Family::Sd2,
        c if c.starts_with("StableDiffusion") || c.is_empty() => Family::Sd1,
        _ => Family::Unknown,
    }
}
