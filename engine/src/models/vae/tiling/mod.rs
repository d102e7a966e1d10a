//! VAE tiling: decoding large latents so that no decoder buffer holds the whole image at full
//! resolution, with the result of an untiled decode (up to float rounding).
//!
//! The layers at latent resolution (`conv_in` and the mid block, whose attention must see every
//! latent) run on the whole latent: they are cheap, at 1/64 of the image's area in SD. The rest of
//! the decoder (the up blocks, `norm_out`, SiLU, `conv_out`) runs over tiles **in lockstep**, one
//! layer over every tile before the next, each tile's activation a tensor of its own:
//!
//! - The tiles' *cores* partition the image. Each tile's activation also holds a *halo* around its
//!   core, as many pixels as the 3x3 convolutions still to come reach beyond it (one per
//!   convolution at its resolution; a ×2 upsampling halves what it needs, rounded up; see
//!   [`block_halos`]). Halos stop at the image border, where the convolutions' zero padding is
//!   what the untiled decode sees too. After a convolution, the outermost ring of each side that
//!   is not on the border saw padding instead of the neighbouring tile; it is cut off, and the
//!   halo left is still what the remaining layers need. So each core pixel is computed from the
//!   values the untiled decode uses.
//! - Each GroupNorm first gathers per-group statistics over the cores only (they partition the
//!   image: these are the statistics of the whole activation), pooled across tiles in f32 with
//!   Chan's formula ([`crate::nn::GroupMoments`]), then normalises every tile, halo included,
//!   with them. Those norms run as burn ops; VAE compilation's fused kernels, which compute their
//!   own statistics, serve only the whole-latent layers here.
//! - In the end each tile holds exactly its core, and the cores are joined.
//!
//! The halo is the full receptive field, nothing is approximated: in SD 1.x, 13 latents at latent
//! resolution, 7 pixels at full resolution. Most of the decoder's work is at full resolution,
//! where halos are thin: with 64-latent tiles the convolutions do 9 % (2x2 tiles) to 19 % (a
//! tile with neighbours on all sides) more work than untiled.
//!
//! What tiling bounds is the largest single buffer, not the total memory: all tiles are alive at
//! once, so a tiled decode needs about the memory of an untiled one plus the halos. Its largest
//! buffers are one tile's activations (SD, 64-latent tiles: 528² pixels × 256 channels in f32,
//! 272 MiB) and the whole-latent layers' (512 channels at latent resolution in f32: 128 MiB for a
//! 2048² image, 1 GiB for a 5792² one), where an untiled 2048² decode has 4 GiB buffers. That is
//! what adapters whose storage bindings stop at 1–4 GiB need (see
//! [`TilingConfig::auto_max_buffer_bytes`]).

use std::ops::Range;

use burn::tensor::Tensor;

use crate::models::blocks::{ResnetBlock2D, Upsample};
use crate::nn::{GroupMoments, GroupNorm, Kernels};
use crate::vae::{AutoencoderKL, VaeConfig};

/// When the decode is tiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TilingMode {
    /// Only when the image is large or a decoder buffer would exceed the limit.
    #[default]
    Auto,
    /// Whenever the latents are larger than one tile.
    Always,
    Never,
}

impl std::str::FromStr for TilingMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(TilingMode::Auto),
            "on" | "always" => Ok(TilingMode::Always),
            "off" | "never" => Ok(TilingMode::Never),
            other => Err(format!(
                "unknown VAE tiling `{other}` (use auto, on or off)"
            )),
        }
    }
}

impl std::fmt::Display for TilingMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TilingMode::Auto => "auto",
            TilingMode::Always => "on",
            TilingMode::Never => "off",
        })
    }
}

