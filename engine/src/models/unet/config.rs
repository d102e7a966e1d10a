//! The UNet's configuration as diffusers' `config.json` spells it, its family presets, and its
//! validation (a user's file or sidecar gets a clear error, never a panic).

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// An int or one value per block, as diffusers configs allow for head counts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PerBlock {
    One(usize),
    Each(Vec<usize>),
}

impl PerBlock {
    pub fn get(&self, block: usize) -> Option<usize> {
        match self {
            PerBlock::One(v) => Some(*v),
            PerBlock::Each(v) => v.get(block).copied(),
        }
    }
}

/// Mirrors diffusers' `UNet2DConditionModel` config (the fields SD 1.x, 2.x and XL use).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct UNetConfig {
    pub in_channels: usize,
    pub out_channels: usize,
    pub block_out_channels: Vec<usize>,
    pub layers_per_block: usize,
    /// Number of heads for SD 1.x (diffusers' historical misnomer, kept for config compatibility).
    pub attention_head_dim: PerBlock,
    pub num_attention_heads: Option<PerBlock>,
    pub cross_attention_dim: usize,
    pub down_block_types: Vec<String>,
    pub up_block_types: Vec<String>,
    pub norm_num_groups: usize,
    pub norm_eps: f64,
    pub flip_sin_to_cos: bool,
    pub freq_shift: f32,
    pub use_linear_projection: bool,
    /// Transformer layers per attention of each level (SDXL: 1, 2, 10); the mid block takes the
    /// last level's.
    pub transformer_layers_per_block: PerBlock,
    pub sample_size: usize,
    /// SDXL's added conditioning: `"text_time"` (the pooled text embedding and the six size and
    /// crop values, [`embeddings::AddEmbedding`]); `None` for SD 1.x/2.x.
    pub addition_embed_type: Option<String>,
    /// Sinusoid width of each of the six size and crop values.
    pub addition_time_embed_dim: Option<usize>,
    /// Width of the added conditioning's input: the pooled text embedding and 6 ×
    /// `addition_time_embed_dim`.
    pub projection_class_embeddings_input_dim: Option<usize>,
    /// Attention's scores and softmax in f32 even when the model runs in f16 (diffusers'
    /// `upcast_attention`, set by SD 2.1's 768-v config: its f16 scores overflow). Our attention
    /// kernels always keep them in f32; this decides for burn's attention where ours does not run.
    pub upcast_attention: bool,
}

impl Default for UNetConfig {
    fn default() -> Self {
        Self::sd15()
    }
}

impl UNetConfig {
    /// diffusers: stable-diffusion-v1-5/unet/config.json
    pub fn sd15() -> Self {
        let down = [
            "CrossAttnDownBlock2D",
            "CrossAttnDownBlock2D",
            "CrossAttnDownBlock2D",
            "DownBlock2D",
        ];
        let up = [
            "UpBlock2D",
            "CrossAttnUpBlock2D",
            "CrossAttnUpBlock2D",
            "CrossAttnUpBlock2D",
        ];
        Self {
            in_channels: 4,
            out_channels: 4,
            block_out_channels: vec![320, 640, 1280, 1280],
            layers_per_block: 2,
            attention_head_dim: PerBlock::One(8),
            num_attention_heads: None,
            cross_attention_dim: 768,
            down_block_types: down.map(String::from).to_vec(),
            up_block_types: up.map(String::from).to_vec(),
            norm_num_groups: 32,
            norm_eps: 1e-5,
            flip_sin_to_cos: true,
            freq_shift: 0.0,
            use_linear_projection: false,
            transformer_layers_per_block: PerBlock::One(1),
            sample_size: 64,
            addition_embed_type: None,
            addition_time_embed_dim: None,
            projection_class_embeddings_input_dim: None,
            upcast_attention: false,
        }
    }

    /// diffusers: stable-diffusion-2-1/unet/config.json (768-v, sample size 96) and
    /// stable-diffusion-2-1-base (512, epsilon): heads per level, OpenCLIP's 1024-wide context,
    /// linear projections into and out of each transformer.
    pub fn sd2(v: bool) -> Self {
        Self {
            attention_head_dim: PerBlock::Each(vec![5, 10, 20, 20]),
            cross_attention_dim: 1024,
            use_linear_projection: true,
            sample_size: if v { 96 } else { 64 },
            // As stable-diffusion-2-1's (768-v) config says; 2-1-base's does not.
            upcast_attention: v,
            ..Self::sd15()
        }
    }

