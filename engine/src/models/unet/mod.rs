//! `UNet2DConditionModel` for SD 1.x, 2.x and XL: the noise predictor.

pub mod attention;
pub mod blocks;
mod config;
pub mod embeddings;
pub mod graph;

use burn::tensor::Tensor;

use crate::error::{Error, Result};
use crate::nn::{Conv2d, GroupNorm, Kernels, Linear, silu};
use crate::weights::Weights;
pub use attention::Context;
use attention::CrossAttention;
use blocks::{BlockSpec, DownBlock, MidBlock, UpBlock, UpChannels};
pub use config::{PerBlock, UNetConfig};
use embeddings::{AddEmbedding, TimestepEmbedding, timestep_projection};

/// The UNet. Field names follow diffusers' module names.
#[derive(Debug, Clone)]
pub struct UNet2DConditionModel {
    time_embedding: TimestepEmbedding,
    /// SDXL's added conditioning (`add_embedding`), where the config has one.
    add_embedding: Option<AddEmbedding>,
    /// The resnets' `time_emb_proj` layers side by side (see `ResnetBlock2D::take_time_projection`).
    time_projections: Option<Linear>,
    conv_in: Conv2d,
    down_blocks: Vec<DownBlock>,
    mid_block: MidBlock,
    up_blocks: Vec<UpBlock>,
    conv_norm_out: GroupNorm,
    conv_out: Conv2d,
    config: UNetConfig,
}

impl UNet2DConditionModel {
    pub fn load(w: &Weights, config: &UNetConfig) -> Result<Self> {
        config.validate()?;
        let c = &config.block_out_channels;
        let n = c.len();
        let temb = c[0] * 4;
        let spec = BlockSpec {
            temb,
            groups: config.norm_num_groups,
            eps: config.norm_eps,
            context_dim: config.cross_attention_dim,
            transformer_layers: 1,
            linear_projection: config.use_linear_projection,
            upcast_attention: config.upcast_attention,
        };
        let level = |i: usize| BlockSpec {
            transformer_layers: config.transformer_layers(i),
            ..spec
        };
        let heads = |i: usize, attn: bool| if attn { config.heads(i) } else { None };

        let mut down_blocks: Vec<DownBlock> = Vec::with_capacity(n);
        for i in 0..n {
            let c_in = if i == 0 { c[0] } else { c[i - 1] };
            down_blocks.push(DownBlock::load(
                &w.pp(format!("down_blocks.{i}")),
                &level(i),
                c_in,
                c[i],
                config.layers_per_block,
                heads(i, config.down_has_attention(i)),
                i + 1 < n,
            )?);
        }
        let mid_heads = config.heads(n - 1).unwrap_or(1);
        let mut mid_block = MidBlock::load(&w.pp("mid_block"), &level(n - 1), c[n - 1], mid_heads)?;

        let mut up_blocks: Vec<UpBlock> = Vec::with_capacity(n);
        for i in 0..n {
            let rev = n - 1 - i; // block width index, reversed
            let ch = UpChannels {
                c_in: c[rev.saturating_sub(1)],
                c_out: c[rev],
                c_prev: if i == 0 { c[n - 1] } else { c[rev + 1] },
            };
            up_blocks.push(UpBlock::load(
                &w.pp(format!("up_blocks.{i}")),
                &level(rev),
                ch,
                config.layers_per_block + 1,
                heads(rev, config.up_has_attention(i)),
                i + 1 < n,
            )?);
        }

        // Every resnet's time-embedding projection in one product, each reading its columns.
        let mut column = 0;
        let mut projections = Vec::new();
        let resnets = down_blocks
            .iter_mut()
            .flat_map(|b| b.resnets_mut())
            .chain(mid_block.resnets_mut())
            .chain(up_blocks.iter_mut().flat_map(|b| b.resnets_mut()));
        for resnet in resnets {
            if let Some(proj) = resnet.take_time_projection(column) {
                column += proj.dims()[1];
                projections.push(proj);
            }
        }
        let time_projections = (!projections.is_empty()).then(|| Linear::concat(&projections));

        let add_embedding = match config.added_conditioning() {
            Some((time, input)) => Some(AddEmbedding {
                embedding: TimestepEmbedding::load(&w.pp("add_embedding"), input, temb)?,
                time_dim: time,
                input,
            }),
            None => None,
        };
        let mut unet = Self {
            time_embedding: TimestepEmbedding::load(&w.pp("time_embedding"), c[0], temb)?,
            add_embedding,
            time_projections,
            conv_in: Conv2d::load(&w.pp("conv_in"), config.in_channels, c[0], 3, 1, 1)?,
            down_blocks,
            mid_block,
            up_blocks,
            conv_norm_out: GroupNorm::load(
                &w.pp("conv_norm_out"),
                config.norm_num_groups,
                c[0],
                config.norm_eps,
            )?,
            conv_out: Conv2d::load(&w.pp("conv_out"), c[0], config.out_channels, 3, 1, 1)?,
            config: config.clone(),
        };
        for (slot, attention) in unet.cross_attentions_mut().enumerate() {
            attention.set_slot(slot);
        }
        Ok(unet)
    }

