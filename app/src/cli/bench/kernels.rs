//! Every op shape of one UNet step, timed alone through the engine's layer code, with the kernel
//! autotune chose for it (read from cubecl's decision log), so no fallback to a slow kernel can
//! hide inside a block total.

use std::path::{Path, PathBuf};

use anyhow::Result;
use burn::tensor::{DType, Device, Distribution, Tensor};
use latent_engine::nn::isolated::IsolatedOp;
use latent_engine::profile::{OpShape, Recording};
use latent_engine::{Precision, StableDiffusion};
use serde_json::Value;

use super::time_ms;

/// Launches of an op per timed sample.
const REPS: usize = 10;

/// One autotune decision: the key as cubecl wrote it, the winner and its measured time.
#[derive(Debug, Clone)]
struct Decision {
    key: Value,
    kernel: String,
    ms: f64,
}

/// cubecl's decision sink, pointed at a file of ours before the first kernel is tuned.
pub struct DecisionLog {
    path: PathBuf,
    consumed: usize,
}

impl DecisionLog {
    /// Points cubecl's decisions at `path` (emptied). `None` when cubecl's configuration was
    /// already read (too late to change) or the file cannot be made.
    pub fn install(path: &Path) -> Option<Self> {
        use burn::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
        std::fs::write(path, b"").ok()?;
        let mut config = CubeClRuntimeConfig::default();
        config.autotune.decisions.file = Some(path.to_path_buf());
        config.autotune.decisions.append = true;
        CubeClRuntimeConfig::try_set(config).then(|| Self {
            path: path.to_path_buf(),
            consumed: 0,
        })
    }

    /// Decisions written since the last call.
    fn take_new(&mut self) -> Vec<Decision> {
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        let fresh = text.get(self.consumed..).unwrap_or_default();
        // Only whole lines: a line being written is read next time.
        let end = fresh.rfind('\n').map_or(0, |i| i + 1);
        self.consumed += end;
        fresh[..end].lines().filter_map(parse_decision).collect()
    }
}

fn parse_decision(line: &str) -> Option<Decision> {
    let v: Value = serde_json::from_str(line).ok()?;
    let winner = v.get("results")?.get(0)?.get("outcome")?.get("Ok")?;
    let kernel = winner.get("name")?.as_str()?.to_string();
    let time = v.get("fastest_time")?;
    let ms = time
        .get("secs")
        .and_then(Value::as_f64)
        .zip(time.get("nanos").and_then(Value::as_f64))
        .map_or(f64::NAN, |(s, n)| s * 1e3 + n / 1e6);
    Some(Decision {
        key: v.get("key")?.clone(),
        kernel: short_name(&kernel),
        ms,
    })
}

/// The tunable's name without its module path.
fn short_name(name: &str) -> String {
    let base = name.split('<').next().unwrap_or(name);
    base.rsplit("::").next().unwrap_or(base).to_string()
}

/// cubecl's anchor at the default autotune level: the next power of two.
fn anchor(x: usize) -> u64 {
    (x.max(1) as u64).next_power_of_two()
}

/// The first object inside `v` that has a field `field`.
fn find_object<'a>(v: &'a Value, field: &str) -> Option<&'a serde_json::Map<String, Value>> {
    match v {
        Value::Object(map) if map.contains_key(field) => Some(map),
        Value::Object(map) => map.values().find_map(|x| find_object(x, field)),
        Value::Array(items) => items.iter().find_map(|x| find_object(x, field)),
        _ => None,
    }
}

fn numbers(v: Option<&Value>) -> Vec<u64> {
    match v {
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_u64).collect(),
        Some(Value::Number(n)) => n.as_u64().into_iter().collect(),
        _ => Vec::new(),
    }
}

