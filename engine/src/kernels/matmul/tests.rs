use burn::tensor::module::linear as burn_linear;
use burn::tensor::{DType, Tensor};

use super::super::testing::{on_cpu, read, relative, tensor, values, wgpu};
use super::{LinearEpilogue, Tiling, WeightLayout, linear};

/// Ours, plain, with this split and lane block.
fn plain<const D: usize>(
    x: Tensor<D>,
    weight: &Tensor<2>,
    layout: WeightLayout,
    bias: Option<&Tensor<1>>,
    slices: Option<usize>,
    block: usize,
) -> Option<Tensor<D>> {
    plain_tiled(
        x,
        weight,
        layout,
        bias,
        Tiling {
            slices,
            block,
            vector: false,
            prefetch: false,
        },
    )
}

fn plain_tiled<const D: usize>(
    x: Tensor<D>,
    weight: &Tensor<2>,
    layout: WeightLayout,
    bias: Option<&Tensor<1>>,
    tiling: Tiling,
) -> Option<Tensor<D>> {
    linear(x, weight, layout, bias, LinearEpilogue::Plain, tiling)
}

/// Ours against burn's `linear` on `[2, rows / 2, depth] -> cols`, in both weight layouts, with
/// and without the bias, for each reduction split given (`None`: the automatic choice), in each
/// dtype and lane block given.
fn check(
    rows: usize,
    depth: usize,
    cols: usize,
    slices: &[Option<usize>],
    dtypes: &[DType],
    block: usize,
) {
    for vector in [false, true] {
        check_tiled(rows, depth, cols, slices, dtypes, block, vector);
    }
}

/// [`check`] with the staging read as scalars or (`vector`) as vectors of 4.
fn check_tiled(
    rows: usize,
    depth: usize,
    cols: usize,
    slices: &[Option<usize>],
    dtypes: &[DType],
    block: usize,
    vector: bool,
) {
    let device = wgpu();
    for &dtype in dtypes {
        let tol = if dtype == DType::F32 { 1e-4 } else { 1e-2 };
        let x: Tensor<3> = tensor(
            values(rows * depth, 0.1),
            [2, rows / 2, depth],
            &device,
            dtype,
        );
        let w_values: Vec<f32> = values(cols * depth, -0.3)
            .into_iter()
            .map(|v| v * 0.2)
            .collect();
        // The same `[in, out]` weight in both layouts.
        let out_in: Tensor<2> = tensor(w_values.clone(), [cols, depth], &device, dtype);
        let as_out_in = out_in.clone().transpose();
        let as_in_out: Tensor<2> = tensor(
            read(out_in.clone().transpose()),
            [depth, cols],
            &device,
            dtype,
        );
        let bias: Tensor<1> = tensor(values(cols, 0.5), [cols], &device, dtype);
        for with_bias in [false, true] {
            let twin = burn_linear(
                on_cpu(&x),
                on_cpu(&as_out_in),
                with_bias.then(|| on_cpu(&bias)),
            );
            let expected = read(twin);
            for (weight, layout) in [
                (&as_out_in, WeightLayout::OutIn),
                (&as_in_out, WeightLayout::InOut),
            ] {
                for &split in slices {
                    // With vectors, the prefetch on alternate bias settings: each layout and
                    // split with and without it.
                    let tiling = Tiling {
                        slices: split,
                        block,
                        vector,
                        prefetch: vector && with_bias,
                    };
                    let ours = plain_tiled(
                        x.clone(),
                        weight,
                        layout,
                        with_bias.then_some(&bias),
                        tiling,
                    )
                    .expect("ours runs on wgpu");
                    assert_eq!(ours.dims(), [2, rows / 2, cols]);
                    let rel = relative(&read(ours), &expected);
                    assert!(
                        rel <= tol,
                        "{rows}x{depth}->{cols} {dtype:?} {layout:?} bias {with_bias} split \
                         {split:?} block {block} vector {vector}: rel {rel:e}"
                    );
                }
            }
        }
    }
}

/// Ragged everywhere: rows, depth and columns none a multiple of their tile, split in 3 (the
/// last slice shorter) and whole.
#[test]
fn ragged_shapes_match_burn() {
    check(154, 77, 100, &[None, Some(3)], &[DType::F32, DType::F16], 4);
}

