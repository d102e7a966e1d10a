//! `Transformer2DModel` with `BasicTransformerBlock`s: self-attention, cross-attention to the
//! prompt, and a GEGLU feed-forward.

use burn::tensor::Tensor;

use crate::attention::{Heads, heads_attention};
use crate::error::Result;
use crate::nn::{Conv2d, GroupNorm, Kernels, LayerNorm, Linear};
use crate::weights::Weights;

/// What the UNet's cross-attention layers read: the prompt's tokens `[b, m, context_dim]` and,
/// where they were projected once for a generation ([`super::UNet2DConditionModel::project_context`]),
/// every layer's `[k | v]` from them by the layer's slot. The prompt is fixed over a generation's
/// steps, so its keys and values are too: SDXL's 70 cross-attention layers projected them at
/// every step in 70 launches (~2.6 ms of a 107 ms step on an H200, BENCHMARKS.md).
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub tokens: &'a Tensor<3>,
    pub projected: Option<&'a [Tensor<3>]>,
}

impl<'a> Context<'a> {
    /// The tokens alone: each layer projects its keys and values.
    pub fn tokens(tokens: &'a Tensor<3>) -> Self {
        Self {
            tokens,
            projected: None,
        }
    }

    /// The tokens with every layer's keys and values projected from them; a layer whose slot
    /// `kv` lacks (an empty `kv`, say) or whose entry does not fit its batch and width projects
    /// its own from the tokens.
    pub fn projected(tokens: &'a Tensor<3>, kv: &'a [Tensor<3>]) -> Self {
        Self {
            tokens,
            projected: Some(kv),
        }
    }
}

/// diffusers `Attention` as used in the UNet: q has no bias, the output projection has one. The
/// projections that read the same input are fused at load into one matmul (q, k and v for
/// self-attention; k and v from the prompt for cross-attention), and the attention reads its heads
/// from that output in place.
#[derive(Debug, Clone)]
pub struct CrossAttention {
    projection: Projections,
    to_out: Linear,
    heads: usize,
    head_dim: usize,
    /// burn's attention (where ours does not run) in f32 for an f16 model.
    upcast: bool,
    /// A cross-attention layer's place among the UNet's ([`Context::projected`]), set by the UNet.
    slot: Option<usize>,
}

#[derive(Debug, Clone)]
// One per attention layer, never moved in a hot loop: boxing would only add an indirection.
#[allow(clippy::large_enum_variant)]
enum Projections {
    /// `[q | k | v]` from the tokens.
    SelfAttention { qkv: Linear },
    /// q from the tokens, `[k | v]` from the context.
    Cross { q: Linear, kv: Linear },
}

impl CrossAttention {
    /// `context_dim`: `None` for self-attention (k and v from the tokens too).
    pub fn load(
        w: &Weights,
        query_dim: usize,
        context_dim: Option<usize>,
        heads: usize,
        head_dim: usize,
    ) -> Result<Self> {
        let inner = heads * head_dim;
        let (wq, wk, wv) = (w.pp("to_q"), w.pp("to_k"), w.pp("to_v"));
        let to_q = Linear::load(&wq, query_dim, inner, false)?;
        let kv_dim = context_dim.unwrap_or(query_dim);
        let to_k = Linear::load(&wk, kv_dim, inner, false)?;
        let to_v = Linear::load(&wv, kv_dim, inner, false)?;
        let projection = match context_dim {
            None => {
                let qkv = Linear::concat(&[to_q, to_k, to_v]);
                qkv.keep_parts_as_views(&[(&wq, inner), (&wk, inner), (&wv, inner)]);
                Projections::SelfAttention { qkv }
            }
            Some(_) => {
                let kv = Linear::concat(&[to_k, to_v]);
                kv.keep_parts_as_views(&[(&wk, inner), (&wv, inner)]);
                Projections::Cross { q: to_q, kv }
            }
        };
        Ok(Self {
            projection,
            to_out: Linear::load(&w.pp("to_out.0"), inner, query_dim, true)?,
            heads,
            head_dim,
            upcast: false,
            slot: None,
        })
    }

    /// Where this layer's keys and values lie in a [`Context::projected`].
    pub(super) fn set_slot(&mut self, slot: usize) {
        self.slot = Some(slot);
    }

    /// A cross-attention layer's `[k | v]` `[b, m, 2 · inner]` from the prompt's tokens; `None`
    /// for self-attention.
    pub(super) fn project_context(&self, tokens: &Tensor<3>) -> Option<Tensor<3>> {
        match &self.projection {
            Projections::Cross { kv, .. } => Some(kv.forward(tokens.clone())),
            Projections::SelfAttention { .. } => None,
        }
    }

