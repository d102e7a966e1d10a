//! Our product on plain lanes (`latent_engine::kernels::matmul`) against burn's `linear` on every
//! linear shape of one UNet step, in both weight layouts a layer holds: time alone, rate, and how
//! far apart the results are.

use anyhow::Result;
use burn::tensor::module::linear;
use burn::tensor::{DType, Device, Distribution, Tensor};
use latent_engine::Precision;
use latent_engine::kernels::matmul::{self, WeightLayout};
use latent_engine::profile::OpShape;

use super::profile::device_ms;
use super::time_ms;

const REPS: usize = 10;

/// One line per linear shape in `ops` (and per weight layout).
pub fn report(
    ops: &[(OpShape, usize)],
    device: &Device,
    dtype: DType,
    precision: Precision,
    runs: usize,
) -> Result<()> {
    let normal = Distribution::Normal(0.0, 1.0);
    for (op, _) in ops {
        let OpShape::Linear {
            rows,
            d_in,
            d_out,
            bias,
        } = *op
        else {
            continue;
        };
        let x = Tensor::<2>::random([rows, d_in], normal, (device, dtype));
        let out_in = Tensor::<2>::random([d_out, d_in], normal, (device, dtype)) * 0.05;
        // `[in, out]` as a view of `[out, in]` (checkpoint layers), and written out (q/k/v).
        let as_out_in = out_in.clone().transpose();
        let as_in_out = Tensor::<2>::from_data(out_in.transpose().into_data(), (device, dtype));
        let bias_t = bias.then(|| Tensor::<1>::random([d_out], normal, (device, dtype)));
        let rate = |ms: f64| op.flops() / (ms * 1e-3) / 1e12;
        for (weight, layout) in [
            (&as_out_in, WeightLayout::OutIn),
            (&as_in_out, WeightLayout::InOut),
        ] {
            let burn = || linear(x.clone(), weight.clone(), bias_t.clone());
            let burn_ms = time_ms(device, 1, runs, || {
                for _ in 0..REPS {
                    let _ = burn();
                }
            })? / REPS as f64;
            let ours = || matmul::linear(x.clone(), weight, layout, bias_t.as_ref(), None);
            let Some(first) = ours() else {
                println!(
                    "[{precision:?}]   {:<40} {layout:?}: burn {burn_ms:8.3} ms {:6.1} TFLOP/s | ours does not run here",
                    op.to_string(),
                    rate(burn_ms)
                );
                continue;
            };
            let ours_ms = time_ms(device, 1, runs, || {
                for _ in 0..REPS {
                    let _ = ours();
                }
            })? / REPS as f64;
            let read = |t: Tensor<2>| t.cast(DType::F32).into_data().try_to_vec::<f32>();
            let rel = match (read(first), read(burn())) {
                (Ok(a), Ok(b)) => latent_engine::vae_compile::relative_difference(&a, &b),
                _ => f32::NAN,
            };
            let taken = if matmul::runs_on(device, dtype) {
                "ours runs"
            } else {
                "burn runs"
            };
            println!(
                "[{precision:?}]   {:<40} {layout:?}: ours (SIMT) {ours_ms:8.3} ms {:6.1} TFLOP/s | burn {burn_ms:8.3} ms {:6.1} TFLOP/s | rel diff {rel:.1e} | {taken}",
                op.to_string(),
                rate(ours_ms),
                rate(burn_ms),
            );
        }
    }
    Ok(())
}

