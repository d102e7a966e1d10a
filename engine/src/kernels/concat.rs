//! The UNet's skip connections joined on channels, channels-last in and out: an up block's input
//! and the skip it takes, `[b, h, w, c1]` and `[b, h, w, c2]` in memory, into `[b, h, w, c1 + c2]`.
//! Each lane writes one vector of the output, read from whichever input holds its channels.
//!
//! burn's `cat` of the two permuted views ran as fused elementwise launches, SDXL's nine ~0.9 ms
//! of its step on an H200; these take 0.19 ms (BENCHMARKS.md, fifty-first session). The twin is
//! that `cat`, whose output ours equals bit for bit.

use burn::cubecl;
use burn::cubecl::prelude::*;
use burn::tensor::Tensor;

use super::group_norm::is_channels_last;
use super::{Element, grid, output, resolve_strided, vector_arg};

const LANES: usize = 256;
/// Widest vector (the widest WGSL takes).
const VEC: usize = 4;

static ON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Whether [`channels_last`] runs our kernel (on unless [`set_on`]).
pub fn on() -> bool {
    ON.load(std::sync::atomic::Ordering::Relaxed)
}

/// Sets [`on`] process-wide (the bench compares our join with burn's `cat` in one process).
pub fn set_on(on: bool) {
    ON.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Output vector `i` of `len`: pixel `i / (av + bv)`, taken from `a` (`av` vectors a pixel) or
/// `b` (`bv`).
#[cube(launch)]
fn join_channels<F: Float, N: Size>(
    a: &[Vector<F, N>],
    b: &[Vector<F, N>],
    y: &mut [Vector<F, N>],
    av: usize,
    bv: usize,
    len: usize,
) {
    let cube = CUBE_POS_X as usize + CUBE_POS_Y as usize * CUBE_COUNT_X as usize;
    let i = cube * LANES + UNIT_POS as usize;
    if i < len {
        let cv = av + bv;
        let p = i / cv;
        let j = i - p * cv;
        if j < av {
            y[i] = a[p * av + j];
        } else {
            y[i] = b[p * bv + j - av];
        }
    }
}

/// The widest vector (4, 2 or 1 values) that starts both inputs' channels of every pixel.
fn width_for(c1: usize, c2: usize) -> usize {
    [VEC, 2]
        .into_iter()
        .find(|&v| c1.is_multiple_of(v) && c2.is_multiple_of(v))
        .unwrap_or(1)
}

/// `cat([x, skip], 1)` of two channels-last `[b, c, h, w]` tensors of one dtype, channels-last,
/// by our kernel. `None` where it does not run (CPU backend, another layout or dtype, sizes
/// that differ, a grid too large); the caller then uses burn's `cat`.
pub fn channels_last(x: &Tensor<4>, skip: &Tensor<4>) -> Option<Tensor<4>> {
    let device = x.device();
    if !on() || !super::available(&device) || x.dtype() != skip.dtype() {
        return None;
    }
    let element = Element::of(x.dtype())?;
    let [b, c1, h, w] = x.dims();
    let [b2, c2, h2, w2] = skip.dims();
    if (b, h, w) != (b2, h2, w2) {
        return None;
    }
    let c = c1 + c2;
    let len = b * h * w * c;
    if len == 0 || len >= u32::MAX as usize {
        return None;
    }
    let xc = resolve_strided(x.clone())?;
    let sc = resolve_strided(skip.clone())?;
    if !is_channels_last(&xc) || !is_channels_last(&sc) {
        return None;
    }
    let width = width_for(c1, c2);
    let vectors = len / width;
    let (gx, gy) = grid(vectors.div_ceil(LANES))?;
    let (out, oc) = output([b, h, w, c], x.dtype(), &device)?;
    let launch = match element {
        Element::F32 => join_channels::launch::<f32>,
        Element::F16 => join_channels::launch::<half::f16>,
    };
    launch(
        &xc.client,
        CubeCount::Static(gx, gy, 1),
        CubeDim::new_1d(LANES as u32),
        width,
        vector_arg(&xc, width),
        vector_arg(&sc, width),
        vector_arg(&oc, width),
        c1 / width,
        c2 / width,
        vectors,
    );
    Some(out.permute([0, 3, 1, 2]))
}

#[cfg(test)]
mod tests {
    use burn::tensor::{DType, Tensor};

    use super::super::group_norm::is_channels_last;
    use super::super::resolve_strided;
    use super::super::testing::{read, tensor, values, wgpu};
    use super::width_for;

    #[test]
    fn widths_start_both_inputs_on_vectors() {
        assert_eq!(width_for(320, 640), 4);
        assert_eq!(width_for(6, 10), 2);
        assert_eq!(width_for(4, 3), 1);
    }

    /// Our join against burn's `cat` on the same channels-last inputs: widths of every vector
    /// size, batch 2, an odd map, past one cube; the result stays channels-last. Inputs that are
    /// not both channels-last, or differ in size, are left to burn.
    #[test]
    fn joins_channels_last_maps_like_burn_cat() {
        let device = wgpu();
        let channels_last = |v: Vec<f32>, [b, c, h, w]: [usize; 4], dtype| {
            tensor(v, [b, h, w, c], &device, dtype).permute([0, 3, 1, 2])
        };
        for dtype in [DType::F32, DType::F16] {
            for (b, c1, c2, h, w) in [
                (2, 8, 4, 5, 7),
                (1, 6, 10, 9, 9),
                (2, 3, 5, 4, 3),
                (2, 32, 16, 16, 16),
            ] {
                let x = channels_last(values(b * c1 * h * w, 1.0), [b, c1, h, w], dtype);
                let skip = channels_last(values(b * c2 * h * w, -3.0), [b, c2, h, w], dtype);
                let ours = super::channels_last(&x, &skip).expect("runs on wgpu");
                assert!(is_channels_last(&resolve_strided(ours.clone()).unwrap()));
                assert_eq!(ours.dims(), [b, c1 + c2, h, w]);
                let twin = Tensor::cat(vec![x, skip], 1);
                assert_eq!(read(ours), read(twin), "{b}x({c1}+{c2})x{h}x{w} {dtype:?}");
            }
        }
        let plain = tensor(
            values(2 * 8 * 4 * 4, 0.0),
            [2, 8, 4, 4],
            &device,
            DType::F32,
        );
        assert!(
            super::channels_last(&plain, &plain).is_none(),
            "not channels-last"
        );
        let a = channels_last(values(2 * 8 * 16, 0.0), [2, 8, 4, 4], DType::F32);
        let b = channels_last(values(2 * 8 * 20, 0.0), [2, 8, 4, 5], DType::F32);
        assert!(super::channels_last(&a, &b).is_none(), "sizes differ");
    }
}
