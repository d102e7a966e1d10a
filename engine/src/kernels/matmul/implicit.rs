//! A convolution's input read in place as the GEMM's `[k, n]` operand (an implicit GEMM): row
//! `kk = c·k² + ky·k + kx` of the weights as stored (`[c_out, c_in·k·k]`), column `oy·ow + ox`
//! of one image's output map, so the product `weights · input` is the convolution, written
//! `[c_out, oh·ow]` as the map it is. Nothing is unrolled into memory: the unrolled operand of a
//! 64² map of 320 channels is 47 MB a batch of two, a VAE's 512² map of 128 channels 600 MB.
//!
//! The GEMM stages `b` a vector of `vec` neighbouring output columns at a time (one output row:
//! the launcher asks `ow` and `w` to be multiples of `vec`). For a stride-1 layer whose taps
//! shift a row by at most one column (3×3 with padding 1, 1×1 without) those columns read one
//! aligned vector of the input row and at most one neighbour; the nearest ×2 upsampling read in
//! place (the upsamplers' convolutions) likewise, each source column twice. Padding falls on the
//! neighbours past the row's ends, which stay zero. Other layers (stride 2) read each value
//! through the vector that holds it.

use burn::cubecl;
use burn::cubecl::prelude::*;

use super::super::Geometry;

/// The input's geometry as [`conv_b_vector`] reads it (host side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvInput {
    /// Channels, rows and columns of one image (before any upsampling).
    pub channels: usize,
    pub h: usize,
    pub w: usize,
    pub geometry: Geometry,
}

impl ConvInput {
    /// The output map `[oh, ow]`, `None` where the kernel does not fit.
    pub fn output(&self) -> Option<[usize; 2]> {
        self.geometry.output(self.h, self.w)
    }

    /// Whether [`conv_b_vector`] reads it with vectors of `vec`: rows and output rows whole
    /// vectors, stride 1 or 2, the reduction a whole number of vectors.
    pub fn fits(&self, vec: usize) -> bool {
        self.output().is_some_and(|[oh, ow]| {
            oh > 0
                && ow.is_multiple_of(vec)
                && self.w.is_multiple_of(vec)
                && (1..=2).contains(&self.geometry.stride)
                && (self.channels * self.geometry.k * self.geometry.k).is_multiple_of(vec)
        })
    }

    /// Elements of one image.
    pub fn image_len(&self) -> usize {
        self.channels * self.h * self.w
    }
}

/// [`ConvInput`] as the kernel reads it at run time.
#[derive(CubeType, CubeLaunch, Clone, Copy)]
pub struct ConvGeometry {
    pub h: usize,
    pub w: usize,
    pub ow: usize,
    pub stride: usize,
    pub pad: usize,
    /// Channels and output pixels of one image (read by [`super::channels_last`] only).
    pub channels: usize,
    pub map: usize,
}

/// What the kernel compiles for: the taps' side (0: `b` is a plain matrix) and the upsampling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ConvTaps {
    pub k: usize,
    pub upsample: bool,
}

impl ConvInput {
    /// The kernel's run-time arguments and its compilation's.
    pub(super) fn launch(&self) -> Option<(ConvGeometryLaunch, ConvTaps)> {
        let [oh, ow] = self.output()?;
        let g = self.geometry;
        Some((
            ConvGeometryLaunch::new(
                self.h,
                self.w,
                ow,
                g.stride,
                g.padding,
                self.channels,
                oh * ow,
            ),
            ConvTaps {
                k: g.k,
                upsample: g.upsample,
            },
        ))
    }
}

