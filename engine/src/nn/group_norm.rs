//! GroupNorm (with the SiLU after it), by burn ops or our kernels, and its statistics for
//! tiles that share them.

use std::sync::OnceLock;

use burn::tensor::activation;
use burn::tensor::{DType, Tensor, TensorData};

use super::rows;
use crate::error::Result;
use crate::kernels::group_norm::ChannelTerms;
use crate::weights::Weights;

/// Which implementation runs a GroupNorm (and the SiLU after it): burn ops, or our kernels where
/// the device runs them (see [`crate::kernels::group_norm`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kernels {
    #[default]
    Plain,
    Fused,
}

/// `nn.GroupNorm` with affine parameters.
#[derive(Debug, Clone)]
pub struct GroupNorm {
    weight: Tensor<1>,
    bias: Tensor<1>,
    groups: usize,
    eps: f64,
    /// Whether the burn-op path sums its groups in pieces ([`rows::loops_capped`]), settled at
    /// its first use.
    pieces: OnceLock<bool>,
}

impl GroupNorm {
    pub fn load(w: &Weights, groups: usize, channels: usize, eps: f64) -> Result<Self> {
        Ok(Self {
            weight: w.tensor("weight", [channels])?.cast(DType::F32),
            bias: w.tensor("bias", [channels])?.cast(DType::F32),
            groups,
            eps,
            pieces: OnceLock::new(),
        })
    }

    /// From f32 affine parameters (benchmarks, tests).
    pub fn from_tensors(weight: Tensor<1>, bias: Tensor<1>, groups: usize, eps: f64) -> Self {
        Self {
            weight,
            bias,
            groups,
            eps,
            pieces: OnceLock::new(),
        }
    }

