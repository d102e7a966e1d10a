use burn::tensor::module::conv2d;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Tensor};

use super::super::testing::{on_cpu, read, relative, tensor, values, wgpu};
use super::{Columns, Epilogue, Simt};

/// One case: batch, channels in/out, map, kernel, stride, padding.
type Case = (usize, usize, usize, usize, usize, usize, usize, usize);

/// Ours (with `slices`, `None` for the automatic choice) against burn's `conv2d` in f32 plus the
/// epilogue's adds with burn ops, for every combination of epilogue terms given, in 4 × 4 lane
/// blocks or as `simt` asks (8 × 8 where the layer takes them, vector staging).
fn check(case: Case, terms: &[(bool, bool, bool)], slices: &[Option<usize>]) {
    check_blocks(case, terms, slices, Simt::default());
}

fn check_blocks(case: Case, terms: &[(bool, bool, bool)], slices: &[Option<usize>], simt: Simt) {
    let device = wgpu();
    let (b, c_in, c_out, h, w, k, stride, pad) = case;
    let oh = (h + 2 * pad - k) / stride + 1;
    let ow = (w + 2 * pad - k) / stride + 1;
    for dtype in [DType::F32, DType::F16] {
        let tol = if dtype == DType::F32 { 1e-4 } else { 1e-2 };
        let x = tensor(
            values(b * c_in * h * w, 0.1),
            [b, c_in, h, w],
            &device,
            dtype,
        );
        let wt = tensor(
            values(c_out * c_in * k * k, -0.3)
                .into_iter()
                .map(|v| v * 0.2)
                .collect(),
            [c_out, c_in, k, k],
            &device,
            dtype,
        );
        let bias: Tensor<1> = tensor(values(c_out, 0.5), [c_out], &device, dtype);
        // The channel term as columns 7.. of a wider tensor, as the UNet passes it.
        let width = c_out + 12;
        let channel: Tensor<2> = tensor(values(b * width, -0.7), [b, width], &device, dtype);
        let residual: Tensor<4> = tensor(
            values(b * c_out * oh * ow, 0.3),
            [b, c_out, oh, ow],
            &device,
            dtype,
        );
        let packed = super::pack(wt.clone());
        let plain = conv2d(
            on_cpu(&x),
            on_cpu(&wt),
            None,
            ConvOptions::new([stride, stride], [pad, pad], [1, 1], 1),
        );
        for &(with_bias, with_channel, with_residual) in terms {
            let (bias32, channel32, residual32) =
                (on_cpu(&bias), on_cpu(&channel), on_cpu(&residual));
            let twin = Epilogue {
                bias: with_bias.then_some(&bias32),
                channel: with_channel.then_some(Columns {
                    tensor: &channel32,
                    column: 7,
                }),
                residual: with_residual.then_some(&residual32),
            }
            .apply(plain.clone());
            let epilogue = Epilogue {
                bias: with_bias.then_some(&bias),
                channel: with_channel.then_some(Columns {
                    tensor: &channel,
                    column: 7,
                }),
                residual: with_residual.then_some(&residual),
            };
            for &split in slices {
                let geometry = super::Geometry {
                    k,
                    stride,
                    padding: pad,
                    upsample: false,
                };
                let ours = super::conv2d_with(x.clone(), &packed, geometry, &epilogue, split, simt)
                    .expect("runs on wgpu");
                assert_eq!(ours.dims(), [b, c_out, oh, ow]);
                assert_eq!(ours.dtype(), dtype);
                let rel = relative(&read(ours), &read(twin.clone()));
                let label = format!(
                    "b{b} {c_in}->{c_out} {h}x{w} k{k}/{stride} {dtype:?} \
                     bias {with_bias} channel {with_channel} residual {with_residual} \
                     slices {split:?} {simt:?}"
                );
                assert!(rel <= tol, "{label}: rel {rel}");
            }
        }
    }
}

/// Where the tiles do not divide the shape: channels off 64 and off 16 in the reduction, an 8×8
/// map, batch 2, stride 2, a 1×1 kernel, an odd map, with and without bias, in f32 and f16.
#[test]
fn implicit_gemm_matches_burn_conv2d() {
    let bias_only = [(true, false, false), (false, false, false)];
    for case in [
        (2, 20, 70, 8, 8, 3, 1, 1),
        (1, 4, 8, 9, 7, 3, 2, 1),
        (2, 33, 65, 5, 6, 1, 1, 0),
        (1, 64, 64, 16, 16, 3, 1, 1),
    ] {
        check(case, &bias_only, &[None]);
    }
}