/// Vector `(oy, ox0)` (output row, first column: a multiple of `vec`) of row `kk` of the image
/// at `base` (elements) unrolled, zeros where the taps fall on padding. A lane stages the same
/// output columns at every step (the GEMM's `b` rows are whole multiples of its lanes apart), so
/// the GEMM splits its column into `(oy, ox0)` once, outside the reduction.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn conv_b_vector<F: Float, N: Size>(
    x: &[Vector<F, N>],
    base: usize,
    kk: usize,
    oy: usize,
    ox0: usize,
    geometry: &ConvGeometry,
    #[comptime] ksize: usize,
    #[comptime] upsample: bool,
    #[comptime] vec: usize,
) -> Vector<F, N> {
    let h = geometry.h;
    let w = geometry.w;
    let stride = geometry.stride;
    let pad = geometry.pad;
    let up = comptime!(if upsample { 2usize } else { 1usize });
    let taps = comptime!(ksize * ksize);
    let c = kk / taps;
    let r = kk % taps;
    let ky = r / ksize;
    let kx = r % ksize;
    let vy = oy * stride + ky;
    let zero = Vector::<F, N>::new(F::new(0.0));
    let mut out = zero;
    if vy >= pad && vy - pad < h * up {
        let row = base + (c * h + (vy - pad) / up) * w;
        if stride == 1 && kx + 1 >= pad && kx <= pad + 1 {
            // `s` 0, 1, 2: the tap shifts the row by -1, 0, +1 (virtual) columns.
            let s = kx + 1 - pad;
            let q = ox0 / up;
            let start = q / vec * vec;
            let o = q - start;
            let cur = x[(row + start) / vec];
            let mut prev = zero;
            let mut next = zero;
            if s == 0 && o == 0 && start >= vec {
                prev = x[(row + start - vec) / vec];
            }
            if s == 2 && start + vec < w && (!upsample || o > 0) {
                next = x[(row + start + vec) / vec];
            }
            if o == 0 {
                if s == 0 {
                    out = window::<F, N>(prev, cur, next, up, 0usize, 0usize, vec);
                } else if s == 1 {
                    out = window::<F, N>(prev, cur, next, up, 0usize, 1usize, vec);
                } else {
                    out = window::<F, N>(prev, cur, next, up, 0usize, 2usize, vec);
                }
            } else if upsample {
                // `o` is half a vector: the other half of the source vector.
                if s == 0 {
                    out = window::<F, N>(prev, cur, next, up, comptime!(vec / 2), 0usize, vec);
                } else if s == 1 {
                    out = window::<F, N>(prev, cur, next, up, comptime!(vec / 2), 1usize, vec);
                } else {
                    out = window::<F, N>(prev, cur, next, up, comptime!(vec / 2), 2usize, vec);
                }
            }
        } else {
            #[unroll]
            for t in 0..vec {
                let vx = (ox0 + t) * stride + kx;
                if vx >= pad && vx - pad < w * up {
                    let src = (vx - pad) / up;
                    let v = x[(row + src / vec * vec) / vec];
                    out.insert(t, v.extract_dynamic(src % vec));
                }
            }
        }
    }
    out
}

/// Element `t` is element `vec + o + ⌊(t + s − 1) / up⌋` of `prev ‖ cur ‖ next` (all comptime).
#[cube]
fn window<F: Float, N: Size>(
    prev: Vector<F, N>,
    cur: Vector<F, N>,
    next: Vector<F, N>,
    #[comptime] up: usize,
    #[comptime] o: usize,
    #[comptime] s: usize,
    #[comptime] vec: usize,
) -> Vector<F, N> {
    let mut out = Vector::<F, N>::new(F::new(0.0));
    #[unroll]
    for t in 0..vec {
        let idx = comptime!(
            ((vec + o) as i64 + (t as i64 + s as i64 - 1).div_euclid(up as i64)) as usize
        );
        let part = comptime!(idx / vec);
        let e = comptime!(idx % vec);
        if comptime!(part == 0) {
            out.insert(t, prev.extract(e));
        } else if comptime!(part == 1) {
            out.insert(t, cur.extract(e));
        } else {
            out.insert(t, next.extract(e));
        }
    }
    out
}