    /// This layer with burn's attention upcast to f32 in f16 models, or not.
    pub fn upcast(self, upcast: bool) -> Self {
        Self { upcast, ..self }
    }

    /// # Shapes
    /// x `[b, n, query_dim]`, context `[b, m, context_dim]` (cross-attention; self-attention
    /// ignores it) -> `[b, n, query_dim]`
    pub fn forward(&self, x: Tensor<3>, context: Option<Context<'_>>) -> Tensor<3> {
        let out = self.attend(x, context);
        self.to_out.forward(out)
    }

    /// `residual + forward(x, context)`, the add fused into the output projection.
    pub fn forward_add(
        &self,
        x: Tensor<3>,
        context: Option<Context<'_>>,
        residual: Tensor<3>,
    ) -> Tensor<3> {
        let out = self.attend(x, context);
        self.to_out.forward_add(out, residual)
    }

    /// The heads' attention before the output projection, `[b, n, heads · head_dim]`.
    fn attend(&self, x: Tensor<3>, context: Option<Context<'_>>) -> Tensor<3> {
        let inner = self.heads * self.head_dim;
        let at = |tensor, column| Heads { tensor, column };
        match &self.projection {
            Projections::SelfAttention { qkv } => {
                let qkv = qkv.forward(x);
                heads_attention(
                    at(&qkv, 0),
                    at(&qkv, inner),
                    at(&qkv, 2 * inner),
                    self.heads,
                    self.head_dim,
                    self.upcast,
                )
            }
            Projections::Cross { q, kv } => {
                // Projected once for the generation where given (and of this batch and width).
                let projected = context
                    .and_then(|c| c.projected)
                    .zip(self.slot)
                    .and_then(|(all, slot)| all.get(slot))
                    .filter(|p| {
                        let [b, _, width] = p.dims();
                        b == x.dims()[0] && width == 2 * inner
                    });
                let kv = match (projected, context) {
                    (Some(p), _) => p.clone(),
                    (None, Some(c)) => kv.forward(c.tokens.clone()),
                    (None, None) => kv.forward(x.clone()),
                };
                let q = q.forward(x);
                heads_attention(
                    at(&q, 0),
                    at(&kv, 0),
                    at(&kv, inner),
                    self.heads,
                    self.head_dim,
                    self.upcast,
                )
            }
        }
    }
}

/// GEGLU feed-forward: `net.0.proj` makes value and gate, `net.2` projects back.
#[derive(Debug, Clone)]
struct FeedForward {
    proj: Linear,
    out: Linear,
}

impl FeedForward {
    fn load(w: &Weights, dim: usize) -> Result<Self> {
        let inner = dim * 4;
        Ok(Self {
            proj: Linear::load(&w.pp("net.0.proj"), dim, inner * 2, true)?,
            out: Linear::load(&w.pp("net.2"), inner, dim, true)?,
        })
    }

    /// `residual + ff(x)`, the gate and the add fused into the products where they can be.
    fn forward_add(&self, x: Tensor<3>, residual: Tensor<3>) -> Tensor<3> {
        self.out.forward_add(self.proj.forward_geglu(x), residual)
    }
}

#[derive(Debug, Clone)]
struct BasicTransformerBlock {
    norm1: LayerNorm,
    attn1: CrossAttention,
    norm2: LayerNorm,
    attn2: CrossAttention,
    norm3: LayerNorm,
    ff: FeedForward,
}

impl BasicTransformerBlock {
    fn load(
        w: &Weights,
        dim: usize,
        context_dim: usize,
        heads: usize,
        upcast: bool,
    ) -> Result<Self> {
        let head_dim = dim / heads;
        let attention = |name: &str, context: Option<usize>| {
            CrossAttention::load(&w.pp(name), dim, context, heads, head_dim)
                .map(|a| a.upcast(upcast))
        };
        Ok(Self {
            norm1: LayerNorm::load(&w.pp("norm1"), dim, 1e-5)?,
            attn1: attention("attn1", None)?,
            norm2: LayerNorm::load(&w.pp("norm2"), dim, 1e-5)?,
            attn2: attention("attn2", Some(context_dim))?,
            norm3: LayerNorm::load(&w.pp("norm3"), dim, 1e-5)?,
            ff: FeedForward::load(&w.pp("ff"), dim)?,
        })
    }

