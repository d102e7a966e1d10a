//! GroupNorm(+SiLU) over a map laid out channels-last (`[b, h, w, c]` in memory, `[b, c, h, w]`
//! as a tensor): what our channels-last convolutions and burn's write and read without a copy.
//! Normalising in place of the layout saves a relayout on each side of every convolution (the
//! VAE's decode spent a fifth of its time on them, BENCHMARKS.md). Three launches: per-channel
//! statistics of pixel chunks (lanes over channels, so reads are coalesced; vectors of four
//! channels where they come so), their pooling per (batch, group) into a scale and shift per
//! channel, and one elementwise pass (on vectors likewise).
//! Statistics are f32, pooled by Chan's formula as in the channels-first kernels.

use burn::backend::wgpu::CubeTensor;
use burn::cubecl;
use burn::cubecl::client::Client;
use burn::cubecl::prelude::*;
use burn::tensor::{DType, Tensor};

use super::super::{Element, buffer_arg, output, vector_arg};
use super::Terms;
use super::statistics::{pool, stats, stats_vectors};

pub(super) const LANES: usize = 256;
/// Elements a statistics cube reads (so its pixels per chunk are `ELEMENTS / c`): enough cubes
/// on the VAE's 64×64 maps of 512 channels, per-channel partials a tenth of what is read.
const ELEMENTS: usize = 16_384;
/// Most statistics chunks an image is cut into: a thousand cubes of 256 lanes fill an H200, and
/// every cube more is work for the pooling.
const MAX_CHUNKS: usize = 1024;
/// Elements each lane normalises.
const PER_LANE: usize = 16;
const TILE: usize = LANES * PER_LANE;
/// Elements of a vector in the vector statistics and [`apply_vectors`]: four, the widest every
/// compiler takes (WGSL's).
pub(super) const VEC: usize = 4;

/// Cube `(t, b)`: tile `t` of image `b`, `x·scale + shift` per channel, then SiLU when `silu`.
#[cube(launch)]
fn apply<F: Float>(
    x: &[F],
    y: &mut [F],
    scale: &[f32],
    offset: &[f32],
    n: usize,
    c: usize,
    #[comptime] silu: bool,
) {
    let lane = UNIT_POS as usize;
    let b = CUBE_POS_Y as usize;
    let tile = CUBE_POS_X as usize * TILE;
    #[unroll]
    for r in 0..PER_LANE {
        let i = tile + r * LANES + lane;
        if i < n {
            let ch = b * c + i % c;
            let mut v = f32::cast_from(x[b * n + i]) * scale[ch] + offset[ch];
            if silu {
                v = v / (1.0 + f32::exp(-v));
            }
            y[b * n + i] = F::cast_from(v);
        }
    }
}

/// [`apply`] a vector of [`VEC`] channels at a time (`vectors` of them an image), where the channels come in whole vectors:
/// one load and store per four values, and one channel index per vector instead of one
/// division per value (the scalar pass ran at a fraction of the bandwidth its maps need).
#[cube(launch)]
fn apply_vectors<F: Float, N: Size>(
    x: &[Vector<F, N>],
    y: &mut [Vector<F, N>],
    scale: &[f32],
    offset: &[f32],
    vectors: usize,
    c: usize,
    #[comptime] silu: bool,
) {
    let lane = UNIT_POS as usize;
    let b = CUBE_POS_Y as usize;
    let tile = CUBE_POS_X as usize * comptime!(TILE / VEC);
    #[unroll]
    for r in 0..comptime!(PER_LANE / VEC) {
        let i = tile + r * LANES + lane;
        if i < vectors {
            let ch = b * c + (i * VEC) % c;
            let xv = x[b * vectors + i];
            let mut yv = Vector::<F, N>::new(F::new(0.0));
            #[unroll]
            for e in 0..VEC {
                let mut v = f32::cast_from(xv.extract(e)) * scale[ch + e] + offset[ch + e];
                if silu {
                    v = v / (1.0 + f32::exp(-v));
                }
                yv.insert(e, F::cast_from(v));
            }
            y[b * vectors + i] = yv;
        }
    }
}

/// Pixels per statistics chunk for a map of `hw` pixels and `c` channels: [`ELEMENTS`] a cube,
/// but at most [`MAX_CHUNKS`] chunks, so the pooling's work (`chunks · c/groups` entries a group
/// where the statistics pool their streams, `chunks · streams · c/groups` where not; one cube
/// each) does not grow with the map (an SDXL decode's 1024² maps would
/// otherwise give it 65 536 entries a group).
fn pixels_per_chunk(hw: usize, c: usize) -> usize {
    ELEMENTS
        .div_ceil(c.max(1))
        .max(hw.div_ceil(MAX_CHUNKS))
        .max(1)
}

