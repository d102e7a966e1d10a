//! `bench --workgroup-gemm`: the GEMM on workgroup-scope cooperative matrices
//! (`latent_engine::kernels::matmul::linear_workgroup`, NVIDIA's `VK_NV_cooperative_matrix2`)
//! per lane count and tile, each output checked against our plane-scope GEMM on the same inputs
//! and timed beside it, on a 4096³ product and SDXL's linears.

use anyhow::Result;
use burn::tensor::{DType, Device, Distribution, Tensor};
use latent_engine::kernels::matmul::{self, LinearEpilogue, WeightLayout, WorkgroupTile};

use super::profile::device_ms;

/// Tiles tried, `(bm, bn, bk)`; those the device or a shape refuses are skipped.
const TILES: [(usize, usize, usize); 11] = [
    (32, 32, 16),
    (64, 64, 16),
    (128, 128, 32),
    (128, 128, 64),
    (128, 128, 16),
    (128, 256, 32),
    (256, 128, 32),
    (128, 64, 32),
    (64, 128, 32),
    (64, 64, 32),
    (256, 256, 32),
];

/// What a shape's epilogue adds besides the bias.
#[derive(Clone, Copy, PartialEq)]
enum Extra {
    Nothing,
    Residual,
    Geglu,
}

/// `(rows, in, out, bias, extra)`: SDXL's linears (a GEGLU's `out` counts values and gates),
/// then SD 1.5's GEGLU products, most beside the same product with its bias alone.
const SHAPES: [(usize, usize, usize, bool, Extra); 17] = [
    (4096, 4096, 4096, false, Extra::Nothing),
    (8192, 640, 640, true, Extra::Nothing),
    (8192, 640, 1920, false, Extra::Nothing),
    (8192, 640, 5120, true, Extra::Geglu),
    (8192, 2560, 640, true, Extra::Residual),
    (2048, 1280, 1280, true, Extra::Nothing),
    (2048, 1280, 3840, false, Extra::Nothing),
    (2048, 1280, 10240, true, Extra::Geglu),
    (2048, 1280, 10240, true, Extra::Nothing),
    (2048, 5120, 1280, true, Extra::Residual),
    (8192, 320, 320, true, Extra::Nothing),
    (8192, 640, 5120, true, Extra::Nothing),
    (8192, 320, 2560, true, Extra::Geglu),
    (8192, 320, 2560, true, Extra::Nothing),
    (2048, 640, 5120, true, Extra::Geglu),
    (2048, 640, 5120, true, Extra::Nothing),
    (512, 1280, 10240, true, Extra::Geglu),
];

fn relative(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    let diff = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    if got.len() != want.len() || got.iter().any(|v| !v.is_finite()) {
        return f32::INFINITY;
    }
    diff / scale
}

fn values(t: Tensor<2>) -> Vec<f32> {
    t.cast(DType::F32)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap_or_default()
}

/// `LATENT_STUDIO_BENCH_WG=256:128x128x32,128:128x64x32t` keeps those lane counts and tiles
/// only (`t`: tensor-addressed loads) (a driver that loses the device on one variant poisons every later one in the process,
/// so the script runs them one process each); `LATENT_STUDIO_BENCH_WG_SHAPES=n` the first `n`
/// shapes.
fn wanted(lanes: usize, (bm, bn, bk): (usize, usize, usize), tensor: bool) -> bool {
    let t = if tensor { "t" } else { "" };
    match std::env::var("LATENT_STUDIO_BENCH_WG") {
        Ok(list) => list
            .split(',')
            .any(|v| v.trim() == format!("{lanes}:{bm}x{bn}x{bk}{t}")),
        Err(_) => true,
    }
}