/// How to tile. Sizes are in latents (one latent = `VaeConfig::downscale()` pixels per side).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TilingConfig {
    pub mode: TilingMode,
    /// Largest side of a tile's core: 64 latents = 512 pixels in SD, the size the VAE was trained
    /// at. Each tile also computes a halo around its core (see the module docs).
    pub tile_latents: usize,
    /// `Auto` tiles images with more pixels than this: 768², so that SDXL's ~1-megapixel sizes
    /// (1024², 1152×896, …) and 1024² hires passes are tiled. A whole 1024² decode grows the pool
    /// by 2.93 GiB over the weights, a tiled one by 1.48 GiB at 2.1× the time (H200,
    /// BENCHMARKS.md twenty-fifth session): whole, SDXL's 1024² txt2img peaked in its decode at
    /// 8.2 GiB, past the 8 GB cards it is meant to fit, and nothing tells the engine how much
    /// memory a card has.
    pub auto_max_pixels: usize,
    /// `Auto` also tiles when the decoder's largest buffer would be larger than this many bytes.
    /// 1 GiB sits under the 2–4 GiB storage-binding limits of desktop Vulkan/DX12 drivers; a
    /// device with a lower limit lowers it further (see [`TilingConfig::fit_to`]).
    pub auto_max_buffer_bytes: u64,
}

impl Default for TilingConfig {
    fn default() -> Self {
        Self {
            mode: TilingMode::Auto,
            tile_latents: 64,
            auto_max_pixels: 768 * 768,
            auto_max_buffer_bytes: 1 << 30,
        }
    }
}

impl TilingConfig {
    pub fn with_mode(mode: TilingMode) -> Self {
        Self {
            mode,
            ..Self::default()
        }
    }

    /// This setting on a device whose largest tensor is `limit` bytes (see
    /// [`crate::limits::DeviceLimits`]): `Auto` also tiles where a decoder buffer would exceed
    /// the limit, and tiles shrink until one tile's buffers, halo included
    /// ([`tile_buffer_bytes`]), fit. A tile too small to hold even one latent's buffers is left at
    /// one latent.
    pub fn fit_to(self, vae: &VaeConfig, batch: usize, limit: u64) -> Self {
        let fits = |t: usize| tile_buffer_bytes(vae, batch, t) <= limit;
        let mut tile = self.tile_latents.max(1);
        while tile > 1 && !fits(tile) {
            tile -= 1;
        }
        Self {
            tile_latents: tile,
            auto_max_buffer_bytes: self.auto_max_buffer_bytes.min(limit),
            ..self
        }
    }

    /// Whether decoding latents of `dims` (`[b, c, h, w]`) should be tiled.
    pub fn should_tile(&self, vae: &VaeConfig, dims: [usize; 4]) -> bool {
        let [_, _, h, w] = dims;
        let larger_than_a_tile = h > self.tile_latents.max(1) || w > self.tile_latents.max(1);
        match self.mode {
            TilingMode::Never => false,
            TilingMode::Always => larger_than_a_tile,
            TilingMode::Auto => {
                let scale = vae.downscale();
                let pixels = h * scale * w * scale;
                larger_than_a_tile
                    && (pixels > self.auto_max_pixels
                        || largest_decoder_buffer_bytes(vae, dims) > self.auto_max_buffer_bytes)
            }
        }
    }

    /// The tiles' cores for latents of `dims` (`[b, c, h, w]`): row spans and column spans, each
    /// tile one row span × one column span.
    pub fn grid(&self, dims: [usize; 4]) -> (Vec<Range<usize>>, Vec<Range<usize>>) {
        let [_, _, h, w] = dims;
        (
            core_spans(h, self.tile_latents),
            core_spans(w, self.tile_latents),
        )
    }

    /// How many tiles a tiled decode of latents of `dims` runs in.
    pub fn tile_count(&self, dims: [usize; 4]) -> usize {
        let (rows, cols) = self.grid(dims);
        rows.len() * cols.len()
    }
}

/// Bytes of the largest buffer of an untiled decode of latents of `dims`: the largest
/// activation, in f32 (GroupNorm computes in f32). Level `i` of the decoder runs at `1 / 2^i` of the
/// full resolution with `block_out_channels[i]` channels, after the upsampler that fed it made
/// `[i + 1]` of them (in SD 1.5: 256 channels at full resolution). The mid block's attention scores
/// are built in slices that fit the device ([`crate::attention`]), so they never are the largest.
/// A tiled decode's largest buffers are a tile's (core plus halo) and the whole-latent layers'.
pub fn largest_decoder_buffer_bytes(vae: &VaeConfig, dims: [usize; 4]) -> u64 {
    let [b, _, h, w] = dims.map(|d| d as u64);
    let scale = vae.downscale() as u64;
    let c = &vae.block_out_channels;
    (0..c.len())
        .map(|i| {
            let channels = c[i].max(c.get(i + 1).copied().unwrap_or(0)) as u64;
            let (ph, pw) = ((h * scale) >> i, (w * scale) >> i);
            b * channels * ph * pw * 4
        })
        .max()
        .unwrap_or(0)
}

