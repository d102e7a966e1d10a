//! Op shapes of a forward pass, recorded on demand, and each op run alone through the engine's
//! own layer code, so `latent-studio bench` can print for every op shape of a UNet step which
//! kernel ran and how fast (no fallback to a slow kernel can hide in a block total).
//!
//! Recording is off unless a [`Recording`] is alive on the calling thread; otherwise the layers
//! pay one thread-local lookup per call.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;

use burn::tensor::{DType, Device, Distribution, Tensor};

use crate::nn::{Conv2d, GroupNorm, Kernels, LayerNorm, Linear};

/// One op as the layers call it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum OpShape {
    /// `nn.Conv2d`: input `[b, c_in, h, w]`, square kernel `k`.
    Conv {
        b: usize,
        c_in: usize,
        c_out: usize,
        h: usize,
        w: usize,
        k: usize,
        stride: usize,
        padding: usize,
        bias: bool,
    },
    /// `nn.Linear` on `rows` vectors.
    Linear {
        rows: usize,
        d_in: usize,
        d_out: usize,
        bias: bool,
    },
    /// Scaled dot-product attention per head.
    Attention {
        b: usize,
        heads: usize,
        n_q: usize,
        n_k: usize,
        d: usize,
    },
    /// GroupNorm on `[b, c, h, w]` (burn ops; `silu` runs one after it).
    GroupNorm {
        b: usize,
        c: usize,
        h: usize,
        w: usize,
        groups: usize,
        silu: bool,
    },
    /// LayerNorm over `dim` on `rows` vectors.
    LayerNorm { rows: usize, dim: usize },
}

impl OpShape {
    /// Multiply-adds ×2 of the matrix ops; 0 for the norms (bandwidth-bound).
    pub fn flops(&self) -> f64 {
        match *self {
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
                let (ho, wo) = out_size(h, w, k, stride, padding);
                2.0 * (b * c_out * ho * wo * c_in * k * k) as f64
            }
            OpShape::Linear {
                rows, d_in, d_out, ..
            } => 2.0 * (rows * d_in * d_out) as f64,
            OpShape::Attention {
                b,
                heads,
                n_q,
                n_k,
                d,
            } => 4.0 * (b * heads * n_q * n_k * d) as f64,
            OpShape::GroupNorm { .. } | OpShape::LayerNorm { .. } => 0.0,
        }
    }

    /// Bytes an op must at least move (inputs, weights and outputs once), in `element` bytes.
    pub fn min_bytes(&self, element: usize) -> f64 {
        let e = element as f64;
        match *self {
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
                let (ho, wo) = out_size(h, w, k, stride, padding);
                e * (b * c_in * h * w + c_out * c_in * k * k + b * c_out * ho * wo) as f64
            }
            OpShape::Linear {
                rows, d_in, d_out, ..
            } => e * (rows * d_in + d_in * d_out + rows * d_out) as f64,
            OpShape::Attention {
                b,
                heads,
                n_q,
                n_k,
                d,
            } => e * (b * heads * d * (2 * n_q + 2 * n_k)) as f64,
            OpShape::GroupNorm { b, c, h, w, .. } => e * 2.0 * (b * c * h * w) as f64,
            OpShape::LayerNorm { rows, dim } => e * 2.0 * (rows * dim) as f64,
        }
    }
}

fn out_size(h: usize, w: usize, k: usize, stride: usize, padding: usize) -> (usize, usize) {
    let o = |n: usize| (n + 2 * padding).saturating_sub(k) / stride.max(1) + 1;
    (o(h), o(w))
}

impl fmt::Display for OpShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            OpShape::Conv {
                b,
                c_in,
                c_out,
                h,
                w,
                k,
                stride,
                ..
            } => write!(
                f,
                "conv{k}x{k}{} {c_in}->{c_out} @{h}x{w} b{b}",
                if stride > 1 { "/2" } else { "" }
            ),
            OpShape::Linear {
                rows, d_in, d_out, ..
            } => write!(f, "linear {d_in}->{d_out} x{rows}"),
            OpShape::Attention {
                b,
                heads,
                n_q,
                n_k,
                d,
            } => write!(f, "attention {heads}x{d} q{n_q} k{n_k} b{b}"),
            OpShape::GroupNorm {
                b,
                c,
                h,
                w,
                groups,
                silu,
            } => write!(
                f,
                "groupnorm{groups}{} {c} @{h}x{w} b{b}",
                if silu { "+silu" } else { "" }
            ),
            OpShape::LayerNorm { rows, dim } => write!(f, "layernorm {dim} x{rows}"),
        }
    }
}