    /// diffusers: stable-diffusion-xl-base-1.0/unet/config.json: three levels (the first without
    /// attention), 1, 2 and 10 transformer layers, CLIP-L and bigG's 2048-wide context, and the
    /// added conditioning (bigG's pooled 1280 and six 256-wide size and crop sinusoids: 2816).
    pub fn sdxl() -> Self {
        let down = [
            "DownBlock2D",
            "CrossAttnDownBlock2D",
            "CrossAttnDownBlock2D",
        ];
        let up = ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"];
        Self {
            block_out_channels: vec![320, 640, 1280],
            attention_head_dim: PerBlock::Each(vec![5, 10, 20]),
            cross_attention_dim: 2048,
            down_block_types: down.map(String::from).to_vec(),
            up_block_types: up.map(String::from).to_vec(),
            use_linear_projection: true,
            transformer_layers_per_block: PerBlock::Each(vec![1, 2, 10]),
            sample_size: 128,
            addition_embed_type: Some("text_time".into()),
            addition_time_embed_dim: Some(256),
            projection_class_embeddings_input_dim: Some(2816),
            ..Self::sd15()
        }
    }

    /// diffusers: stable-diffusion-xl-refiner-1.0/unet/config.json: four levels, attention on the
    /// middle two (and the mid block), four transformer layers each, bigG's 1280-wide context,
    /// five added values (sizes, crop, aesthetic score) beside the 1280-wide pooled embedding.
    pub fn sdxl_refiner() -> Self {
        let down = [
            "DownBlock2D",
            "CrossAttnDownBlock2D",
            "CrossAttnDownBlock2D",
            "DownBlock2D",
        ];
        let up = [
            "UpBlock2D",
            "CrossAttnUpBlock2D",
            "CrossAttnUpBlock2D",
            "UpBlock2D",
        ];
        Self {
            block_out_channels: vec![384, 768, 1536, 1536],
            attention_head_dim: PerBlock::Each(vec![6, 12, 24, 24]),
            cross_attention_dim: 1280,
            down_block_types: down.map(String::from).to_vec(),
            up_block_types: up.map(String::from).to_vec(),
            transformer_layers_per_block: PerBlock::One(4),
            projection_class_embeddings_input_dim: Some(2560),
            ..Self::sdxl()
        }
    }

    /// How many size (and score) values the added conditioning takes beside the pooled
    /// embedding of `pooled` width: 6 for SDXL base (sizes, crop, target size), 5 for the
    /// refiner (sizes, crop, aesthetic score).
    pub fn added_values(&self, pooled: usize) -> Option<usize> {
        let (time_dim, input) = self.added_conditioning()?;
        let rest = input.checked_sub(pooled)?;
        (time_dim > 0 && rest % time_dim == 0).then_some(rest / time_dim)
    }

    /// Heads of block `i` (diffusers: `num_attention_heads or attention_head_dim`).
    pub fn heads(&self, block: usize) -> Option<usize> {
        self.num_attention_heads
            .as_ref()
            .unwrap_or(&self.attention_head_dim)
            .get(block)
    }

    /// Transformer layers of each attention at level `block` (the mid block: the last level).
    pub fn transformer_layers(&self, block: usize) -> usize {
        self.transformer_layers_per_block
            .get(block)
            .or_else(|| self.transformer_layers_per_block.get(0))
            .unwrap_or(1)
    }

    /// The added conditioning's widths `(time value sinusoid, input)` where the UNet has one.
    pub fn added_conditioning(&self) -> Option<(usize, usize)> {
        self.addition_embed_type.as_ref()?;
        Some((
            self.addition_time_embed_dim?,
            self.projection_class_embeddings_input_dim?,
        ))
    }

    fn has_cross_attention(kind: &str) -> bool {
        kind.starts_with("CrossAttn")
    }

    /// Whether down block `i` has transformers.
    pub fn down_has_attention(&self, i: usize) -> bool {
        self.down_block_types
            .get(i)
            .is_some_and(|k| Self::has_cross_attention(k))
    }

    /// Whether up block `i` has transformers.
    pub fn up_has_attention(&self, i: usize) -> bool {
        self.up_block_types
            .get(i)
            .is_some_and(|k| Self::has_cross_attention(k))
    }