/// Whether `t` (a `[b, c, h, w]` tensor as it lies) is channels-last: `[b, h, w, c]` in memory.
pub(crate) fn is_channels_last(t: &CubeTensor) -> bool {
    let shape = t.meta.shape();
    let strides: &[usize] = t.meta.strides();
    if shape.len() != 4 || strides.len() != 4 {
        return false;
    }
    let (c, h, w) = (shape[1], shape[2], shape[3]);
    // A size-1 dimension's stride is never read: any value is the layout.
    let fits = |dim: usize, want: usize| shape[dim] == 1 || strides[dim] == want;
    c > 1 && fits(1, 1) && fits(3, c) && fits(2, w * c) && fits(0, h * w * c)
}

/// GroupNorm of the channels-last `xc` (`[b, c, h, w]`, checked by [`is_channels_last`]) plus
/// its channel `terms`, with f32 `gamma`/`beta`, then SiLU when `silu`;
/// the result is channels-last too. `None` where the grid cannot hold the map.
#[allow(clippy::too_many_arguments)]
pub(super) fn group_norm(
    xc: &CubeTensor,
    gamma: &CubeTensor,
    beta: &CubeTensor,
    terms: &Terms,
    [b, c, h, w]: [usize; 4],
    groups: usize,
    eps: f32,
    silu: bool,
    device: &burn::tensor::Device,
) -> Option<Tensor<4>> {
    let element = Element::of(xc.dtype)?;
    let hw = h * w;
    let n = hw * c;
    let pixels = pixels_per_chunk(hw, c);
    let chunks = hw.div_ceil(pixels);
    let tiles = n.div_ceil(TILE);
    // Lanes a pixel's channels take, in vectors where they come in whole ones.
    let width = match c.is_multiple_of(VEC) {
        true => (c / VEC).min(LANES),
        false => c.min(LANES),
    };
    let streams = LANES / width;
    let per_group = c / groups;
    if b > 65_535 || chunks > 65_535 || tiles > 65_535 || groups > 65_535 || n >= u32::MAX as usize
    {
        return None;
    }
    let (out, oc) = output([b, h, w, c], xc.dtype, device)?;
    let (_, scale) = output([b, c], DType::F32, device)?;
    let (_, shift) = output([b, c], DType::F32, device)?;
    // The vector statistics write one entry per channel and chunk (their streams pooled or one).
    let entry_streams = match c.is_multiple_of(VEC) {
        true => 1,
        false => streams,
    };
    let entries = b * chunks * entry_streams * c * 3;
    let partial = xc.client.empty(entries * size_of::<f32>());
    let sizes = Sizes {
        b,
        c,
        hw,
        pixels,
        chunks,
        width,
        streams,
        tiles,
        per_group,
        groups,
        entry_streams,
    };
    let buffers = Buffers {
        x: xc,
        y: &oc,
        terms,
        gamma,
        beta,
        scale: &scale,
        shift: &shift,
        partial: &partial,
        entries,
    };
    match element {
        Element::F32 => launch::<f32>(&xc.client, buffers, sizes, eps, silu),
        Element::F16 => launch::<half::f16>(&xc.client, buffers, sizes, eps, silu),
    }
    Some(out.permute([0, 3, 1, 2]))
}

struct Buffers<'a> {
    x: &'a CubeTensor,
    y: &'a CubeTensor,
    terms: &'a Terms,
    gamma: &'a CubeTensor,
    beta: &'a CubeTensor,
    scale: &'a CubeTensor,
    shift: &'a CubeTensor,
    partial: &'a burn::cubecl::server::Handle,
    entries: usize,
}

struct Sizes {
    b: usize,
    c: usize,
    hw: usize,
    pixels: usize,
    chunks: usize,
    width: usize,
    streams: usize,
    tiles: usize,
    per_group: usize,
    groups: usize,
    /// Streams of entries per chunk the statistics write.
    entry_streams: usize,
}