thread_local! {
    // Per thread: the forward pass enqueues its ops from the calling thread, and tests running
    // beside each other must not see each other's ops.
    static RECORDED: RefCell<Option<Vec<OpShape>>> = const { RefCell::new(None) };
}

thread_local! {
    // The op this thread entered last, while a `Labelling` is alive: the kernel profile names
    // each launch's op by it (launches are enqueued on the thread that runs the op).
    static LABELLING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static CURRENT: std::cell::Cell<Option<OpShape>> = const { std::cell::Cell::new(None) };
}

/// Called by the layers; `shape` is only evaluated while this thread records or labels.
pub(crate) fn record(shape: impl FnOnce() -> OpShape) {
    let labelling = LABELLING.with(|l| l.get());
    RECORDED.with(|r| {
        let mut recorded = r.borrow_mut();
        if recorded.is_none() && !labelling {
            return;
        }
        let op = shape();
        if let Some(ops) = recorded.as_mut() {
            ops.push(op);
        }
        if labelling {
            CURRENT.with(|c| c.set(Some(op)));
        }
    });
}

/// The op this thread entered last while a [`Labelling`] is alive (launches after it, up to the
/// next op, are its kernels, give or take burn's deferred fusions).
pub fn current_op() -> Option<OpShape> {
    CURRENT.with(|c| c.get())
}

/// Keeps [`current_op`] up to date on this thread while alive.
pub struct Labelling(());

impl Labelling {
    pub fn start() -> Self {
        LABELLING.with(|l| l.set(true));
        CURRENT.with(|c| c.set(None));
        Labelling(())
    }
}

impl Drop for Labelling {
    fn drop(&mut self) {
        LABELLING.with(|l| l.set(false));
        CURRENT.with(|c| c.set(None));
    }
}

/// Records the op shapes this thread runs while alive.
pub struct Recording(());

impl Recording {
    pub fn start() -> Self {
        RECORDED.with(|r| *r.borrow_mut() = Some(Vec::new()));
        Recording(())
    }

    /// The distinct shapes seen, each with how many times it ran, in first-seen order.
    pub fn finish(self) -> Vec<(OpShape, usize)> {
        let ops = RECORDED.with(|r| r.borrow_mut().take()).unwrap_or_default();
        let mut counts: BTreeMap<OpShape, usize> = BTreeMap::new();
        let mut order = Vec::new();
        for op in ops {
            let n = counts.entry(op).or_insert(0);
            if *n == 0 {
                order.push(op);
            }
            *n += 1;
        }
        order.into_iter().map(|op| (op, counts[&op])).collect()
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        RECORDED.with(|r| *r.borrow_mut() = None);
    }
}

/// Random inputs and weights for one op, built once, then run through the engine's layer code
/// as many times as asked.
pub struct IsolatedOp {
    run: Box<dyn Fn()>,
}

impl IsolatedOp {
    pub fn new(op: OpShape, device: &Device, dtype: DType) -> Self {
        let normal = Distribution::Normal(0.0, 1.0);
        let t4 = |dims: [usize; 4]| Tensor::<4>::random(dims, normal, (device, dtype));
        let t3 = |dims: [usize; 3]| Tensor::<3>::random(dims, normal, (device, dtype));
        let run: Box<dyn Fn()> = match op {
            OpShape::Conv {
                b,
                c_in,
                c_out,
                h,
                w,
                k,
                stride,
                padding,
                bias,
            } => {
                let conv = Conv2d::from_tensors(
                    t4([c_out, c_in, k, k]),
                    bias.then(|| Tensor::<1>::random([c_out], normal, (device, dtype))),
                    stride,
                    padding,
                );
                let x = t4([b, c_in, h, w]);
                Box::new(move || {
                    let _ = conv.forward(x.clone());
                })
            }
            OpShape::Linear {
                rows,
                d_in,
                d_out,
                bias,
            } => {
                let lin = Linear::from_tensors(
                    Tensor::<2>::random([d_in, d_out], normal, (device, dtype)),
                    bias.then(|| Tensor::<1>::random([d_out], normal, (device, dtype))),
                );
                let x = t3([1, rows, d_in]);
                Box::new(move || {
                    let _ = lin.forward(x.clone());
                })
            }
            OpShape::Attention {
                b,
                heads,
                n_q,
                n_k,
                d,
            } => {
                let q = t3([b, n_q, heads * d]);
                let k = t3([b, n_k, heads * d]);
                let v = t3([b, n_k, heads * d]);
                Box::new(move || {
                    let at = |t| crate::attention::Heads {
                        tensor: t,
                        column: 0,
                    };
                    let _ =
                        crate::attention::heads_attention(at(&q), at(&k), at(&v), heads, d, false);
                })
            }
            OpShape::GroupNorm {
                b,
                c,
                h,
                w,
                groups,
                silu,
            } => {
                let norm = GroupNorm::from_tensors(
                    Tensor::<1>::ones([c], (device, DType::F32)),
                    Tensor::<1>::zeros([c], (device, DType::F32)),
                    groups,
                    1e-5,
                );
                let x = t4([b, c, h, w]);
                Box::new(move || {
                    let _ = norm.forward_with(x.clone(), silu, Kernels::Fused);
                })
            }
            OpShape::LayerNorm { rows, dim } => {
                let norm = LayerNorm::from_tensors(
                    Tensor::<1>::ones([dim], (device, DType::F32)),
                    Tensor::<1>::zeros([dim], (device, DType::F32)),
                    1e-5,
                );
                let x = t3([1, rows, dim]);
                Box::new(move || {
                    let _ = norm.forward(x.clone());
                })
            }
        };
        Self { run }
    }

