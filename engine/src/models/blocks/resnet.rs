//! `ResnetBlock2D`, shared by the UNet (with a time embedding) and the VAE (without).

use burn::tensor::Tensor;

use crate::error::Result;
use crate::kernels::conv::Columns;
use crate::nn::{Conv2d, GroupNorm, Kernels, Linear, silu};
use crate::weights::Weights;

#[derive(Debug, Clone)]
pub struct ResnetBlock2D {
    norm1: GroupNorm,
    conv1: Conv2d,
    time_emb_proj: Option<Linear>,
    /// Where this resnet's projection sits in the UNet's fused one, once the UNet took it
    /// ([`Self::take_time_projection`]).
    time_column: Option<usize>,
    norm2: GroupNorm,
    conv2: Conv2d,
    conv_shortcut: Option<Conv2d>,
}

/// The parts of a resnet's shape that differ between call sites.
#[derive(Debug, Clone, Copy)]
pub struct ResnetSpec {
    pub c_in: usize,
    pub c_out: usize,
    /// Width of the time embedding, `None` in the VAE.
    pub temb: Option<usize>,
    pub groups: usize,
    pub eps: f64,
}

/// A resnet's layers, for callers that run them in their own order: the tiled VAE decode runs
/// each layer over every tile before the next (`crate::vae_tiling`).
#[derive(Debug, Clone, Copy)]
pub struct ResnetLayers<'a> {
    pub norm1: &'a GroupNorm,
    /// 3x3, padding 1.
    pub conv1: &'a Conv2d,
    pub norm2: &'a GroupNorm,
    /// 3x3, padding 1.
    pub conv2: &'a Conv2d,
    /// 1x1, where the channel count changes.
    pub conv_shortcut: Option<&'a Conv2d>,
    /// The UNet's time embedding projection; `None` in the VAE.
    pub time_emb_proj: Option<&'a Linear>,
}

impl ResnetBlock2D {
    pub fn layers(&self) -> ResnetLayers<'_> {
        ResnetLayers {
            norm1: &self.norm1,
            conv1: &self.conv1,
            norm2: &self.norm2,
            conv2: &self.conv2,
            conv_shortcut: self.conv_shortcut.as_ref(),
            time_emb_proj: self.time_emb_proj.as_ref(),
        }
    }

    pub fn load(w: &Weights, s: ResnetSpec) -> Result<Self> {
        Ok(Self {
            norm1: GroupNorm::load(&w.pp("norm1"), s.groups, s.c_in, s.eps)?,
            conv1: Conv2d::load(&w.pp("conv1"), s.c_in, s.c_out, 3, 1, 1)?,
            time_emb_proj: s
                .temb
                .map(|t| Linear::load(&w.pp("time_emb_proj"), t, s.c_out, true))
                .transpose()?,
            time_column: None,
            norm2: GroupNorm::load(&w.pp("norm2"), s.groups, s.c_out, s.eps)?,
            conv2: Conv2d::load(&w.pp("conv2"), s.c_out, s.c_out, 3, 1, 1)?,
            conv_shortcut: (s.c_in != s.c_out)
                .then(|| Conv2d::load(&w.pp("conv_shortcut"), s.c_in, s.c_out, 1, 1, 0))
                .transpose()?,
        })
    }

    /// A copy with its weights in `dtype` (norms stay f32, as they are loaded).
    pub fn cast(&self, dtype: burn::tensor::DType) -> Self {
        Self {
            norm1: self.norm1.clone(),
            conv1: self.conv1.cast(dtype),
            time_emb_proj: self.time_emb_proj.as_ref().map(|l| l.cast(dtype)),
            time_column: self.time_column,
            norm2: self.norm2.clone(),
            conv2: self.conv2.cast(dtype),
            conv_shortcut: self.conv_shortcut.as_ref().map(|c| c.cast(dtype)),
        }
    }

    /// Hands this resnet's time-embedding projection to the UNet, which computes every resnet's
    /// in one product (one launch instead of one per resnet); this resnet then reads columns
    /// `column ..` of that product. `None` where it has none (the VAE's).
    pub fn take_time_projection(&mut self, column: usize) -> Option<Linear> {
        let proj = self.time_emb_proj.take()?;
        self.time_column = Some(column);
        Some(proj)
    }

    /// # Shapes
    /// x `[b, c_in, h, w]` -> `[b, c_out, h, w]`. `time`: the UNet's projections of every
    /// resnet's time embedding `[b, Σ c_out]` where the UNet took this resnet's projection
    /// ([`Self::take_time_projection`]), else the time embedding `[b, t]` itself.
    ///
    /// The GroupNorm+SiLU pairs run through our kernels where the device runs them.
    pub fn forward(&self, x: Tensor<4>, time: Option<&Tensor<2>>) -> Tensor<4> {
        self.forward_with(x, time, Kernels::Fused)
    }

    /// [`Self::forward`] with its GroupNorm+SiLU pairs run through `kernels`.
    pub fn forward_with(
        &self,
        x: Tensor<4>,
        time: Option<&Tensor<2>>,
        kernels: Kernels,
    ) -> Tensor<4> {
        let own; // [b, c_out], where this resnet projects its own
        let t = match (self.time_column, &self.time_emb_proj, time) {
            (Some(column), _, Some(all)) => Some(Columns {
                tensor: all,
                column,
            }),
            (None, Some(proj), Some(temb)) => {
                own = proj.forward(silu(temb.clone()));
                Some(Columns::all(&own))
            }
            _ => None,
        };
        // The time embedding and the shortcut are added in the convolutions' epilogues; where
        // conv1's map comes back channels-last (burn's convolution, or ours channels-last), its
        // bias and the time embedding are left to norm2 (no pass over the map for them).
        let normed = self.norm1.forward_with(x.clone(), true, kernels);
        let h = match kernels {
            Kernels::Fused => {
                let (h, pre) = self.conv1.forward_deferred(normed, t);
                self.norm2.forward_shifted(h, pre, true, kernels)
            }
            _ => self
                .norm2
                .forward_with(self.conv1.forward_adding(normed, t, None), true, kernels),
        };
        let shortcut = match &self.conv_shortcut {
            Some(conv) => conv.forward(x),
            None => x,
        };
        self.conv2.forward_adding(h, None, Some(&shortcut))
    }
}
