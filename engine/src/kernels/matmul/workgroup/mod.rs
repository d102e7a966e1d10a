//! The GEMM on workgroup-scope cooperative matrices (`VK_NV_cooperative_matrix2`: NVIDIA's
//! drivers on Turing and later). A cube's whole output tile is one matrix the driver spreads over
//! its lanes, and its operands are loaded from global memory as whole `bm × bk` and `bk × bn`
//! matrices: the staging through workgroup memory, its barriers and the overlap of loads with
//! products are the driver's, which is what held our plane-scope GEMM ([`super::mma`]) at half
//! its products' ceiling (BENCHMARKS.md, thirty-second session: the staging stores).
//!
//! Intel's Arc and every other Vulkan driver have only the KHR extension and keep the
//! plane-scope GEMM; a device without the extension never reaches this file
//! ([`workgroup_gemm_on`]).
//!
//! The epilogue: the bias enters as one more product (a `bm × kg` matrix of `1 / kg` times the
//! bias read with a zero stride, so every one of its `kg` rows is the bias), and the residual
//! as the accumulator's first value (loaded in f16, converted to f32). Shapes must be whole
//! tiles (`m`, `n`, `k` multiples of the tile), so no load or store leaves its matrix.

mod kernel;
mod launch;

pub use launch::{linear_workgroup, workgroup_gemm_into};

use burn::cubecl::ir::{ElemType, FloatKind};
use burn::tensor::{DType, Tensor};

use super::super::resolve;

/// What the device offers for f16 × f16 → f32 products on workgroup-scope matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkgroupGemm {
    /// Lanes a cube must have for the configuration.
    pub lanes: usize,
    /// Granularity of every dimension (`m`, `n`, `k`).
    pub granularity: [usize; 3],
    /// Largest dimension a matrix may have.
    pub max_dim: usize,
    /// Whether an f16 accumulator exists at the same lanes (the residual is loaded in f16).
    pub f16_accumulator: bool,
    /// Whether operands may be loaded through tensor layouts.
    pub tensor_addressing: bool,
}

/// The most f32 accumulator values a tile may give each lane.
const MAX_VALUES_PER_LANE: usize = 128;

/// A cube's output tile and reduction step, and how its operands are loaded: as strided
/// matrices (`tensor: false`, the KHR load) or through the extension's tensor layouts (the
/// addressing llama.cpp's NVIDIA matmul uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkgroupTile {
    pub bm: usize,
    pub bn: usize,
    pub bk: usize,
    pub tensor: bool,
}

impl WorkgroupGemm {
    /// Whether `tile` is legal for the device: each side a multiple of its granularity and
    /// within the largest dimension.
    pub fn allows(&self, t: WorkgroupTile) -> bool {
        let [gm, gn, gk] = self.granularity;
        let side = |v: usize, g: usize| g > 0 && v > 0 && v.is_multiple_of(g) && v <= self.max_dim;
        side(t.bm, gm)
            && side(t.bn, gn)
            && side(t.bk, gk)
            && side(gk, gk)
            && (!t.tensor || self.tensor_addressing)
            // At most 128 accumulator values a lane: 32 lanes over a 128 × 128 tile (512 a
            // lane) lost the H200's device (BENCHMARKS.md, fortieth session).
            && t.bm * t.bn <= MAX_VALUES_PER_LANE * self.lanes
    }
}

/// Every f16 × f16 → f32 workgroup-scope configuration the device reports, one per lane count.
pub fn workgroup_gemms(device: &burn::tensor::Device) -> Vec<WorkgroupGemm> {
    if !super::super::available(device) || super::super::cooperative_matrices_off() {
        return Vec::new();
    }
    let Some(probe) = resolve(Tensor::<1>::zeros([1], (device, DType::F16))) else {
        return Vec::new();
    };
    let f16 = ElemType::Float(FloatKind::F16);
    let f32 = ElemType::Float(FloatKind::F32);
    let features = probe.client.features();
    let configs = &features.matmul.cube_mma;
    let tensor_addressing = features.matmul.cmma_tensor_addressing;
    let mut out: Vec<WorkgroupGemm> = configs
        .iter()
        .filter(|c| c.a_type == f16 && c.b_type == f16 && c.cd_type == f32)
        .map(|c| {
            let lanes = c.units_per_block.unwrap_or(0) as usize;
            WorkgroupGemm {
                lanes,
                granularity: [
                    c.m_granularity as usize,
                    c.n_granularity as usize,
                    c.k_granularity as usize,
                ],
                max_dim: c.m_max.min(c.n_max).min(c.k_max) as usize,
                f16_accumulator: configs.iter().any(|h| {
                    h.a_type == f16
                        && h.cd_type == f16
                        && h.units_per_block.unwrap_or(0) as usize == lanes
                }),
                tensor_addressing,
            }
        })
        .filter(|g| g.lanes > 0)
        .collect();
    out.sort_by_key(|g| g.lanes);
    out.dedup();
    out
}

/// The configuration the GEMM takes: 256 lanes where offered, else the most.
pub fn workgroup_gemm_on(device: &burn::tensor::Device) -> Option<WorkgroupGemm> {
    let all = workgroup_gemms(device);
    all.iter()
        .find(|g| g.lanes == 256)
        .or_else(|| all.last())
        .copied()
}

/// The reported configurations, one line (`devices` and the bench print it).
pub fn describe(gemms: &[WorkgroupGemm]) -> String {
    if gemms.is_empty() {
        return "none".into();
    }
    gemms
        .iter()
        .map(|g| {
            let [m, n, k] = g.granularity;
            format!(
                "{} lanes, {m}x{n}x{k} granularity, up to {}{}{}",
                g.lanes,
                g.max_dim,
                if g.f16_accumulator {
                    ""
                } else {
                    ", no f16 accumulator"
                },
                if g.tensor_addressing {
                    ", tensor addressing"
                } else {
                    ""
                }
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nv() -> WorkgroupGemm {
        WorkgroupGemm {
            lanes: 256,
            granularity: [16, 16, 16],
            max_dim: 256,
            f16_accumulator: true,
            tensor_addressing: false,
        }
    }

    #[test]
    fn tiles_follow_the_devices_granularity() {
        let t = |bm, bn, bk| WorkgroupTile {
            bm,
            bn,
            bk,
            tensor: false,
        };
        assert!(nv().allows(t(128, 128, 32)));
        assert!(nv().allows(t(256, 128, 64)));
        assert!(!nv().allows(t(128, 512, 32)), "past the largest dimension");
        assert!(!nv().allows(t(120, 128, 32)), "not a multiple of 16");
        assert!(!nv().allows(t(128, 128, 0)));
        assert!(!nv().allows(t(256, 256, 32)), "256 values a lane");
        let narrow = WorkgroupGemm { lanes: 32, ..nv() };
        assert!(narrow.allows(t(32, 32, 16)));
        assert!(!narrow.allows(t(128, 128, 32)), "512 values a lane");
        let tensor = WorkgroupTile {
            tensor: true,
            ..t(128, 128, 32)
        };
        assert!(!nv().allows(tensor), "no tensor addressing");
        let addressing = WorkgroupGemm {
            tensor_addressing: true,
            ..nv()
        };
        assert!(addressing.allows(tensor));
    }

    /// No device here has the extension: lavapipe and the CPU report none.
    #[test]
    fn nothing_on_devices_without_the_extension() {
        let device = crate::kernels::testing::wgpu();
        assert!(workgroup_gemms(&device).is_empty());
        assert!(workgroup_gemm_on(&burn::tensor::Device::flex()).is_none());
        assert_eq!(describe(&[]), "none");
    }
}
