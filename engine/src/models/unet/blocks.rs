//! The UNet's down, mid and up blocks (diffusers `unet_2d_blocks.py`).

use burn::tensor::Tensor;

use super::attention::{Context, CrossAttention, Transformer2D, TransformerSpec};
use crate::error::Result;
use crate::models::blocks::{Downsample, Upsample};
use crate::models::blocks::{ResnetBlock2D, ResnetSpec};
use crate::weights::Weights;

/// `CrossAttnDownBlock2D` (with attentions) or `DownBlock2D` (without).
#[derive(Debug, Clone)]
pub struct DownBlock {
    resnets: Vec<ResnetBlock2D>,
    attentions: Vec<Transformer2D>,
    downsampler: Option<Downsample>,
}

/// Shapes shared by every block of one UNet.
#[derive(Debug, Clone, Copy)]
pub struct BlockSpec {
    pub temb: usize,
    pub groups: usize,
    pub eps: f64,
    pub context_dim: usize,
    pub transformer_layers: usize,
    pub linear_projection: bool,
    pub upcast_attention: bool,
}

impl BlockSpec {
    fn resnet(&self, c_in: usize, c_out: usize) -> ResnetSpec {
        ResnetSpec {
            c_in,
            c_out,
            temb: Some(self.temb),
            groups: self.groups,
            eps: self.eps,
        }
    }

    fn transformer(&self, channels: usize, heads: usize) -> TransformerSpec {
        TransformerSpec {
            channels,
            heads,
            context_dim: self.context_dim,
            layers: self.transformer_layers,
            groups: self.groups,
            linear_projection: self.linear_projection,
            upcast_attention: self.upcast_attention,
        }
    }
}

impl DownBlock {
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        w: &Weights,
        spec: &BlockSpec,
        c_in: usize,
        c_out: usize,
        layers: usize,
        heads: Option<usize>,
        downsample: bool,
    ) -> Result<Self> {
        let mut resnets = Vec::with_capacity(layers);
        let mut attentions = Vec::new();
        for i in 0..layers {
            let c = if i == 0 { c_in } else { c_out };
            resnets.push(ResnetBlock2D::load(
                &w.pp(format!("resnets.{i}")),
                spec.resnet(c, c_out),
            )?);
            if let Some(heads) = heads {
                attentions.push(Transformer2D::load(
                    &w.pp(format!("attentions.{i}")),
                    spec.transformer(c_out, heads),
                )?);
            }
        }
        let downsampler = downsample
            .then(|| Downsample::load(&w.pp("downsamplers.0"), c_out, 1))
            .transpose()?;
        Ok(Self {
            resnets,
            attentions,
            downsampler,
        })
    }

    pub fn resnets_mut(&mut self) -> impl Iterator<Item = &mut ResnetBlock2D> {
        self.resnets.iter_mut()
    }

    /// The cross-attention layers, in the order the block runs them.
    pub fn cross_attentions(&self) -> impl Iterator<Item = &CrossAttention> {
        self.attentions.iter().flat_map(|a| a.cross_attentions())
    }

    /// [`Self::cross_attentions`], mutable, in the same order.
    pub fn cross_attentions_mut(&mut self) -> impl Iterator<Item = &mut CrossAttention> {
        self.attentions
            .iter_mut()
            .flat_map(|a| a.cross_attentions_mut())
    }

    /// Returns the block output and the skip connections it produced, in order.
    pub fn forward(
        &self,
        mut x: Tensor<4>,
        temb: &Tensor<2>,
        context: Context<'_>,
        skips: &mut Vec<Tensor<4>>,
    ) -> Tensor<4> {
        for (i, resnet) in self.resnets.iter().enumerate() {
            x = resnet.forward(x, Some(temb));
            if let Some(attn) = self.attentions.get(i) {
                x = attn.forward(x, context);
            }
            skips.push(x.clone());
        }
        if let Some(down) = &self.downsampler {
            x = down.forward(x);
            skips.push(x.clone());
        }
        x
    }
}

/// `UNetMidBlock2DCrossAttn`: resnet, transformer, resnet.
#[derive(Debug, Clone)]
pub struct MidBlock {
    resnet_0: ResnetBlock2D,
    attention: Transformer2D,
    resnet_1: ResnetBlock2D,
}

impl MidBlock {
    pub fn load(w: &Weights, spec: &BlockSpec, channels: usize, heads: usize) -> Result<Self> {
        Ok(Self {
            resnet_0: ResnetBlock2D::load(&w.pp("resnets.0"), spec.resnet(channels, channels))?,
            attention: Transformer2D::load(
                &w.pp("attentions.0"),
                spec.transformer(channels, heads),
            )?,
            resnet_1: ResnetBlock2D::load(&w.pp("resnets.1"), spec.resnet(channels, channels))?,
        })
    }