/// The narrow tiles (16 and 32 output channels by 256 and 128 pixels): 3, 16, 17 and 32
/// channels over several pixel tiles with a partial last one, whole and split, with every
/// epilogue term.
#[test]
fn narrow_tiles_match_burn_conv2d() {
    assert_eq!(super::tile_rows(3, 4), 16);
    assert_eq!(super::tile_rows(16, 4), 16);
    assert_eq!(super::tile_rows(17, 4), 32);
    assert_eq!(super::tile_rows(32, 4), 32);
    assert_eq!(super::tile_rows(33, 4), 64);
    assert_eq!(super::tile_rows(1280, 4), 64);
    for rows in [16, 32, 64] {
        assert_eq!(rows * super::tile_pixels(rows, 4), 64 * 64);
    }
    let all = [(true, true, true), (true, false, false)];
    for case in [
        (2, 20, 3, 17, 19, 3, 1, 1),
        (1, 16, 16, 20, 20, 3, 1, 1),
        (1, 24, 17, 13, 11, 3, 2, 1),
        (2, 12, 32, 9, 10, 3, 1, 1),
    ] {
        check(case, &all, &[None, Some(3)]);
    }
}

/// The 8 × 8 lane blocks (128 × 128 tiles): one and two channel tiles, each over a partial last
/// pixel tile, whole and split, stride 1 and 2, with every epilogue term; layers that 128 does
/// not divide keep 4 × 4 blocks.
#[test]
fn wide_blocks_match_burn_conv2d() {
    assert_eq!(super::tile_block(64, true), 4);
    assert_eq!(super::tile_block(320, true), 4);
    assert_eq!(super::tile_block(640, true), 8);
    assert_eq!(super::tile_block(1280, false), 4);
    assert_eq!(super::tile_rows(640, 8), 128);
    assert_eq!(128 * super::tile_pixels(128, 8), 128 * 128);
    // Each combination is a kernel of its own (an LLVM compile on lavapipe): the terms and the
    // split where they change the write, the stride and the 64-channel tile once.
    let wide = Simt {
        wide: true,
        ..Simt::default()
    };
    check_blocks(
        (2, 19, 128, 9, 7, 3, 1, 1),
        &[(true, true, true)],
        &[None, Some(3)],
        wide,
    );
    check_blocks(
        (1, 24, 256, 11, 13, 3, 2, 1),
        &[(true, false, false)],
        &[None],
        wide,
    );
}

/// The staging read as vectors of 4 (`Simt::vector`), with and without the next step's loads
/// prefetched, 32 reduction indices a step (`Simt::deep`) and 4 × 8 lane blocks
/// (`Simt::pixels8`, on the 64-channel tile): every tile height (16, 32, 64 channels in 4 × 4 blocks, 128 in 8 × 8), maps
/// whose pixel count 4 does not divide (a vector of pixels spanning two images or a partial
/// tile), stride 2, a 1×1 kernel, whole and split, with every epilogue term.
#[test]
fn vector_staging_matches_burn_conv2d() {
    let all = [(true, true, true)];
    // Deep without prefetch is f16's default on a card.
    for (prefetch, deep, pixels8) in [
        (false, false, false),
        (true, false, false),
        (false, true, false),
        (false, true, true),
    ] {
        let simt = Simt {
            wide: false,
            vector: true,
            prefetch,
            deep,
            pixels8,
        };
        check_blocks((2, 20, 3, 5, 7, 3, 1, 1), &all, &[None], simt);
        check_blocks((1, 12, 32, 9, 10, 3, 2, 1), &all, &[Some(3)], simt);
        check_blocks((2, 33, 65, 5, 6, 1, 1, 0), &all, &[None], simt);
        if pixels8 {
            // A 3×3 layer on the 64-channel tile, 143 pixels (no whole vector of 8), split too.
            check_blocks((1, 9, 40, 11, 13, 3, 1, 1), &all, &[None, Some(2)], simt);
        }
        check_blocks(
            (2, 19, 128, 9, 7, 3, 1, 1),
            &all,
            &[None, Some(3)],
            Simt { wide: true, ..simt },
        );
    }
}

/// The epilogue's time-embedding and residual adds, alone and together, and the reduction split
/// into slices that do not divide it (3 slices of a 23-step reduction, 2 and 7 of 41), on an 8×8
/// map at batch 2 and an odd strided one: the split sums equal the whole.
#[test]
fn epilogue_and_split_reduction_match_the_twin() {
    let terms = [
        (true, true, false),
        (false, false, true),
        (true, true, true),
    ];
    check(
        (2, 40, 70, 8, 8, 3, 1, 1),
        &terms,
        &[Some(1), Some(3), None],
    );
    check(
        (1, 72, 33, 7, 9, 3, 2, 1),
        &[(true, true, true)],
        &[Some(2), Some(7)],
    );
}

