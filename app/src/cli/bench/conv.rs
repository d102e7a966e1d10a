//! Our implicit-GEMM convolution (`latent_engine::kernels::conv`) against burn's `conv2d` on every
//! convolution shape of one UNet step: time alone, rate, and how far apart the results are.

use anyhow::Result;
use burn::tensor::module::conv2d;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Device, Distribution, Tensor};
use latent_engine::Precision;
use latent_engine::kernels::conv;
use latent_engine::profile::OpShape;

use super::profile::device_ms;
use super::time_ms;

const REPS: usize = 10;

/// One convolution shape's random input, weights and bias.
struct Inputs {
    x: Tensor<4>,
    weight: Tensor<4>,
    bias: Tensor<1>,
    options: ConvOptions<2>,
    geometry: conv::Geometry,
}

impl Inputs {
    fn new(
        [b, c_in, c_out, h, w, k, stride, padding]: [usize; 8],
        device: &Device,
        dtype: DType,
    ) -> Self {
        let normal = Distribution::Normal(0.0, 1.0);
        Self {
            x: Tensor::<4>::random([b, c_in, h, w], normal, (device, dtype)),
            weight: Tensor::<4>::random([c_out, c_in, k, k], normal, (device, dtype)) * 0.05,
            bias: Tensor::<1>::random([c_out], normal, (device, dtype)),
            options: ConvOptions::new([stride, stride], [padding, padding], [1, 1], 1),
            geometry: conv::Geometry {
                k,
                stride,
                padding,
                upsample: false,
            },
        }
    }

    /// Our kernels' epilogue: the bias where the layer has one.
    fn epilogue(&self, bias: bool) -> conv::Epilogue<'_> {
        conv::Epilogue {
            bias: bias.then_some(&self.bias),
            ..Default::default()
        }
    }

    /// burn's path as `nn::Conv2d` takes it: the bias added after the convolution (passed in,
    /// it drops burn's cooperative-matrix candidates; see `nn::Conv2d::forward`).
    fn burn(&self, bias: bool) -> Tensor<4> {
        let y = conv2d(
            self.x.clone(),
            self.weight.clone(),
            None,
            self.options.clone(),
        );
        if bias {
            let c_out = self.bias.dims()[0];
            y + self.bias.clone().reshape([1, c_out, 1, 1])
        } else {
            y
        }
    }
}

