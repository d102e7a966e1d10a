//! VAE tiling on the tiny model (tests/fixtures/tiny-sd.safetensors + tiny-sd.json, from
//! make_model_fixtures.py): a decode in 3x4 tiles (GroupNorm statistics shared across tiles,
//! halos as wide as the receptive field, the mid block on the whole latent) is within 2/255 of the
//! whole decode on CPU and wgpu (lavapipe); the pipeline follows the setting; Auto switches at its
//! threshold. The tile grid and halo arithmetic are unit-tested in engine/src/models/vae/tiling/.

use crate::common;

use burn::tensor::{DType, Device, DeviceKind, Tensor, TensorData};
use common::fixtures;
use latent_engine::checkpoint::Checkpoint;
use latent_engine::image_io::RgbImage;
use latent_engine::noise::TorchRng;
use latent_engine::pipeline::{DecodeOptions, Notice, Observer, decode, to_rgb8};
use latent_engine::vae_tiling::{TilingConfig, TilingMode, tiled_decode};
use latent_engine::{LoadOptions, Precision, StableDiffusion};

fn tiny_model(device: &Device) -> StableDiffusion {
    let ckpt = Checkpoint::open(&fixtures().join("tiny-sd.safetensors")).expect("tiny model");
    StableDiffusion::load(&ckpt, device, LoadOptions::default()).expect("loads")
}

/// Tiles of at most 6 latents (48 px): a 16x16 latent (128x128 px) is cut into 3x3 tiles. The
/// tiny decoder's halo is 9 latents, so at latent resolution only some tile sides are interior;
/// at the later resolutions all are.
fn small_tiles(mode: TilingMode) -> TilingConfig {
    TilingConfig {
        mode,
        tile_latents: 6,
        ..TilingConfig::default()
    }
}

/// Sampler-like latents: unit normal, as torch.randn with the seed.
fn latents(device: &Device, h: usize, w: usize, seed: u64) -> Tensor<4> {
    let values = TorchRng::new(seed).randn(4 * h * w);
    Tensor::from_data(TensorData::new(values, [1, 4, h, w]), (device, DType::F32))
}

/// What a decode reported: its notices, and the tile count of each decode.
#[derive(Default)]
struct Notices(Vec<Notice>, Vec<usize>);

impl Observer for Notices {
    fn notice(&mut self, notice: &Notice) {
        self.0.push(notice.clone());
    }

    fn decoding(&mut self, tiles: usize) {
        self.1.push(tiles);
    }
}

/// Where two images differ most: (x, y) of the worst pixel.
fn worst_pixel(a: &RgbImage, b: &RgbImage) -> (usize, usize) {
    let worst = (a.pixels.iter().zip(&b.pixels))
        .map(|(x, y)| x.abs_diff(*y))
        .enumerate()
        .max_by_key(|&(_, d)| d)
        .map_or(0, |(i, _)| i / 3);
    (worst % a.width, worst / a.width)
}

fn max_channel_diff(a: &RgbImage, b: &RgbImage) -> u8 {
    assert_eq!((a.width, a.height), (b.width, b.height));
    a.pixels
        .iter()
        .zip(&b.pixels)
        .map(|(x, y)| x.abs_diff(*y))
        .max()
        .unwrap_or(0)
}

/// Decodes `z` through the pipeline's decode whole and in tiles of `small_tiles`, checking that
/// the setting is followed (`tiles` tiles) and no warning comes. Returns (whole, tiled).
fn decode_both(name: &str, model: &StableDiffusion, z: &Tensor<4>, tiles: usize) -> [RgbImage; 2] {
    let mut notices = Notices::default();
    let mut run = |mode| {
        let options = DecodeOptions {
            tiling: small_tiles(mode),
            compile: false,
        };
        decode(model, z.clone(), &options, &mut notices).expect("decodes")
    };
    let images = [run(TilingMode::Never), run(TilingMode::Always)];
    assert_eq!(notices.1, [1, tiles], "{name}: the pipeline tiles as set");
    assert!(
        notices.0.is_empty(),
        "{name}: no warnings expected: {:?}",
        notices.0
    );
    images
}

/// The seams requirement: a tiled decode within 2/255 of the whole decode.
fn assert_seamless(name: &str, [whole, tiled]: &[RgbImage; 2]) {
    let diff = max_channel_diff(tiled, whole);
    eprintln!("{name}: tiled vs whole, max 8-bit difference {diff}");
    assert!(
        diff <= 2,
        "{name}: tiled differs by {diff}/255, most at {:?} of {}x{}",
        worst_pixel(tiled, whole),
        whole.width,
        whole.height
    );
}

