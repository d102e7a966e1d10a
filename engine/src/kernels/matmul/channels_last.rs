//! A convolution's input read in place, channels-last, as the GEMM's `a` operand (an implicit
//! GEMM over pixels): row `p` is output pixel `p` of the whole batch, column
//! `kk = (ky·k + kx)·c + ci` (tap-major), so `a · wᵀ` with the weights laid out `[c_out, ky,
//! kx, ci]` is the convolution, written `[pixels, c_out]`: channels-last again.
//!
//! The channels of one pixel lie together, so a lane's vector of 8 is one 16-byte load of one
//! tap's channels (the channels-first read, [`super::implicit`], shifts and splices vectors
//! along a row). With `c` a multiple of the GEMM's reduction step, a step's columns lie in one
//! tap: its tap and first channel come from one division a step, the same for every lane, and
//! each lane's pixel is split once before the reduction (`oy·stride`, `ox·stride` and its
//! image's offset). Padding reads as zeros; the ×2 nearest upsampling is read in place (each
//! source pixel serves four).

use burn::cubecl;
use burn::cubecl::prelude::*;

use super::implicit::{ConvGeometry, ConvInput};

/// Rows past the product's end get this as their `oy·stride`: every tap falls outside the map.
pub(super) const PAST_THE_END: usize = 1 << 30;

impl ConvInput {
    /// Whether the GEMM reads it channels-last with reduction steps of `bk`: each step's
    /// columns in one tap (`c` a multiple of `bk`).
    pub fn fits_rows(&self, bk: usize) -> bool {
        bk > 0
            && self.channels.is_multiple_of(bk)
            && self.geometry.stride > 0
            && self.output().is_some_and(|[oh, ow]| oh * ow > 0)
    }
}

/// Vector `[k0 + off, k0 + off + vec)` of the unrolled row of the pixel whose image starts at
/// `base` (elements) and whose window's corner is (`oys`, `ox`s) in the padded (and upsampled)
/// map; `k0` a multiple of `c` apart from the step's start is what the caller guarantees (`off`
/// below the step, the step within one tap).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn conv_a_vector<F: Float, N: Size>(
    x: &[Vector<F, N>],
    base: usize,
    oys: usize,
    oxs: usize,
    k0: usize,
    off: usize,
    geometry: &ConvGeometry,
    #[comptime] ksize: usize,
    #[comptime] upsample: bool,
    #[comptime] vec: usize,
) -> Vector<F, N> {
    let c = geometry.channels;
    let tap = k0 / c;
    let ci = k0 - tap * c + off;
    let ky = tap / ksize;
    let kx = tap % ksize;
    let vy = oys + ky;
    let vx = oxs + kx;
    let pad = geometry.pad;
    let up = comptime!(if upsample { 2usize } else { 1usize });
    let mut out = Vector::<F, N>::new(F::new(0.0));
    if vy >= pad && vx >= pad && vy - pad < geometry.h * up && vx - pad < geometry.w * up {
        let iy = (vy - pad) / up;
        let ix = (vx - pad) / up;
        out = x[(base + (iy * geometry.w + ix) * c + ci) / vec];
    }
    out
}

/// Row `row`'s image offset (elements) and window corner (`oy·stride`, `ox·stride`) into entry
/// `i` of `base`, `oys` and `oxs`; the corner past every map for rows at or past `m`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn conv_a_row(
    row: usize,
    m: usize,
    geometry: &ConvGeometry,
    base: &mut Array<usize>,
    oys: &mut Array<usize>,
    oxs: &mut Array<usize>,
    #[comptime] i: usize,
) {
    let image = row / geometry.map;
    let p = row % geometry.map;
    let mut corner_y = (p / geometry.ow) * geometry.stride;
    if row >= m {
        corner_y = PAST_THE_END;
    }
    base[i] = image * geometry.h * geometry.w * geometry.channels;
    oys[i] = corner_y;
    oxs[i] = (p % geometry.ow) * geometry.stride;
}

/// Writes the unrolled input `[pixels, k·k·c]` through [`conv_a_row`] and [`conv_a_vector`]
/// with steps of `bk`, one vector a lane: what the GEMM stages, for tests on any adapter.
#[cfg(test)]
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn unroll_channels_last<F: Float, N: Size>(
    x: &[Vector<F, N>],
    out: &mut [Vector<F, N>],
    pixels: usize,
    k_total: usize,
    geometry: ConvGeometry,
    #[comptime] bk: usize,
    #[comptime] ksize: usize,
    #[comptime] upsample: bool,
    #[comptime] vec: usize,
) {
    let v = CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS as usize;
    let per_row = k_total / vec;
    if v < pixels * per_row {
        let row = v / per_row;
        let kk = (v % per_row) * vec;
        let mut base = Array::<usize>::new(1usize);
        let mut oys = Array::<usize>::new(1usize);
        let mut oxs = Array::<usize>::new(1usize);
        conv_a_row(
            row, pixels, &geometry, &mut base, &mut oys, &mut oxs, 0usize,
        );
        out[v] = conv_a_vector::<F, N>(
            x,
            base[0],
            oys[0],
            oxs[0],
            kk / bk * bk,
            kk % bk,
            &geometry,
            ksize,
            upsample,
            vec,
        );
    }
}

