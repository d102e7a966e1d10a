//! What the device's cooperative matrices deliver with global memory out of the way: the
//! ceiling our GEMM ([`super::mma`]) and attention work under. Thirty sessions of tuning left the
//! GEMM at ~100 TFLOP/s on SDXL's linears on an H200 over Vulkan; whether that is the Vulkan
//! path's products themselves, the fragment loads from workgroup memory, the GEMM's barriers or
//! its staging stores decides where the next work goes, so each is timed alone.
//!
//! Each plane keeps `tm × tn` accumulators, as a plane of the GEMM does, and per iteration
//! runs two reduction sub-steps (the GEMM's 32-deep step on 16-deep fragments):
//! - [`Ceiling::Products`]: fragments loaded once; products only.
//! - [`Ceiling::Loads`]: every sub-step loads its `tm` A and `tn` B fragments from workgroup
//!   memory laid out as the GEMM stages them (rows padded by one 16-byte vector), then
//!   multiplies: the GEMM's inner loop with no global memory and no barriers.
//! - [`Ceiling::Barriers`]: the same with the single-stage GEMM's two cube barriers an
//!   iteration.
//! - [`Ceiling::Staging`]: the same with each lane storing four 16-byte vectors into the
//!   staging before the first barrier, as the default GEMM's lanes stage a 128 × 128 × 32 step:
//!   everything the GEMM does but read global memory.
//!
//! Measured on an H200 (BENCHMARKS.md, thirty-second session; two calls within 1 %): products
//! alone ~643 TFLOP/s with any arrangement (16×16×16 and 16×8×16 fragments alike, 16×8×8 478);
//! for the default 8 planes of 64 × 32, + fragment loads 630, + barriers 552, + staging stores
//! **370**; 4 planes of 64 × 64 reach 456 with everything. The GEMM itself ran a 4096³ product at
//! 184 TFLOP/s in the same process (burn's matmul 125): half of its ceiling is the staging's
//! share of workgroup memory, half the global loads' latency.

use burn::cubecl;
use burn::cubecl::prelude::*;
use burn::tensor::DType;

use super::layout::MmaGemm;
use super::mma::VEC;
use crate::kernels::{buffer_arg, output};

/// What one ceiling launch times (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ceiling {
    Products,
    Loads,
    Barriers,
    Staging,
}

impl Ceiling {
    pub const ALL: [Ceiling; 4] = [
        Ceiling::Products,
        Ceiling::Loads,
        Ceiling::Barriers,
        Ceiling::Staging,
    ];

    fn code(self) -> u32 {
        match self {
            Ceiling::Products => 0,
            Ceiling::Loads => 1,
            Ceiling::Barriers => 2,
            Ceiling::Staging => 3,
        }
    }
}

impl std::fmt::Display for Ceiling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Ceiling::Products => "products only",
            Ceiling::Loads => "+ fragment loads",
            Ceiling::Barriers => "+ 2 barriers",
            Ceiling::Staging => "+ staging stores",
        })
    }
}

/// One ceiling launch's shape: `planes` planes a cube, each `tm × tn` accumulators, `cubes`
/// cubes, `iters` iterations of two sub-steps.
#[derive(Debug, Clone, Copy)]
pub struct CeilingShape {
    pub planes: usize,
    pub tm: usize,
    pub tn: usize,
    pub cubes: usize,
    pub iters: usize,
}

