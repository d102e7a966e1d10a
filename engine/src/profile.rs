//! Op shapes of a forward pass, recorded on demand, so `latent-studio bench` can print for every
//! op shape of a UNet step which kernel ran and how fast (each op is then run alone by
//! `crate::nn::isolated`; no fallback to a slow kernel can hide in a block total).
//!
//! Recording is off unless a [`Recording`] is alive on the calling thread; otherwise the layers
//! pay one thread-local lookup per call.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;

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
}
