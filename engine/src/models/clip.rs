//! CLIP text encoder (transformers' `CLIPTextModel`), the prompt encoder of SD 1.x and 2.x, and
//! `CLIPTextModelWithProjection` (SDXL's second encoder, whose projected end-token state is the
//! pooled conditioning).

use burn::tensor::{DType, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::nn::{Embedding, LayerNorm, Linear, gelu, multi_head_attention, quick_gelu};
use crate::weights::Weights;

/// Mirrors the fields of transformers' `CLIPTextConfig` that SD uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClipConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub max_position_embeddings: usize,
    pub hidden_act: Activation,
    pub layer_norm_eps: f64,
    /// The id that follows the end token to the 77th position: SD 1.x repeats the end token,
    /// SD 2.x pads with 0 (`!`), as its tokenizer, A1111 and ComfyUI do. Set from the model's
    /// family, never read from a config (SD 2.1's `pad_token_id` is a placeholder).
    #[serde(skip)]
    pub pad_token: u32,
    /// Width of the projection of the end token's state (`text_projection`), read where the
    /// encoder has one ([`Self::with_projection`]).
    pub projection_dim: Option<usize>,
    /// Whether the weights include `text_projection` (`CLIPTextModelWithProjection`: SDXL's
    /// OpenCLIP ViT-bigG). Set from the model's family: every CLIP config names a
    /// `projection_dim`, whether or not the encoder was saved with its projection.
    #[serde(skip)]
    pub with_projection: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    QuickGelu,
    Gelu,
}

impl Default for ClipConfig {
    fn default() -> Self {
        Self::sd15()
    }
}

impl ClipConfig {
    /// OpenAI CLIP ViT-L/14 text tower.
    /// diffusers: stable-diffusion-v1-5/text_encoder/config.json
    pub fn sd15() -> Self {
        Self {
            vocab_size: 49408,
            hidden_size: 768,
            intermediate_size: 3072,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            max_position_embeddings: 77,
            hidden_act: Activation::QuickGelu,
            layer_norm_eps: 1e-5,
            pad_token: crate::tokenizer::EOS,
            projection_dim: None,
            with_projection: false,
        }
    }

    /// OpenCLIP ViT-bigG/14's text tower, SDXL's second encoder: its penultimate layer's output
    /// and its projected end-token state (the pooled conditioning), GELU, padding with id 0.
    /// diffusers: stable-diffusion-xl-base-1.0/text_encoder_2/config.json
    pub fn sdxl_g() -> Self {
        Self {
            hidden_size: 1280,
            intermediate_size: 5120,
            num_hidden_layers: 32,
            num_attention_heads: 20,
            hidden_act: Activation::Gelu,
            pad_token: 0,
            projection_dim: Some(1280),
            with_projection: true,
            ..Self::sd15()
        }
    }

    /// OpenCLIP ViT-H/14's text tower as SD 2.x uses it: its last layer dropped (the
    /// penultimate layer's output), GELU, padding with id 0.
    /// diffusers: stable-diffusion-2-1/text_encoder/config.json
    pub fn sd2() -> Self {
        Self {
            hidden_size: 1024,
            intermediate_size: 4096,
            num_hidden_layers: 23,
            num_attention_heads: 16,
            hidden_act: Activation::Gelu,
            pad_token: 0,
            ..Self::sd15()
        }
    }

    /// Every field a layer is sized from, within [`crate::bounds`] (see
    /// [`crate::unet::UNetConfig::validate`]).
    pub fn validate(&self) -> crate::Result<()> {
        use crate::bounds::{self, MAX_GROUPS, MAX_LAYERS, MAX_WIDTH};
        bounds::count("text encoder vocab_size", self.vocab_size, 1 << 20)?;
        bounds::count("text encoder hidden_size", self.hidden_size, MAX_WIDTH)?;
        bounds::count(
            "text encoder intermediate_size",
            self.intermediate_size,
            4 * MAX_WIDTH,
        )?;
        bounds::count(
            "text encoder num_hidden_layers",
            self.num_hidden_layers,
            MAX_LAYERS,
        )?;
        bounds::count(
            "text encoder num_attention_heads",
            self.num_attention_heads,
            MAX_GROUPS,
        )?;
        bounds::count(
            "text encoder max_position_embeddings",
            self.max_position_embeddings,
            4096,
        )?;
        bounds::positive("text encoder layer_norm_eps", self.layer_norm_eps, 1.0)?;
        if self.with_projection {
            let dim = self.projection_dim.unwrap_or(0);
            bounds::count("text encoder projection_dim", dim, MAX_WIDTH)?;
        }
        bounds::divides(
            "text encoder hidden_size",
            self.hidden_size,
            self.num_attention_heads,
            "heads",
        )
    }
}

#[derive(Debug, Clone)]
struct EncoderLayer {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    out_proj: Linear,
    layer_norm1: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    layer_norm2: LayerNorm,
    heads: usize,
    act: Activation,
}

