//! Our products against burn's `linear` on every linear shape of one UNet step: the SIMT product
//! on plain lanes (4 × 4 and 8 × 8 lane blocks, with the transformer block's epilogues) and the
//! cooperative-matrix GEMM; device time, rate, and how far apart the results are.

use anyhow::Result;
use burn::tensor::module::linear;
use burn::tensor::{DType, Device, Distribution, Tensor};
use latent_engine::Precision;
use latent_engine::kernels::matmul::{self, LinearEpilogue, Tiling, WeightLayout};
use latent_engine::profile::OpShape;

use super::profile::device_ms;

/// The epilogue a transformer block gives a linear shape: GEGLU's gate on its projection
/// (`out = 8·in`), the residual on the layers that end a branch (square with a bias, or the
/// feed-forward's `4·out → out`); burn fuses both into its matmul.
fn block_epilogue(d_in: usize, d_out: usize, bias: bool) -> Option<bool> {
    if d_out == 8 * d_in {
        Some(true)
    } else if bias && (d_in == d_out || d_in == 4 * d_out) {
        Some(false)
    } else {
        None
    }
}

/// One line per linear shape in `ops` (weights `[out, in]` as checkpoints store them): burn's
/// matmul and the SIMT product in 4 × 4 and 8 × 8 lane blocks, device time (timestamp queries);
/// then the same with the shape's epilogue (burn's fused by burn). Totals a step by count.
pub fn report(
    ops: &[(OpShape, usize)],
    device: &Device,
    dtype: DType,
    precision: Precision,
    runs: usize,
) -> Result<()> {
    let normal = Distribution::Normal(0.0, 1.0);
    let read = |t: Tensor<2>| {
        t.cast(DType::F32)
            .into_data()
            .try_to_vec::<f32>()
            .map_err(|e| anyhow::anyhow!("{e:?}"))
    };
    println!(
        "[{precision:?}] the SIMT product against burn's matmul, device time, median of {runs} (weights [out, in]):"
    );
    let mut totals = [0.0f64; 3];
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
        let residual = Tensor::<2>::random([rows, d_out], normal, (device, dtype));
        let kind = block_epilogue(d_in, d_out, bias);
        let epilogue = match kind {
            Some(true) => LinearEpilogue::Geglu,
            Some(false) => LinearEpilogue::Residual(residual.clone()),
            None => LinearEpilogue::Plain,
        };
        // Burn's matmul and, after it, what burn fuses into it.
        let burn = || {
            let y = linear(x.clone(), weight.clone(), bias_t.clone());
            match kind {
                Some(true) => {
                    let half = d_out / 2;
                    y.clone().narrow(1, 0, half) * latent_engine::nn::gelu(y.narrow(1, half, half))
                }
                Some(false) => y + residual.clone(),
                None => y,
            }
        };
        let flops = op.flops();
        let rate = |ms: f64| flops / (ms * 1e-3) / 1e12;
        let burn_ms = device_ms(device, runs, || {
            let _ = burn();
        })?;
        let want = read(burn())?;
        let mut line = format!(
            "[{precision:?}]   {:<40} x{count:<3} {:<9} burn {burn_ms:7.3} ms {:5.1} TFLOP/s",
            op.to_string(),
            match kind {
                Some(true) => "+gelu",
                Some(false) => "+residual",
                None => "",
            },
            rate(burn_ms)
        );
        totals[0] += burn_ms * count as f64;
        for (i, block) in [4usize, 8].into_iter().enumerate() {
            let tiling = Tiling {
                slices: None,
                block,
                vector: latent_engine::kernels::matmul::product_rules().vector,
                prefetch: latent_engine::kernels::matmul::product_rules().prefetch,
            };
            let ours = || {
                matmul::linear(
                    x.clone(),
                    &weight,
                    WeightLayout::OutIn,
                    bias_t.as_ref(),
                    epilogue.clone(),
                    tiling,
                )
            };
            let Some(first) = ours() else {
                line += &format!(" | {block}x{block} does not run");
                continue;
            };
            let rel = latent_engine::vae_compile::relative_difference(&read(first)?, &want);
            let ms = device_ms(device, runs, || {
                let _ = ours();
            })?;
            totals[i + 1] += ms * count as f64;
            line += &format!(
                " | {block}x{block} {ms:7.3} ms {:5.1} TFLOP/s rel {rel:.0e}",
                rate(ms)
            );
        }
        let place = matmul::place_of(device, dtype);
        let taken = match matmul::product_rules().block(place, dtype, rows, d_out) {
            Some(b) => format!("ours {b}x{b} runs"),
            None => "burn runs".to_string(),
        };
        println!("{line} | {taken}");
    }
    println!(
        "[{precision:?}]   these linears a step (device time, summed by count): burn {:.2} ms, SIMT 4x4 {:.2} ms, SIMT 8x8 {:.2} ms",
        totals[0], totals[1], totals[2]
    );
    Ok(())
}

/// A linear layer's op shape: `rows` tokens, `d_in → d_out`, with or without a bias.
pub fn linear_shape(rows: usize, d_in: usize, d_out: usize, bias: bool) -> OpShape {
    OpShape::Linear {
        rows,
        d_in,
        d_out,
        bias,
    }
}