/// One line per convolution shape in `ops`.
pub fn report(
    ops: &[(OpShape, usize)],
    device: &Device,
    dtype: DType,
    precision: Precision,
    runs: usize,
) -> Result<()> {
    for (op, _) in ops {
        let OpShape::Conv {
            b,
            c_in,
            c_out,
            h,
            w,
            k,
            stride,
            padding,
            bias,
        } = *op
        else {
            continue;
        };
        let case = Inputs::new([b, c_in, c_out, h, w, k, stride, padding], device, dtype);
        let (x, weight, bias_t) = (&case.x, &case.weight, &case.bias);
        let packed = conv::pack(weight.clone());
        let burn = || case.burn(bias);
        let burn_ms = time_ms(device, 1, runs, || {
            for _ in 0..REPS {
                let _ = burn();
            }
        })? / REPS as f64;
        let ours = conv::conv2d(
            x.clone(),
            &packed,
            bias.then_some(bias_t),
            k,
            stride,
            padding,
        );
        let Some(ours) = ours else {
            println!(
                "[{precision:?}]   {:<40} ours: does not run here",
                op.to_string()
            );
            continue;
        };
        let ours_ms = time_ms(device, 1, runs, || {
            for _ in 0..REPS {
                let _ = conv::conv2d(
                    x.clone(),
                    &packed,
                    bias.then_some(bias_t),
                    k,
                    stride,
                    padding,
                );
            }
        })? / REPS as f64;
        let twin = burn();
        let read = |t: Tensor<4>| t.cast(DType::F32).into_data().try_to_vec::<f32>();
        let rel = match (read(ours), read(twin)) {
            (Ok(a), Ok(b)) => latent_engine::vae_compile::relative_difference(&a, &b),
            _ => f32::NAN,
        };
        let rate = |ms: f64| op.flops() / (ms * 1e-3) / 1e12;
        // Where the reduction is split, the same kernel unsplit, to show what the split buys.
        let oh = (h + 2 * padding - k) / stride + 1;
        let ow = (w + 2 * padding - k) / stride + 1;
        let tiles = (b * oh * ow).div_ceil(64) * c_out.div_ceil(64);
        let slices = conv::splits(tiles, (c_in * k * k).div_ceil(16));
        let whole = if slices > 1 {
            let (epilogue, geometry) = (case.epilogue(bias), case.geometry);
            let ms = time_ms(device, 1, runs, || {
                for _ in 0..REPS {
                    let _ = conv::conv2d_with(
                        x.clone(),
                        &packed,
                        geometry,
                        &epilogue,
                        Some(1),
                        conv::Simt::default(),
                    );
                }
            })? / REPS as f64;
            format!(" | {slices} slices; whole reduction {ms:8.3} ms")
        } else {
            String::new()
        };
        // The other SIMT variants (`conv::Simt`): 8 × 8 lane blocks where the layer takes them,
        // the staging read as vectors, the next step's loads prefetched.
        let mut variants = String::new();
        let simt = |wide, vector, prefetch| conv::Simt {
            wide,
            vector,
            prefetch,
            deep: false,
            pixels8: false,
        };
        for (name, s) in [
            ("8x8", simt(true, false, false)),
            ("vec", simt(false, true, false)),
            ("vec+pf", simt(false, true, true)),
            ("8x8 vec+pf", simt(true, true, true)),
        ] {
            if s.wide && c_out <= 64 {
                continue;
            }
            let (epilogue, geometry) = (case.epilogue(bias), case.geometry);
            let run = || conv::conv2d_with(x.clone(), &packed, geometry, &epilogue, None, s);
            let rel = match run().map(read) {
                Some(Ok(a)) => match read(burn()) {
                    Ok(b) => latent_engine::vae_compile::relative_difference(&a, &b),
                    Err(_) => f32::NAN,
                },
                _ => f32::NAN,
            };
            let ms = time_ms(device, 1, runs, || {
                for _ in 0..REPS {
                    let _ = run();
                }
            })? / REPS as f64;
            variants.push_str(&format!(
                " | {name} {ms:8.3} ms {:6.1} TFLOP/s rel {rel:.1e}",
                rate(ms)
            ));
        }
        println!(
            "[{precision:?}]   {:<40} implicit GEMM (SIMT, scalar 4x4) {ours_ms:8.3} ms {:6.1} TFLOP/s | burn {burn_ms:8.3} ms {:6.1} TFLOP/s | rel diff {rel:.1e}{whole}{variants}",
            op.to_string(),
            rate(ours_ms),
            rate(burn_ms),
        );
        // Our cooperative-matrix variant, where the device has one it can use.
        if let Some(mma) = conv::mma_on(device, dtype) {
            let (epilogue, geometry) = (case.epilogue(bias), case.geometry);
            let run =
                |slices| conv::conv2d_mma(x.clone(), weight, mma, geometry, &epilogue, slices);
            let Some(ours) = run(None) else {
                println!(
                    "[{precision:?}]   {:<40} ours on cooperative matrices: does not run",
                    op.to_string()
                );
                continue;
            };
            let rel = match (read(ours), read(burn())) {
                (Ok(a), Ok(b)) => latent_engine::vae_compile::relative_difference(&a, &b),
                _ => f32::NAN,
            };
            // The route's way (input unrolled, split as the route splits it), whole, and the
            // unrolled input (batch-major) on our GEMM.
            let gemm = latent_engine::kernels::matmul::mma_gemm_on(device, dtype);
            let on_gemm = || {
                gemm.and_then(|g| {
                    conv::conv2d_unrolled_gemm(
                        x.clone(),
                        weight,
                        geometry,
                        &epilogue,
                        g,
                        None,
                        false,
                    )
                })
            };
            let mut timed = Vec::new();
            for variant in 0..3 {
                let ms = time_ms(device, 1, runs, || {
                    for _ in 0..REPS {
                        let _ = match variant {
                            0 => run(None),
                            1 => run(Some(1)),
                            _ => on_gemm(),
                        };
                    }
                });
                timed.push(ms? / REPS as f64);
            }
            println!(
                "[{precision:?}]   {:<40} implicit GEMM (cmma {}x{}x{}, plane {}) {:8.3} ms {:6.1} TFLOP/s, {slices} slices, input unrolled first | whole reduction {:8.3} ms | rel diff {rel:.1e} | unrolled on our GEMM {:8.3} ms {:6.1} TFLOP/s",
                op.to_string(),
                mma.fragment.m,
                mma.fragment.n,
                mma.fragment.k,
                mma.plane,
                timed[0],
                rate(timed[0]),
                timed[1],
                timed[2],
                rate(timed[2]),
            );
        }
    }
    Ok(())
}