/// The split rule: none where the grid fills the GPU or the reduction is short; slices equal and
/// never empty; SD 1.5's 1280-channel 8×8 layer (40 tiles, 720 steps) gets enough cubes.
#[test]
fn splits_only_small_grids_with_long_reductions() {
    assert_eq!(super::splits(256, 720), 1);
    assert_eq!(super::splits(1000, 720), 1);
    assert_eq!(super::splits(40, 20), 1, "a short reduction stays whole");
    let s = super::splits(40, 720);
    assert!(40 * s >= 256 && s <= 16, "{s}");
    assert_eq!(super::splits(160, 720), 2);
    for tiles in 1..300 {
        for steps in [1, 31, 32, 33, 64, 100, 719, 720, 2000] {
            let s = super::splits(tiles, steps);
            assert!((1..=16).contains(&s));
            let per = steps.div_ceil(s);
            assert!(per * (s - 1) < steps, "no empty slice: {tiles} {steps} {s}");
        }
    }
}

/// `nn::Conv2d`'s route on lavapipe (a software adapter, no cooperative matrices): ours for every
/// 3×3 and 1×1 layer, narrow outputs included (packed once, shared by clones); other kernel sizes
/// are burn's.
#[test]
fn prepared_routes_by_shape_and_device() {
    let device = wgpu();
    assert!(
        super::super::software(&device),
        "lavapipe is a software adapter"
    );
    let dtype = DType::F32;
    let x = tensor(values(2 * 8 * 6 * 6, 0.2), [2, 8, 6, 6], &device, dtype);
    let weight = |c_out: usize, k: usize| {
        tensor(
            values(c_out * 8 * k * k, -0.1),
            [c_out, 8, k, k],
            &device,
            dtype,
        )
    };
    let bias: Tensor<1> = tensor(values(40, 0.3), [40], &device, dtype);
    let with_bias = Epilogue {
        bias: Some(&bias),
        ..Default::default()
    };
    let geometry = |k: usize, padding: usize| super::Geometry {
        k,
        stride: 1,
        padding,
        upsample: false,
    };
    let prepared = super::Prepared::default();
    let w3 = weight(40, 3);
    let ours = prepared
        .forward(&x, &w3, geometry(3, 1), &with_bias)
        .expect("ours runs");
    assert!(super::runs_for(&device, dtype, 3, 40));
    let twin = conv2d(
        on_cpu(&x),
        on_cpu(&w3),
        Some(on_cpu(&bias)),
        ConvOptions::new([1, 1], [1, 1], [1, 1], 1),
    );
    assert!(relative(&read(ours), &read(twin)) <= 1e-4);
    let shared = prepared.clone();
    assert!(shared.is_packed(), "packed once, shared");
    let none = Epilogue::default();
    let narrow = weight(4, 3);
    let ours = super::Prepared::default()
        .forward(&x, &narrow, geometry(3, 1), &none)
        .expect("ours runs narrow outputs too");
    let twin = conv2d(
        on_cpu(&x),
        on_cpu(&narrow),
        None,
        ConvOptions::new([1, 1], [1, 1], [1, 1], 1),
    );
    assert!(relative(&read(ours), &read(twin)) <= 1e-4);
    let pointwise = weight(40, 1);
    let ours = super::Prepared::default()
        .forward(&x, &pointwise, geometry(1, 0), &none)
        .expect("ours runs 1×1 layers too");
    assert!(super::runs_for(&device, dtype, 1, 40));
    let twin = conv2d(
        on_cpu(&x),
        on_cpu(&pointwise),
        None,
        ConvOptions::new([1, 1], [0, 0], [1, 1], 1),
    );
    assert!(relative(&read(ours), &read(twin)) <= 1e-4);
    assert!(!super::runs_for(&device, dtype, 5, 40));
}

