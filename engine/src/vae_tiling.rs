//! VAE tiling: decoding large latents in overlapping tiles so no decoder buffer grows with the
//! whole image (the mid block's attention alone is `(h·w)²` floats). The idea is diffusers'
//! `AutoencoderKL.tiled_decode`: tiles overlap and the seams are cross-faded linearly. Here the
//! tiles of each axis are spread evenly over the image, and every pixel's blend weights sum to
//! exactly one, so an image of flat colour stays flat across seams.
//!
//! The result differs a little from an untiled decode: the decoder's attention sees one tile, not
//! the whole image, and convolutions near a tile's edge see padding instead of neighbours. The
//! overlap hides both (tests/vae_tiling.rs: within 2/255 on the tiny model).

use std::ops::Range;

use burn::tensor::{DType, Tensor, TensorData};

use crate::vae::VaeConfig;

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
    /// Side of a tile: 64 latents = 512 pixels in SD, the size the VAE was trained at.
    pub tile_latents: usize,
    /// Latents neighbouring tiles share, cross-faded (diffusers' default overlap is 25 %).
    pub overlap_latents: usize,
    /// `Auto` tiles images with more pixels than this.
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
            overlap_latents: 16,
            auto_max_pixels: 1024 * 1024,
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
    /// the limit, and tiles shrink (keeping their share of overlap) until one tile's buffers fit.
    /// A tile too small to hold even one latent's buffers is left at one latent.
    pub fn fit_to(self, vae: &VaeConfig, batch: usize, limit: u64) -> Self {
        let fits = |t: usize| largest_decoder_buffer_bytes(vae, [batch, 4, t, t]) <= limit;
        let mut tile = self.tile_latents.max(1);
        while tile > 1 && !fits(tile) {
            tile -= 1;
        }
        let overlap = if tile < self.tile_latents {
            self.overlap_latents * tile / self.tile_latents.max(1)
        } else {
            self.overlap_latents
        };
        Self {
            tile_latents: tile,
            overlap_latents: overlap,
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
}

/// Bytes of the decoder's largest buffer for latents of `dims`: the largest activation, in f32
/// (GroupNorm computes in f32). Level `i` of the decoder runs at `1 / 2^i` of the full resolution
/// with `block_out_channels[i]` channels, after the upsampler that fed it made `[i + 1]` of them
/// (in SD 1.5: 256 channels at full resolution). The mid block's attention scores are built in
/// slices that fit the device ([`crate::attention`]), so they never are the largest.
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

/// Tiles of one axis of `len` latents: each `tile` long (or the whole axis when it is shorter),
/// spread evenly from 0 to `len` so that neighbours share at least `overlap` latents. Together
/// they cover `0..len`.
pub fn tile_spans(len: usize, tile: usize, overlap: usize) -> Vec<Range<usize>> {
    let tile = tile.max(1);
    if len <= tile {
        return vec![0..len];
    }
    // At least one latent of progress per tile, whatever the overlap asked.
    let step = tile - overlap.min(tile - 1);
    let travel = len - tile;
    let gaps = travel.div_ceil(step); // tiles - 1
    // Evenly spread starts: consecutive starts differ by at most ceil(travel / gaps) ≤ step.
    (0..=gaps)
        .map(|k| {
            let start = k * travel / gaps;
            start..start + tile
        })
        .collect()
}

/// Blend weights along one axis, in pixels: for each span (in latents, times `scale`), the weight
/// of each of its pixels. Inside an overlap a tile's weight ramps linearly towards the tile's
/// edge; the weights of all tiles at any pixel sum to one.
pub fn blend_weights(spans: &[Range<usize>], scale: usize) -> Vec<Vec<f32>> {
    let px = |r: &Range<usize>| r.start * scale..r.end * scale;
    let ramps: Vec<Vec<f32>> = spans
        .iter()
        .enumerate()
        .map(|(k, span)| {
            let span = px(span);
            // Overlaps with the previous and next tile, in pixels.
            let before = (k > 0).then(|| span.start..px(&spans[k - 1]).end.min(span.end));
            let after = spans
                .get(k + 1)
                .map(|next| px(next).start.max(span.start)..span.end);
            span.map(|p| {
                let centre = p as f32 + 0.5;
                let up = before.as_ref().map_or(1.0, |r| {
                    ((centre - r.start as f32) / r.len().max(1) as f32).min(1.0)
                });
                let down = after.as_ref().map_or(1.0, |r| {
                    ((r.end as f32 - centre) / r.len().max(1) as f32).min(1.0)
                });
                up.min(down).max(0.0)
            })
            .collect()
        })
        .collect();
    // Normalise so every pixel's weights sum to one (three tiles can meet where spans crowd).
    let len = spans.last().map_or(0, |s| s.end * scale);
    let mut sum = vec![0.0f32; len];
    for (span, ramp) in spans.iter().zip(&ramps) {
        for (p, w) in px(span).zip(ramp) {
            sum[p] += w;
        }
    }
    spans
        .iter()
        .zip(ramps)
        .map(|(span, ramp)| {
            px(span)
                .zip(ramp)
                .map(|(p, w)| if sum[p] > 0.0 { w / sum[p] } else { 0.0 })
                .collect()
        })
        .collect()
}

/// Decodes `latents` tile by tile with `decode_tile` (which maps `[b, c, th, tw]` latents to
/// `[b, out, th·scale, tw·scale]` pixels, e.g. through the VAE compiler) and blends the tiles into
/// one f32 image.
///
/// # Shapes
/// `[b, c, h, w] -> [b, out_channels, h·scale, w·scale]`
pub fn tiled_decode(
    latents: Tensor<4>,
    vae: &VaeConfig,
    config: &TilingConfig,
    decode_tile: &mut dyn FnMut(Tensor<4>) -> Tensor<4>,
) -> Tensor<4> {
    let [b, c, h, w] = latents.dims();
    let scale = vae.downscale();
    let device = latents.device();
    let rows = tile_spans(h, config.tile_latents, config.overlap_latents);
    let cols = tile_spans(w, config.tile_latents, config.overlap_latents);
    let row_weights = blend_weights(&rows, scale);
    let col_weights = blend_weights(&cols, scale);
    let mut out = Tensor::<4>::zeros(
        [b, vae.out_channels, h * scale, w * scale],
        (&device, DType::F32),
    );
    for (r, wr) in rows.iter().zip(&row_weights) {
        let wy = Tensor::<4>::from_data(
            TensorData::new(wr.clone(), [1, 1, wr.len(), 1]),
            (&device, DType::F32),
        );
        for (col, wc) in cols.iter().zip(&col_weights) {
            let wx = Tensor::<4>::from_data(
                TensorData::new(wc.clone(), [1, 1, 1, wc.len()]),
                (&device, DType::F32),
            );
            let tile = latents.clone().slice([0..b, 0..c, r.clone(), col.clone()]);
            let pixels = decode_tile(tile).cast(DType::F32); // [b, out, th·s, tw·s]
            let region = [
                0..b,
                0..vae.out_channels,
                r.start * scale..r.end * scale,
                col.start * scale..col.end * scale,
            ];
            let blended = out.clone().slice(region.clone()) + pixels * wy.clone() * wx;
            out = out.slice_assign(region, blended);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every latent of every axis length is covered, tiles have the asked size (or the whole axis),
    /// stay in bounds, neighbours overlap by at least the asked overlap, and the blend weights of
    /// every pixel sum to one, for many lengths: multiples of the step and not, shorter than a tile.
    #[test]
    fn tiles_cover_every_pixel_exactly_once_in_weight() {
        for tile in [1, 2, 3, 4, 7, 8, 16, 64] {
            for overlap in [0, 1, 2, 3, 4, 16, 100] {
                for len in 1..=3 * tile + 17 {
                    let spans = tile_spans(len, tile, overlap);
                    let what = format!("len {len}, tile {tile}, overlap {overlap}");
                    assert_eq!(spans[0].start, 0, "{what}");
                    assert_eq!(spans.last().map(|s| s.end), Some(len), "{what}");
                    for s in &spans {
                        assert_eq!(s.len(), tile.min(len), "{what}: {s:?}");
                        assert!(s.end <= len, "{what}");
                    }
                    let want_overlap = overlap.min(tile - 1).min(len);
                    for pair in spans.windows(2) {
                        assert!(pair[1].start > pair[0].start, "{what}: {spans:?}");
                        let shared = pair[0].end.saturating_sub(pair[1].start);
                        assert!(shared >= want_overlap, "{what}: {spans:?}");
                    }
                    for scale in [1, 8] {
                        let weights = blend_weights(&spans, scale);
                        let mut sum = vec![0.0f64; len * scale];
                        let mut hits = vec![0usize; len * scale];
                        for (span, ws) in spans.iter().zip(&weights) {
                            assert_eq!(ws.len(), span.len() * scale, "{what}");
                            for (p, w) in (span.start * scale..span.end * scale).zip(ws) {
                                assert!(w.is_finite() && *w >= 0.0, "{what}");
                                sum[p] += *w as f64;
                                hits[p] += 1;
                            }
                        }
                        for p in 0..len * scale {
                            assert!(hits[p] >= 1, "{what}: pixel {p} not covered");
                            assert!(
                                (sum[p] - 1.0).abs() < 1e-5,
                                "{what}, scale {scale}: pixel {p} weighs {}",
                                sum[p]
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_short_axis_is_one_tile() {
        assert_eq!(tile_spans(5, 8, 2), vec![0..5]);
        assert_eq!(tile_spans(8, 8, 2), vec![0..8]);
        assert_eq!(tile_spans(0, 8, 2), vec![0..0]);
        // 20 latents, tiles of 8 with step 6: three tiles spread evenly.
        assert_eq!(tile_spans(20, 8, 2), vec![0..8, 6..14, 12..20]);
    }

    /// SD 1.5's largest decoder buffer is 256 channels at full resolution (256 MiB at 512²), so
    /// under WebGPU's 128 MiB a 512² decode tiles, in tiles of 45 latents; without a limit the
    /// setting is unchanged.
    #[test]
    fn tiles_shrink_to_fit_the_device() {
        let vae = VaeConfig::sd15();
        assert_eq!(
            largest_decoder_buffer_bytes(&vae, [1, 4, 64, 64]),
            256 << 20
        );
        let fitted = TilingConfig::default().fit_to(&vae, 1, 128 << 20);
        assert_eq!((fitted.tile_latents, fitted.overlap_latents), (45, 11));
        assert_eq!(fitted.auto_max_buffer_bytes, 128 << 20);
        assert!(largest_decoder_buffer_bytes(&vae, [1, 4, 45, 45]) <= 128 << 20);
        assert!(fitted.should_tile(&vae, [1, 4, 64, 64]));
        let host = TilingConfig::default().fit_to(&vae, 1, u64::MAX);
        assert_eq!(host, TilingConfig::default());
    }

    #[test]
    fn modes_parse_and_decide() {
        assert_eq!("auto".parse(), Ok(TilingMode::Auto));
        assert_eq!("on".parse(), Ok(TilingMode::Always));
        assert_eq!("off".parse(), Ok(TilingMode::Never));
        assert!("maybe".parse::<TilingMode>().is_err());
        let vae = VaeConfig::sd15();
        let auto = TilingConfig::default();
        // 512x512 and 1024x1024 decode whole; 1024x1536 is tiled.
        assert!(!auto.should_tile(&vae, [1, 4, 64, 64]));
        assert!(!auto.should_tile(&vae, [1, 4, 128, 128]));
        assert!(auto.should_tile(&vae, [1, 4, 192, 128]));
        // A small buffer limit tiles 768x768 too (its full-resolution activations are 576 MiB).
        let small = TilingConfig {
            auto_max_buffer_bytes: 128 << 20,
            ..auto
        };
        assert!(small.should_tile(&vae, [1, 4, 96, 96]));
        let always = TilingConfig::with_mode(TilingMode::Always);
        assert!(always.should_tile(&vae, [1, 4, 65, 8]));
        assert!(
            !always.should_tile(&vae, [1, 4, 64, 64]),
            "one tile is no tiling"
        );
        let never = TilingConfig::with_mode(TilingMode::Never);
        assert!(!never.should_tile(&vae, [1, 4, 1024, 1024]));
    }
}
