//! Sums over long rows, in pieces short enough for every reduction burn may run.
//!
//! lavapipe and llvmpipe (Mesa 22.3, CI's) end every shader loop after 65535 iterations (a
//! kernel counting to 65536, 100000 or 200000 returned 65535 in every lane). burn 0.22's row
//! reduction with one lane per row (cubek's unit routine) loses values from that threshold on:
//! summing `[8, 65536]` rows of ones came out short in rows 3 and 7, `[1, 262144]` 16 values
//! short, `[8, 163840]` had four rows at zero, while rows of up to 49152 values and `[64, 10240]`
//! were exact. It is the only row reduction lavapipe runs, and burn's fusion runs it too whenever
//! the autotune of a fused reduction picks the unfused fallback, which is why CI's VAE decode went
//! wrong only now and then (twice in ~48 runs): its GroupNorms reduce `(c / groups)·h·w` values a
//! group, 81920 in the tiny test VAE's last block and millions in SD's. On software adapters
//! every long row is therefore summed as pieces of at most [`ROW_PIECE`] values, then the pieces'
//! sums; cards, without the cap, sum whole rows ([`loops_capped`]). Our own kernels' loops
//! checked for the cap (the attention's key tiles, the convolutions' reduction steps,
//! GroupNorm's chunks) stay far below it at any size the engine runs.

use burn::tensor::ops::PadMode;
use burn::tensor::{Device, Tensor};

/// The longest row handed to one reduction where loops are capped: a quarter of the shortest
/// row seen failing.
pub const ROW_PIECE: usize = 16384;

/// Whether `device` may end shader loops after 65535 iterations: taken to be every software
/// adapter ([`crate::kernels::software`]: lavapipe and llvmpipe, which do, and SwiftShader or
/// any adapter without a card, which may; pieces only cost time). Cards sum rows whole: on an
/// H200 the pieces made the plain 512² VAE decode 5 % slower (47.1 → 49.5 ms, BENCHMARKS.md).
/// Makes a tensor: callers settle it once per layer.
pub fn loops_capped(device: &Device) -> bool {
    crate::kernels::software(device)
}

/// `x.sum_dim(2)` for `[b, g, n]`; with `pieces` ([`loops_capped`]), rows longer than
/// [`ROW_PIECE`] are summed in pieces ([`sum_in_pieces`]).
///
/// # Shapes
/// `[b, g, n] -> [b, g, 1]`
pub fn sum_last(x: Tensor<3>, pieces: bool) -> Tensor<3> {
    if pieces {
        sum_in_pieces(x)
    } else {
        x.sum_dim(2)
    }
}

/// `x.sum_dim(2) / n` for `[b, g, n]`, summed as [`sum_last`] sums.
pub fn mean_last(x: Tensor<3>, pieces: bool) -> Tensor<3> {
    let n = x.dims()[2].max(1);
    sum_last(x, pieces) / n as f64
}

/// `x.sum_dim(2)` for `[b, g, n]`, reducing rows of at most [`ROW_PIECE`] values at a time.
///
/// # Shapes
/// `[b, g, n] -> [b, g, 1]`
pub fn sum_in_pieces(x: Tensor<3>) -> Tensor<3> {
    let [b, g, n] = x.dims();
    if n <= ROW_PIECE {
        return x.sum_dim(2);
    }
    let piece = piece_len(n);
    let padded = n.next_multiple_of(piece);
    let x = match padded - n {
        0 => x,
        // Zeros leave the sum alone; only rows with no large divisor pay for this copy.
        extra => x.pad((0, extra, 0, 0), PadMode::Constant(0.0)),
    };
    let pieces = padded / piece;
    let partial = x.reshape([b, g * pieces, piece]).sum_dim(2);
    sum_in_pieces(partial.reshape([b, g, pieces]))
}

/// How long the pieces of a row of `n > ROW_PIECE` values are: the largest divisor of `n` from a
/// quarter of [`ROW_PIECE`] up (no padding), else [`ROW_PIECE`] (the row is padded).
fn piece_len(n: usize) -> usize {
    (ROW_PIECE / 4..=ROW_PIECE)
        .rev()
        .find(|d| n.is_multiple_of(*d))
        .unwrap_or(ROW_PIECE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{DType, TensorData};

    #[test]
    fn pieces_divide_the_row_or_pad_it() {
        assert_eq!(piece_len(81920), 16384);
        assert_eq!(piece_len(3 * 5 * 4099), 4099 * 3);
        // 2 × a prime above ROW_PIECE: no divisor in range, so the row is padded.
        assert_eq!(piece_len(2 * 16411), ROW_PIECE);
    }

    /// Rows of small integers sum exactly in f32, so any lost or repeated value shows; the values
    /// run on across rows (`i mod 7` of the flat index), so each row's sum is its own and a piece
    /// added to the wrong row shows too. The shapes include those burn's own row reduction got
    /// wrong on lavapipe (see the module docs) and a row that needs padding; summed in pieces,
    /// and as `sum_last` sums on this device.
    fn sums_rows_exactly(device: &Device) {
        for [g, n] in [
            [8, 65536],
            [8, 81920],
            [1, 262144],
            [8, 163840],
            [2, 2 * 16411],
            [3, 100],
        ] {
            let b = 2;
            let values: Vec<f32> = (0..b * g * n).map(|i| (i % 7) as f32).collect();
            let expected: Vec<f32> = values
                .chunks(n)
                .map(|row| row.iter().map(|&v| f64::from(v)).sum::<f64>() as f32)
                .collect();
            let x =
                Tensor::<3>::from_data(TensorData::new(values, [b, g, n]), (device, DType::F32));
            let capped = loops_capped(device);
            for (name, sums) in [
                ("in pieces", sum_in_pieces(x.clone())),
                ("as the device needs", sum_last(x, capped)),
            ] {
                let sums = sums.into_data().try_to_vec::<f32>().unwrap();
                assert_eq!(sums, expected, "[{b}, {g}, {n}] {name} (capped: {capped})");
            }
        }
    }

    #[test]
    fn long_rows_sum_exactly_on_cpu() {
        sums_rows_exactly(&Device::flex());
    }

    #[test]
    fn long_rows_sum_exactly_on_wgpu() {
        sums_rows_exactly(&crate::kernels::testing::wgpu());
    }
}