    pub fn resnets_mut(&mut self) -> impl Iterator<Item = &mut ResnetBlock2D> {
        [&mut self.resnet_0, &mut self.resnet_1].into_iter()
    }

    /// The cross-attention layers, in order.
    pub fn cross_attentions(&self) -> impl Iterator<Item = &CrossAttention> {
        self.attention.cross_attentions()
    }

    /// [`Self::cross_attentions`], mutable, in the same order.
    pub fn cross_attentions_mut(&mut self) -> impl Iterator<Item = &mut CrossAttention> {
        self.attention.cross_attentions_mut()
    }

    pub fn forward(&self, x: Tensor<4>, temb: &Tensor<2>, context: Context<'_>) -> Tensor<4> {
        let x = self.resnet_0.forward(x, Some(temb));
        let x = self.attention.forward(x, context);
        self.resnet_1.forward(x, Some(temb))
    }
}

/// `CrossAttnUpBlock2D` or `UpBlock2D`.
#[derive(Debug, Clone)]
pub struct UpBlock {
    resnets: Vec<ResnetBlock2D>,
    attentions: Vec<Transformer2D>,
    upsampler: Option<Upsample>,
    /// Whether the skip connections are concatenated channels-last.
    channels_last: crate::kernels::conv::ChannelsLast,
}

/// Channel bookkeeping of one up block, as diffusers computes it.
#[derive(Debug, Clone, Copy)]
pub struct UpChannels {
    /// Channels of the matching down block's input (the last skip's width).
    pub c_in: usize,
    pub c_out: usize,
    pub c_prev: usize,
}

impl UpBlock {
    pub fn load(
        w: &Weights,
        spec: &BlockSpec,
        ch: UpChannels,
        layers: usize,
        heads: Option<usize>,
        upsample: bool,
    ) -> Result<Self> {
        let mut resnets = Vec::with_capacity(layers);
        let mut attentions = Vec::new();
        for i in 0..layers {
            let skip = if i == layers - 1 { ch.c_in } else { ch.c_out };
            let input = if i == 0 { ch.c_prev } else { ch.c_out };
            resnets.push(ResnetBlock2D::load(
                &w.pp(format!("resnets.{i}")),
                spec.resnet(input + skip, ch.c_out),
            )?);
            if let Some(heads) = heads {
                attentions.push(Transformer2D::load(
                    &w.pp(format!("attentions.{i}")),
                    spec.transformer(ch.c_out, heads),
                )?);
            }
        }
        let upsampler = upsample
            .then(|| Upsample::load(&w.pp("upsamplers.0"), ch.c_out))
            .transpose()?;
        Ok(Self {
            resnets,
            attentions,
            upsampler,
            channels_last: Default::default(),
        })
    }

    pub fn resnets_mut(&mut self) -> impl Iterator<Item = &mut ResnetBlock2D> {
        self.resnets.iter_mut()
    }

    /// The cross-attention layers, in the order the block runs them.
    pub fn cross_attentions(&self) -> impl Iterator<Item = &CrossAttention> {
        self.attentions.iter().flat_map(|a| a.cross_attentions())
    }

    /// [`Self::cross_attentions`], mutable, in the same order.
    pub fn cross_attentions_mut(&mut self) -> impl Iterator<Item = &mut CrossAttention> {
        self.attentions
            .iter_mut()
            .flat_map(|a| a.cross_attentions_mut())
    }

    pub fn forward(
        &self,
        mut x: Tensor<4>,
        temb: &Tensor<2>,
        context: Context<'_>,
        skips: &mut Vec<Tensor<4>>,
    ) -> Tensor<4> {
        for (i, resnet) in self.resnets.iter().enumerate() {
            if let Some(skip) = skips.pop() {
                x = if self.channels_last.keeps(&x) {
                    // Concatenated channels-last: the layout the convolutions keep.
                    crate::kernels::concat::channels_last(&x, &skip).unwrap_or_else(|| {
                        Tensor::cat(vec![x.permute([0, 2, 3, 1]), skip.permute([0, 2, 3, 1])], 3)
                            .permute([0, 3, 1, 2])
                    })
                } else {
                    Tensor::cat(vec![x, skip], 1)
                };
            }
            x = resnet.forward(x, Some(temb));
            if let Some(attn) = self.attentions.get(i) {
                x = attn.forward(x, context);
            }
        }
        if let Some(up) = &self.upsampler {
            let size = skips.last().map(|s| {
                let [_, _, h, w] = s.dims();
                [h, w]
            });
            x = up.forward(x, size);
        }
        x
    }
}
