//! `AutoencoderKL`: the VAE that maps latents to pixels (decoder) and pixels to latents (encoder).

pub mod compile;
pub mod graph;
pub mod tiling;

use burn::tensor::{DType, Tensor};
use serde::{Deserialize, Serialize};

use crate::attention::Heads;
use crate::error::{Error, Result};
use crate::models::blocks::{Downsample, ResnetBlock2D, ResnetSpec, Upsample};
use crate::nn::{Conv2d, GroupNorm, Kernels, Linear, silu, wide_head_attention};
use crate::weights::Weights;

/// Mirrors diffusers' `AutoencoderKL` config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct VaeConfig {
    pub in_channels: usize,
    pub out_channels: usize,
    pub latent_channels: usize,
    pub block_out_channels: Vec<usize>,
    pub layers_per_block: usize,
    pub norm_num_groups: usize,
    /// Latents are multiplied by this after encoding and divided before decoding.
    pub scaling_factor: f32,
}

impl Default for VaeConfig {
    fn default() -> Self {
        Self::sd15()
    }
}

impl VaeConfig {
    /// diffusers: stable-diffusion-v1-5/vae/config.json
    pub fn sd15() -> Self {
        Self {
            in_channels: 3,
            out_channels: 3,
            latent_channels: 4,
            block_out_channels: vec![128, 256, 512, 512],
            layers_per_block: 2,
            norm_num_groups: 32,
            scaling_factor: 0.18215,
        }
    }

    /// diffusers: stable-diffusion-xl-base-1.0/vae/config.json: SD 1.5's architecture, its own
    /// scaling factor.
    pub fn sdxl() -> Self {
        Self {
            scaling_factor: 0.13025,
            ..Self::sd15()
        }
    }

    /// Pixels per latent along each side.
    pub fn downscale(&self) -> usize {
        1 << (self.block_out_channels.len().saturating_sub(1))
    }

    /// Every field a layer is sized from, within [`crate::bounds`] (see
    /// [`crate::unet::UNetConfig::validate`]).
    pub fn validate(&self) -> crate::Result<()> {
        use crate::bounds::{self, MAX_GROUPS, MAX_IO_CHANNELS, MAX_LAYERS, MAX_LEVELS, MAX_WIDTH};
        bounds::count("VAE in_channels", self.in_channels, MAX_IO_CHANNELS)?;
        bounds::count("VAE out_channels", self.out_channels, MAX_IO_CHANNELS)?;
        bounds::count("VAE latent_channels", self.latent_channels, MAX_IO_CHANNELS)?;
        bounds::counts(
            "VAE block_out_channels",
            &self.block_out_channels,
            MAX_WIDTH,
            MAX_LEVELS,
        )?;
        bounds::count("VAE layers_per_block", self.layers_per_block, MAX_LAYERS)?;
        bounds::count("VAE norm_num_groups", self.norm_num_groups, MAX_GROUPS)?;
        bounds::positive("VAE scaling_factor", self.scaling_factor as f64, 1e3)?;
        for &c in &self.block_out_channels {
            bounds::divides("VAE width", c, self.norm_num_groups, "groups")?;
        }
        Ok(())
    }

    fn resnet(&self, c_in: usize, c_out: usize) -> ResnetSpec {
        ResnetSpec {
            c_in,
            c_out,
            temb: None,
            groups: self.norm_num_groups,
            eps: 1e-6,
        }
    }
}

/// Single-head spatial self-attention of the VAE's mid block.
#[derive(Debug, Clone)]
struct VaeAttention {
    group_norm: GroupNorm,
    /// q, k and v as one projection (`c → 3c`): one product instead of three.
    qkv: Linear,
    to_out: Linear,
}

impl VaeAttention {
    fn load(w: &Weights, c: usize, groups: usize) -> Result<Self> {
        let (wq, wk, wv) = (w.pp("to_q"), w.pp("to_k"), w.pp("to_v"));
        let qkv = Linear::concat(&[
            Linear::load(&wq, c, c, true)?,
            Linear::load(&wk, c, c, true)?,
            Linear::load(&wv, c, c, true)?,
        ]);
        // Kept weights (a LoRA's base, a parked model) hold each part once, as views of it.
        qkv.keep_parts_as_views(&[(&wq, c), (&wk, c), (&wv, c)]);
        Ok(Self {
            group_norm: GroupNorm::load(&w.pp("group_norm"), groups, c, 1e-6)?,
            qkv,
            to_out: Linear::load(&w.pp("to_out.0"), c, c, true)?,
        })
    }

    fn cast(&self, dtype: DType) -> Self {
        Self {
            group_norm: self.group_norm.clone(),
            qkv: self.qkv.cast(dtype),
            to_out: self.to_out.cast(dtype),
        }
    }