/// 8 × 8 lane blocks (128-square tiles), ragged: in f32, whole and split.
#[test]
fn wide_blocks_match_burn() {
    check(154, 77, 300, &[None, Some(3)], &[DType::F32], 8);
}

/// The transformer block's epilogues against burn's ops after burn's `linear`: `+ residual` and
/// GEGLU's `value · gelu(gate)` (values then gates, an output not a multiple of any tile), in
/// both lane blocks, whole and split in 3.
#[test]
fn epilogues_match_burn() {
    let device = wgpu();
    let (rows, depth, half) = (154, 77, 100);
    let dtype = DType::F32;
    let x: Tensor<2> = tensor(values(rows * depth, 0.1), [rows, depth], &device, dtype);
    for geglu in [false, true] {
        let cols = if geglu { 2 * half } else { half };
        let w_values: Vec<f32> = values(cols * depth, -0.3)
            .into_iter()
            .map(|v| v * 0.2)
            .collect();
        let weight = tensor::<2>(w_values, [cols, depth], &device, dtype).transpose();
        let bias: Tensor<1> = tensor(values(cols, 0.5), [cols], &device, dtype);
        let residual: Tensor<2> = tensor(values(rows * half, 0.7), [rows, half], &device, dtype);
        let y = burn_linear(on_cpu(&x), on_cpu(&weight), Some(on_cpu(&bias)));
        let (expected, epilogue) = if geglu {
            let value = y.clone().narrow(1, 0, half);
            let gate = y.narrow(1, half, half);
            (read(value * crate::nn::gelu(gate)), LinearEpilogue::Geglu)
        } else {
            (
                read(y + on_cpu(&residual)),
                LinearEpilogue::Residual(residual.clone()),
            )
        };
        for (block, vector, prefetch) in [
            (4, false, false),
            (8, false, false),
            (4, true, false),
            (8, true, true),
        ] {
            for slices in [Some(1), Some(3)] {
                let ours = linear(
                    x.clone(),
                    &weight,
                    WeightLayout::OutIn,
                    Some(&bias),
                    epilogue.clone(),
                    Tiling {
                        slices,
                        block,
                        vector,
                        prefetch,
                    },
                )
                .expect("ours runs on wgpu");
                assert_eq!(ours.dims(), [rows, half]);
                let rel = relative(&read(ours), &expected);
                assert!(
                    rel <= 1e-4,
                    "geglu {geglu} block {block} vector {vector} prefetch {prefetch} slices {slices:?}: rel {rel:e}"
                );
            }
        }
    }
    // A residual not shaped as the output is refused, not broadcast.
    let weight: Tensor<2> = tensor(values(depth * half, 0.0), [depth, half], &device, dtype);
    let wrong: Tensor<2> = tensor(values(rows * 2, 0.0), [rows, 2], &device, dtype);
    let refused = linear(
        x,
        &weight,
        WeightLayout::InOut,
        None,
        LinearEpilogue::Residual(wrong),
        Tiling::default(),
    );
    assert!(refused.is_none());
}

/// Exact tiles, narrow output (a head's 40 columns) and a depth the automatic rule splits.
#[test]
fn whole_tiles_narrow_outputs_and_automatic_splits_match_burn() {
    let both = [DType::F32, DType::F16];
    check(128, 64, 40, &[None], &both, 4);
    check(128, 1280, 64, &[None], &both, 4);
}

#[test]
fn mismatched_inputs_are_refused() {
    let device = wgpu();
    let x: Tensor<2> = tensor(values(64 * 8, 0.0), [64, 8], &device, DType::F32);
    let w: Tensor<2> = tensor(values(9 * 16, 0.0), [9, 16], &device, DType::F32);
    assert!(plain(x.clone(), &w, WeightLayout::InOut, None, None, 4).is_none());
    let w: Tensor<2> = tensor(values(8 * 16, 0.0), [8, 16], &device, DType::F32);
    let bias: Tensor<1> = tensor(values(15, 0.0), [15], &device, DType::F32);
    assert!(plain(x.clone(), &w, WeightLayout::InOut, Some(&bias), None, 4).is_none());
    assert!(
        plain(x, &w, WeightLayout::InOut, None, None, 6).is_none(),
        "blocks are 4 or 8"
    );
}