impl CeilingShape {
    /// Floating-point operations of one launch (a multiply-add counts two).
    pub fn flops(&self, gemm: MmaGemm) -> f64 {
        let f = gemm.fragment;
        let products = self.cubes * self.planes * self.iters * 2 * self.tm * self.tn;
        products as f64 * 2.0 * (f.m * f.n * f.k) as f64
    }
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn mma_ceiling<F: Float, N: Size>(
    out: &mut [f32],
    iters: u32,
    #[comptime] tm: usize,
    #[comptime] tn: usize,
    #[comptime] fm: usize,
    #[comptime] fn_: usize,
    #[comptime] fk: usize,
    #[comptime] planes: usize,
    #[comptime] plane: usize,
    #[comptime] mode: u32,
) {
    let lanes = comptime!(planes * plane);
    let lane = UNIT_POS as usize;
    let warp = lane / plane;
    // Two 32-deep halves, so that consecutive iterations read different addresses.
    let depth = comptime!(4 * fk);
    let k_row = comptime!(depth + VEC);
    let n_row = comptime!(tn * fn_ + VEC);
    let a_len = comptime!(tm * fm * k_row);
    let b_len = comptime!(depth * n_row);
    // Vectors of 8, as the GEMM stages them.
    let mut a_s = Shared::<[Vector<F, N>]>::new_slice(comptime!(a_len / VEC));
    let mut b_s = Shared::<[Vector<F, N>]>::new_slice(comptime!(b_len / VEC));
    #[unroll]
    for r in 0..comptime!((a_len / VEC).div_ceil(lanes)) {
        let i = lane + r * lanes;
        if i < comptime!(a_len / VEC) {
            a_s[i] = Vector::<F, N>::new(F::cast_from(f32::cast_from(i % 7) * 0.01));
        }
    }
    #[unroll]
    for r in 0..comptime!((b_len / VEC).div_ceil(lanes)) {
        let i = lane + r * lanes;
        if i < comptime!(b_len / VEC) {
            b_s[i] = Vector::<F, N>::new(F::cast_from(f32::cast_from(i % 5) * 0.01));
        }
    }
    sync_cube();

    let mut acc = Sequence::<cmma::Matrix<f32>>::new();
    #[unroll]
    for _ in 0..comptime!(tm * tn) {
        acc.push(cmma::Matrix::<f32>::from_value(
            cmma::MatrixIdent::Accumulator,
            fm,
            fn_,
            fk,
            cmma::MatrixLayout::Undefined,
            0.0f32,
        ));
    }

    if comptime!(mode == 0) {
        let mut af = Sequence::<cmma::Matrix<F>>::new();
        let mut bf = Sequence::<cmma::Matrix<F>>::new();
        #[unroll]
        for i in 0..tm {
            let mut f = unsafe {
                cmma::Matrix::<F>::uninitialized(
                    cmma::MatrixIdent::A,
                    fm,
                    fn_,
                    fk,
                    cmma::MatrixLayout::RowMajor,
                )
            };
            cmma::load(
                &mut f,
                &a_s[i * fm * k_row / VEC..a_len / VEC],
                k_row as u32,
            );
            af.push(f);
        }
        #[unroll]
        for j in 0..tn {
            let mut f = unsafe {
                cmma::Matrix::<F>::uninitialized(
                    cmma::MatrixIdent::B,
                    fm,
                    fn_,
                    fk,
                    cmma::MatrixLayout::RowMajor,
                )
            };
            cmma::load(&mut f, &b_s[j * fn_ / VEC..b_len / VEC], n_row as u32);
            bf.push(f);
        }
        for _ in 0..iters {
            #[unroll]
            for _kk in 0..2u32 {
                #[unroll]
                for i in 0..tm {
                    #[unroll]
                    for j in 0..tn {
                        let c = acc.index(i * tn + j);
                        cmma::execute(af.index(i), bf.index(j), c, c);
                    }
                }
            }
        }
    } else {
        for it in 0..iters {
            let half = (it as usize % 2) * comptime!(2 * fk);
            if comptime!(mode == 3) {
                // Four vectors a lane, over both operands' halves being read this iteration.
                let v = Vector::<F, N>::new(F::cast_from(f32::cast_from(it % 3) * 0.01));
                #[unroll]
                for r in 0..4usize {
                    let i = (lane + r * lanes) % comptime!(2 * fk * n_row / VEC);
                    if r % 2 == 0 {
                        b_s[half * comptime!(n_row / VEC) + i] = v;
                    } else {
                        let row = i % comptime!(tm * fm);
                        a_s[(row * k_row + half) / VEC
                            + i / comptime!(tm * fm) % comptime!(2 * fk / VEC)] = v;
                    }
                }
            }
            if comptime!(mode >= 2) {
                sync_cube();
            }
            #[unroll]
            for kk in 0..2usize {
                let k0 = half + kk * fk;
                let mut bf = Sequence::<cmma::Matrix<F>>::new();
                #[unroll]
                for j in 0..tn {
                    let mut f = unsafe {
                        cmma::Matrix::<F>::uninitialized(
                            cmma::MatrixIdent::B,
                            fm,
                            fn_,
                            fk,
                            cmma::MatrixLayout::RowMajor,
                        )
                    };
                    cmma::load(
                        &mut f,
                        &b_s[(k0 * n_row + j * fn_) / VEC..b_len / VEC],
                        n_row as u32,
                    );
                    bf.push(f);
                }
                #[unroll]
                for i in 0..tm {
                    let mut af = unsafe {
                        cmma::Matrix::<F>::uninitialized(
                            cmma::MatrixIdent::A,
                            fm,
                            fn_,
                            fk,
                            cmma::MatrixLayout::RowMajor,
                        )
                    };
                    cmma::load(
                        &mut af,
                        &a_s[(i * fm * k_row + k0) / VEC..a_len / VEC],
                        k_row as u32,
                    );
                    #[unroll]
                    for j in 0..tn {
                        let c = acc.index(i * tn + j);
                        cmma::execute(&af, bf.index(j), c, c);
                    }
                }
            }
            if comptime!(mode >= 2) {
                sync_cube();
            }
        }
    }

    // Every accumulator stored, so no product is dead code.
    let frag = comptime!(fm * fn_);
    let base = ((CUBE_POS_X as usize * planes + warp) * comptime!(tm * tn)) * frag;
    #[unroll]
    for t in 0..comptime!(tm * tn) {
        let at = base + t * frag;
        cmma::store(
            &mut out[at..at + frag],
            acc.index(t),
            fn_ as u32,
            cmma::MatrixLayout::RowMajor,
        );
    }
}

/// The f16×f16→f32 fragment shapes `device` reports (empty off wgpu or without cooperative
/// matrices).
pub fn reported_fragments(
    device: &burn::tensor::Device,
) -> Vec<crate::kernels::attention::Fragment> {
    let probe = burn::tensor::Tensor::<1>::zeros([1], (device, DType::F16));
    crate::kernels::resolve(probe)
        .map(|t| crate::kernels::attention::device_fragments(&t.client))
        .unwrap_or_default()
}

/// Launches one ceiling run on `device` (f16 fragments, f32 accumulators); `None` where the
/// GEMM does not run there or the shape is out of range. The caller times it.
pub fn mma_ceiling_launch(
    gemm: MmaGemm,
    device: &burn::tensor::Device,
    mode: Ceiling,
    shape: CeilingShape,
) -> Option<()> {
    let f = gemm.fragment;
    let lanes = shape.planes * gemm.plane;
    if shape.planes == 0
        || lanes > super::mma::MAX_LANES
        || shape.tm == 0
        || shape.tn == 0
        || shape.cubes == 0
        || shape.cubes > 65_535
    {
        return None;
    }
    let iters = u32::try_from(shape.iters).ok()?;
    let len = shape.cubes * shape.planes * shape.tm * shape.tn * f.m * f.n;
    let (_out, out) = output([len], DType::F32, device)?;
    mma_ceiling::launch::<half::f16>(
        &out.client,
        CubeCount::Static(shape.cubes as u32, 1, 1),
        CubeDim::new_1d(lanes as u32),
        VEC,
        buffer_arg(&out),
        iters,
        shape.tm,
        shape.tn,
        f.m,
        f.n,
        f.k,
        shape.planes,
        gemm.plane,
        mode.code(),
    );
    Some(())
}

#[cfg(test)]
mod tests {
    use super::{Ceiling, CeilingShape, MmaGemm, mma_ceiling_launch};
    use crate::kernels::attention::Fragment;