    /// The cross-attention layers in the order the forward pass runs them (a layer's slot in
    /// [`Self::project_context`]).
    fn cross_attentions(&self) -> impl Iterator<Item = &CrossAttention> {
        let down = self.down_blocks.iter().flat_map(|b| b.cross_attentions());
        let up = self.up_blocks.iter().flat_map(|b| b.cross_attentions());
        down.chain(self.mid_block.cross_attentions()).chain(up)
    }

    /// [`Self::cross_attentions`], mutable, in the same order.
    fn cross_attentions_mut(&mut self) -> impl Iterator<Item = &mut CrossAttention> {
        let down = self
            .down_blocks
            .iter_mut()
            .flat_map(|b| b.cross_attentions_mut());
        let up = self
            .up_blocks
            .iter_mut()
            .flat_map(|b| b.cross_attentions_mut());
        down.chain(self.mid_block.cross_attentions_mut()).chain(up)
    }

    /// Every cross-attention layer's keys and values `[b, m, 2 · inner]` from the prompt's
    /// tokens `[b, m, context_dim]`, by slot: what [`Context::projected`] takes, fixed for a
    /// generation's steps. Each equals what the layer computes from the tokens at every step.
    pub fn project_context(&self, tokens: &Tensor<3>) -> Vec<Tensor<3>> {
        self.cross_attentions()
            .map(|a| a.project_context(tokens))
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default()
    }

    pub fn config(&self) -> &UNetConfig {
        &self.config
    }

    /// The forward pass with a wall-clock time per top-level block, `sync` waiting for the device
    /// after each: where a step's time goes (benchmarks only; syncing costs throughput).
    pub fn forward_profiled(
        &self,
        x: Tensor<4>,
        timesteps: &[f32],
        context: &Tensor<3>,
        sync: &dyn Fn(),
    ) -> Vec<(String, std::time::Duration)> {
        let mut times = Vec::new();
        let mut clock = std::time::Instant::now();
        let context = Context::tokens(context);
        let _ = self.forward_with(x, timesteps, context, None, &mut |block, index| {
            sync();
            let name = match index {
                Some(i) => format!("{block}.{i}"),
                None => block.to_string(),
            };
            times.push((name, clock.elapsed()));
            clock = std::time::Instant::now();
        });
        times
    }

    /// Predicts noise for a batch of latents at (possibly fractional) timesteps.
    ///
    /// # Shapes
    /// x `[b, 4, h/8, w/8]`, timesteps `[b]`, context `[b, 77, 768]` -> `[b, 4, h/8, w/8]`
    pub fn forward(&self, x: Tensor<4>, timesteps: &[f32], context: &Tensor<3>) -> Tensor<4> {
        self.forward_with(x, timesteps, Context::tokens(context), None, &mut |_, _| {})
    }

    /// [`Self::forward`] (with SDXL's `added` conditioning where given) from a [`Context`]: the
    /// prompt's keys and values may be projected once for a generation
    /// ([`Self::project_context`]).
    pub fn forward_context(
        &self,
        x: Tensor<4>,
        timesteps: &[f32],
        context: Context<'_>,
        added: Option<&Tensor<2>>,
    ) -> Tensor<4> {
        self.forward_with(x, timesteps, context, added, &mut |_, _| {})
    }

    /// [`Self::forward`] with SDXL's added conditioning ([`Self::added_conditioning`], `[b,
    /// 4·c0]`), added to the time embedding.
    pub fn forward_added(
        &self,
        x: Tensor<4>,
        timesteps: &[f32],
        context: &Tensor<3>,
        added: &Tensor<2>,
    ) -> Tensor<4> {
        self.forward_with(
            x,
            timesteps,
            Context::tokens(context),
            Some(added),
            &mut |_, _| {},
        )
    }

