//! TAESD, the tiny autoencoder of madebyollin (diffusers' `AutoencoderTiny`): its decoder turns
//! latents into a rough image for a fraction of the full VAE's cost, for live previews.
//!
//! The architecture, as diffusers' `DecoderTiny` (models/autoencoders/vae.py) and madebyollin's
//! `Decoder` (taesd.py) build it:
//!
//! ```text
//! x = tanh(latents / 3) * 3
//! x = ReLU(conv3x3(latent_channels -> c[0], bias))
//! for each group i:
//!     num_blocks[i] x Block(c[i]):  x = ReLU(conv(x) + x),
//!                                   conv = conv3x3 (bias), ReLU, conv3x3 (bias), ReLU, conv3x3 (bias)
//!     not the last group:  x = conv3x3(c[i] -> c[i + 1], NO bias)(nearest_upsample(x, factor))
//!     the last group:      x = conv3x3(c[i] -> out_channels, bias)(x)
//! out = x * 2 - 1      (diffusers only: madebyollin's Sequential stops at [0, 1])
//! ```
//!
//! diffusers keeps the widths equal (its upsample conv is `c[i] -> c[i]`, and the real TAESD is 64
//! channels throughout); mapping to the next group's width instead is the same thing then, and is
//! what madebyollin's wider variants do.
//!
//! Two key layouts name the same tensors. diffusers: `decoder.layers.{n}.*`, `n` indexing
//! `DecoderTiny.layers` (0 the first conv, 1 its ReLU, then blocks, upsamples and convs in order).
//! madebyollin's `taesd_decoder.safetensors`: `{n + 1}.*`, his Sequential starting with the
//! `Clamp` module at index 0 (diffusers' `scripts/convert_tiny_autoencoder_to_diffusers.py` does
//! exactly this renumbering). The real decoder: `1.*` first conv, `3..=5` blocks, `7` conv, ...,
//! `18` block, `19` final conv; block keys `{k}.conv.{0,2,4}.{weight,bias}`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::tensor::activation::relu;
use burn::tensor::module::interpolate;
use burn::tensor::ops::{InterpolateMode, InterpolateOptions};
use burn::tensor::{DType, Device, Tensor};
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::nn::Conv2d;
use crate::weights::{KeyMap, SafetensorsFile, Weights};

/// Shapes of a TAESD decoder (diffusers' `AutoencoderTiny` config, decoder half).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaesdConfig {
    pub latent_channels: usize,
    /// Width of each block group (diffusers: `decoder_block_out_channels`).
    pub block_out_channels: Vec<usize>,
    /// Blocks in each group (diffusers: `num_decoder_blocks`).
    pub num_blocks: Vec<usize>,
    /// Nearest-neighbour upscale between groups (diffusers: `upsampling_scaling_factor`).
    pub upsample_factor: usize,
    pub out_channels: usize,
}

impl Default for TaesdConfig {
    fn default() -> Self {
        Self::standard()
    }
}

/// The keys of diffusers' `AutoencoderTiny` config.json this decoder reads; everything else in
/// the file (encoder shapes, latent magnitude, ...) is ignored.
#[derive(Deserialize)]
struct RawConfig {
    latent_channels: Option<usize>,
    out_channels: Option<usize>,
    decoder_block_out_channels: Option<Vec<usize>>,
    /// diffusers registers the decoder widths under this name too.
    block_out_channels: Option<Vec<usize>>,
    num_decoder_blocks: Option<Vec<usize>>,
    upsampling_scaling_factor: Option<usize>,
    act_fn: Option<String>,
    upsample_fn: Option<String>,
}

impl TaesdConfig {
    /// The real TAESD for SD 1.x/2.x (madebyollin/taesd, diffusers `AutoencoderTiny` defaults):
    /// 4 latent channels, four groups of 64 channels with 3, 3, 3 and 1 blocks, x2 upsampling.
    pub fn standard() -> Self {
        Self {
            latent_channels: 4,
            block_out_channels: vec![64; 4],
            num_blocks: vec![3, 3, 3, 1],
            upsample_factor: 2,
            out_channels: 3,
        }
    }