fn launch<F: Float + CubeElement>(client: &Client, t: Buffers, s: Sizes, eps: f32, silu: bool) {
    let cube = CubeDim::new_1d(LANES as u32);
    let partial = || unsafe { BufferArg::from_raw_parts(t.partial.clone(), t.entries) };
    let chunks = CubeCount::Static(s.chunks as u32, s.b as u32, 1);
    if s.c.is_multiple_of(VEC) {
        stats_vectors::launch::<F>(
            client,
            chunks,
            cube,
            VEC,
            vector_arg(t.x, VEC),
            partial(),
            s.hw,
            s.c,
            s.pixels,
            s.chunks,
            s.width,
            s.streams,
            s.c / VEC <= LANES,
        );
    } else {
        stats::launch::<F>(
            client,
            chunks,
            cube,
            buffer_arg(t.x),
            partial(),
            s.hw,
            s.c,
            s.pixels,
            s.chunks,
            s.width,
            s.streams,
        );
    }
    let columns = t.terms.columns.as_ref();
    pool::launch::<F>(
        client,
        CubeCount::Static(s.groups as u32, s.b as u32, 1),
        cube,
        partial(),
        // An absent term binds a buffer of its type, never read (compiled out).
        buffer_arg(t.terms.bias.as_ref().unwrap_or(t.gamma)),
        buffer_arg(columns.map_or(t.x, |c| &c.0)),
        columns.map_or(0, |c| c.1),
        columns.map_or(0, |c| c.2),
        buffer_arg(t.gamma),
        buffer_arg(t.beta),
        buffer_arg(t.scale),
        buffer_arg(t.shift),
        s.c,
        s.per_group,
        s.chunks * s.entry_streams * s.per_group,
        eps,
        t.terms.bias.is_some(),
        columns.is_some(),
    );
    let count = CubeCount::Static(s.tiles as u32, s.b as u32, 1);
    if s.c.is_multiple_of(VEC) {
        apply_vectors::launch::<F>(
            client,
            count,
            cube,
            VEC,
            vector_arg(t.x, VEC),
            vector_arg(t.y, VEC),
            buffer_arg(t.scale),
            buffer_arg(t.shift),
            s.hw * s.c / VEC,
            s.c,
            silu,
        );
    } else {
        apply::launch::<F>(
            client,
            count,
            cube,
            buffer_arg(t.x),
            buffer_arg(t.y),
            buffer_arg(t.scale),
            buffer_arg(t.shift),
            s.hw * s.c,
            s.c,
            silu,
        );
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{DType, Device, Tensor};

    use super::super::super::resolve_strided;
    use super::super::super::testing::{on_cpu, read, relative, tensor, values, wgpu};
    use super::is_channels_last;

    /// Chunks hold `ELEMENTS` values until an image would need more than `MAX_CHUNKS` of them
    /// (an SDXL decode's 1024² × 128 map: 1024 chunks, not 8192), and cover every pixel.
    #[test]
    fn chunks_are_bounded_and_cover_the_map() {
        use super::{ELEMENTS, MAX_CHUNKS, pixels_per_chunk};
        assert_eq!(pixels_per_chunk(64 * 64, 512), ELEMENTS / 512);
        assert_eq!(pixels_per_chunk(512 * 512, 128), 256);
        assert_eq!(
            (1024 * 1024usize).div_ceil(pixels_per_chunk(1024 * 1024, 128)),
            MAX_CHUNKS
        );
        for (hw, c) in [
            (1, 3),
            (323, 128),
            (72, 320),
            (2048 * 2048, 128),
            (5, 100_000),
        ] {
            let pixels = pixels_per_chunk(hw, c);
            assert!(pixels >= 1 && hw.div_ceil(pixels) <= MAX_CHUNKS, "{hw}x{c}");
        }
    }

    /// A channels-last map is normalised as it lies and stays channels-last; the values equal the
    /// burn-op twin's in f32 and f16: channels in vectors of four (8, 10 and 3 pixel streams
    /// pooled in the cube; more vectors than lanes, some lanes with two) and not (the scalar
    /// passes: several streams, and one stream over more channels than lanes), maps that end
    /// mid-chunk and mid-unroll, an empty stream, batch 2, a large mean; and shifted by a
    /// per-(image, channel) term first, as a convolution's bias left to the norm.
    #[test]
    fn channels_last_maps_match_burn_ops() {
        let device = wgpu();
        for (b, c, h, w, groups, offset) in [
            (2, 128, 17, 19, 32, 3.0),
            (1, 320, 9, 8, 32, -1.0),
            (1, 96, 23, 12, 32, 300.0),
            // 129 pixels: the last chunk's one pixel leaves its second stream empty.
            (1, 128, 3, 43, 32, 0.5),
            // Channels not in whole vectors: the scalar passes.
            (2, 6, 5, 7, 3, 1.0),
            // More vectors than lanes: one stream, some lanes with two vectors.
            (1, 1280, 3, 5, 32, 0.5),
            // Not in vectors, more channels than lanes: the scalar statistics' one stream.
            (1, 258, 4, 5, 2, -0.5),
            // The one-launch kernel's unrolled walk several times over, batch 2.
            (2, 64, 40, 40, 32, 2.0),
        ] {
            let n = b * c * h * w;
            let (gamma, beta, norm) = super::super::tests::affine(c, groups, &device);
            for dtype in [DType::F32, DType::F16] {
                // [b, h, w, c] in memory, [b, c, h, w] as a tensor.
                let x =
                    tensor(values(n, offset), [b, h, w, c], &device, dtype).permute([0, 3, 1, 2]);
                assert!(is_channels_last(&resolve_strided(x.clone()).unwrap()));
                // Three launches, then the one-launch kernel (`slab`) on the same map.
                for (silu, slab_max) in [
                    (false, 0),
                    (true, 0),
                    (false, usize::MAX),
                    (true, usize::MAX),
                ] {
                    let mut twin = norm.forward(on_cpu(&x));
                    if silu {
                        twin = burn::tensor::activation::silu(twin);
                    }
                    let run = super::super::run;
                    let ours = run(&x, &gamma, &beta, None, groups, 1e-5, silu, slab_max)
                        .expect("our kernels run on wgpu");
                    assert_eq!(ours.dtype(), dtype);
                    assert!(is_channels_last(&resolve_strided(ours.clone()).unwrap()));
                    let rel = relative(&read(ours), &read(twin));
                    let tol = if dtype == DType::F32 { 1e-4 } else { 1e-2 };
                    assert!(
                        rel <= tol,
                        "{b}x{c}x{h}x{w} {dtype:?} silu={silu} slab {slab_max}: rel {rel}"
                    );
                }
                // Shifted per (image, channel) first: a convolution's bias (f32 `[c]`) and
                // columns of a wider term in the map's dtype (the time embedding's projection),
                // each alone and both.
                let bias: Vec<f32> = (0..c).map(|i| (i * 37 % 23) as f32 * 0.3 - 3.0).collect();
                let bias = tensor(bias, [c], &device, DType::F32);
                let (width, column) = (c + 24, 8);
                let wide: Vec<f32> = (0..b * width)
                    .map(|i| (i * 53 % 19) as f32 * 0.25 - 2.0)
                    .collect();
                let wide = tensor(wide, [b, width], &device, dtype);
                let cols = on_cpu(&wide)
                    .slice([0..b, column..column + c])
                    .cast(DType::F32);
                for (with_bias, with_columns) in [(true, false), (false, true), (true, true)] {
                    let terms = super::super::ChannelTerms {
                        bias: with_bias.then(|| bias.clone()),
                        columns: with_columns.then(|| (wide.clone(), column)),
                    };
                    let mut shifted = on_cpu(&x).cast(DType::F32);
                    if with_bias {
                        shifted = shifted + on_cpu(&bias).reshape([1, c, 1, 1]);
                    }
                    if with_columns {
                        shifted = shifted + cols.clone().reshape([b, c, 1, 1]);
                    }
                    let twin = burn::tensor::activation::silu(norm.forward(shifted));
                    let twin = read(twin);
                    for slab_max in [0, usize::MAX] {
                        let run = super::super::run;
                        let ours = run(
                            &x,
                            &gamma,
                            &beta,
                            Some(&terms),
                            groups,
                            1e-5,
                            true,
                            slab_max,
                        )
                        .expect("taken channels-last");
                        assert!(is_channels_last(&resolve_strided(ours.clone()).unwrap()));
                        let rel = relative(&read(ours), &twin);
                        let tol = if dtype == DType::F32 { 1e-4 } else { 1e-2 };
                        assert!(
                            rel <= tol,
                            "{b}x{c}x{h}x{w} {dtype:?} bias {with_bias} columns {with_columns}, \
                             slab {slab_max}: rel {rel}"
                        );
                    }
                }
                // Terms of the wrong shape or dtype are refused, not read past their ends.
                let short = super::super::ChannelTerms {
                    bias: None,
                    columns: Some((wide.clone(), width - c + 1)),
                };
                let other = match dtype {
                    DType::F32 => DType::F16,
                    _ => DType::F32,
                };
                let mistyped = super::super::ChannelTerms {
                    bias: None,
                    columns: Some((wide.clone().cast(other), 0)),
                };
                let narrow = super::super::ChannelTerms {
                    bias: Some(bias.clone().narrow(0, 0, c - 1)),
                    columns: None,
                };
                for terms in [short, mistyped, narrow] {
                    let got = super::super::group_norm_shifted(
                        &x, &gamma, &beta, &terms, groups, 1e-5, true,
                    );
                    assert!(got.is_none());
                }
            }
        }
        // A channels-first map is not taken for channels-last, nor shifted (the caller adds).
        let x = tensor(values(240, 0.0), [2, 8, 3, 5], &device, DType::F32);
        assert!(!is_channels_last(&resolve_strided(x.clone()).unwrap()));
        let (gamma, beta) = (Tensor::ones([8], &device), Tensor::zeros([8], &device));
        let terms = super::super::ChannelTerms {
            bias: Some(Tensor::zeros([8], &device)),
            columns: None,
        };
        assert!(
            super::super::group_norm_shifted(&x, &gamma, &beta, &terms, 4, 1e-5, true).is_none()
        );
        assert!(!super::super::super::available(&Device::flex()));
    }
}
