//! One recorded op ([`crate::profile::OpShape`]) run alone through the engine's own layer code,
//! with random inputs and weights: what `latent-studio bench` times for each op shape of a step.

use burn::tensor::{DType, Device, Distribution, Tensor};

use super::{Conv2d, GroupNorm, Kernels, LayerNorm, Linear};
use crate::profile::OpShape;

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
    use crate::profile::{Labelling, Recording, current_op};

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