/// Every 3×3 shape of `ops` on burn's convolution (bias added after, as `nn::Conv2d` runs it)
/// and as the input unrolled times the weights on our cooperative-matrix GEMM (automatic tile,
/// each of the GEMM's compilations), with their difference; device time of the kernels, and the
/// sums a step weighted by count.
pub fn gemm_report(
    ops: &[(OpShape, usize)],
    device: &Device,
    precision: Precision,
    runs: usize,
) -> Result<()> {
    use latent_engine::kernels::matmul;
    let dtype = precision.dtype();
    let Some(gemm) = matmul::mma_gemm_on(device, dtype) else {
        return Ok(());
    };
    let mut burn_total = 0.0;
    let mut implicit_total = 0.0;
    let mut ours_total = vec![0.0; super::linear::knob_sets().len()];
    for &(op, count) in ops {
        let OpShape::Conv {
            b,
            c_in,
            c_out,
            h,
            w,
            k,
            stride,
            padding,
            bias,
        } = op
        else {
            continue;
        };
        let case = Inputs::new([b, c_in, c_out, h, w, k, stride, padding], device, dtype);
        let (x, weight) = (&case.x, &case.weight);
        let burn = || case.burn(bias);
        let burn_ms = device_ms(device, runs, || {
            let _ = burn();
        })?;
        let read = |t: Tensor<4>| t.cast(DType::F32).into_data().try_to_vec::<f32>();
        let want = read(burn()).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let (epilogue, geometry) = (case.epilogue(bias), case.geometry);
        let rate = |ms: f64| op.flops() / (ms * 1e-3) / 1e12;
        let mut line = format!(
            "[{precision:?}]   {:<40} x{count:<3} burn {burn_ms:7.3} ms {:6.1} TFLOP/s | unrolled + our GEMM",
            op.to_string(),
            rate(burn_ms)
        );
        let ours = || {
            conv::conv2d_unrolled_gemm(x.clone(), weight, geometry, &epilogue, gemm, None, false)
        };
        super::linear::knob_sweep(
            device,
            runs,
            count,
            &want,
            rate,
            &mut ours_total,
            &mut line,
            || ours().and_then(|t| read(t).ok()),
            || {
                let _ = ours();
            },
        )?;
        // The GEMM reading the input in place (default knobs).
        let implicit =
            || conv::conv2d_unrolled_gemm(x.clone(), weight, geometry, &epilogue, gemm, None, true);
        match implicit().map(read) {
            Some(Ok(got)) => {
                let rel = latent_engine::vae_compile::relative_difference(&got, &want);
                let ms = device_ms(device, runs, || {
                    let _ = implicit();
                })?;
                implicit_total += ms * count as f64;
                line += &format!(
                    " | in place {ms:7.3} ms {:6.1} TFLOP/s rel {rel:.0e}",
                    rate(ms)
                );
            }
            _ => line += " | in place: does not run",
        }
        burn_total += burn_ms * count as f64;
        println!("{line}");
    }
    println!(
        "[{precision:?}]   these convolutions a step (device time, summed by count): burn {burn_total:.2} ms, unrolled + our GEMM {}, read in place {implicit_total:.2} ms",
        super::linear::knob_totals(&ours_total)
    );
    Ok(())
}

/// The 512² VAE decode (compiled, as the pipeline decodes) under the rules in force and
/// channels-last on our GEMM ([`super::unet::channels_last_rules`]), interleaved over five
/// rounds in one process, with each rule's difference from the first's output.
pub fn vae_ab(
    vae: &latent_engine::vae::AutoencoderKL,
    device: &Device,
    precision: Precision,
    runs: usize,
) -> Result<()> {
    use conv::{conv_rules, set_conv_rules};
    use latent_engine::nn::Kernels;
    let d = conv_rules();
    let rules = super::unet::channels_last_rules(d);
    let z = Tensor::<4>::random(
        [1, 4, 64, 64],
        Distribution::Normal(0.0, 1.0),
        (device, precision.dtype()),
    );
    let read = |t: Tensor<4>| t.cast(DType::F32).into_data().try_to_vec::<f32>();
    let mut want = Vec::new();
    let mut times = vec![Vec::new(); rules.len()];
    for round in 0..5 {
        for (i, (rule, name)) in rules.iter().enumerate() {
            set_conv_rules(*rule);
            if round == 0 {
                let got = read(vae.decode_with(z.clone(), Kernels::Fused))
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
                if i == 0 {
                    want = got;
                } else {
                    let rel = latent_engine::vae_compile::relative_difference(&got, &want);
                    println!(
                        "[{precision:?}] VAE decode, {name}: rel diff {rel:.1e} from the default's"
                    );
                }
            }
            times[i].push(time_ms(device, 1, runs.min(5), || {
                let _ = vae.decode_with(z.clone(), Kernels::Fused);
            })?);
        }
    }
    set_conv_rules(d);
    let names: Vec<&str> = rules.iter().map(|r| r.1).collect();
    super::unet::print_rounds(precision, "VAE decode 512x512,", &names, &times);
    Ok(())
}