    /// With `kernels` fused, the head runs our flash attention where it takes this width
    /// ([`crate::kernels::attention::attention`]: no score matrix); else, and on burn's plain
    /// ops, the sliced matmuls of [`wide_head_attention`].
    fn forward(&self, x: Tensor<4>, kernels: Kernels) -> Tensor<4> {
        let [b, c, h, w] = x.dims();
        let t = self
            .group_norm
            .forward_with(x.clone(), false, kernels)
            // [b, hw, c]: no copy from a channels-last map (what burn's convolution writes).
            .permute([0, 2, 3, 1])
            .reshape([b, h * w, c]);
        // `[b, hw, 3c]`: our attention reads q, k and v in place by column.
        let qkv = self.qkv.forward(t);
        let at = |column| Heads {
            tensor: &qkv,
            column,
        };
        let ours = match kernels {
            Kernels::Fused => crate::kernels::attention::attention(at(0), at(c), at(2 * c), 1, c),
            Kernels::Plain => None,
        };
        let attended = ours.unwrap_or_else(|| {
            let part = |i: usize| qkv.clone().narrow(2, i * c, c);
            wide_head_attention(part(0), part(1), part(2))
        });
        let out = self.to_out.forward(attended);
        out.reshape([b, h, w, c]).permute([0, 3, 1, 2]) + x
    }
}

/// `UNetMidBlock2D` without time embedding: resnet, attention, resnet.
#[derive(Debug, Clone)]
struct VaeMidBlock {
    resnet_0: ResnetBlock2D,
    attention: VaeAttention,
    resnet_1: ResnetBlock2D,
}

impl VaeMidBlock {
    fn load(w: &Weights, c: usize, config: &VaeConfig) -> Result<Self> {
        Ok(Self {
            resnet_0: ResnetBlock2D::load(&w.pp("resnets.0"), config.resnet(c, c))?,
            attention: VaeAttention::load(&w.pp("attentions.0"), c, config.norm_num_groups)?,
            resnet_1: ResnetBlock2D::load(&w.pp("resnets.1"), config.resnet(c, c))?,
        })
    }

    fn cast(&self, dtype: DType) -> Self {
        Self {
            resnet_0: self.resnet_0.cast(dtype),
            attention: self.attention.cast(dtype),
            resnet_1: self.resnet_1.cast(dtype),
        }
    }

    fn forward(&self, x: Tensor<4>, kernels: Kernels) -> Tensor<4> {
        let x = self.resnet_0.forward_with(x, None, kernels);
        let x = self.attention.forward(x, kernels);
        self.resnet_1.forward_with(x, None, kernels)
    }
}

#[derive(Debug, Clone)]
struct EncoderBlock {
    resnets: Vec<ResnetBlock2D>,
    downsampler: Option<Downsample>,
}

#[derive(Debug, Clone)]
struct DecoderBlock {
    resnets: Vec<ResnetBlock2D>,
    upsampler: Option<Upsample>,
}

/// The VAE encoder, pixels -> latent mean and log-variance.
#[derive(Debug, Clone)]
pub struct Encoder {
    conv_in: Conv2d,
    down_blocks: Vec<EncoderBlock>,
    mid_block: VaeMidBlock,
    conv_norm_out: GroupNorm,
    conv_out: Conv2d,
    quant_conv: Conv2d,
}

impl Encoder {
    fn load(w: &Weights, vae: &Weights, config: &VaeConfig) -> Result<Self> {
        let c = &config.block_out_channels;
        let n = c.len();
        let down_blocks = (0..n)
            .map(|i| {
                let bw = w.pp(format!("down_blocks.{i}"));
                let c_in = if i == 0 { c[0] } else { c[i - 1] };
                let resnets = (0..config.layers_per_block)
                    .map(|j| {
                        let ci = if j == 0 { c_in } else { c[i] };
                        ResnetBlock2D::load(&bw.pp(format!("resnets.{j}")), config.resnet(ci, c[i]))
                    })
                    .collect::<Result<_>>()?;
                // The encoder pads right/bottom by one and convolves without padding.
                let downsampler = (i + 1 < n)
                    .then(|| Downsample::load(&bw.pp("downsamplers.0"), c[i], 0))
                    .transpose()?;
                Ok(EncoderBlock {
                    resnets,
                    downsampler,
                })
            })
            .collect::<Result<_>>()?;
        let latent2 = 2 * config.latent_channels;
        Ok(Self {
            conv_in: Conv2d::load(&w.pp("conv_in"), config.in_channels, c[0], 3, 1, 1)?,
            down_blocks,
            mid_block: VaeMidBlock::load(&w.pp("mid_block"), c[n - 1], config)?,
            conv_norm_out: GroupNorm::load(
                &w.pp("conv_norm_out"),
                config.norm_num_groups,
                c[n - 1],
                1e-6,
            )?,
            conv_out: Conv2d::load(&w.pp("conv_out"), c[n - 1], latent2, 3, 1, 1)?,
            quant_conv: Conv2d::load(&vae.pp("quant_conv"), latent2, latent2, 1, 1, 0)?,
        })
    }

    fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let mut x = self.conv_in.forward(x);
        for block in &self.down_blocks {
            for resnet in &block.resnets {
                x = resnet.forward(x, None);
            }
            if let Some(down) = &block.downsampler {
                x = down.forward(x.pad((0, 1, 0, 1), burn::tensor::ops::PadMode::Constant(0.0)));
            }
        }
        let x = self.mid_block.forward(x, Kernels::Plain);
        let x = self.conv_out.forward(silu(self.conv_norm_out.forward(x)));
        self.quant_conv.forward(x)
    }
}

/// The VAE decoder, latents -> pixels in [-1, 1] (unclamped).
#[derive(Debug, Clone)]
pub struct Decoder {
    post_quant_conv: Conv2d,
    conv_in: Conv2d,
    mid_block: VaeMidBlock,
    up_blocks: Vec<DecoderBlock>,
    conv_norm_out: GroupNorm,
    conv_out: Conv2d,
}

impl Decoder {
    fn load(w: &Weights, vae: &Weights, config: &VaeConfig) -> Result<Self> {
        let c = &config.block_out_channels;
        let n = c.len();
        let l = config.latent_channels;
        let up_blocks = (0..n)
            .map(|i| {
                let bw = w.pp(format!("up_blocks.{i}"));
                let rev = n - 1 - i;
                let c_prev = if i == 0 { c[n - 1] } else { c[rev + 1] };
                let resnets = (0..config.layers_per_block + 1)
                    .map(|j| {
                        let ci = if j == 0 { c_prev } else { c[rev] };
                        ResnetBlock2D::load(
                            &bw.pp(format!("resnets.{j}")),
                            config.resnet(ci, c[rev]),
                        )
                    })
                    .collect::<Result<_>>()?;
                let upsampler = (i + 1 < n)
                    .then(|| Upsample::load(&bw.pp("upsamplers.0"), c[rev]))
                    .transpose()?;
                Ok(DecoderBlock { resnets, upsampler })
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            post_quant_conv: Conv2d::load(&vae.pp("post_quant_conv"), l, l, 1, 1, 0)?,
            conv_in: Conv2d::load(&w.pp("conv_in"), l, c[n - 1], 3, 1, 1)?,
            mid_block: VaeMidBlock::load(&w.pp("mid_block"), c[n - 1], config)?,
            up_blocks,
            conv_norm_out: GroupNorm::load(
                &w.pp("conv_norm_out"),
                config.norm_num_groups,
                c[0],
                1e-6,
            )?,
            conv_out: Conv2d::load(&w.pp("conv_out"), c[0], config.out_channels, 3, 1, 1)?,
        })
    }

    fn cast(&self, dtype: DType) -> Self {
        Self {
            post_quant_conv: self.post_quant_conv.cast(dtype),
            conv_in: self.conv_in.cast(dtype),
            mid_block: self.mid_block.cast(dtype),
            up_blocks: self
                .up_blocks
                .iter()
                .map(|b| DecoderBlock {
                    resnets: b.resnets.iter().map(|r| r.cast(dtype)).collect(),
                    upsampler: b.upsampler.as_ref().map(|u| u.cast(dtype)),
                })
                .collect(),
            conv_norm_out: self.conv_norm_out.clone(),
            conv_out: self.conv_out.cast(dtype),
        }
    }

    fn forward(&self, z: Tensor<4>, kernels: Kernels) -> Tensor<4> {
        let mut x = self.head(z, kernels);
        for block in &self.up_blocks {
            for resnet in &block.resnets {
                x = resnet.forward_with(x, None, kernels);
            }
            if let Some(up) = &block.upsampler {
                x = up.forward(x, None);
            }
        }
        self.conv_out
            .forward(self.conv_norm_out.forward_with(x, true, kernels))
    }

    /// The layers at latent resolution: `post_quant_conv`, `conv_in` and the mid block.
    fn head(&self, z: Tensor<4>, kernels: Kernels) -> Tensor<4> {
        let z = self.post_quant_conv.forward(z);
        self.mid_block.forward(self.conv_in.forward(z), kernels)
    }

    fn tail(&self) -> DecoderTail<'_> {
        DecoderTail {
            blocks: self
                .up_blocks
                .iter()
                .map(|b| (b.resnets.as_slice(), b.upsampler.as_ref()))
                .collect(),
            norm_out: &self.conv_norm_out,
            conv_out: &self.conv_out,
        }
    }
}