impl EncoderLayer {
    fn load(w: &Weights, c: &ClipConfig) -> Result<Self> {
        let d = c.hidden_size;
        let attn = w.pp("self_attn");
        Ok(Self {
            q_proj: Linear::load(&attn.pp("q_proj"), d, d, true)?,
            k_proj: Linear::load(&attn.pp("k_proj"), d, d, true)?,
            v_proj: Linear::load(&attn.pp("v_proj"), d, d, true)?,
            out_proj: Linear::load(&attn.pp("out_proj"), d, d, true)?,
            layer_norm1: LayerNorm::load(&w.pp("layer_norm1"), d, c.layer_norm_eps)?,
            fc1: Linear::load(&w.pp("mlp.fc1"), d, c.intermediate_size, true)?,
            fc2: Linear::load(&w.pp("mlp.fc2"), c.intermediate_size, d, true)?,
            layer_norm2: LayerNorm::load(&w.pp("layer_norm2"), d, c.layer_norm_eps)?,
            heads: c.num_attention_heads,
            act: c.hidden_act,
        })
    }

    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let h = self.layer_norm1.forward(x.clone());
        let (q, k, v) = (
            self.q_proj.forward(h.clone()),
            self.k_proj.forward(h.clone()),
            self.v_proj.forward(h),
        );
        // CLIP's text tower is causal: each token sees only the tokens before it.
        let x = x + self
            .out_proj
            .forward(multi_head_attention(q, k, v, self.heads, true));
        let h = self.fc1.forward(self.layer_norm2.forward(x.clone()));
        let h = match self.act {
            Activation::QuickGelu => quick_gelu(h),
            Activation::Gelu => gelu(h),
        };
        x + self.fc2.forward(h)
    }
}

/// `CLIPTextModel`; weights under `text_model.*`.
#[derive(Debug, Clone)]
pub struct ClipTextModel {
    token_embedding: Embedding,
    position_embedding: Embedding,
    layers: Vec<EncoderLayer>,
    final_layer_norm: LayerNorm,
    /// `text_projection` (`[hidden] -> [projection_dim]`, no bias), where the encoder has one.
    projection: Option<Linear>,
    config: ClipConfig,
}

/// What SDXL takes from one text encoder ([`ClipTextModel::encode_sdxl`]).
#[derive(Debug, Clone)]
pub struct SdxlEncoding {
    /// The penultimate layer's output without the final layer norm, `[b, n, hidden]`.
    pub hidden: Tensor<3>,
    /// The projected end-token state after the final layer norm, `[b, projection_dim]`, where
    /// the encoder has a projection.
    pub pooled: Option<Tensor<2>>,
}

impl ClipTextModel {
    pub fn load(w: &Weights, config: &ClipConfig) -> Result<Self> {
        config.validate()?;
        let projection = match (config.with_projection, config.projection_dim) {
            // transformers' `[proj, hidden]` weight, or OpenCLIP's `[hidden, proj]` matrix as
            // single files store it (the same values transposed; the name tells which).
            (true, Some(dim)) if w.contains("text_projection.weight") => Some(Linear::load(
                &w.pp("text_projection"),
                config.hidden_size,
                dim,
                false,
            )?),
            (true, Some(dim)) => Some(Linear::from_tensors(
                w.tensor("text_projection", [config.hidden_size, dim])?,
                None,
            )),
            _ => None,
        };
        let w = w.pp("text_model");
        let emb = w.pp("embeddings");
        let layers = (0..config.num_hidden_layers)
            .map(|i| EncoderLayer::load(&w.pp(format!("encoder.layers.{i}")), config))
            .collect::<Result<_>>()?;
        Ok(Self {
            token_embedding: Embedding::load(
                &emb.pp("token_embedding"),
                config.vocab_size,
                config.hidden_size,
            )?,
            position_embedding: Embedding::load(
                &emb.pp("position_embedding"),
                config.max_position_embeddings,
                config.hidden_size,
            )?,
            layers,
            final_layer_norm: LayerNorm::load(
                &w.pp("final_layer_norm"),
                config.hidden_size,
                config.layer_norm_eps,
            )?,
            projection,
            config: config.clone(),
        })
    }

    pub fn config(&self) -> &ClipConfig {
        &self.config
    }

    /// How many tensors hold the token embedding (more than one where the whole table is larger
    /// than the device allows in one buffer).
    pub fn token_embedding_chunks(&self) -> usize {
        self.token_embedding.chunks()
    }

    /// Encodes token ids. `clip_skip` follows A1111: 1 = last layer, 2 = penultimate, … The final
    /// layer norm is applied in every case, as A1111, ComfyUI and diffusers' `clip_skip` do.
    ///
    /// # Shapes
    /// ids `[b, n]` -> `[b, n, hidden]`
    pub fn forward(&self, ids: &[Vec<u32>], clip_skip: usize) -> Result<Tensor<3>> {
        self.forward_with(ids, clip_skip, &[])
    }