    /// Enqueues one run.
    pub fn run(&self) {
        (self.run)()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flops_and_labels() {
        let conv = OpShape::Conv {
            b: 2,
            c_in: 320,
            c_out: 320,
            h: 64,
            w: 64,
            k: 3,
            stride: 1,
            padding: 1,
            bias: true,
        };
        assert_eq!(
            conv.flops(),
            2.0 * (2usize * 320 * 64 * 64 * 320 * 9) as f64
        );
        assert_eq!(conv.to_string(), "conv3x3 320->320 @64x64 b2");
        let down = OpShape::Conv {
            b: 2,
            c_in: 320,
            c_out: 320,
            h: 64,
            w: 64,
            k: 3,
            stride: 2,
            padding: 1,
            bias: true,
        };
        assert_eq!(down.flops(), conv.flops() / 4.0);
        let attn = OpShape::Attention {
            b: 2,
            heads: 8,
            n_q: 4096,
            n_k: 77,
            d: 40,
        };
        assert_eq!(attn.flops(), 4.0 * (2 * 8 * 4096 * 77 * 40) as f64);
    }

    /// The layers record what they run, counted per distinct shape in first-seen order, and run
    /// alone they produce what the layer produces for those shapes.
    #[test]
    fn a_forward_pass_records_its_ops() {
        let device = Device::flex();
        let conv = Conv2d::from_tensors(
            Tensor::<4>::ones([3, 2, 3, 3], &device),
            Some(Tensor::<1>::ones([3], &device)),
            1,
            1,
        );
        let x = Tensor::<4>::ones([1, 2, 5, 5], &device);
        let rec = Recording::start();
        let y = conv.forward(x.clone());
        let _ = conv.forward(y.clone().slice([0..1, 0..2]));
        let _ = conv.forward(x);
        let ops = rec.finish();
        assert_eq!(ops.len(), 1, "{ops:?}");
        assert_eq!(ops[0].1, 3);
        // Not recording any more.
        let rec = Recording::start();
        drop(rec);
        let _ = conv.forward(Tensor::<4>::ones([1, 2, 5, 5], &device));
        assert!(Recording::start().finish().is_empty());
        // The centre pixel sees 2 channels x 9 ones, plus the bias.
        let centre = y
            .slice([0..1, 0..1, 2..3, 2..3])
            .into_data()
            .try_to_vec::<f32>();
        assert_eq!(centre.ok(), Some(vec![19.0]));
        for (op, _) in ops {
            IsolatedOp::new(op, &device, DType::F32).run();
        }
    }

    /// While labelling, the op entered last is the current one; before and after, none.
    #[test]
    fn labelling_follows_the_ops() {
        let device = Device::flex();
        let conv = Conv2d::from_tensors(Tensor::<4>::ones([3, 2, 1, 1], &device), None, 1, 0);
        let x = Tensor::<4>::ones([1, 2, 4, 4], &device);
        let _ = conv.forward(x.clone());
        assert_eq!(current_op(), None, "not labelling");
        let labels = Labelling::start();
        assert_eq!(current_op(), None);
        let _ = conv.forward(x.clone());
        let seen = current_op().map(|op| op.to_string());
        assert_eq!(seen.as_deref(), Some("conv1x1 2->3 @4x4 b1"));
        drop(labels);
        assert_eq!(current_op(), None);
        let _ = conv.forward(x);
        assert_eq!(current_op(), None, "labelling ended");
    }
}