    /// Parses an `AutoencoderTiny` config.json (or a sidecar holding a subset of its keys); missing
    /// keys take the standard TAESD's values.
    pub fn from_json(text: &str) -> Result<Self> {
        let raw: RawConfig =
            serde_json::from_str(text).map_err(|e| Error::Config(e.to_string()))?;
        if let Some(act) = raw.act_fn.as_deref().filter(|a| *a != "relu") {
            return Err(Error::Config(format!(
                "TAESD activation `{act}` is not supported (only relu)"
            )));
        }
        if let Some(mode) = raw.upsample_fn.as_deref().filter(|m| *m != "nearest") {
            return Err(Error::Config(format!(
                "TAESD upsampling `{mode}` is not supported (only nearest)"
            )));
        }
        let standard = Self::standard();
        let config = Self {
            latent_channels: raw.latent_channels.unwrap_or(standard.latent_channels),
            block_out_channels: raw
                .decoder_block_out_channels
                .or(raw.block_out_channels)
                .unwrap_or(standard.block_out_channels),
            num_blocks: raw.num_decoder_blocks.unwrap_or(standard.num_blocks),
            upsample_factor: raw
                .upsampling_scaling_factor
                .unwrap_or(standard.upsample_factor),
            out_channels: raw.out_channels.unwrap_or(standard.out_channels),
        };
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<()> {
        if self.block_out_channels.is_empty() {
            return Err(Error::Config("TAESD needs at least one block group".into()));
        }
        if self.block_out_channels.len() != self.num_blocks.len() {
            return Err(Error::Config(format!(
                "TAESD has {} block widths but {} block counts",
                self.block_out_channels.len(),
                self.num_blocks.len()
            )));
        }
        if self.latent_channels == 0
            || self.out_channels == 0
            || self.upsample_factor == 0
            || self.block_out_channels.contains(&0)
        {
            return Err(Error::Config(
                "TAESD channel counts and upsample factor must be positive".into(),
            ));
        }
        Ok(())
    }

    /// Pixels per latent along each side (8 for the real TAESD).
    pub fn upscale(&self) -> usize {
        self.upsample_factor
            .pow(self.block_out_channels.len().saturating_sub(1) as u32)
    }
}

/// How the decoder's tensors are named in a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaesdLayout {
    /// madebyollin's `taesd_decoder.safetensors`: `{n + 1}.*`.
    Madebyollin,
    /// diffusers' `AutoencoderTiny`: `decoder.layers.{n}.*`.
    Diffusers,
}

const DIFFUSERS_PREFIX: &str = "decoder.layers.";

impl TaesdLayout {
    /// The layout of a file from its tensor names: any `decoder.layers.*` key makes it diffusers,
    /// else keys starting with a layer number make it madebyollin's. `None`: not a TAESD decoder.
    pub fn detect<'a>(keys: impl IntoIterator<Item = &'a str>) -> Option<Self> {
        let mut numbered = false;
        for key in keys {
            if key.starts_with(DIFFUSERS_PREFIX) {
                return Some(Self::Diffusers);
            }
            numbered |= key
                .split_once('.')
                .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        }
        numbered.then_some(Self::Madebyollin)
    }

    /// The stored key of a name relative to `DecoderTiny.layers` (`"2.conv.0.weight"`).
    pub fn stored_key(self, name: &str) -> String {
        match self {
            Self::Diffusers => format!("{DIFFUSERS_PREFIX}{name}"),
            Self::Madebyollin => match name.split_once('.') {
                Some((n, rest)) => match n.parse::<usize>() {
                    Ok(n) => format!("{}.{rest}", n + 1),
                    Err(_) => name.to_string(),
                },
                None => name.to_string(),
            },
        }
    }

    pub fn key_map(self) -> KeyMap {
        Arc::new(move |name: &str| self.stored_key(name))
    }
}

