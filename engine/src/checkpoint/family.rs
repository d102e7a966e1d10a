//! Which model family a checkpoint holds, decided from its keys and shapes.

use super::ldm::{CLIP_PREFIX, UNET_PREFIX};
use super::safetensors::SafetensorsFile;

/// The families a checkpoint can be recognised as. `Sd1` and `Sd2` are supported today.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Sd1,
    Sd1Inpainting,
    Sd1InstructPix2Pix,
    Sd2,
    Sd2Inpainting,
    Sdxl,
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
            Family::Sd1Inpainting => "Stable Diffusion 1.x inpainting (9 input channels)",
            Family::Sd1InstructPix2Pix => "InstructPix2Pix (8 input channels)",
            Family::Sd2 => "Stable Diffusion 2.x (OpenCLIP ViT-H text encoder)",
            Family::Sd2Inpainting => "Stable Diffusion 2.x inpainting (9 input channels)",
            Family::Sdxl => "Stable Diffusion XL",
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
        return Family::Sdxl;
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
        Some([_, 9, _, _]) if sd2 => return Family::Sd2Inpainting,
        Some([_, 4, _, _]) if sd2 => return Family::Sd2,
        Some([_, 9, _, _]) => return Family::Sd1Inpainting,
        Some([_, 8, _, _]) => return Family::Sd1InstructPix2Pix,
        Some([_, 4, _, _]) => {}
        _ => return Family::Unknown,
    }
    if has_prefix(CLIP_PREFIX) {
        Family::Sd1
    } else {
        Family::Unknown
    }
}

/// Classifies a diffusers folder from its pipeline class, UNet config and whether its text
/// encoder uses GELU (OpenCLIP, SD 2.x) rather than CLIP's quick GELU (SD 1.x).
pub fn detect_diffusers(
    pipeline_class: &str,
    unet_in_channels: usize,
    cross_attention_dim: usize,
    text_gelu: bool,
) -> Family {
    match pipeline_class {
        c if c.contains("XL") => Family::Sdxl,
        c if c.contains("StableDiffusion3") => Family::Sd3,
        c if c.contains("Flux") => Family::Flux,
        c if c.contains("InstructPix2Pix") => Family::Sd1InstructPix2Pix,
        _ if unet_in_channels == 9 => Family::Sd1Inpainting,
        _ if unet_in_channels == 8 => Family::Sd1InstructPix2Pix,
        _ if cross_attention_dim == 1024 || text_gelu => Family::Sd2,
        c if c.starts_with("StableDiffusion") || c.is_empty() => Family::Sd1,
        _ => Family::Unknown,
    }
}