    fn forward(&self, x: Tensor<3>, context: Context<'_>) -> Tensor<3> {
        let x = self
            .attn1
            .forward_add(self.norm1.forward(x.clone()), None, x);
        let x = self
            .attn2
            .forward_add(self.norm2.forward(x.clone()), Some(context), x);
        self.ff.forward_add(self.norm3.forward(x.clone()), x)
    }
}

/// SD 1.x projects in and out with 1x1 convolutions, SD 2.x with linear layers.
#[derive(Debug, Clone)]
enum Projection {
    Conv(Conv2d),
    Linear(Linear),
}

impl Projection {
    fn load(w: &Weights, c_in: usize, c_out: usize, linear: bool) -> Result<Self> {
        Ok(if linear {
            Projection::Linear(Linear::load(w, c_in, c_out, true)?)
        } else {
            Projection::Conv(Conv2d::load(w, c_in, c_out, 1, 1, 0)?)
        })
    }
}

/// `Transformer2DModel` (continuous input).
#[derive(Debug, Clone)]
pub struct Transformer2D {
    norm: GroupNorm,
    proj_in: Projection,
    blocks: Vec<BasicTransformerBlock>,
    proj_out: Projection,
    /// Whether tokens and map share one channels-last buffer.
    channels_last: crate::kernels::conv::ChannelsLast,
}

/// What shapes one `Transformer2D` has.
#[derive(Debug, Clone, Copy)]
pub struct TransformerSpec {
    pub channels: usize,
    pub heads: usize,
    pub context_dim: usize,
    pub layers: usize,
    pub groups: usize,
    pub linear_projection: bool,
    /// Attention in f32 where burn's runs in f16 ([`crate::unet::UNetConfig::upcast_attention`]).
    pub upcast_attention: bool,
}

impl Transformer2D {
    pub fn load(w: &Weights, s: TransformerSpec) -> Result<Self> {
        let c = s.channels;
        Ok(Self {
            norm: GroupNorm::load(&w.pp("norm"), s.groups, c, 1e-6)?,
            proj_in: Projection::load(&w.pp("proj_in"), c, c, s.linear_projection)?,
            blocks: (0..s.layers)
                .map(|i| {
                    BasicTransformerBlock::load(
                        &w.pp(format!("transformer_blocks.{i}")),
                        c,
                        s.context_dim,
                        s.heads,
                        s.upcast_attention,
                    )
                })
                .collect::<Result<_>>()?,
            proj_out: Projection::load(&w.pp("proj_out"), c, c, s.linear_projection)?,
            channels_last: Default::default(),
        })
    }

    /// The blocks' cross-attention layers, in order.
    pub fn cross_attentions(&self) -> impl Iterator<Item = &CrossAttention> {
        self.blocks.iter().map(|b| &b.attn2)
    }

    /// [`Self::cross_attentions`], mutable, in the same order.
    pub fn cross_attentions_mut(&mut self) -> impl Iterator<Item = &mut CrossAttention> {
        self.blocks.iter_mut().map(|b| &mut b.attn2)
    }

    /// # Shapes
    /// x `[b, c, h, w]`, context `[b, m, context_dim]` -> `[b, c, h, w]`
    pub fn forward(&self, x: Tensor<4>, context: Context<'_>) -> Tensor<4> {
        let [b, c, h, w] = x.dims();
        let residual = x.clone();
        let x = self.norm.forward_with(x, false, Kernels::Fused);
        // Where the maps are kept channels-last, tokens and map are one buffer (no copy).
        let last = self.channels_last.keeps(&x);
        let to_tokens = |t: Tensor<4>| match last {
            true => t.permute([0, 2, 3, 1]).reshape([b, h * w, c]),
            false => t.reshape([b, c, h * w]).swap_dims(1, 2), // [b, hw, c]
        };
        let mut tokens = match &self.proj_in {
            Projection::Conv(conv) => to_tokens(conv.forward(x)),
            Projection::Linear(lin) => lin.forward(to_tokens(x)),
        };
        for block in &self.blocks {
            tokens = block.forward(tokens, context);
        }
        let to_map = |t: Tensor<3>| match last {
            true => t.reshape([b, h, w, c]).permute([0, 3, 1, 2]),
            false => t.swap_dims(1, 2).reshape([b, c, h, w]),
        };
        match &self.proj_out {
            // The residual in the convolution's epilogue where ours runs: no pass of its own;
            // on our GEMM the tokens are read as they lie (no transpose back to a map).
            Projection::Conv(conv) => conv.forward_tokens(tokens, [h, w], Some(&residual)),
            Projection::Linear(lin) => to_map(lin.forward(tokens)) + residual,
        }
    }
}