/// `AutoencoderTinyBlock` with equal in/out widths: `ReLU(conv(x) + x)`.
#[derive(Debug, Clone)]
struct Block {
    convs: [Conv2d; 3],
}

impl Block {
    fn load(w: &Weights, c: usize) -> Result<Self> {
        let conv = |i: usize| conv3x3(&w.pp(format!("conv.{i}")), c, c, true);
        Ok(Self {
            convs: [conv(0)?, conv(2)?, conv(4)?],
        })
    }

    fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let [a, b, c] = &self.convs;
        let h = relu(a.forward(x.clone()));
        let h = relu(b.forward(h));
        relu(c.forward(h) + x)
    }
}

/// One group: its blocks, then (upsample and) a conv.
#[derive(Debug, Clone)]
struct Group {
    blocks: Vec<Block>,
    upsample: bool,
    conv: Conv2d,
}

/// A 3x3 convolution with padding 1. A required bias must be there (`Conv2d::load` alone would
/// take a missing one as "no bias").
fn conv3x3(w: &Weights, c_in: usize, c_out: usize, bias: bool) -> Result<Conv2d> {
    if bias && !w.contains("bias") {
        // Fails with the missing key's stored name.
        let _ = w.tensor::<1>("bias", [c_out])?;
    }
    Conv2d::load(w, c_in, c_out, 3, 1, 1)
}

/// The TAESD decoder.
#[derive(Debug, Clone)]
pub struct TaesdDecoder {
    conv_in: Conv2d,
    groups: Vec<Group>,
    config: TaesdConfig,
    dtype: DType,
}

impl TaesdDecoder {
    /// Opens a TAESD decoder: madebyollin's `taesd_decoder.safetensors`, a diffusers
    /// `AutoencoderTiny` folder (config.json + diffusion_pytorch_model[.fp16].safetensors), or a
    /// single safetensors file with `decoder.layers.*` keys; the layout is read from the keys.
    ///
    /// The config comes from the folder's config.json; for a file, from a `<name>.json` sidecar
    /// beside it, else from a `config.json` beside it that belongs to an `AutoencoderTiny`, else
    /// it is [`TaesdConfig::standard`].
    pub fn open(path: &Path, device: &Device, dtype: DType) -> Result<Self> {
        let (weights_path, config) = if path.is_dir() {
            let config_path = path.join("config.json");
            let config = if config_path.is_file() {
                read_config(&config_path)?
            } else {
                TaesdConfig::standard()
            };
            (find_weights(path)?, config)
        } else {
            (path.to_path_buf(), config_beside(path)?)
        };
        let file = Arc::new(SafetensorsFile::open(&weights_path)?);
        let layout =
            TaesdLayout::detect(file.entries().keys().map(String::as_str)).ok_or_else(|| {
                Error::InvalidInput(format!(
                    "not a TAESD decoder: no `decoder.layers.*` or numbered layer keys ({})",
                    weights_path.display()
                ))
            })?;
        if layout == TaesdLayout::Madebyollin && file.entry("0.weight").is_some() {
            // The encoder's Sequential starts with a conv; the decoder's with the weightless Clamp.
            return Err(Error::InvalidInput(format!(
                "this is a TAESD encoder; previews need the decoder (taesd_decoder.safetensors) ({})",
                weights_path.display()
            )));
        }
        let w = Weights::from_file("TAESD decoder", file, layout.key_map(), device, dtype);
        Self::load(&w, &config)
    }