/// Bytes of the largest buffer one tile of a tiled decode holds, for cores of `tile` latents: an
/// interior tile's activation at each level, its core plus the halo on both sides (the halo the
/// level's block needs, or twice what the block before it kept, after its ×2 upsampling), in f32.
pub fn tile_buffer_bytes(vae: &VaeConfig, batch: usize, tile: usize) -> u64 {
    let c = &vae.block_out_channels;
    let n = c.len();
    let halos = block_halos(&decoder_blocks(vae));
    let scale = vae.downscale();
    (0..n)
        .map(|i| {
            let k = n - 1 - i; // the up block working at level i (level 0: full resolution)
            let own = halos.get(k).copied().unwrap_or(1);
            let fed = if k > 0 { 2 * halos[k - 1] } else { 0 };
            let side = ((tile * scale) >> i) + 2 * own.max(fed);
            let channels = c[i].max(c.get(i + 1).copied().unwrap_or(0));
            (batch * channels * side * side * 4) as u64
        })
        .max()
        .unwrap_or(0)
}

/// The cores of one axis of `len` latents: as few spans of at most `tile` latents as cover it,
/// as even as can be (lengths differ by at most one), in order. They partition `0..len`.
pub fn core_spans(len: usize, tile: usize) -> Vec<Range<usize>> {
    let count = len.div_ceil(tile.max(1)).max(1);
    (0..count)
        .map(|k| k * len / count..(k + 1) * len / count)
        .collect()
}

/// One up block of the decoder, as far as halos are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockConvs {
    /// 3x3 convolutions at the block's resolution (two per resnet).
    pub convs: usize,
    /// Whether the block ends with an upsampler: ×2 nearest, then a 3x3 convolution at the new
    /// resolution.
    pub upsample: bool,
}

/// The up blocks of a decoder with `vae`'s config (diffusers' `Decoder`: `layers_per_block + 1`
/// resnets per block, an upsampler after every block but the last).
pub fn decoder_blocks(vae: &VaeConfig) -> Vec<BlockConvs> {
    let n = vae.block_out_channels.len();
    (0..n)
        .map(|i| BlockConvs {
            convs: 2 * (vae.layers_per_block + 1),
            upsample: i + 1 < n,
        })
        .collect()
}

/// The halo each up block's input needs, in pixels at that block's resolution, for `blocks`
/// followed by `conv_out` (one 3x3 convolution). Walking back from the output: a 3x3 convolution
/// needs one more pixel around what it produces; a ×2 nearest upsampling needs half of what its
/// output needs, rounded up (output pixel `p` reads input pixel `p / 2`).
pub fn block_halos(blocks: &[BlockConvs]) -> Vec<usize> {
    let mut need: usize = 1; // conv_out
    let mut halos = vec![0; blocks.len()];
    for (halo, block) in halos.iter_mut().zip(blocks).rev() {
        if block.upsample {
            need = (need + 1).div_ceil(2); // its convolution, then the ×2
        }
        need += block.convs;
        *halo = need;
    }
    halos
}

/// The halo, in latents, a tile of `vae`'s decoder needs after the mid block: 13 in SD 1.x.
pub fn halo_latents(vae: &VaeConfig) -> usize {
    block_halos(&decoder_blocks(vae))
        .first()
        .copied()
        .unwrap_or(1)
}