/// Whether a decision's key is burn's convolution key for this op (same kernel, stride and
/// anchored channels, batch and spatial size).
fn conv_key_matches(key: &Value, op: &OpShape) -> bool {
    let OpShape::Conv {
        b,
        c_in,
        c_out,
        h,
        w,
        k,
        stride,
        ..
    } = *op
    else {
        return false;
    };
    let Some(conv) = find_object(key, "kernel_size") else {
        return false;
    };
    let n = |f: &str| numbers(conv.get(f));
    n("kernel_size") == [k as u64, k as u64]
        && n("stride") == [stride as u64, stride as u64]
        && n("in_channels") == [anchor(c_in)]
        && n("out_channels") == [anchor(c_out)]
        && n("batch_size") == [anchor(b)]
        && n("shape") == [anchor(h), anchor(w)]
}

/// A key in one line: its variant and fields, without the alignment details.
fn key_summary(key: &Value) -> String {
    let mut text = key.to_string();
    text.retain(|c| c != '"');
    if text.len() > 150 {
        let cut = (0..=150)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        text.truncate(cut);
        text.push('…');
    }
    text
}

/// Records the op shapes of one UNet step (batch 2, 64×64 latents), then times each alone and
/// prints kernel, time, share of the step and TFLOP/s (or GB/s for the norms). The recording pass
/// is the first forward at this precision, so the decisions it writes are this step's.
pub fn unet_report(
    model: &StableDiffusion,
    device: &Device,
    precision: Precision,
    runs: usize,
    mut log: Option<&mut DecisionLog>,
) -> Result<()> {
    let dtype = precision.dtype();
    let normal = Distribution::Normal(0.0, 1.0);
    let x = Tensor::<4>::random([2, 4, 64, 64], normal, (device, dtype));
    let ctx = Tensor::<3>::random([2, 77, 768], normal, (device, dtype));
    let recording = Recording::start();
    let _ = model.unet()?.forward(x, &[500.0], &ctx);
    let ops = recording.finish();
    super::sync(device)?;
    let decisions = log.as_mut().map(|l| l.take_new()).unwrap_or_default();

    let element = dtype.size();
    println!(
        "[{precision:?}] UNet step op by op ({} shapes, {} ops; each alone, median of {runs}):",
        ops.len(),
        ops.iter().map(|(_, n)| n).sum::<usize>()
    );
    let mut rows = Vec::new();
    let mut total = 0.0;
    for (op, count) in &ops {
        let isolated = IsolatedOp::new(*op, device, dtype);
        // REPS launches between two syncs, so a sync's latency (~0.4 ms) does not swamp small ops.
        let ms = time_ms(device, 1, runs, || {
            for _ in 0..REPS {
                isolated.run();
            }
        })? / REPS as f64;
        total += ms * *count as f64;
        rows.push((*op, *count, ms));
    }
    for (op, count, ms) in &rows {
        let rate = if op.flops() > 0.0 {
            format!("{:7.1} TFLOP/s", op.flops() / (ms * 1e-3) / 1e12)
        } else {
            format!("{:7.0} GB/s   ", op.min_bytes(element) / (ms * 1e-3) / 1e9)
        };
        let kernel = match op {
            OpShape::Conv {
                k,
                c_out,
                c_in,
                b,
                h,
                w,
                stride,
                padding,
                ..
            } if latent_engine::kernels::conv::runs_for(device, dtype, *k, *c_out) => {
                match latent_engine::kernels::conv::mma_on(device, dtype) {
                    None => "ours, implicit GEMM (SIMT)".to_string(),
                    Some(_) => {
                        let side = |n: usize| (n + 2 * padding - k) / stride + 1;
                        let tiles = (b * side(*h) * side(*w)).div_ceil(64) * c_out.div_ceil(64);
                        let steps = (c_in * k * k).div_ceil(16);
                        let split = latent_engine::kernels::conv::splits(tiles, steps) > 1;
                        let rules = latent_engine::kernels::conv::conv_rules();
                        if split && tiles <= rules.split_max_tiles {
                            "ours, implicit GEMM (cmma, split)".to_string()
                        } else if tiles <= rules.gemm_max_tiles || *c_out >= rules.gemm_min_out {
                            "ours, input unrolled on our GEMM (cmma)".to_string()
                        } else {
                            "burn (larger map)".to_string()
                        }
                    }
                }
            }
            OpShape::Conv { .. } => decisions
                .iter()
                .find(|d| conv_key_matches(&d.key, op))
                .map_or_else(
                    || "(no conv decision matched)".to_string(),
                    |d| d.kernel.clone(),
                ),
            OpShape::Linear { rows, d_out, .. } => {
                use latent_engine::kernels::matmul;
                let place = matmul::place_of(device, dtype);
                if matmul::mma_linears() && matmul::mma_gemm_on(device, dtype).is_some() {
                    "ours, cooperative-matrix GEMM".to_string()
                } else if let Some(b) = matmul::product_rules().block(place, dtype, *rows, *d_out) {
                    format!("ours, SIMT product ({b}x{b} lane blocks)")
                } else {
                    "burn matmul".to_string()
                }
            }
            OpShape::Attention { d, n_q, n_k, .. } => {
                latent_engine::kernels::attention::describe(device, dtype, *d, *n_q, *n_k)
            }
            _ => String::new(),
        };
        println!(
            "[{precision:?}]   {:<40} x{count:<3} {ms:8.3} ms  {:5.1}%  {rate}  {kernel}",
            op.to_string(),
            100.0 * ms * *count as f64 / total,
        );
    }
    println!("[{precision:?}]   sum of ops run alone: {total:.2} ms");
    // The largest shares timed again, last: an entry that changes was an artefact of when it ran
    // (clocks, the first ops after the step), not of its kernel.
    let mut largest = rows.clone();
    largest.sort_by(|a, b| (b.2 * b.1 as f64).total_cmp(&(a.2 * a.1 as f64)));
    for (op, _, first) in largest.into_iter().take(4) {
        let isolated = IsolatedOp::new(op, device, dtype);
        let ms = time_ms(device, 1, runs, || {
            for _ in 0..REPS {
                isolated.run();
            }
        })? / REPS as f64;
        println!(
            "[{precision:?}]   {:<40} timed again last: {ms:8.3} ms (first {first:.3} ms)",
            op.to_string()
        );
    }
    attention_report(&ops, device, precision, runs)?;
    super::conv::report(&ops, device, dtype, precision, runs)?;
    super::linear::report(&ops, device, dtype, precision, runs)?;
    if !decisions.is_empty() {
        println!(
            "[{precision:?}] autotune decisions of that step ({}):",
            decisions.len()
        );
        for d in &decisions {
            println!(
                "[{precision:?}]   {:<34} {:8.3} ms  {}",
                d.kernel,
                d.ms,
                key_summary(&d.key)
            );
        }
    }
    Ok(())
}