/// SDXL's main linear shapes per UNet step at 1024² (batch 2), as [`sd15_linear_shapes`]:
/// 10 transformer blocks over 4096 tokens of 640, 60 over 1024 tokens of 1280.
pub fn sdxl_linear_shapes() -> Vec<(OpShape, usize)> {
    let mut v = Vec::new();
    for (rows, c, blocks) in [(8192, 640, 10), (2048, 1280, 60)] {
        v.push((linear_shape(rows, c, c, true), 2 * blocks));
        v.push((linear_shape(rows, c, 3 * c, false), blocks));
        v.push((linear_shape(rows, c, 8 * c, true), blocks));
        v.push((linear_shape(rows, 4 * c, c, true), blocks));
    }
    v
}

/// SD 1.5's main linear shapes per UNet step at 512² (batch 2: tokens × in → out, bias), with
/// their counts: each level's transformer blocks (proj_in/out, the attention outputs and the
/// cross-attention's query, the fused q/k/v, GEGLU and the feed-forward's output) and the
/// cross-attention's keys and values from the 77-token context.
pub fn sd15_linear_shapes() -> Vec<(OpShape, usize)> {
    let mut v = Vec::new();
    for (rows, c, blocks) in [
        (8192, 320, 5),
        (2048, 640, 5),
        (512, 1280, 5),
        (128, 1280, 1),
    ] {
        v.push((linear_shape(rows, c, c, true), 4 * blocks));
        v.push((linear_shape(rows, c, c, false), blocks));
        v.push((linear_shape(rows, c, 3 * c, false), blocks));
        v.push((linear_shape(rows, c, 8 * c, true), blocks));
        v.push((linear_shape(rows, 4 * c, c, true), blocks));
        v.push((linear_shape(154, 768, 2 * c, false), blocks));
    }
    v
}

/// Whether `LATENT_STUDIO_BENCH_KNOBS=small` asks for the small-grid knobs only.
pub fn small_knobs_only() -> bool {
    std::env::var("LATENT_STUDIO_BENCH_KNOBS").is_ok_and(|v| v == "small")
}

/// The GEMM's compilations the reports compare: the default first, then with its sub-steps
/// fenced ([`matmul::GemmKnobs::fence`]) alone and with two stages, then the prefetch and two
/// stages alone, unsplit, and each fixed reduction step. (Lost and
/// removed, BENCHMARKS.md forty-eighth session: the prefetch with two 32-deep stages,
/// double-buffered, SD 1.5's step 30.37 against 25.64 ms; 4 planes of 64 × 32 over 128 × 64
/// tiles, 35.63 against 23.76 and SDXL's 264.1 against 114.6; 4 planes of 64 × 64, lost in
/// every session that ran it.) `LATENT_STUDIO_BENCH_KNOBS=small` keeps the default and the
/// small-grid knobs only; `fence` the default and the fenced ones; `waves` the default and the
/// other tile rule ([`matmul::GemmKnobs::waves`]).
pub fn knob_sets() -> Vec<matmul::GemmKnobs> {
    let base = matmul::GemmKnobs::default();
    let small = [
        base,
        matmul::GemmKnobs {
            split_k: !base.split_k,
            ..base
        },
    ];
    if small_knobs_only() {
        return small.to_vec();
    }
    let fence = matmul::GemmKnobs {
        fence: !base.fence,
        ..base
    };
    let fenced = [fence, matmul::GemmKnobs { stages: 2, ..fence }];
    let mut sets = vec![base];
    sets.extend_from_slice(&fenced);
    if std::env::var("LATENT_STUDIO_BENCH_KNOBS").is_ok_and(|v| v == "fence") {
        return sets;
    }
    if std::env::var("LATENT_STUDIO_BENCH_KNOBS").is_ok_and(|v| v == "waves") {
        return vec![
            base,
            matmul::GemmKnobs {
                waves: !base.waves,
                ..base
            },
            matmul::GemmKnobs {
                tails: !base.tails,
                ..base
            },
        ];
    }
    sets.extend([
        matmul::GemmKnobs {
            prefetch: !base.prefetch,
            ..base
        },
        matmul::GemmKnobs { stages: 2, ..base },
    ]);
    sets.extend_from_slice(&small[1..]);
    sets.extend(matmul::GEMM_STEPS.map(|bk| matmul::GemmKnobs {
        bk: Some(bk),
        ..base
    }));
    sets
}

/// How the reports name a compilation: `bk auto 2x4 s1` (`, checked` with bounds checks).
pub fn knob_label(k: &matmul::GemmKnobs) -> String {
    let bk = k.bk.map_or("auto".to_string(), |b| b.to_string());
    format!(
        "bk {bk} {}x{} s{}{}{}{}{}{}{}",
        k.planes[0],
        k.planes[1],
        k.stages,
        if k.fence { " fenced" } else { "" },
        if k.waves { " waves" } else { "" },
        if k.tails { " tails" } else { "" },
        if k.prefetch { " prefetch" } else { "" },
        if k.split_k { " split-k" } else { "" },
        if k.unchecked { "" } else { ", checked" }
    )
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