/// SD 1.5's main linear shapes per UNet step at 512² (batch 2: tokens × in → out, bias), with
/// their counts: each level's transformer blocks (proj_in/out, the attention outputs and the
/// cross-attention's query, the fused q/k/v, GEGLU and the feed-forward's output) and the
/// cross-attention's keys and values from the 77-token context.
pub fn sd15_linear_shapes() -> Vec<(OpShape, usize)> {
    let lin = |rows, d_in, d_out, bias| OpShape::Linear {
        rows,
        d_in,
        d_out,
        bias,
    };
    let mut v = Vec::new();
    for (rows, c, blocks) in [
        (8192, 320, 5),
        (2048, 640, 5),
        (512, 1280, 5),
        (128, 1280, 1),
    ] {
        v.push((lin(rows, c, c, true), 4 * blocks));
        v.push((lin(rows, c, c, false), blocks));
        v.push((lin(rows, c, 3 * c, false), blocks));
        v.push((lin(rows, c, 8 * c, true), blocks));
        v.push((lin(rows, 4 * c, c, true), blocks));
        v.push((lin(154, 768, 2 * c, false), blocks));
    }
    v
}

/// The GEMM's compilations the reports compare: the automatic reduction step, then each step.
pub fn knob_sets() -> Vec<matmul::GemmKnobs> {
    std::iter::once(None)
        .chain(matmul::GEMM_STEPS.map(Some))
        .map(|bk| matmul::GemmKnobs {
            bk,
            ..Default::default()
        })
        .collect()
}

/// How the reports name a compilation: `bk auto`, `bk 32` (`, checked` with bounds checks).
pub fn knob_label(k: &matmul::GemmKnobs) -> String {
    let bk = k.bk.map_or("auto".to_string(), |b| b.to_string());
    format!("bk {bk}{}", if k.unchecked { "" } else { ", checked" })
}

/// Runs an op of ours under each of [`knob_sets`]: `values` runs it once and reads its result
/// (`None`: it does not run here), `launch` enqueues it for the device-time median. Appends each
/// compilation's time, rate and difference from `want` to `line`, and adds its time × `count`
/// to `totals`.
#[allow(clippy::too_many_arguments)]
pub(super) fn knob_sweep(
    device: &Device,
    runs: usize,
    count: usize,
    want: &[f32],
    rate: impl Fn(f64) -> f64,
    totals: &mut [f64],
    line: &mut String,
    mut values: impl FnMut() -> Option<Vec<f32>>,
    mut launch: impl FnMut(),
) -> Result<()> {
    let default = matmul::gemm_knobs();
    for (i, k) in knob_sets().iter().enumerate() {
        matmul::set_gemm_knobs(*k);
        let Some(first) = values() else {
            *line += " | does not run";
            break;
        };
        let rel = latent_engine::vae_compile::relative_difference(&first, want);
        let ms = device_ms(device, runs, &mut launch)?;
        totals[i] += ms * count as f64;
        *line += &format!(
            " | {} {ms:7.3} ms {:6.1} TFLOP/s rel {rel:.0e}",
            knob_label(k),
            rate(ms)
        );
    }
    matmul::set_gemm_knobs(default);
    Ok(())
}