    /// Burn ops: the twin of our kernels (see [`Self::forward_with`]), and what the CPU backend runs.
    ///
    /// # Shapes
    /// `[b, c, h, w] -> [b, c, h, w]`
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        self.record(&x, false);
        self.forward_plain(x)
    }

    fn record(&self, x: &Tensor<4>, silu: bool) {
        crate::profile::record(|| {
            let [b, c, h, w] = x.dims();
            crate::profile::OpShape::GroupNorm {
                b,
                c,
                h,
                w,
                groups: self.groups,
                silu,
            }
        });
    }

    fn forward_plain(&self, x: Tensor<4>) -> Tensor<4> {
        let dtype = x.dtype();
        let dims = x.dims();
        let pieces = self.pieces(&x);
        let x = self.grouped(x);
        // burn's `var_mean_bias`, its sums in pieces where loops are capped (`rows`).
        let mean = rows::mean_last(x.clone(), pieces);
        let deviation = x.clone() - mean.clone();
        let var = rows::mean_last(deviation.clone() * deviation, pieces);
        self.normalize(x, mean, var, dims, dtype)
    }

    /// The statistics of `x` (all of it), to pool with those of other parts of one activation.
    ///
    /// # Shapes
    /// `[b, c, h, w]` -> moments of `[b, groups]`
    pub fn moments(&self, x: Tensor<4>) -> GroupMoments {
        let [b, c, h, w] = x.dims();
        if c * h * w == 0 {
            // burn's reshape reads a 0 as "keep this dimension": no grouping of nothing.
            let zeros = || Tensor::zeros([b, self.groups, 1], (&x.device(), DType::F32));
            return GroupMoments {
                count: 0.0,
                mean: zeros(),
                m2: zeros(),
            };
        }
        let pieces = self.pieces(&x);
        let x = self.grouped(x);
        let mean = rows::mean_last(x.clone(), pieces);
        // Deviations from the part's own mean: no cancellation, unlike a sum of squares.
        let deviation = x - mean.clone();
        let m2 = rows::sum_last(deviation.clone() * deviation, pieces);
        GroupMoments {
            count: ((c / self.groups) * h * w) as f64,
            mean,
            m2,
        }
    }

    /// GroupNorm of `x` with statistics given rather than computed from `x` (a tile normalised
    /// with the statistics of the whole activation), then SiLU when `silu`. Burn ops only.
    pub fn forward_with_moments(
        &self,
        x: Tensor<4>,
        moments: &GroupMoments,
        silu: bool,
    ) -> Tensor<4> {
        let dtype = x.dtype();
        let dims = x.dims();
        let x = self.grouped(x);
        let var = moments.m2.clone() / moments.count.max(1.0);
        let y = self.normalize(x, moments.mean.clone(), var, dims, dtype);
        if silu { activation::silu(y) } else { y }
    }

    /// Whether this layer's device sums long rows in pieces (settled once).
    fn pieces(&self, x: &Tensor<4>) -> bool {
        *self.pieces.get_or_init(|| rows::loops_capped(&x.device()))
    }

    /// `[b, c, h, w]` -> f32 `[b, groups, c/groups·h·w]`.
    fn grouped(&self, x: Tensor<4>) -> Tensor<3> {
        let [b, c, h, w] = x.dims();
        x.cast(DType::F32)
            .reshape([b, self.groups, (c / self.groups) * h * w])
    }

    /// `(x - mean) / sqrt(var + eps)`, affine, back to `[b, c, h, w]` in `dtype`.
    fn normalize(
        &self,
        x: Tensor<3>,
        mean: Tensor<3>,
        var: Tensor<3>,
        [b, c, h, w]: [usize; 4],
        dtype: DType,
    ) -> Tensor<4> {
        let x = (x - mean) / (var + self.eps).sqrt();
        let x = x.reshape([b, c, h, w]);
        let x =
            x * self.weight.clone().reshape([1, c, 1, 1]) + self.bias.clone().reshape([1, c, 1, 1]);
        x.cast(dtype)
    }

    /// [`Self::forward_with`] of `x + terms` (a convolution's bias and time-embedding term left
    /// to this norm, [`Conv2d::forward_deferred`]): read in place and added on the way by our
    /// kernels where the map is channels-last, as burn ops before the norm otherwise.
    pub fn forward_shifted(
        &self,
        x: Tensor<4>,
        terms: Option<ChannelTerms>,
        silu: bool,
        kernels: Kernels,
    ) -> Tensor<4> {
        let Some(terms) = terms else {
            return self.forward_with(x, silu, kernels);
        };
        if kernels == Kernels::Fused
            && let Some(y) = crate::kernels::group_norm::group_norm_shifted(
                &x,
                &self.weight,
                &self.bias,
                &terms,
                self.groups,
                self.eps,
                silu,
            )
        {
            self.record(&x, silu);
            return y;
        }
        let [b, c, _, _] = x.dims();
        let dtype = x.dtype();
        match terms.sum(b, c) {
            Some(pre) => {
                self.forward_with(x + pre.cast(dtype).reshape([b, c, 1, 1]), silu, kernels)
            }
            None => self.forward_with(x, silu, kernels),
        }
    }

    /// GroupNorm, then SiLU when `silu`, through `kernels`. Our kernels
    /// ([`crate::kernels::group_norm`]) fall back to burn ops where they cannot run.
    pub fn forward_with(&self, x: Tensor<4>, silu: bool, kernels: Kernels) -> Tensor<4> {
        self.record(&x, silu);
        if kernels == Kernels::Fused
            && let Some(y) = crate::kernels::group_norm::group_norm(
                &x,
                &self.weight,
                &self.bias,
                self.groups,
                self.eps,
                silu,
            )
        {
            return y;
        }
        let y = self.forward_plain(x);
        if silu { activation::silu(y) } else { y }
    }
}

/// A GroupNorm's input statistics per (batch, group), in f32: the element count, the mean and M2
/// (the sum of squared deviations from the mean). The statistics of disjoint parts of an activation
/// pool into those of their union exactly ([`GroupMoments::pool`]), so tiles that partition an
/// image can be normalised as the whole image would be.
#[derive(Debug, Clone)]
pub struct GroupMoments {
    /// Elements per (batch, group); the same for every group.
    count: f64,
    /// `[b, groups, 1]`
    mean: Tensor<3>,
    /// `[b, groups, 1]`
    m2: Tensor<3>,
}

impl GroupMoments {
    /// The statistics of all `parts` (disjoint parts of one activation) together, by the k-way
    /// form of Chan, Golub and LeVeque's formula: `mean = Σ nᵢ·meanᵢ / n` and
    /// `M2 = Σ M2ᵢ + Σ nᵢ·(meanᵢ − mean)²`. Only deviations are squared, so nothing cancels
    /// catastrophically, and it is a few tensor ops however many parts there are. `None` when
    /// no part holds an element.
    pub fn pool(parts: Vec<GroupMoments>) -> Option<GroupMoments> {
        let mut parts: Vec<_> = parts.into_iter().filter(|p| p.count > 0.0).collect();
        if parts.len() <= 1 {
            return parts.pop();
        }
        let count: f64 = parts.iter().map(|p| p.count).sum();
        let dims = parts[0].mean.dims();
        let device = parts[0].mean.device();
        let shares: Vec<f32> = parts.iter().map(|p| (p.count / count) as f32).collect();
        let shares = Tensor::<4>::from_data(
            TensorData::new(shares, [parts.len(), 1, 1, 1]),
            (&device, DType::F32),
        );
        let (means, m2s): (Vec<_>, Vec<_>) = parts.into_iter().map(|p| (p.mean, p.m2)).unzip();
        let means = Tensor::stack::<4>(means, 0); // [parts, b, groups, 1]
        let mean = (means.clone() * shares.clone()).sum_dim(0); // [1, b, groups, 1]
        let deviation = means - mean.clone();
        let between = (deviation.clone() * deviation * shares).sum_dim(0) * count;
        let m2 = Tensor::stack::<4>(m2s, 0).sum_dim(0) + between;
        Some(GroupMoments {
            count,
            mean: mean.reshape(dims),
            m2: m2.reshape(dims),
        })
    }