/// The decoder's layers after the mid block, in order: per up block its resnets, then its
/// upsampler (×2 nearest, 3x3 conv) if any; then `norm_out`, SiLU and `conv_out` (3x3).
#[derive(Debug, Clone)]
pub struct DecoderTail<'a> {
    pub blocks: Vec<(&'a [ResnetBlock2D], Option<&'a Upsample>)>,
    pub norm_out: &'a GroupNorm,
    pub conv_out: &'a Conv2d,
}

/// `AutoencoderKL`. The encoder is optional: txt2img never needs it, so it is loaded on request.
#[derive(Debug, Clone)]
pub struct AutoencoderKL {
    encoder: Option<Encoder>,
    decoder: Decoder,
    config: VaeConfig,
    /// The compiled decode's recorded graph ([`graph`]), shared by clones (they share the weights).
    recording: graph::DecodeRecording,
}

impl AutoencoderKL {
    pub fn load(w: &Weights, config: &VaeConfig, with_encoder: bool) -> Result<Self> {
        config.validate()?;
        // A checkpoint without encoder weights still makes images (txt2img); img2img then says
        // the encoder is missing.
        let present = w.pp("encoder").contains("conv_in.weight");
        if with_encoder && !present {
            tracing::warn!("this checkpoint has no VAE encoder weights; img2img is unavailable");
        }
        let encoder = (with_encoder && present)
            .then(|| Encoder::load(&w.pp("encoder"), w, config))
            .transpose()?;
        Ok(Self {
            encoder,
            decoder: Decoder::load(&w.pp("decoder"), w, config)?,
            config: config.clone(),
            recording: graph::DecodeRecording::default(),
        })
    }

    pub fn config(&self) -> &VaeConfig {
        &self.config
    }

    /// The compiled decode's recording ([`Self::decode_compiled`]).
    pub fn recording(&self) -> &graph::DecodeRecording {
        &self.recording
    }

    /// A decoder-only copy with its weights in `dtype`: the f32 retry of an f16 model whose decode
    /// overflowed (A1111's automatic `--no-half-vae`). Casting the loaded f16 weights keeps what f16
    /// already rounded, but the overflow is in the activations, which then compute in f32.
    pub fn decoder_in(&self, dtype: DType) -> Self {
        Self {
            encoder: None,
            decoder: self.decoder.cast(dtype),
            config: self.config.clone(),
            recording: graph::DecodeRecording::default(),
        }
    }

    /// Decodes scaled latents (as the sampler produces them) to pixels in about [-1, 1].
    ///
    /// # Shapes
    /// `[b, 4, h/8, w/8] -> [b, 3, h, w]`
    pub fn decode(&self, latents: Tensor<4>) -> Tensor<4> {
        self.decode_with(latents, Kernels::Plain)
    }

    /// [`Self::decode`] with the decoder's GroupNorm(+SiLU) layers run through `kernels`.
    pub fn decode_with(&self, latents: Tensor<4>, kernels: Kernels) -> Tensor<4> {
        self.decoder
            .forward(latents / self.config.scaling_factor, kernels)
    }

    /// The first part of [`Self::decode_with`]: the layers at latent resolution (up to and
    /// including the mid block, whose attention spans the whole latent). [`Self::decoder_tail`]
    /// holds the rest; `crate::vae_tiling` runs it in tiles.
    ///
    /// # Shapes
    /// `[b, 4, h, w] -> [b, block_out_channels.last(), h, w]`
    pub fn decode_head(&self, latents: Tensor<4>, kernels: Kernels) -> Tensor<4> {
        self.decoder
            .head(latents / self.config.scaling_factor, kernels)
    }

    /// The decoder's layers after [`Self::decode_head`].
    pub fn decoder_tail(&self) -> DecoderTail<'_> {
        self.decoder.tail()
    }

    /// Encodes pixels in [-1, 1] to the latent distribution's mean and log-variance, both scaled
    /// by the scaling factor's convention: returns `(mean * scaling_factor, logvar)`.
    ///
    /// # Shapes
    /// `[b, 3, h, w] -> ([b, 4, h/8, w/8], [b, 4, h/8, w/8])`
    pub fn encode(&self, pixels: Tensor<4>) -> Result<(Tensor<4>, Tensor<4>)> {
        let encoder = self
            .encoder
            .as_ref()
            .ok_or_else(|| Error::InvalidInput("the VAE encoder was not loaded".into()))?;
        let moments = encoder.forward(pixels);
        let [b, c2, h, w] = moments.dims();
        let l = c2 / 2;
        let mean = moments.clone().slice([0..b, 0..l, 0..h, 0..w]);
        let logvar = moments.slice([0..b, l..c2, 0..h, 0..w]).clamp(-30.0, 20.0);
        Ok((mean * self.config.scaling_factor, logvar))
    }
}