/// SD 1.5's attention shapes per UNet step (batch 2): self- and cross-attention at each level.
pub fn sd15_attention_shapes() -> Vec<(OpShape, usize)> {
    let shape = |n_q, n_k, d| attention_shape(8, n_q, n_k, d);
    vec![
        (shape(4096, 4096, 40), 5),
        (shape(4096, 77, 40), 5),
        (shape(1024, 1024, 80), 5),
        (shape(1024, 77, 80), 5),
        (shape(256, 256, 160), 5),
        (shape(256, 77, 160), 5),
        (shape(64, 64, 160), 1),
        (shape(64, 77, 160), 1),
    ]
}

/// An attention op of `heads` heads of width `d`, `n_q` queries over `n_k` keys, batch 2 (CFG).
pub fn attention_shape(heads: usize, n_q: usize, n_k: usize, d: usize) -> OpShape {
    OpShape::Attention {
        b: 2,
        heads,
        n_q,
        n_k,
        d,
    }
}

/// SDXL's attention shapes per UNet step at 1024² (batch 2), then SD 1.5's at a 1024² hires
/// pass: the long sequences where attention weighs most.
pub fn long_attention_shapes() -> Vec<(OpShape, usize)> {
    let shape = attention_shape;
    vec![
        (shape(10, 4096, 4096, 64), 10),
        (shape(10, 4096, 77, 64), 10),
        (shape(20, 1024, 1024, 64), 60),
        (shape(20, 1024, 77, 64), 60),
        (shape(8, 16384, 16384, 40), 5),
        (shape(8, 4096, 4096, 80), 5),
    ]
}