/// Decodes `latents` as [`AutoencoderKL::decode_with`] does, with the layers after the mid block
/// run in tiles of at most `config.tile_latents` latents (see the module docs). `kernels` runs the
/// whole-latent layers' GroupNorms (e.g. [`crate::vae_compile::VaeCompiler::kernels`]); the
/// tiles' GroupNorms share statistics and run as burn ops.
///
/// # Shapes
/// `[b, c, h, w] -> [b, out_channels, h·scale, w·scale]`
pub fn tiled_decode(
    vae: &AutoencoderKL,
    latents: Tensor<4>,
    config: &TilingConfig,
    kernels: Kernels,
) -> Tensor<4> {
    let dims = latents.dims();
    if dims.contains(&0) {
        return vae.decode_with(latents, kernels); // nothing to cut
    }
    let (rows, cols) = config.grid(dims);
    let tail = vae.decoder_tail();
    let blocks: Vec<BlockConvs> = tail
        .blocks
        .iter()
        .map(|(resnets, up)| BlockConvs {
            convs: 2 * resnets.len(),
            upsample: up.is_some(),
        })
        .collect();
    let halos = block_halos(&blocks);
    let x = vae.decode_head(latents, kernels);
    let mut tiles = Tiles::cut(x, &rows, &cols, halos.first().copied().unwrap_or(1));
    for ((resnets, upsampler), halo) in tail.blocks.iter().zip(halos) {
        tiles.crop(halo); // what the last block's upsampling left beyond the need
        for resnet in resnets.iter() {
            tiles.resnet(resnet);
        }
        if let Some(up) = upsampler {
            tiles.upsample(up);
        }
    }
    tiles.crop(1);
    tiles.group_norm(tail.norm_out, true);
    tiles.conv3x3(|x| tail.conv_out.forward(x));
    tiles.join(cols.len())
}

/// Rows × columns of the image, at the resolution of the activation in question.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rect {
    rows: Range<usize>,
    cols: Range<usize>,
}

impl Rect {
    /// Grown by `by` on every side, clipped to an image of `size` (rows, columns).
    fn grown(&self, by: usize, size: [usize; 2]) -> Rect {
        let grow = |r: &Range<usize>, len: usize| r.start.saturating_sub(by)..(r.end + by).min(len);
        Rect {
            rows: grow(&self.rows, size[0]),
            cols: grow(&self.cols, size[1]),
        }
    }

    /// What stays valid after a 3x3 convolution with zero padding: one less on every side that is
    /// not on the border of an image of `size` (there the padding is the image's own).
    fn after_conv3x3(&self, size: [usize; 2]) -> Rect {
        let shrink = |r: &Range<usize>, len: usize| {
            let start = r.start + usize::from(r.start > 0);
            let end = r.end.saturating_sub(usize::from(r.end < len));
            start..end.max(start)
        };
        Rect {
            rows: shrink(&self.rows, size[0]),
            cols: shrink(&self.cols, size[1]),
        }
    }

    fn scaled(&self, k: usize) -> Rect {
        Rect {
            rows: self.rows.start * k..self.rows.end * k,
            cols: self.cols.start * k..self.cols.end * k,
        }
    }

    fn contains(&self, other: &Rect) -> bool {
        let within = |o: &Range<usize>, r: &Range<usize>| r.start <= o.start && o.end <= r.end;
        within(&other.rows, &self.rows) && within(&other.cols, &self.cols)
    }

    /// Where `inner` (which `self` contains) lies within `self`, as tensor index ranges.
    fn locate(&self, inner: &Rect) -> [Range<usize>; 2] {
        [
            inner.rows.start - self.rows.start..inner.rows.end - self.rows.start,
            inner.cols.start - self.cols.start..inner.cols.end - self.cols.start,
        ]
    }
}

/// One tile's activation `[b, c, held rows, held columns]`: its core plus a halo.
struct Tile {
    x: Tensor<4>,
    held: Rect,
    core: Rect,
}

/// `x`, which holds `held`, cut down to `region`.
fn crop(x: Tensor<4>, held: &Rect, region: &Rect) -> Tensor<4> {
    debug_assert!(held.contains(region), "{region:?} is not within {held:?}");
    if held == region {
        return x;
    }
    let [b, c, _, _] = x.dims();
    let [rows, cols] = held.locate(region);
    x.slice([0..b, 0..c, rows, cols])
}

/// Every tile of one activation, in row-major order, and the size (rows, columns) of the whole
/// image at the activation's resolution.
struct Tiles {
    tiles: Vec<Tile>,
    size: [usize; 2],
}