    /// Builds the decoder from weights named relative to `DecoderTiny.layers` (`"0.weight"`,
    /// `"2.conv.0.weight"`, ...); [`TaesdLayout::key_map`] maps those to either layout's keys.
    pub fn load(w: &Weights, config: &TaesdConfig) -> Result<Self> {
        config.validate()?;
        let c = &config.block_out_channels;
        let n = c.len();
        let conv_in = conv3x3(&w.pp(0), config.latent_channels, c[0], true)?;
        let mut index: usize = 2; // 1 is the ReLU after conv_in
        let mut groups = Vec::with_capacity(n);
        for (i, &count) in config.num_blocks.iter().enumerate() {
            let blocks = (0..count)
                .map(|_| {
                    let block = Block::load(&w.pp(index), c[i]);
                    index += 1;
                    block
                })
                .collect::<Result<Vec<_>>>()?;
            let last = i + 1 == n;
            if !last {
                index += 1; // the Upsample
            }
            let (c_out, bias) = if last {
                (config.out_channels, true)
            } else {
                (c[i + 1], false)
            };
            let conv = conv3x3(&w.pp(index), c[i], c_out, bias)?;
            index += 1;
            groups.push(Group {
                blocks,
                upsample: !last,
                conv,
            });
        }
        Ok(Self {
            conv_in,
            groups,
            config: config.clone(),
            dtype: w.dtype(),
        })
    }

    pub fn config(&self) -> &TaesdConfig {
        &self.config
    }

    /// Decodes latents exactly as the sampler holds them (SD's scaled latents; TAESD's scaling
    /// factor is 1) to pixels in about [-1, 1], unclamped: diffusers' `DecoderTiny.forward`, i.e.
    /// `AutoencoderTiny.decode(latents).sample`, the same range as [`crate::vae::AutoencoderKL::decode`].
    /// madebyollin's decoder returns `(out + 1) / 2`. Latents are cast to the weights' dtype, and
    /// so is the output.
    ///
    /// # Shapes
    /// `[b, latent_channels, h, w] -> [b, out_channels, h * s, w * s]`, `s` = [`TaesdConfig::upscale`] (8)
    pub fn decode(&self, latents: Tensor<4>) -> Tensor<4> {
        let x = latents.cast(self.dtype);
        let x = (x / 3.0).tanh() * 3.0;
        let mut x = relu(self.conv_in.forward(x));
        let factor = self.config.upsample_factor;
        for group in &self.groups {
            for block in &group.blocks {
                x = block.forward(x);
            }
            if group.upsample {
                let [_, _, h, w] = x.dims();
                x = interpolate(
                    x,
                    InterpolateOptions::new(InterpolateMode::Nearest)
                        .with_output_size([h * factor, w * factor]),
                );
            }
            x = group.conv.forward(x);
        }
        x * 2.0 - 1.0
    }
}

fn read_config(path: &Path) -> Result<TaesdConfig> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io("TAESD config", path, e))?;
    TaesdConfig::from_json(&text).map_err(|e| e.in_file(path))
}

/// A single file's config: `<name>.json`, else an `AutoencoderTiny` config.json in the same
/// folder (the madebyollin/taesd repository holds both layouts side by side), else the standard.
fn config_beside(path: &Path) -> Result<TaesdConfig> {
    let sidecar = path.with_extension("json");
    if sidecar.is_file() {
        return read_config(&sidecar);
    }
    if let Some(sibling) = path.parent().map(|d| d.join("config.json"))
        && sibling.is_file()
    {
        let is_tiny = std::fs::read_to_string(&sibling)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|v| {
                v.get("_class_name").and_then(|c| c.as_str()) == Some("AutoencoderTiny")
            });
        if is_tiny {
            return read_config(&sibling);
        }
    }
    Ok(TaesdConfig::standard())
}

/// The weights file of a diffusers `AutoencoderTiny` folder.
fn find_weights(dir: &Path) -> Result<PathBuf> {
    let stem = "diffusion_pytorch_model";
    for name in [
        format!("{stem}.safetensors"),
        format!("{stem}.fp16.safetensors"),
    ] {
        let p = dir.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    for name in [format!("{stem}.bin"), format!("{stem}.fp16.bin")] {
        let p = dir.join(name);
        if p.is_file() {
            return Err(Error::PickleRefused { path: p });
        }
    }
    Err(Error::InvalidInput(format!(
        "no {stem}.safetensors in the TAESD folder ({})",
        dir.display()
    )))
}

#[cfg(test)]
mod tests;