    /// [`Self::forward`] with textual-inversion vectors in place of some token embeddings:
    /// `fixes[row]` lists `(position, embedding)`, its vectors written from that position on
    /// (cut at the row's end), before the position embeddings are added (A1111's
    /// `EmbeddingsWithFixes`).
    pub fn forward_with(
        &self,
        ids: &[Vec<u32>],
        clip_skip: usize,
        fixes: &[Vec<(usize, &crate::prompt::Embedding)>],
    ) -> Result<Tensor<3>> {
        let layers = self.layers.len();
        let skip = clip_skip.max(1);
        if skip > layers {
            return Err(Error::InvalidInput(format!(
                "clip skip {skip} exceeds the {layers} text encoder layers"
            )));
        }
        let mut x = self.embed(ids, fixes)?;
        for layer in &self.layers[..layers + 1 - skip] {
            x = layer.forward(x);
        }
        Ok(self.final_layer_norm.forward(x))
    }

    /// SDXL's use of an encoder, as diffusers' `encode_prompt` and ComfyUI make it: the output of
    /// the layer `1 + extra_skip` before the last, without the final layer norm (`hidden_states[-2]`
    /// for `extra_skip` 0, diffusers' `clip_skip` = `extra_skip`), and, where the encoder has a
    /// projection, the last layer's state at each row's end token (its largest id, as
    /// transformers picks it), layer-normed and projected.
    ///
    /// # Shapes
    /// ids `[b, n]` -> hidden `[b, n, hidden]`, pooled `[b, projection_dim]`
    pub fn encode_sdxl(
        &self,
        ids: &[Vec<u32>],
        extra_skip: usize,
        fixes: &[Vec<(usize, &crate::prompt::Embedding)>],
    ) -> Result<SdxlEncoding> {
        let layers = self.layers.len();
        if extra_skip + 2 > layers {
            return Err(Error::InvalidInput(format!(
                "clip skip {} exceeds the {layers} text encoder layers",
                extra_skip + 2
            )));
        }
        let mut x = self.embed(ids, fixes)?;
        let used = layers - 1 - extra_skip;
        for layer in &self.layers[..used] {
            x = layer.forward(x);
        }
        let hidden = x.clone();
        let pooled = match &self.projection {
            None => None,
            Some(projection) => {
                for layer in &self.layers[used..] {
                    x = layer.forward(x);
                }
                let last = self.final_layer_norm.forward(x);
                let [b, _, d] = last.dims();
                let rows: Vec<Tensor<2>> = ids
                    .iter()
                    .enumerate()
                    .map(|(r, row)| {
                        // The first position of the row's largest id (the end token).
                        let at = row
                            .iter()
                            .enumerate()
                            .fold(
                                (0, 0),
                                |best, (i, &id)| if id > best.1 { (i, id) } else { best },
                            )
                            .0;
                        last.clone()
                            .slice([r..r + 1, at..at + 1, 0..d])
                            .reshape([1, d])
                    })
                    .collect();
                Some(projection.forward(Tensor::cat(rows, 0).reshape([b, d])))
            }
        };
        Ok(SdxlEncoding { hidden, pooled })
    }

    /// The token embeddings (with `fixes`) plus the position embeddings, after checking `ids`.
    fn embed(
        &self,
        ids: &[Vec<u32>],
        fixes: &[Vec<(usize, &crate::prompt::Embedding)>],
    ) -> Result<Tensor<3>> {
        let b = ids.len();
        let n = ids.first().map_or(0, Vec::len);
        if b == 0
            || n == 0
            || n > self.config.max_position_embeddings
            || ids.iter().any(|r| r.len() != n)
        {
            return Err(Error::InvalidInput(format!(
                "token ids must be {b} rows of equal length 1..={}",
                self.config.max_position_embeddings
            )));
        }
        if let Some(&bad) = ids
            .iter()
            .flatten()
            .find(|&&id| id as usize >= self.config.vocab_size)
        {
            return Err(Error::InvalidInput(format!(
                "token id {bad} is outside the vocabulary"
            )));
        }
        let flat: Vec<usize> = ids.iter().flatten().map(|&id| id as usize).collect();
        let positions: Vec<usize> = (0..n).collect();
        let mut tokens = self.token_embedding.forward(&flat, b, n)?; // [b, n, d]
        let d = self.config.hidden_size;
        for (row, list) in fixes.iter().enumerate().take(b) {
            for &(at, embedding) in list {
                let len = embedding.vectors.min(n.saturating_sub(at));
                if len == 0 || embedding.width != d {
                    continue;
                }
                let values = Tensor::<3>::from_data(
                    TensorData::new(embedding.data[..len * d].to_vec(), [1, len, d]),
                    (&tokens.device(), DType::F32),
                )
                .cast(tokens.dtype());
                tokens = tokens.slice_assign([row..row + 1, at..at + len, 0..d], values);
            }
        }
        Ok(tokens + self.position_embedding.forward(&positions, 1, n)?) // [b, n, d]
    }
}