/// The sums a step of [`knob_sweep`]'s totals, one per compilation.
pub(super) fn knob_totals(totals: &[f64]) -> String {
    knob_sets()
        .iter()
        .zip(totals)
        .map(|(k, t)| format!("{} {t:.2} ms", knob_label(k)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Our cooperative-matrix GEMM (`matmul::linear_mma`, automatic tile, each of [`knob_sets`])
/// against burn's `linear` on every shape of `ops`, weights `[out, in]` as checkpoints store
/// them; device time of the kernels (timestamp queries), not wall time.
pub fn gemm_report(
    ops: &[(OpShape, usize)],
    device: &Device,
    precision: Precision,
    runs: usize,
) -> Result<()> {
    let dtype = precision.dtype();
    let Some(gemm) = matmul::mma_gemm_on(device, dtype) else {
        println!("[{precision:?}] our cooperative-matrix GEMM does not run here");
        return Ok(());
    };
    println!(
        "[{precision:?}] our cooperative-matrix GEMM: plane {}, fragment {}x{}x{}; device time per op, median of {runs}",
        gemm.plane, gemm.fragment.m, gemm.fragment.n, gemm.fragment.k
    );
    let normal = Distribution::Normal(0.0, 1.0);
    let mut burn_total = 0.0;
    let mut ours_total = vec![0.0; knob_sets().len()];
    for &(op, count) in ops {
        let OpShape::Linear {
            rows,
            d_in,
            d_out,
            bias,
        } = op
        else {
            continue;
        };
        let x = Tensor::<2>::random([rows, d_in], normal, (device, dtype));
        let weight = Tensor::<2>::random([d_out, d_in], normal, (device, dtype)).transpose() * 0.05;
        let bias_t = bias.then(|| Tensor::<1>::random([d_out], normal, (device, dtype)));
        let rate = |ms: f64| op.flops() / (ms * 1e-3) / 1e12;
        let burn = || linear(x.clone(), weight.clone(), bias_t.clone());
        let burn_ms = device_ms(device, runs, || {
            let _ = burn();
        })?;
        let read = |t: Tensor<2>| t.cast(DType::F32).into_data().try_to_vec::<f32>();
        let want = read(burn()).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let (tm, tn) = gemm.tiles_for(rows, d_out, 1);
        let mut line = format!(
            "[{precision:?}]   {:<40} x{count:<3} burn {burn_ms:7.3} ms {:6.1} TFLOP/s | ours {tm}x{tn}",
            op.to_string(),
            rate(burn_ms)
        );
        let ours = |epilogue: matmul::LinearEpilogue<2>| {
            matmul::linear_mma(
                gemm,
                x.clone(),
                &weight,
                WeightLayout::OutIn,
                bias_t.as_ref(),
                None,
                epilogue,
            )
        };
        let plain = || ours(matmul::LinearEpilogue::Plain);
        knob_sweep(
            device,
            runs,
            count,
            &want,
            rate,
            &mut ours_total,
            &mut line,
            || plain().and_then(|t| read(t).ok()),
            || {
                let _ = plain();
            },
        )?;
        burn_total += burn_ms * count as f64;
        println!("{line}");
        // The epilogues a transformer block uses: GEGLU's gate on its projection, the residual
        // on the layers that end a branch (burn fuses both into its matmul).
        let geglu = d_out == 8 * d_in;
        if geglu || (bias && d_in != d_out * 3) {
            let residual = Tensor::<2>::random([rows, d_out], normal, (device, dtype));
            let burn_fused = || {
                let y = burn();
                if geglu {
                    let half = d_out / 2;
                    y.clone().narrow(1, 0, half) * latent_engine::nn::gelu(y.narrow(1, half, half))
                } else {
                    y + residual.clone()
                }
            };
            let epilogue = if geglu {
                matmul::LinearEpilogue::Geglu
            } else {
                matmul::LinearEpilogue::Residual(residual.clone())
            };
            let fused = || ours(epilogue.clone());
            let name = if geglu {
                "value · gelu(gate)"
            } else {
                "+ residual"
            };
            let Some(first) = fused() else {
                println!("[{precision:?}]     {name}: ours does not run");
                continue;
            };
            let want = read(burn_fused()).map_err(|e| anyhow::anyhow!("{e:?}"))?;
            let rel = match read(first) {
                Ok(a) => latent_engine::vae_compile::relative_difference(&a, &want),
                Err(_) => f32::NAN,
            };
            let burn_ms = device_ms(device, runs, || {
                let _ = burn_fused();
            })?;
            let ms = device_ms(device, runs, || {
                let _ = fused();
            })?;
            println!(
                "[{precision:?}]     {name}: burn (fused by burn) {burn_ms:7.3} ms | ours in the epilogue {ms:7.3} ms rel {rel:.0e}"
            );
        }
    }
    println!(
        "[{precision:?}]   these linears a step (device time, summed by count): burn {burn_total:.2} ms, ours {}",
        knob_totals(&ours_total)
    );
    Ok(())
}