/// The ×2 nearest upsampling read in place: equal to burn's `interpolate` then `conv2d`, on an
/// odd map at batch 2, whole and split.
#[test]
fn upsampled_input_matches_interpolate_then_conv() {
    use burn::tensor::module::interpolate;
    use burn::tensor::ops::{InterpolateMode, InterpolateOptions};
    let device = wgpu();
    let (b, c_in, c_out, h, w) = (2, 24, 128, 5, 7);
    for dtype in [DType::F32, DType::F16] {
        let tol = if dtype == DType::F32 { 1e-4 } else { 1e-2 };
        let x = tensor(
            values(b * c_in * h * w, 0.2),
            [b, c_in, h, w],
            &device,
            dtype,
        );
        let wt = tensor(
            values(c_out * c_in * 9, -0.4)
                .into_iter()
                .map(|v| v * 0.2)
                .collect(),
            [c_out, c_in, 3, 3],
            &device,
            dtype,
        );
        let bias: Tensor<1> = tensor(values(c_out, 0.5), [c_out], &device, dtype);
        let up = interpolate(
            on_cpu(&x),
            InterpolateOptions::new(InterpolateMode::Nearest).with_output_size([2 * h, 2 * w]),
        );
        let twin = conv2d(
            up,
            on_cpu(&wt),
            Some(on_cpu(&bias)),
            ConvOptions::new([1, 1], [1, 1], [1, 1], 1),
        );
        let packed = super::pack(wt);
        let geometry = super::Geometry {
            k: 3,
            stride: 1,
            padding: 1,
            upsample: true,
        };
        let epilogue = Epilogue {
            bias: Some(&bias),
            ..Default::default()
        };
        let (wide, vector) = (
            Simt {
                wide: true,
                ..Simt::default()
            },
            Simt {
                vector: true,
                prefetch: true,
                ..Simt::default()
            },
        );
        for (slices, simt) in [
            (Some(1), Simt::default()),
            (Some(3), Simt::default()),
            (Some(3), wide),
            (Some(3), vector),
        ] {
            let ours = super::conv2d_with(x.clone(), &packed, geometry, &epilogue, slices, simt)
                .expect("runs on wgpu");
            assert_eq!(ours.dims(), [b, c_out, 2 * h, 2 * w]);
            let rel = relative(&read(ours), &read(twin.clone()));
            assert!(
                rel <= tol,
                "{dtype:?} slices {slices:?} {simt:?}: rel {rel}"
            );
        }
    }
}

/// The unrolled input the cooperative-matrix kernels read (`im2col`) against burn's `unfold4d`
/// (`[b, c·k·k, L]`, the same channel-major order), laid out `[c·k·k, b·L]` and batch-major: odd maps, stride 2,
/// padding, and the 2× nearest upsampling read in place. The product itself needs cooperative
/// matrices, which lavapipe lacks; the GPU bench checks it against burn's convolution.
#[test]
fn unrolled_input_matches_unfold() {
    use burn::tensor::module::{interpolate, unfold4d};
    use burn::tensor::ops::{InterpolateMode, InterpolateOptions, UnfoldOptions};
    let device = wgpu();
    let cases = [
        // batch, channels, h, w, kernel, stride, padding, upsample
        (2, 3, 5, 7, 3, 1, 1, false),
        (1, 4, 9, 6, 3, 2, 1, false),
        (2, 2, 3, 4, 3, 1, 1, true),
        (1, 5, 4, 4, 1, 1, 0, false),
    ];
    for (b, c, h, w, k, stride, padding, upsample) in cases {
        for dtype in [DType::F32, DType::F16] {
            let x: Tensor<4> = tensor(values(b * c * h * w, 0.3), [b, c, h, w], &device, dtype);
            let geometry = super::Geometry {
                k,
                stride,
                padding,
                upsample,
            };
            let ours = super::unroll(x.clone(), geometry, false).expect("runs on wgpu");
            let batch_major = super::unroll(x.clone(), geometry, true).expect("runs on wgpu");
            let source = if upsample {
                interpolate(
                    x.cast(DType::F32),
                    InterpolateOptions::new(InterpolateMode::Nearest)
                        .with_output_size([2 * h, 2 * w]),
                )
            } else {
                x.cast(DType::F32)
            };
            let unfolded = unfold4d(
                source,
                [k, k],
                UnfoldOptions::new([stride, stride], [padding, padding], [1, 1]),
            ); // [b, c·k·k, L]
            let [_, rows, l] = unfolded.dims();
            let twin_batch_major = unfolded.clone().reshape([b * rows, l]);
            let twin = unfolded.swap_dims(0, 1).reshape([rows, b * l]);
            assert_eq!(ours.dims(), [rows, b * l], "case {b} {c} {h}x{w} k{k}");
            assert!(
                read(batch_major) == read(twin_batch_major),
                "{dtype:?} case {b} {c} {h}x{w} k{k} s{stride} up {upsample}: batch-major values differ"
            );
            let (got, want) = (read(ours), read(twin));
            assert!(
                got == want,
                "{dtype:?} case {b} {c} {h}x{w} k{k} s{stride} up {upsample}: values differ"
            );
        }
    }
}