/// Writes the unrolled input `[batch, c·k·k, oh·ow]` through [`conv_b_vector`], one vector a
/// lane (cube `x`, image `z`): what the GEMM stages, for tests on any adapter.
#[cfg(test)]
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn unroll_implicit<F: Float, N: Size>(
    x: &[Vector<F, N>],
    out: &mut [Vector<F, N>],
    k_total: usize,
    map: usize,
    image: usize,
    geometry: ConvGeometry,
    #[comptime] ksize: usize,
    #[comptime] upsample: bool,
    #[comptime] vec: usize,
) {
    let v = CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS as usize;
    let z = CUBE_POS_Z as usize;
    let per_row = map / vec;
    if v < k_total * per_row {
        let kk = v / per_row;
        let col = (v % per_row) * vec;
        out[z * k_total * per_row + v] = conv_b_vector::<F, N>(
            x,
            z * image,
            kk,
            col / geometry.ow,
            col % geometry.ow,
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
    use super::super::super::conv::unroll;
    use super::super::super::testing::{read, tensor, values, wgpu};
    use super::super::super::{output, resolve, vector_arg};
    use super::{ConvInput, unroll_implicit};

    /// What the GEMM stages from an input read in place equals the unrolled input (`im2col`,
    /// itself checked against burn's `unfold4d`), in vectors of 4 as WGSL has them: both taps'
    /// shifts with padding at the row ends, the ×2 upsampling read in place at both halves of a
    /// source vector, stride 2 (each value through its vector), a 1×1 layer, batches of two.
    #[test]
    fn in_place_reads_equal_the_unrolled_input() {
        let device = wgpu();
        let vec = 4;
        let cases = [
            // batch, channels, h, w, kernel, stride, padding, upsample
            (2, 4, 5, 8, 3, 1, 1, false),
            (1, 4, 3, 4, 3, 1, 1, true),
            (1, 4, 4, 8, 3, 1, 1, true),
            (2, 4, 9, 16, 3, 2, 1, false),
            (1, 8, 4, 8, 1, 1, 0, false),
        ];
        for (b, c, h, w, k, stride, padding, upsample) in cases {
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
            assert!(input.fits(vec), "case {c} {h}x{w} k{k} s{stride}");
            let [oh, ow] = input.output().expect("fits");
            let (k_total, map) = (c * k * k, oh * ow);
            for dtype in [DType::F32, DType::F16] {
                let x: Tensor<4> = tensor(values(b * c * h * w, 0.3), [b, c, h, w], &device, dtype);
                let want = read(unroll(x.clone(), geometry, true).expect("runs on wgpu"));
                let xc = resolve(x).expect("wgpu");
                let (got, oc) = output([b, k_total, map], dtype, &device).expect("wgpu");
                let (launch_geometry, taps) = input.launch().expect("fits");
                let vectors = k_total * map / vec;
                macro_rules! launch {
                    ($t:ty) => {
                        unroll_implicit::launch::<$t>(
                            &xc.client,
                            CubeCount::Static(vectors.div_ceil(64) as u32, 1, b as u32),
                            CubeDim::new_1d(64),
                            vec,
                            vector_arg(&xc, vec),
                            vector_arg(&oc, vec),
                            k_total,
                            map,
                            input.image_len(),
                            launch_geometry,
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
                assert!(
                    read(got) == want,
                    "{dtype:?} case {b} {c} {h}x{w} k{k} s{stride} up {upsample}: values differ"
                );
            }
        }
    }

    /// Maps whose rows or output rows are not whole vectors, and stride 3, are refused.
    #[test]
    fn refuses_what_it_cannot_read_in_vectors() {
        let g = Geometry {
            k: 3,
            stride: 1,
            padding: 1,
            upsample: false,
        };
        let base = ConvInput {
            channels: 8,
            h: 8,
            w: 8,
            geometry: g,
        };
        let with = |geometry| ConvInput { geometry, ..base };
        assert!(base.fits(8));
        assert!(!ConvInput { w: 12, ..base }.fits(8));
        assert!(
            !with(Geometry { padding: 0, ..g }).fits(8),
            "6 output columns"
        );
        assert!(!with(Geometry { stride: 3, ..g }).fits(8));
        let one_by_one = Geometry {
            k: 1,
            padding: 0,
            ..g
        };
        assert!(
            !ConvInput {
                channels: 4,
                geometry: one_by_one,
                ..base
            }
            .fits(8)
        );
        assert!(
            with(Geometry {
                upsample: true,
                ..g
            })
            .fits(8)
        );
    }
}