    pub fn count(&self) -> f64 {
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    /// A GroupNorm with statistics pooled from parts (uneven column strips, one empty) of an
    /// activation with a large mean, in f32 and f16, normalises as the plain GroupNorm does and
    /// as an f64 reference does. Seeded inputs: the result must not depend on the draw.
    #[test]
    fn pooled_group_moments_normalise_as_the_whole() {
        let device = Device::flex();
        let (b, c, h, w, groups, eps) = (2, 8, 5, 13, 4, 1e-6);
        let seeded = |seed, n, mean: f32, std: f32| -> Vec<f32> {
            crate::noise::randn(seed, n)
                .into_iter()
                .map(|v| mean + std * v)
                .collect()
        };
        let (weight, bias) = (seeded(1, c, 1.0, 0.5), seeded(2, c, 0.0, 0.5));
        // An offset of 100 makes a sum-of-squares variance lose most of its digits in f32.
        let data = seeded(3, b * c * h * w, 100.0, 2.0);
        let vector =
            |v: &Vec<f32>| Tensor::<1>::from_data(TensorData::new(v.clone(), [c]), &device);
        let norm = GroupNorm {
            weight: vector(&weight),
            bias: vector(&bias),
            groups,
            eps,
            pieces: OnceLock::new(),
        };
        let x = Tensor::<4>::from_data(TensorData::new(data, [b, c, h, w]), &device);
        for dtype in [DType::F32, DType::F16] {
            let x = x.clone().cast(dtype);
            let read = |t: Tensor<4>| t.cast(DType::F32).into_data().try_to_vec::<f32>().unwrap();
            let reference =
                group_norm_silu_f64(&read(x.clone()), &weight, &bias, [b, c, h * w], groups, eps);
            let parts = [0..0, 0..1, 1..7, 7..13]
                .map(|cols| norm.moments(x.clone().slice([0..b, 0..c, 0..h, cols])));
            let pooled = GroupMoments::pool(parts.to_vec()).expect("non-empty parts");
            assert_eq!(pooled.count(), (c / groups * h * w) as f64);
            let shared = read(norm.forward_with_moments(x.clone(), &pooled, true));
            let plain = read(activation::silu(norm.forward(x)));
            // f32: the mean of values near 100 is known to ~1e-5 of σ (measured: pooled 2.5e-6,
            // plain 1.0e-5; a sum-of-squares variance is ~1e-4 off); f16 rounds the output.
            let tol = if dtype == DType::F32 { 3e-5 } else { 2e-3 };
            for (name, got) in [("pooled", &shared), ("plain", &plain)] {
                let rel = crate::vae_compile::relative_difference(got, &reference);
                assert!(rel < tol, "{dtype:?} {name}: {rel}");
            }
        }
        assert!(GroupMoments::pool(Vec::new()).is_none());
    }

    /// GroupNorm then SiLU of `[b, c, n]` data, in f64.
    fn group_norm_silu_f64(
        x: &[f32],
        weight: &[f32],
        bias: &[f32],
        [b, c, n]: [usize; 3],
        groups: usize,
        eps: f64,
    ) -> Vec<f32> {
        let per = c / groups * n;
        let mut out = vec![0.0; x.len()];
        for (g, chunk) in x.chunks(per).enumerate().take(b * groups) {
            let mean = chunk.iter().map(|&v| v as f64).sum::<f64>() / per as f64;
            let var = chunk
                .iter()
                .map(|&v| (v as f64 - mean).powi(2))
                .sum::<f64>()
                / per as f64;
            for (i, &v) in chunk.iter().enumerate() {
                let channel = (g % groups) * (c / groups) + i / n;
                let y = (v as f64 - mean) / (var + eps).sqrt() * weight[channel] as f64
                    + bias[channel] as f64;
                out[g * per + i] = (y / (1.0 + (-y).exp())) as f32;
            }
        }
        out
    }
}