/// SD 1.5's 3×3 convolution shapes per UNet step at 512² (batch 2, with bias), with their
/// counts: resnets, down- and upsamplers (the upsampler's as a plain convolution of the
/// upsampled size), `conv_in` and `conv_out`.
pub fn sd15_conv_shapes() -> Vec<(OpShape, usize)> {
    let conv = |c_in, c_out, side, stride| OpShape::Conv {
        b: 2,
        c_in,
        c_out,
        h: side,
        w: side,
        k: 3,
        stride,
        padding: 1,
        bias: true,
    };
    vec![
        (conv(4, 320, 64, 1), 1),
        (conv(320, 320, 64, 1), 7),
        (conv(320, 320, 64, 2), 1),
        (conv(320, 640, 32, 1), 1),
        (conv(640, 640, 32, 1), 6),
        (conv(640, 640, 32, 2), 1),
        (conv(640, 1280, 16, 1), 1),
        (conv(1280, 1280, 16, 1), 7),
        (conv(1280, 1280, 16, 2), 1),
        (conv(1280, 1280, 8, 1), 11),
        (conv(2560, 1280, 8, 1), 3),
        (conv(2560, 1280, 16, 1), 2),
        (conv(1920, 1280, 16, 1), 1),
        (conv(1280, 1280, 32, 1), 1),
        (conv(1920, 640, 32, 1), 1),
        (conv(1280, 640, 32, 1), 1),
        (conv(960, 640, 32, 1), 1),
        (conv(640, 640, 64, 1), 1),
        (conv(960, 320, 64, 1), 1),
        (conv(640, 320, 64, 1), 2),
        (conv(320, 4, 64, 1), 1),
    ]
}

/// The SD VAE decoder's 3×3 convolution shapes at 512² (one image, with bias), with their
/// counts: each level's resnets (the upsamplers' as plain convolutions of the upsampled size).
pub fn vae_conv_shapes() -> Vec<(OpShape, usize)> {
    let conv = |c_in, c_out, side| OpShape::Conv {
        b: 1,
        c_in,
        c_out,
        h: side,
        w: side,
        k: 3,
        stride: 1,
        padding: 1,
        bias: true,
    };
    vec![
        (conv(512, 512, 64), 10),
        (conv(512, 512, 128), 7),
        (conv(512, 512, 256), 1),
        (conv(512, 256, 256), 1),
        (conv(256, 256, 256), 5),
        (conv(256, 256, 512), 1),
        (conv(256, 128, 512), 1),
        (conv(128, 128, 512), 5),
    ]
}

