//! Our product on plain lanes (`latent_engine::kernels::matmul`) against burn's `linear` on every
//! linear shape of one UNet step, in both weight layouts a layer holds: time alone, rate, and how
//! far apart the results are.

use anyhow::Result;
use burn::tensor::module::linear;
use burn::tensor::{DType, Device, Distribution, Tensor};
use latent_engine::Precision;
use latent_engine::kernels::matmul::{self, WeightLayout};
use latent_engine::profile::OpShape;

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
