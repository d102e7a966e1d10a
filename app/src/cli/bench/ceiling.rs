//! `bench --mma-ceiling`: what the cooperative matrices deliver with global memory out of the
//! way (`latent_engine::kernels::matmul::Ceiling`), per plane arrangement and fragment shape,
//! beside our GEMM and burn's matmul on a 4096³ product and every GEMM compilation on SDXL's
//! linear shapes, in the same process. (The op-alone times are not reliable to ±10 % on these
//! machines, BENCHMARKS.md twenty-second session; the ceiling's repeated within 1 % over two calls.)

use anyhow::Result;
use burn::tensor::{DType, Device, Distribution, Tensor};
use latent_engine::Precision;
use latent_engine::kernels::matmul::{self, Ceiling, CeilingShape, WeightLayout};

use super::profile::device_ms;

/// Plane arrangements timed: `(planes, tm, tn)`, the GEMM's default first.
const ARRANGEMENTS: [(usize, usize, usize); 6] = [
    (8, 4, 2),
    (8, 2, 2),
    (4, 4, 4),
    (4, 2, 8),
    (4, 4, 2),
    (8, 2, 4),
];

/// Cubes a launch: enough waves to fill any GPU we bench on.
const CUBES: usize = 4 * 1056;
/// Iterations a plane (two 16-deep sub-steps each).
const ITERS: usize = 512;

pub fn report(device: &Device, precision: Precision, runs: usize) -> Result<()> {
    let Some(gemm) = matmul::mma_gemm_on(device, DType::F16) else {
        println!("[{precision:?}] no cooperative-matrix GEMM here: no ceiling to time");
        return Ok(());
    };
    let f = gemm.fragment;
    println!(
        "cooperative-matrix ceiling: plane {}, fragment {}x{}x{} f16 -> f32, {CUBES} cubes x {ITERS} iterations, median of {runs}",
        gemm.plane, f.m, f.n, f.k
    );
    for (planes, tm, tn) in ARRANGEMENTS {
        let shape = CeilingShape {
            planes,
            tm,
            tn,
            cubes: CUBES,
            iters: ITERS,
        };
        let mut line = format!(
            "  {planes} planes of {}x{} ({tm}x{tn} accumulators):",
            tm * f.m,
            tn * f.n
        );
        for mode in Ceiling::ALL {
            if matmul::mma_ceiling_launch(gemm, device, mode, shape).is_none() {
                line += &format!(" {mode} refused |");
                continue;
            }
            let ms = device_ms(device, runs, || {
                let _ = matmul::mma_ceiling_launch(gemm, device, mode, shape);
            })?;
            let rate = shape.flops(gemm) / (ms * 1e-3) / 1e12;
            line += &format!(" {mode} {rate:6.1} TFLOP/s ({ms:.3} ms) |");
        }
        println!("{line}");
    }
    // Products alone on every fragment shape the device reports (the kernels take 16×16×16).
    for fragment in matmul::reported_fragments(device) {
        let other = matmul::MmaGemm { fragment, ..gemm };
        let shape = CeilingShape {
            planes: 8,
            tm: 4,
            tn: 2,
            cubes: CUBES,
            iters: ITERS,
        };
        let mode = Ceiling::Products;
        if matmul::mma_ceiling_launch(other, device, mode, shape).is_none() {
            continue;
        }
        let ms = device_ms(device, runs, || {
            let _ = matmul::mma_ceiling_launch(other, device, mode, shape);
        })?;
        println!(
            "  fragment {}x{}x{}, 8 planes of 4x2 accumulators, {mode}: {:.1} TFLOP/s ({ms:.3} ms)",
            fragment.m,
            fragment.n,
            fragment.k,
            shape.flops(other) / (ms * 1e-3) / 1e12
        );
    }
    // The GEMM itself on a square product, for the same process's comparison.
    let normal = Distribution::Normal(0.0, 1.0);
    let n: usize = 4096;
    let x = Tensor::<2>::random([n, n], normal, (device, DType::F16));
    let w = Tensor::<2>::random([n, n], normal, (device, DType::F16)).transpose() * 0.05;
    let ms = device_ms(device, runs, || {
        let _ = matmul::linear_mma(
            gemm,
            x.clone(),
            &w,
            WeightLayout::OutIn,
            None,
            None,
            matmul::LinearEpilogue::Plain,
        );
    })?;
    let burn_ms = device_ms(device, runs, || {
        let _ = x.clone().matmul(w.clone());
    })?;
    let flops = 2.0 * (n * n * n) as f64;
    println!(
        "  our GEMM {n}^3: {:.1} TFLOP/s ({ms:.3} ms); burn's matmul {:.1} TFLOP/s ({burn_ms:.3} ms)",
        flops / (ms * 1e-3) / 1e12,
        flops / (burn_ms * 1e-3) / 1e12
    );
    // Every compilation of the GEMM on SDXL's linear shapes.
    let square = super::linear::linear_shape(n, n, n, false);
    let shapes: Vec<_> = std::iter::once((square, 0))
        .chain(super::linear::sdxl_linear_shapes())
        .collect();
    super::linear::gemm_report(&shapes, device, precision, runs)?;
    Ok(())
}