#[cfg(test)]
mod tests {
    use burn::cubecl::prelude::*;
    use burn::tensor::{DType, Tensor};

    use super::super::super::Geometry;
    use super::super::super::testing::{read, tensor, values, wgpu};
    use super::super::super::{output, resolve, vector_arg};
    use super::super::implicit::ConvInput;
    use super::unroll_channels_last;

    /// The unrolled channels-last input by definition: `[pixels, k·k·c]`, tap-major columns.
    fn unrolled(x: &[f32], [b, c, h, w]: [usize; 4], g: Geometry) -> Vec<f32> {
        let up = if g.upsample { 2 } else { 1 };
        let [oh, ow] = g.output(h, w).expect("fits");
        let mut out = Vec::new();
        for (image, oy, ox) in
            (0..b).flat_map(|i| (0..oh).flat_map(move |y| (0..ow).map(move |x| (i, y, x))))
        {
            for ky in 0..g.k {
                for kx in 0..g.k {
                    for ci in 0..c {
                        let vy = (oy * g.stride + ky) as isize - g.padding as isize;
                        let vx = (ox * g.stride + kx) as isize - g.padding as isize;
                        let inside =
                            vy >= 0 && vx >= 0 && (vy as usize) < h * up && (vx as usize) < w * up;
                        out.push(if inside {
                            let (iy, ix) = (vy as usize / up, vx as usize / up);
                            x[((image * h + iy) * w + ix) * c + ci]
                        } else {
                            0.0
                        });
                    }
                }
            }
        }
        out
    }

    /// What the GEMM stages from a channels-last input read in place equals the unrolled input
    /// by definition, in vectors of 4 as WGSL has them: padding on every side of odd-sized maps,
    /// stride 2, the ×2 upsampling read in place, a 1×1 layer, batches of two, steps of one
    /// tap and of part of one.
    #[test]
    fn channels_last_reads_equal_the_unrolled_input() {
        let device = wgpu();
        let vec = 4;
        let cases = [
            // batch, channels, h, w, kernel, stride, padding, upsample, step
            (2, 8, 5, 7, 3, 1, 1, false, 8),
            (1, 16, 6, 5, 3, 1, 1, false, 8),
            (2, 8, 9, 6, 3, 2, 1, false, 8),
            (1, 8, 3, 5, 3, 1, 1, true, 8),
            (2, 16, 4, 3, 1, 1, 0, false, 16),
        ];
        for (b, c, h, w, k, stride, padding, upsample, bk) in cases {
            let geometry = Geometry {
                k,
                stride,
                padding,
                upsample,
            };
            let input = ConvInput {
                channels: c,
                h,
                w,
                geometry,
            };
            assert!(input.fits_rows(bk), "case {c} {h}x{w} k{k} s{stride}");
            let [oh, ow] = input.output().expect("fits");
            let (pixels, k_total) = (b * oh * ow, c * k * k);
            let host = values(b * h * w * c, 0.3);
            let want = unrolled(&host, [b, c, h, w], geometry);
            for dtype in [DType::F32, DType::F16] {
                // Channels-last in memory: `[b, h, w, c]`.
                let x: Tensor<4> = tensor(host.clone(), [b, h, w, c], &device, dtype);
                let xc = resolve(x).expect("wgpu");
                let (got, oc) = output([pixels, k_total], dtype, &device).expect("wgpu");
                let (launch_geometry, taps) = input.launch().expect("fits");
                let vectors = pixels * k_total / vec;
                macro_rules! launch {
                    ($t:ty) => {
                        unroll_channels_last::launch::<$t>(
                            &xc.client,
                            CubeCount::Static(vectors.div_ceil(64) as u32, 1, 1),
                            CubeDim::new_1d(64),
                            vec,
                            vector_arg(&xc, vec),
                            vector_arg(&oc, vec),
                            pixels,
                            k_total,
                            launch_geometry,
                            bk,
                            taps.k,
                            taps.upsample,
                            vec,
                        )
                    };
                }
                match dtype {
                    DType::F32 => launch!(f32),
                    _ => launch!(half::f16),
                }
                let got = read(got);
                let close = got.len() == want.len()
                    && got
                        .iter()
                        .zip(&want)
                        .all(|(g, w)| (g - w).abs() <= 1e-3 * w.abs().max(1.0));
                assert!(
                    close,
                    "{dtype:?} case {b} {c} {h}x{w} k{k} s{stride} up {upsample}: values differ"
                );
            }
        }
    }

    /// Channels that a step would straddle two taps of are refused.
    #[test]
    fn refuses_steps_across_taps() {
        let input = ConvInput {
            channels: 320,
            h: 8,
            w: 8,
            geometry: Geometry {
                k: 3,
                stride: 1,
                padding: 1,
                upsample: false,
            },
        };
        assert!(input.fits_rows(64));
        assert!(
            !ConvInput {
                channels: 4,
                ..input
            }
            .fits_rows(64)
        );
        assert!(
            !ConvInput {
                channels: 96,
                ..input
            }
            .fits_rows(64)
        );
        assert!(
            ConvInput {
                channels: 96,
                ..input
            }
            .fits_rows(32)
        );
    }
}
