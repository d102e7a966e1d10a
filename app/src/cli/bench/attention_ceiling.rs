//! `bench --attention-ceiling`: where the planes attention kernel's time goes. Each long shape
//! of SD 1.5 and SDXL under its default tiling, with parts of the kernel left out in turn
//! (`latent_engine::kernels::attention::planes_knock`: the output's rescaling, the row-maximum
//! pass, the scalar softmax, the key/value global loads, their staging and the cube barriers,
//! the plane barriers), with one and with two fragments of query rows a plane; before that
//! every planes tiling of the default's compilation whole. Device-timed medians. Every whole
//! kernel's output (nothing left out) is checked against burn's attention on the same inputs.

use anyhow::Result;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{DType, Device, Distribution, Tensor};
use latent_engine::Precision;
use latent_engine::attention::Heads;
use latent_engine::kernels::attention::{
    attention_knocked, default_plan, planes_knock as knock, plans, set_planes_rows,
};
use latent_engine::profile::OpShape;

use super::profile::device_ms;

/// The ladder timed: each step leaves out one more part (the first is the whole kernel), but
/// the last, which leaves out the rescale and the plane barriers only.
const LADDER: [(u32, &str); 8] = [
    (0, "whole kernel"),
    (knock::RESCALE, "no rescale"),
    (knock::RESCALE | knock::MAX_PASS, "no rescale, no max pass"),
    (knock::RESCALE | knock::SOFTMAX, "no scalar softmax"),
    (
        knock::RESCALE | knock::SOFTMAX | knock::GLOBAL,
        "no scalar softmax, no global loads",
    ),
    (
        knock::RESCALE | knock::SOFTMAX | knock::STAGE,
        "no scalar softmax, no staging or cube barriers",
    ),
    (
        knock::RESCALE | knock::SOFTMAX | knock::STAGE | knock::PLANE_SYNC,
        "no softmax, staging or plane barriers",
    ),
    (
        knock::RESCALE | knock::PLANE_SYNC,
        "no rescale, no plane barriers (softmax kept)",
    ),
];

/// The shapes (batch 2): SDXL's two self-attention levels at 1024², its cross-attention, and
/// SD 1.5's two widest self-attention levels at 512².
fn shapes() -> Vec<OpShape> {
    let shape = super::kernels::attention_shape;
    vec![
        shape(10, 4096, 4096, 64),
        shape(20, 1024, 1024, 64),
        shape(10, 4096, 77, 64),
        shape(8, 4096, 4096, 40),
        shape(8, 1024, 1024, 80),
    ]
}

pub fn report(device: &Device, precision: Precision, runs: usize) -> Result<()> {
    let dtype = precision.dtype();
    if dtype != DType::F16 {
        println!("[{precision:?}] the planes kernel runs in f16 only: no attention ceiling");
        return Ok(());
    }
    let normal = Distribution::Normal(0.0, 1.0);
    for op in shapes() {
        let OpShape::Attention {
            b,
            heads,
            n_q,
            n_k,
            d,
        } = op
        else {
            continue;
        };
        let Some(plan) = default_plan(device, dtype, d, n_q, n_k) else {
            println!("  {op}: no plan of ours by default");
            continue;
        };
        if plan.plane.is_none() {
            println!("  {op}: default plan {plan} is not the planes kernel");
            continue;
        }
        let q = Tensor::<4>::random([b, heads, n_q, d], normal, (device, dtype));
        let k = Tensor::<4>::random([b, heads, n_k, d], normal, (device, dtype));
        let v = Tensor::<4>::random([b, heads, n_k, d], normal, (device, dtype));
        let tokens = |t: Tensor<4>, n: usize| t.swap_dims(1, 2).reshape([b, n, heads * d]);
        let options = AttentionModuleOptions {
            scale: None,
            softcap: None,
            is_causal: false,
        };
        let read = |t: Tensor<3>| t.cast(DType::F32).into_data().try_to_vec::<f32>().ok();
        let reference = read(tokens(
            attention(q.clone(), k.clone(), v.clone(), None, None, options),
            n_q,
        ));
        // Scores spread far past any first tile's maximum: a walk with tiles in registers must
        // spill into its second walk and still agree (the round trip's tilings beside it).
        let loud = q.clone() * 12.0;
        let loud_reference = read(tokens(
            attention(loud.clone(), k.clone(), v.clone(), None, None, options),
            n_q,
        ));
        let loud = tokens(loud, n_q);
        let (qt, kt, vt) = (tokens(q, n_q), tokens(k, n_k), tokens(v, n_k));
        let at = |t| Heads {
            tensor: t,
            column: 0,
        };
        let check = |plan| {
            let whole = attention_knocked(at(&qt), at(&kt), at(&vt), heads, d, plan, 0);
            match (whole.and_then(read), &reference) {
                (Some(a), Some(r)) => latent_engine::vae_compile::relative_difference(&a, r),
                _ => f32::NAN,
            }
        };
        // Every planes tiling of the default's compilation.
        let tilings = plans(device, dtype, d).into_iter().filter(|p| {
            p.plane.is_some() && p.wide_loads == plan.wide_loads && p.prefetch == plan.prefetch
        });
        for tiling in tilings {
            let rel = check(tiling);
            // Every tiling, so that the round trip's figure stands beside the second walks'.
            let whole = attention_knocked(at(&loud), at(&kt), at(&vt), heads, d, tiling, 0);
            let loud_rel = match (whole.and_then(read), &loud_reference) {
                (Some(a), Some(r)) => latent_engine::vae_compile::relative_difference(&a, r),
                _ => f32::NAN,
            };
            println!("  {op} {tiling}, q × 12: max rel diff to burn's {loud_rel:.1e}");
            let ms = device_ms(device, runs, || {
                let _ = attention_knocked(at(&qt), at(&kt), at(&vt), heads, d, tiling, 0);
            });
            match ms {
                Ok(ms) => println!(
                    "  {op} {tiling}: {ms:8.3} ms  {:7.1} TFLOP/s  (max rel diff to burn's {rel:.1e})",
                    op.flops() / (ms * 1e-3) / 1e12
                ),
                Err(e) => println!("  {op} {tiling}: not timed: {e}"),
            }
        }
        // LATENT_STUDIO_BENCH_LADDER=0: the tilings only.
        let ladder = !std::env::var("LATENT_STUDIO_BENCH_LADDER").is_ok_and(|v| v == "0");
        // The ladder knocks out parts of the round trip: its tiles, whatever the default takes.
        let plan = latent_engine::kernels::attention::Plan {
            elementwise: false,
            ..plan
        };
        for rows in [1usize, 2].into_iter().filter(|_| ladder) {
            set_planes_rows(Some(rows));
            let rel = check(plan);
            println!(
                "  {op} {plan}, {rows} row fragment(s) a plane: max rel diff to burn's {rel:.1e}"
            );
            for (bits, name) in &LADDER {
                let ms = device_ms(device, runs, || {
                    let _ = attention_knocked(at(&qt), at(&kt), at(&vt), heads, d, plan, *bits);
                });
                match ms {
                    Ok(ms) => println!(
                        "    {name:<48} {ms:8.3} ms  {:7.1} TFLOP/s",
                        op.flops() / (ms * 1e-3) / 1e12
                    ),
                    Err(e) => println!("    {name:<48} not timed: {e}"),
                }
            }
        }
        set_planes_rows(None);
    }
    Ok(())
}