impl Tiles {
    /// Cuts `whole` into tiles whose cores are `rows` × `cols`, each with `halo` around its core.
    fn cut(whole: Tensor<4>, rows: &[Range<usize>], cols: &[Range<usize>], halo: usize) -> Self {
        let [_, _, h, w] = whole.dims();
        let size = [h, w];
        let everything = Rect {
            rows: 0..h,
            cols: 0..w,
        };
        let tiles = rows
            .iter()
            .flat_map(|r| cols.iter().map(move |c| (r.clone(), c.clone())))
            .map(|(rows, cols)| {
                let core = Rect { rows, cols };
                let held = core.grown(halo, size);
                Tile {
                    x: crop(whole.clone(), &everything, &held),
                    held,
                    core,
                }
            })
            .collect();
        Self { tiles, size }
    }

    /// Cuts every tile down to its core plus `halo` (a tile never holds less than that).
    fn crop(&mut self, halo: usize) {
        for tile in &mut self.tiles {
            let want = tile.core.grown(halo, self.size);
            tile.x = crop(tile.x.clone(), &tile.held, &want);
            tile.held = want;
        }
    }

    /// Applies a 3x3 convolution (padding 1) to every tile and drops the ring it got wrong.
    fn conv3x3(&mut self, conv: impl Fn(Tensor<4>) -> Tensor<4>) {
        for tile in &mut self.tiles {
            let valid = tile.held.after_conv3x3(self.size);
            debug_assert!(valid.contains(&tile.core), "halo used up: {valid:?}");
            tile.x = crop(conv(tile.x.clone()), &tile.held, &valid);
            tile.held = valid;
        }
    }

    /// ×2 nearest, then the upsampler's 3x3 convolution. Nearest upsampling of a crop is the crop
    /// of the upsampled image, so only the convolution costs halo.
    fn upsample(&mut self, up: &Upsample) {
        let size = self.size.map(|s| 2 * s);
        for tile in &mut self.tiles {
            let held = tile.held.scaled(2);
            let valid = held.after_conv3x3(size);
            let x = up.conv().forward_upsampled(tile.x.clone());
            tile.x = crop(x, &held, &valid);
            tile.held = valid;
            tile.core = tile.core.scaled(2);
        }
        self.size = size;
    }

    /// GroupNorm (then SiLU when `silu`) of every tile with the statistics of the whole activation:
    /// the pooled statistics of the cores, which partition it.
    fn group_norm(&mut self, norm: &GroupNorm, silu: bool) {
        let parts = self
            .tiles
            .iter()
            .map(|t| norm.moments(crop(t.x.clone(), &t.held, &t.core)))
            .collect();
        let Some(moments) = GroupMoments::pool(parts) else {
            return; // no tiles, or empty ones: nothing to normalise
        };
        for tile in &mut self.tiles {
            tile.x = norm.forward_with_moments(tile.x.clone(), &moments, silu);
        }
    }

    /// `ResnetBlock2D` without a time embedding, as its `forward_with`, layer by layer over all
    /// tiles; the shortcut is cropped to what the convolutions left.
    fn resnet(&mut self, resnet: &ResnetBlock2D) {
        let layers = resnet.layers();
        debug_assert!(
            layers.time_emb_proj.is_none(),
            "the VAE has no time embedding"
        );
        let inputs: Vec<(Tensor<4>, Rect)> = self
            .tiles
            .iter()
            .map(|t| (t.x.clone(), t.held.clone()))
            .collect();
        self.group_norm(layers.norm1, true);
        self.conv3x3(|x| layers.conv1.forward(x));
        self.group_norm(layers.norm2, true);
        self.conv3x3(|x| layers.conv2.forward(x));
        for (tile, (x, held)) in self.tiles.iter_mut().zip(inputs) {
            let x = crop(x, &held, &tile.held);
            let shortcut = match layers.conv_shortcut {
                Some(conv) => conv.forward(x), // 1x1: per pixel, so cropping first is exact
                None => x,
            };
            tile.x = shortcut + tile.x.clone();
        }
    }

    /// Joins the tiles, each cropped to exactly its core by now, into one image.
    fn join(self, columns: usize) -> Tensor<4> {
        let mut rows = Vec::new();
        let mut row = Vec::with_capacity(columns);
        for tile in self.tiles {
            row.push(crop(tile.x, &tile.held, &tile.core));
            if row.len() == columns.max(1) {
                rows.push(Tensor::cat(std::mem::take(&mut row), 3));
            }
        }
        Tensor::cat(rows, 2)
    }
}

#[cfg(test)]
mod tests;
