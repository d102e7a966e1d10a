use burn::tensor::module::linear as burn_linear;
use burn::tensor::{DType, Tensor};

use super::super::testing::{on_cpu, read, relative, tensor, values, wgpu};
use super::{WeightLayout, linear};

/// Ours against burn's `linear` in f32 on `[2, rows / 2, depth] -> cols`, in both weight layouts,
/// with and without the bias, for each reduction split given (`None`: the automatic choice).
fn check(rows: usize, depth: usize, cols: usize, slices: &[Option<usize>]) {
    let device = wgpu();
    for dtype in [DType::F32, DType::F16] {
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
                    let ours = linear(x.clone(), weight, layout, with_bias.then_some(&bias), split)
                        .expect("ours runs on wgpu");
                    assert_eq!(ours.dims(), [2, rows / 2, cols]);
                    let rel = relative(&read(ours), &expected);
                    assert!(
                        rel <= tol,
                        "{rows}x{depth}->{cols} {dtype:?} {layout:?} bias {with_bias} split \
                         {split:?}: rel {rel:e}"
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
    check(154, 77, 100, &[None, Some(3)]);
}

/// Exact tiles, narrow output (a head's 40 columns) and a depth the automatic rule splits.
#[test]
fn whole_tiles_narrow_outputs_and_automatic_splits_match_burn() {
    check(128, 64, 40, &[None]);
    check(128, 1280, 64, &[None]);
}

#[test]
fn mismatched_inputs_are_refused() {
    let device = wgpu();
    let x: Tensor<2> = tensor(values(64 * 8, 0.0), [64, 8], &device, DType::F32);
    let w: Tensor<2> = tensor(values(9 * 16, 0.0), [9, 16], &device, DType::F32);
    assert!(linear(x.clone(), &w, WeightLayout::InOut, None, None).is_none());
    let w: Tensor<2> = tensor(values(8 * 16, 0.0), [8, 16], &device, DType::F32);
    let bias: Tensor<1> = tensor(values(15, 0.0), [15], &device, DType::F32);
    assert!(linear(x, &w, WeightLayout::InOut, Some(&bias), None).is_none());
}