    /// Shapes the kernel cannot take are refused before anything is allocated or launched:
    /// no planes, more lanes than a cube may have, empty accumulators, no cubes or more than a
    /// grid row holds, and iterations past `u32` (lavapipe, whose adapter has no cooperative
    /// matrices: only the checks run).
    #[test]
    fn ceiling_refuses_shapes_it_cannot_launch() {
        let gemm = MmaGemm {
            plane: 32,
            fragment: Fragment {
                m: 16,
                n: 16,
                k: 16,
            },
        };
        let ok = CeilingShape {
            planes: 8,
            tm: 4,
            tn: 2,
            cubes: 4,
            iters: 2,
        };
        let device = crate::kernels::testing::wgpu();
        for (what, shape) in [
            ("no planes", CeilingShape { planes: 0, ..ok }),
            ("over 256 lanes", CeilingShape { planes: 9, ..ok }),
            ("no accumulator rows", CeilingShape { tm: 0, ..ok }),
            ("no accumulator columns", CeilingShape { tn: 0, ..ok }),
            ("no cubes", CeilingShape { cubes: 0, ..ok }),
            (
                "over a grid row",
                CeilingShape {
                    cubes: 65_536,
                    ..ok
                },
            ),
            (
                "iterations past u32",
                CeilingShape {
                    iters: u32::MAX as usize + 1,
                    ..ok
                },
            ),
        ] {
            assert!(
                mma_ceiling_launch(gemm, &device, Ceiling::Products, shape).is_none(),
                "{what}"
            );
        }
    }

    /// A launch's count: every plane's `tm × tn` products, two sub-steps an iteration, each a
    /// `m × n × k` multiply-add.
    #[test]
    fn ceiling_flops_count_every_product() {
        let gemm = MmaGemm {
            plane: 32,
            fragment: Fragment { m: 16, n: 8, k: 16 },
        };
        let shape = CeilingShape {
            planes: 8,
            tm: 4,
            tn: 2,
            cubes: 3,
            iters: 5,
        };
        assert_eq!(shape.flops(gemm), (3 * 8 * 5 * 2 * 8) as f64 * 2.0 * 2048.0);
    }
}