/// 16x20 latents in 3x4 tiles (neither side a multiple of the tile): corner, edge and interior
/// tiles. Also the public entry: it gives the pipeline's tiled image, and pixel values within
/// float rounding of the whole decode's.
#[test]
fn tiled_decode_matches_whole_decode_on_cpu() {
    let device = Device::flex();
    let model = tiny_model(&device);
    let z = latents(&device, 16, 20, 11);
    let images = decode_both("cpu", &model, &z, 12);
    assert_seamless("cpu", &images);

    let config = small_tiles(TilingMode::Always);
    let (rows, cols) = config.grid(z.dims());
    assert_eq!((rows.len(), cols.len()), (3, 4), "3 tiles down, 4 across");
    assert!(
        rows.iter().chain(&cols).all(|s| s.len() <= 6),
        "{rows:?} {cols:?}"
    );
    let kernels = model
        .vae_compile
        .kernels(false, &model.vae, &z, &mut |_| {});
    let tiled = tiled_decode(&model.vae, z.clone(), &config, kernels);
    let whole = model.vae.decode(z);
    let worst = max_abs_diff(&tiled, &whole);
    eprintln!("cpu: tiled vs whole, max difference of pixel values {worst:e}");
    assert!(worst < 1e-4, "{worst}");
    assert_eq!(to_rgb8(tiled).expect("finite"), images[1]);
}

/// An f16 model tiles too (its GroupNorm statistics are f32 either way).
#[test]
fn tiled_decode_matches_whole_decode_in_f16() {
    let device = Device::flex();
    let ckpt = Checkpoint::open(&fixtures().join("tiny-sd.safetensors")).expect("tiny model");
    let options = LoadOptions {
        precision: Precision::F16,
        ..LoadOptions::default()
    };
    let model = StableDiffusion::load(&ckpt, &device, options).expect("loads");
    let z = latents(&device, 16, 20, 11);
    assert_seamless("cpu f16", &decode_both("cpu f16", &model, &z, 12));
}

/// The same on wgpu (lavapipe in CI), through the pipeline. VAE compilation stays off: its
/// first-use check decodes twice more, which doubles this test's kernel compilation on lavapipe
/// (~50 s); tiling passes the verified kernels to the whole-latent layers only.
///
/// Twice in ~48 CI runs this failed with the whole decode 29/255 off, repeatably within the run:
/// when the autotune of the GroupNorm variance's fused reduction picked burn's unfused fallback,
/// lavapipe summed the last block's 81920-value groups short (`engine/src/nn/rows.rs`; its test
/// fails on lavapipe with the loop cap ignored). GroupNorm sums long rows in pieces there since.
#[test]
fn tiled_decode_matches_whole_decode_on_wgpu() {
    let device = Device::wgpu(DeviceKind::DefaultDevice);
    let model = tiny_model(&device);
    let z = latents(&device, 16, 20, 11);
    assert_seamless("wgpu", &decode_both("wgpu", &model, &z, 12));
}

fn max_abs_diff(a: &Tensor<4>, b: &Tensor<4>) -> f32 {
    let read = |t: &Tensor<4>| {
        t.clone()
            .cast(DType::F32)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap()
    };
    let (a, b) = (read(a), read(b));
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Auto leaves small images whole and tiles once the image is over the pixel threshold.
#[test]
fn auto_tiles_only_large_images() {
    let device = Device::flex();
    let model = tiny_model(&device);
    let z = latents(&device, 16, 16, 3);
    // The decoded image and how many tiles the decode ran in.
    let run = |config: TilingConfig| {
        let options = DecodeOptions {
            tiling: config,
            compile: false,
        };
        let mut seen = Notices::default();
        let image = decode(&model, z.clone(), &options, &mut seen).expect("decodes");
        (image, seen.1)
    };
    let auto = |max_pixels| {
        run(TilingConfig {
            auto_max_pixels: max_pixels,
            ..small_tiles(TilingMode::Auto)
        })
    };
    let (whole, tiles) = run(small_tiles(TilingMode::Never));
    assert_eq!(tiles, [1]);
    let (at_threshold, tiles) = auto(128 * 128);
    assert_eq!(tiles, [1], "128x128 is not over 128x128 pixels");
    assert_eq!(at_threshold, whole);
    let (over, tiles) = auto(128 * 128 - 1);
    assert_eq!(tiles, [9], "over the threshold the decode is tiled");
    let (always, tiles) = run(small_tiles(TilingMode::Always));
    assert_eq!(tiles, [9]);
    assert_eq!(over, always, "Auto over the threshold tiles as Always does");
}