/// Each attention shape of `ops`: burn's attention alone, ours against it, and every tiling of
/// ours that fits the device, each timed alone.
pub fn attention_report(
    ops: &[(OpShape, usize)],
    device: &Device,
    precision: Precision,
    runs: usize,
) -> Result<()> {
    let dtype = precision.dtype();
    let normal = Distribution::Normal(0.0, 1.0);
    // burn's attention alone on contiguous [b, heads, n, d] inputs: what our [b, n, heads·d]
    // layout costs around it.
    for (op, _) in ops {
        if let OpShape::Attention {
            b,
            heads,
            n_q,
            n_k,
            d,
        } = *op
        {
            use burn::tensor::module::attention;
            use burn::tensor::ops::AttentionModuleOptions;
            let q = Tensor::<4>::random([b, heads, n_q, d], normal, (device, dtype));
            let k = Tensor::<4>::random([b, heads, n_k, d], normal, (device, dtype));
            let v = Tensor::<4>::random([b, heads, n_k, d], normal, (device, dtype));
            let options = AttentionModuleOptions {
                scale: None,
                softcap: None,
                is_causal: false,
            };
            let ms = time_ms(device, 1, runs, || {
                for _ in 0..REPS {
                    let _ = attention(q.clone(), k.clone(), v.clone(), None, None, options);
                }
            })? / REPS as f64;
            println!(
                "[{precision:?}]   {:<40} burn attention on [b,h,n,d] alone: {ms:8.3} ms  {:7.1} TFLOP/s",
                op.to_string(),
                op.flops() / (ms * 1e-3) / 1e12
            );
            // Ours against burn's on the same values, as the UNet lays them out.
            let tokens = |t: Tensor<4>, n: usize| t.swap_dims(1, 2).reshape([b, n, heads * d]);
            let (qt, kt, vt) = (
                tokens(q.clone(), n_q),
                tokens(k.clone(), n_k),
                tokens(v.clone(), n_k),
            );
            let at = |t| latent_engine::attention::Heads {
                tensor: t,
                column: 0,
            };
            let ours = latent_engine::attention::heads_attention(
                at(&qt),
                at(&kt),
                at(&vt),
                heads,
                d,
                false,
            );
            let burn = tokens(attention(q, k, v, None, None, options), n_q);
            let read = |t: Tensor<3>| t.cast(DType::F32).into_data().try_to_vec::<f32>();
            let rel = match (read(ours), read(burn.clone())) {
                (Ok(a), Ok(b)) => latent_engine::vae_compile::relative_difference(&a, &b),
                _ => f32::NAN,
            };
            println!(
                "[{precision:?}]   {:<40} ours vs burn attention: max rel diff {rel:.2e}",
                op.to_string()
            );
            // Every tiling of ours that fits the device (those named in LATENT_STUDIO_BENCH_PLANS,
            // comma-separated parts of their names, where set), timed alone on the same inputs,
            // each with its difference from burn's.
            use latent_engine::kernels::attention::{attention_planned, plans};
            let wanted = std::env::var("LATENT_STUDIO_BENCH_PLANS").unwrap_or_default();
            let burn = read(burn).ok();
            for plan in plans(device, dtype, d) {
                let name = plan.to_string();
                if !wanted.is_empty() && !wanted.split(',').any(|w| name.contains(w)) {
                    continue;
                }
                let ms = time_ms(device, 1, runs, || {
                    for _ in 0..REPS {
                        let _ = attention_planned(at(&qt), at(&kt), at(&vt), heads, d, plan);
                    }
                })? / REPS as f64;
                let rel = match (
                    attention_planned(at(&qt), at(&kt), at(&vt), heads, d, plan).map(read),
                    &burn,
                ) {
                    (Some(Ok(a)), Some(b)) => {
                        latent_engine::vae_compile::relative_difference(&a, b)
                    }
                    _ => f32::NAN,
                };
                println!(
                    "[{precision:?}]   {:<40} ours {plan}: {ms:8.3} ms  {:7.1} TFLOP/s  rel {rel:.1e}",
                    op.to_string(),
                    op.flops() / (ms * 1e-3) / 1e12
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_parse_and_match_conv_ops() {
        let line = r#"{"key":{"Conv":{"kernel_size":[3,3],"stride":[1,1],"padding":[[1,1],[1,1]],"dilation":[1,1],"groups":1,"in_channels":1024,"out_channels":1024,"shape":[32,32],"batch_size":2,"has_bias":false,"dtype":"F16"}},"fastest_index":2,"fastest_time":{"secs":0,"nanos":250000},"results":[{"outcome":{"Ok":{"name":"burn_cubecl::kernel::conv::SimpleSyncCmma<f16>","index":2}}}]}"#;
        let d = parse_decision(line).unwrap();
        assert_eq!(d.kernel, "SimpleSyncCmma");
        assert!((d.ms - 0.25).abs() < 1e-9);
        let op = |c_in, h| OpShape::Conv {
            b: 2,
            c_in,
            c_out: 640,
            h,
            w: h,
            k: 3,
            stride: 1,
            padding: 1,
            bias: true,
        };
        // 640 and 960 input channels both anchor to 1024: one decision serves both.
        assert!(conv_key_matches(&d.key, &op(640, 32)));
        assert!(conv_key_matches(&d.key, &op(960, 32)));
        assert!(!conv_key_matches(&d.key, &op(1280, 32)));
        assert!(!conv_key_matches(&d.key, &op(640, 64)));
        assert!(parse_decision("{\"error\": \"x\"}").is_none());
    }
}
