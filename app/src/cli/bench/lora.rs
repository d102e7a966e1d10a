//! LoRA on the full-size model: what merging a LoRA into the weights costs once, what a step
//! costs with the merged weights against the base, and what applying the same LoRA as low-rank
//! products beside every layer would add to each step (the alternative to merging).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use burn::tensor::module::conv2d;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Device, Distribution, Tensor};
use latent_engine::lora::keys::{Net, flatten};
use latent_engine::lora::{Lora, LoraSet, LoraUse};
use latent_engine::profile::{OpShape, Recording};
use latent_engine::unet::graph::{UNetSteps, WARMUP_RUNS};
use latent_engine::{Precision, StableDiffusion};

use super::{sync, time_ms};

/// A rank-`rank` LoRA on every matrix and convolution of the text encoder and UNet (kohya names,
/// f32, small random factors), written to a temporary file.
fn write_lora(model: &StableDiffusion, rank: usize) -> Result<std::path::PathBuf> {
    let path = std::env::temp_dir().join(format!("latent-studio-bench-lora-r{rank}.safetensors"));
    let mut header = serde_json::Map::new();
    let mut data: Vec<u8> = Vec::new();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut push = |name: String, shape: Vec<usize>, data: &mut Vec<u8>| {
        let n: usize = shape.iter().product();
        let start = data.len();
        for _ in 0..n {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let v = ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.02;
            data.extend_from_slice(&v.to_le_bytes());
        }
        header.insert(
            name,
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    };
    for (net, name, shape) in model.lora_targets() {
        let module = name.trim_end_matches(".weight");
        let prefix = match net {
            Net::TextEncoder => "lora_te1_",
            Net::TextEncoder2 => "lora_te2_",
            Net::Unet => "lora_unet_",
        };
        let stem = format!("{prefix}{}", flatten(module));
        let mut down = vec![rank];
        down.extend_from_slice(&shape[1..]);
        let mut up = vec![shape[0], rank];
        up.extend(std::iter::repeat_n(1, shape.len() - 2));
        push(format!("{stem}.lora_down.weight"), down, &mut data);
        push(format!("{stem}.lora_up.weight"), up, &mut data);
    }
    let header = serde_json::Value::Object(header).to_string();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&data);
    std::fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

pub(super) fn lora_bench(
    model: &StableDiffusion,
    device: &Device,
    precision: Precision,
    rank: usize,
    runs: usize,
    x: &Tensor<4>,
    ctx: &Tensor<3>,
) -> Result<()> {
    let path = write_lora(model, rank)?;
    let t = Instant::now();
    let lora = Arc::new(Lora::open(&path)?);
    println!(
        "[{precision:?}] LoRA rank {rank} on all {} layers ({:.0} MiB f32): opened and hashed in {:.0} ms",
        lora.layers.len(),
        std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) as f64 / (1u64 << 20) as f64,
        t.elapsed().as_secs_f64() * 1e3
    );
    let set = |strength: f32| {
        LoraSet(vec![LoraUse {
            lora: lora.clone(),
            te: strength,
            unet: strength,
        }])
    };
    // Merging: alternate two strengths so that every call merges again.
    let mut merges = Vec::new();
    for i in 0..runs.max(1) + 1 {
        let t = Instant::now();
        let _ = model.networks(&set(if i % 2 == 0 { 0.8 } else { 0.7 }))?;
        sync(device)?;
        merges.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let first = merges.remove(0);
    merges.sort_by(f64::total_cmp);
    println!(
        "[{precision:?}]   merge into the text encoder and UNet on the device: median {:.0} ms (first {first:.0} ms)",
        merges[merges.len() / 2]
    );
    // A step with merged weights against the base, replayed as txt2img runs it, interleaved,
    // with a control: a set on the text encoder only, whose UNet is the base's own.
    let rebuilt = model.networks(&LoraSet(vec![LoraUse {
        lora: lora.clone(),
        te: 0.5,
        unet: 0.0,
    }]))?;
    let merged_again = model.networks(&set(0.8))?;
    // One recorded graph at a time, as a generation keeps one (a second recording would run
    // launch by launch): each network records its own step, is timed, and releases it.
    let nets = [&model.unet()?, &merged_again.unet, &rebuilt.unet];
    let mut times = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..3 {
        for (unet, t) in nets.iter().zip(&mut times) {
            let mut steps = UNetSteps::new(unet, ctx.clone());
            for _ in 0..=WARMUP_RUNS {
                let _ = steps.forward(x.clone(), 500.0);
            }
            sync(device)?;
            t.push(time_ms(device, 1, runs, || {
                let _ = steps.forward(x.clone(), 500.0);
            })?);
            steps.release();
        }
    }
    let [base, with, through] = times.map(|mut v| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    });
    println!(
        "[{precision:?}]   UNet step replayed, three rounds: base {base:.2} ms, LoRA merged {with:.2} ms, \
         text-encoder-only set (UNet shared with the base) {through:.2} ms"
    );

    // The alternative: the same rank's products beside every UNet layer of one step.
    let recording = Recording::start();
    let _ = model.unet()?.forward(x.clone(), &[500.0], ctx);
    let ops = recording.finish();
    sync(device)?;
    let dtype = precision.dtype();
    let normal = Distribution::Normal(0.0, 0.02);
    let mut side: Vec<Box<dyn Fn() -> Tensor<1>>> = Vec::new();
    for (op, count) in ops {
        for _ in 0..count {
            match op {
                OpShape::Linear {
                    rows, d_in, d_out, ..
                } => {
                    let input = Tensor::<2>::random([rows, d_in], normal, (device, dtype));
                    let down = Tensor::<2>::random([d_in, rank], normal, (device, dtype));
                    let up = Tensor::<2>::random([rank, d_out], normal, (device, dtype));
                    side.push(Box::new(move || {
                        input.clone().matmul(down.clone()).matmul(up.clone()).sum()
                    }));
                }
                OpShape::Conv {
                    b,
                    c_in,
                    c_out,
                    h,
                    w,
                    k,
                    stride,
                    padding,
                    ..
                } => {
                    let input = Tensor::<4>::random([b, c_in, h, w], normal, (device, dtype));
                    let down = Tensor::<4>::random([rank, c_in, k, k], normal, (device, dtype));
                    let up = Tensor::<4>::random([c_out, rank, 1, 1], normal, (device, dtype));
                    let (s, p) = ([stride; 2], [padding; 2]);
                    side.push(Box::new(move || {
                        let mid = conv2d(
                            input.clone(),
                            down.clone(),
                            None,
                            ConvOptions::new(s, p, [1, 1], 1),
                        );
                        conv2d(
                            mid,
                            up.clone(),
                            None,
                            ConvOptions::new([1, 1], [0, 0], [1, 1], 1),
                        )
                        .sum()
                    }));
                }
                _ => {}
            }
        }
    }
    let extra = time_ms(device, 2, runs, || {
        let _ = side.iter().map(|f| f()).reduce(|a, b| a + b);
    })?;
    println!(
        "[{precision:?}]   low-rank products beside every UNet matrix and convolution ({} layers, rank {rank}): {extra:.2} ms a step more (merged: none)",
        side.len()
    );
    let _ = std::fs::remove_file(&path);
    Ok(())
}