    /// Every field a layer is sized from, within [`crate::bounds`]: a clear error for a zero,
    /// absurd or inconsistent value from a user's `config.json` or sidecar, never a panic.
    /// An inpainting UNet: besides the latents it takes the mask and the masked picture's
    /// latents (9 channels for 4 latent ones).
    pub fn is_inpainting(&self) -> bool {
        self.in_channels == 2 * self.out_channels + 1
    }

    pub fn validate(&self) -> crate::Result<()> {
        use crate::bounds::{self, MAX_GROUPS, MAX_IO_CHANNELS, MAX_LAYERS, MAX_LEVELS, MAX_WIDTH};
        bounds::count("in_channels", self.in_channels, MAX_IO_CHANNELS)?;
        bounds::count("out_channels", self.out_channels, MAX_IO_CHANNELS)?;
        bounds::counts(
            "block_out_channels",
            &self.block_out_channels,
            MAX_WIDTH,
            MAX_LEVELS,
        )?;
        bounds::count("layers_per_block", self.layers_per_block, MAX_LAYERS)?;
        match &self.transformer_layers_per_block {
            PerBlock::One(v) => bounds::count("transformer_layers_per_block", *v, MAX_LAYERS)?,
            PerBlock::Each(v) => {
                if v.len() != self.block_out_channels.len() {
                    return Err(Error::Config(format!(
                        "transformer_layers_per_block has {} values for {} levels",
                        v.len(),
                        self.block_out_channels.len()
                    )));
                }
                bounds::counts("transformer_layers_per_block", v, MAX_LAYERS, MAX_LEVELS)?;
            }
        }
        match self.addition_embed_type.as_deref() {
            None => {}
            Some("text_time") => {
                let (Some(time), Some(input)) = (
                    self.addition_time_embed_dim,
                    self.projection_class_embeddings_input_dim,
                ) else {
                    return Err(Error::Config(
                        "addition_embed_type text_time needs addition_time_embed_dim and \
                         projection_class_embeddings_input_dim"
                            .into(),
                    ));
                };
                bounds::count("addition_time_embed_dim", time, MAX_WIDTH)?;
                bounds::count(
                    "projection_class_embeddings_input_dim",
                    input,
                    8 * MAX_WIDTH,
                )?;
                if input <= 6 * time {
                    return Err(Error::Config(format!(
                        "projection_class_embeddings_input_dim {input} leaves no room for the \
                         pooled text embedding beside 6 × {time}"
                    )));
                }
            }
            Some(other) => {
                return Err(Error::Config(format!(
                    "unsupported UNet addition_embed_type `{other}`"
                )));
            }
        }
        bounds::count("norm_num_groups", self.norm_num_groups, MAX_GROUPS)?;
        // A zero head count is refused wherever it stands, even in a field the other overrides
        // or for a level without attention: a file that says 0 heads is wrong, not unused.
        let heads = [
            ("attention_head_dim", Some(&self.attention_head_dim)),
            ("num_attention_heads", self.num_attention_heads.as_ref()),
        ];
        for (field, value) in heads {
            let zero = match value {
                Some(PerBlock::One(v)) => *v == 0,
                Some(PerBlock::Each(v)) => v.contains(&0),
                None => false,
            };
            if zero {
                return Err(Error::Config(format!(
                    "{field} has a zero; a level has at least one attention head"
                )));
            }
        }
        bounds::count("cross_attention_dim", self.cross_attention_dim, MAX_WIDTH)?;
        bounds::count("sample_size", self.sample_size, 4096)?;
        bounds::positive("norm_eps", self.norm_eps, 1.0)?;
        if !self.freq_shift.is_finite() || self.freq_shift.abs() > 1e3 {
            return Err(Error::Config(format!(
                "freq_shift {} is not a small finite number",
                self.freq_shift
            )));
        }
        // The time embedding's frequencies divide by (half width − shift).
        let half = (self.block_out_channels[0] / 2) as f32;
        if half - self.freq_shift <= 0.0 {
            return Err(Error::Config(format!(
                "freq_shift {} leaves no time-embedding frequencies for width {}",
                self.freq_shift, self.block_out_channels[0]
            )));
        }
        let n = self.block_out_channels.len();
        if self.down_block_types.len() != n || self.up_block_types.len() != n {
            return Err(Error::Config(format!(
                "UNet needs one down and one up block type per block_out_channels entry ({n})"
            )));
        }
        let known_down = ["CrossAttnDownBlock2D", "DownBlock2D"];
        let known_up = ["CrossAttnUpBlock2D", "UpBlock2D"];
        if let Some(k) = self
            .down_block_types
            .iter()
            .find(|k| !known_down.contains(&k.as_str()))
        {
            return Err(Error::Config(format!("unsupported UNet down block `{k}`")));
        }
        if let Some(k) = self
            .up_block_types
            .iter()
            .find(|k| !known_up.contains(&k.as_str()))
        {
            return Err(Error::Config(format!("unsupported UNet up block `{k}`")));
        }
        for (i, &c) in self.block_out_channels.iter().enumerate() {
            bounds::divides(
                &format!("block {i} width"),
                c,
                self.norm_num_groups,
                "groups",
            )?;
            let attn = self.down_has_attention(i) || self.up_has_attention(n - 1 - i) || i == n - 1;
            match self.heads(i) {
                Some(h) if (1..=MAX_GROUPS).contains(&h) && c % h == 0 => {}
                _ if !attn => {}
                h => {
                    return Err(Error::Config(format!(
                        "block {i} width {c} does not split into {h:?} heads \
                         (attention_head_dim or num_attention_heads)"
                    )));
                }
            }
        }
        // The time embedding is 4× the first width; the resnets' GroupNorms see every width.
        bounds::count(
            "block_out_channels[0] × 4",
            self.block_out_channels[0] * 4,
            4 * MAX_WIDTH,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{PerBlock, UNetConfig};

    fn sdxl_like() -> UNetConfig {
        UNetConfig {
            transformer_layers_per_block: PerBlock::Each(vec![1, 2, 10, 10]),
            addition_embed_type: Some("text_time".into()),
            addition_time_embed_dim: Some(256),
            projection_class_embeddings_input_dim: Some(2816),
            ..UNetConfig::sd15()
        }
    }

    /// What a user's SDXL config or sidecar can get wrong is refused with a clear error.
    #[test]
    fn sdxl_fields_are_validated() {
        assert!(sdxl_like().validate().is_ok());
        assert_eq!(sdxl_like().transformer_layers(2), 10);
        assert_eq!(sdxl_like().added_conditioning(), Some((256, 2816)));
        let bad = [
            UNetConfig {
                transformer_layers_per_block: PerBlock::Each(vec![1, 2]),
                ..sdxl_like()
            },
            UNetConfig {
                transformer_layers_per_block: PerBlock::Each(vec![1, 0, 10, 10]),
                ..sdxl_like()
            },
            UNetConfig {
                addition_embed_type: Some("image".into()),
                ..sdxl_like()
            },
            UNetConfig {
                addition_time_embed_dim: None,
                ..sdxl_like()
            },
            UNetConfig {
                addition_time_embed_dim: Some(0),
                ..sdxl_like()
            },
            UNetConfig {
                projection_class_embeddings_input_dim: Some(6 * 256),
                ..sdxl_like()
            },
        ];
        for config in bad {
            let e = config.validate().expect_err("refused");
            assert!(!e.to_string().is_empty());
        }
        assert_eq!(UNetConfig::sd15().added_conditioning(), None);
    }

    /// SD 2.1's 768-v config upcasts attention, its 512 base and SD 1.5 do not; a config.json
    /// that says so is read, one that does not say keeps the default.
    #[test]
    fn upcast_attention_as_the_configs_say() {
        assert!(UNetConfig::sd2(true).upcast_attention);
        assert!(!UNetConfig::sd2(false).upcast_attention);
        assert!(!UNetConfig::sd15().upcast_attention);
        let read = |json: &str| serde_json::from_str::<UNetConfig>(json).expect("parses");
        assert!(
            read(r#"{"upcast_attention": true, "cross_attention_dim": 1024}"#).upcast_attention
        );
        assert!(!read(r#"{"cross_attention_dim": 1024}"#).upcast_attention);
        // A sidecar's wrong type is refused, not read as a default.
        assert!(serde_json::from_str::<UNetConfig>(r#"{"upcast_attention": "yes"}"#).is_err());
    }
}