    /// SDXL's added conditioning for each batch row: its pooled text embedding `[b, pooled]` and
    /// its six size and crop values (original height and width, crop top and left, target height
    /// and width, in pixels; the refiner's five end with an aesthetic score instead of the target
    /// size), through `add_embedding`: `[b, 4·c0]`, the same for every step. An
    /// error where the UNet has none or the widths disagree.
    pub fn added_conditioning(
        &self,
        text_embeds: &Tensor<2>,
        time_ids: &[impl AsRef<[f32]>],
    ) -> Result<Tensor<2>> {
        let add = self.add_embedding.as_ref().ok_or_else(|| {
            Error::InvalidInput("this UNet takes no added conditioning (not SDXL)".into())
        })?;
        add.forward(text_embeds, time_ids, &self.config)
    }

    /// Whether the UNet needs [`Self::added_conditioning`] (SDXL).
    pub fn takes_added_conditioning(&self) -> bool {
        self.add_embedding.is_some()
    }

    /// The sinusoidal projection of one timestep per batch item (or one for all), `[b, c0]` f32:
    /// the step's only input computed on the host, kept apart so a recorded step can take it as
    /// a buffer ([`graph::UNetSteps`]).
    pub fn timestep_input(&self, timesteps: &[f32], device: &burn::tensor::Device) -> Tensor<2> {
        timestep_projection(
            timesteps,
            self.config.block_out_channels[0],
            self.config.flip_sin_to_cos,
            self.config.freq_shift,
            device,
        )
    }

    /// [`Self::forward`] from the timestep projection ([`Self::timestep_input`]) `[b, c0]`.
    pub fn forward_projected(
        &self,
        x: Tensor<4>,
        t: Tensor<2>,
        context: Context<'_>,
        added: Option<&Tensor<2>>,
    ) -> Tensor<4> {
        self.forward_from(x, t, context, added, &mut |_, _| {})
    }

    /// The forward pass, calling `after_block(name, index)` after each top-level block.
    fn forward_with(
        &self,
        x: Tensor<4>,
        timesteps: &[f32],
        context: Context<'_>,
        added: Option<&Tensor<2>>,
        after_block: &mut dyn FnMut(&'static str, Option<usize>),
    ) -> Tensor<4> {
        let b = x.dims()[0];
        // One timestep for the whole batch is broadcast, as diffusers does.
        let timesteps = if timesteps.len() == 1 {
            vec![timesteps[0]; b]
        } else {
            timesteps.to_vec()
        };
        let t = self.timestep_input(&timesteps, &x.device());
        self.forward_from(x, t, context, added, after_block)
    }

    fn forward_from(
        &self,
        x: Tensor<4>,
        t: Tensor<2>,
        context: Context<'_>,
        added: Option<&Tensor<2>>,
        after_block: &mut dyn FnMut(&'static str, Option<usize>),
    ) -> Tensor<4> {
        let dtype = x.dtype();
        let mut temb = self.time_embedding.forward(t.cast(dtype)); // [b, 4*c0]
        if let Some(added) = added {
            temb = temb + added.clone().cast(dtype);
        }
        // Every resnet's projection at once, [b, Σ c_out]; each resnet reads its columns.
        let temb = match &self.time_projections {
            Some(proj) => proj.forward(silu(temb)),
            None => temb,
        };

        let mut x = self.conv_in.forward(x); // [b, c0, h, w]
        let mut skips = vec![x.clone()];
        after_block("time embedding + conv_in", None);
        for (i, block) in self.down_blocks.iter().enumerate() {
            x = block.forward(x, &temb, context, &mut skips);
            after_block("down_blocks", Some(i));
        }
        x = self.mid_block.forward(x, &temb, context);
        after_block("mid_block", None);
        for (i, block) in self.up_blocks.iter().enumerate() {
            x = block.forward(x, &temb, context, &mut skips);
            after_block("up_blocks", Some(i));
        }
        let out = self
            .conv_out
            .forward(self.conv_norm_out.forward_with(x, true, Kernels::Fused));
        after_block("conv_norm_out + conv_out", None);
        out
    }
}