fn shape_count() -> usize {
    std::env::var("LATENT_STUDIO_BENCH_WG_SHAPES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX)
}

pub fn report(device: &Device, runs: usize) -> Result<()> {
    let all = matmul::workgroup_gemms(device);
    println!(
        "workgroup-scope cooperative matrices (f16 x f16 -> f32): {}",
        matmul::describe_workgroup(&all)
    );
    let Some(plane_gemm) = matmul::mma_gemm_on(device, DType::F16) else {
        println!("no plane-scope GEMM to check against");
        return Ok(());
    };
    let normal = Distribution::Normal(0.0, 1.0);
    for (rows, d_in, d_out, with_bias, extra) in SHAPES.into_iter().take(shape_count()) {
        let with_residual = extra == Extra::Residual;
        let out_cols = if extra == Extra::Geglu {
            d_out / 2
        } else {
            d_out
        };
        let x = Tensor::<2>::random([rows, d_in], normal, (device, DType::F16));
        // `[out, in]` as checkpoints store it, scaled so the sums stay near 1.
        let w = Tensor::<2>::random([d_out, d_in], normal, (device, DType::F16)).transpose()
            * (1.0 / (d_in as f64).sqrt());
        let bias = with_bias.then(|| Tensor::<1>::random([d_out], normal, (device, DType::F16)));
        let residual = with_residual
            .then(|| Tensor::<2>::random([rows, out_cols], normal, (device, DType::F16)));
        let epilogue = || match (&residual, extra) {
            (Some(r), _) => LinearEpilogue::Residual(r.clone()),
            (None, Extra::Geglu) => LinearEpilogue::Geglu,
            (None, _) => LinearEpilogue::Plain,
        };
        let flops = 2.0 * (rows * d_in * d_out) as f64;
        let tflops = |ms: f64| flops / (ms * 1e-3) / 1e12;
        let plane = || {
            matmul::linear_mma(
                plane_gemm,
                x.clone(),
                &w,
                WeightLayout::OutIn,
                bias.as_ref(),
                None,
                epilogue(),
            )
        };
        let Some(want) = plane() else {
            println!("{rows} x {d_in} -> {d_out}: the plane-scope GEMM refused it");
            continue;
        };
        let want = values(want);
        let plane_ms = device_ms(device, runs, || {
            let _ = plane();
        })?;
        let burn_ms = device_ms(device, runs, || {
            let _ = x.clone().matmul(w.clone());
        })?;
        println!(
            "{rows} x {d_in} -> {d_out}{}{}{}: plane-scope GEMM {plane_ms:.3} ms ({:.1} TFLOP/s), burn's matmul (no epilogue) {burn_ms:.3} ms ({:.1})",
            if with_bias { ", bias" } else { "" },
            if with_residual { ", residual" } else { "" },
            if extra == Extra::Geglu { ", GEGLU" } else { "" },
            tflops(plane_ms),
            tflops(burn_ms)
        );
        row_rules(device, runs, &want, plane_ms, tflops, plane)?;
        for wg in &all {
            for ((bm, bn, bk), tensor) in TILES.into_iter().flat_map(|t| [(t, false), (t, true)]) {
                if !wanted(wg.lanes, (bm, bn, bk), tensor) {
                    continue;
                }
                let tile = WorkgroupTile { bm, bn, bk, tensor };
                let run = || {
                    matmul::linear_workgroup(
                        *wg,
                        x.clone(),
                        &w,
                        WeightLayout::OutIn,
                        bias.as_ref(),
                        epilogue(),
                        tile,
                    )
                };
                let label = format!(
                    "  {} lanes, {bm}x{bn}x{bk}{}",
                    wg.lanes,
                    if tensor { ", tensor loads" } else { "" }
                );
                let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run));
                let got = match got {
                    Ok(Some(t)) => t,
                    Ok(None) => continue,
                    Err(_) => {
                        println!("{label}: panicked");
                        continue;
                    }
                };
                let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    relative(&values(got), &want)
                }));
                let Ok(diff) = checked else {
                    println!("{label}: reading the output panicked");
                    continue;
                };
                let timed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    device_ms(device, runs, || {
                        let _ = run();
                    })
                }));
                match timed {
                    Ok(Ok(ms)) => println!(
                        "{label}: {ms:.3} ms ({:.1} TFLOP/s), {:.2}x the plane-scope GEMM's time, off by {diff:.2e}",
                        tflops(ms),
                        ms / plane_ms
                    ),
                    _ => println!("{label}: off by {diff:.2e}, timing failed"),
                }
            }
        }
    }
    Ok(())
}

/// A product on the plane-scope GEMM with its step-invariant offsets formed the other way
/// (once before the reduction, or at every step), checked against the default's output `want`
/// and timed.
fn row_rules(
    device: &Device,
    runs: usize,
    want: &[f32],
    default_ms: f64,
    tflops: impl Fn(f64) -> f64,
    run: impl Fn() -> Option<Tensor<2>>,
) -> Result<()> {
    use matmul::{gemm_knobs, set_gemm_knobs};
    let knobs = gemm_knobs();
    set_gemm_knobs(matmul::GemmKnobs {
        hoist_rows: !knobs.hoist_rows,
        ..knobs
    });
    let diff = run().map(|t| relative(&values(t), want));
    let ms = device_ms(device, runs, || {
        let _ = run();
    });
    set_gemm_knobs(knobs);
    let ms = ms?;
    println!(
        "  offsets formed once {}: {ms:.3} ms ({:.1} TFLOP/s), {:.2}x the default's time, off by {}",
        !knobs.hoist_rows,
        tflops(ms),
        ms / default_ms,
        diff.map_or("(refused)".to_string(), |d| format!("{d:.2e}"))
    );
    Ok(())
}
