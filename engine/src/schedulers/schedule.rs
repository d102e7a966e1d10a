//! The training noise schedule and the numeric helpers the samplers build their plans from.
//!
//! diffusers computes these tables in a mix of float32 (torch) and float64 (numpy); the samplers'
//! results move by more than float32 rounding when a table value moves by one ulp, so each helper
//! says which precision it mirrors and why.

use super::{BetaSchedule, SchedulerConfig, TimestepSpacing};

/// `torch.linspace(start, end, n, dtype=torch.float32)`, bit for bit.
///
/// torch's CPU kernel (`RangeFactoriesKernel.cpp`) steps in float32 and fills the first half
/// forward from `start` and the second half backward from `end`, each value one fused
/// multiply-add. A plain `start + i * step` differs in the last bit for ~15% of SD's betas.
pub(crate) fn torch_linspace_f32(start: f64, end: f64, n: usize) -> Vec<f32> {
    let (start, end) = (start as f32, end as f32);
    if n == 1 {
        return vec![start];
    }
    let step = (end - start) / (n - 1) as f32;
    let half = n / 2;
    (0..n)
        .map(|i| {
            if i < half {
                step.mul_add(i as f32, start)
            } else {
                (-step).mul_add((n - 1 - i) as f32, end)
            }
        })
        .collect()
}

/// `np.linspace(start, stop, num)` in float64: `i * step + start`, the last value exactly `stop`
/// (and `[start]` for `num == 1`).
pub(crate) fn np_linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    if num == 1 {
        return vec![start];
    }
    let step = (stop - start) / (num - 1) as f64;
    (0..num)
        .map(|i| {
            if i == num - 1 {
                stop
            } else {
                i as f64 * step + start
            }
        })
        .collect()
}

/// Descending timesteps of `steps` steps in `spacing`, as diffusers' `set_timesteps` makes them
/// before any rounding a scheduler adds: "linspace" from T − 1 to 0 (float), "leading"
/// `i · (T // steps) + offset`, "trailing" `round(T − i · T/steps) − 1`. (For the few step
/// counts where numpy's float `arange` yields one value more, diffusers breaks; these are the
/// first `steps` of its values.)
pub(crate) fn spaced_timesteps(
    train: usize,
    steps: usize,
    spacing: TimestepSpacing,
    offset: usize,
) -> Vec<f64> {
    match spacing {
        TimestepSpacing::Linspace => np_linspace(0.0, (train - 1) as f64, steps)
            .into_iter()
            .rev()
            .collect(),
        TimestepSpacing::Leading => (0..steps)
            .rev()
            .map(|i| (i * (train / steps) + offset) as f64)
            .collect(),
        TimestepSpacing::Trailing => {
            let ratio = train as f64 / steps as f64;
            (0..steps)
                .map(|i| (train as f64 - i as f64 * ratio).round_ties_even() - 1.0)
                .collect()
        }
    }
}

/// Karras et al. (2022) sigmas, `_convert_to_karras` in `scheduling_euler_discrete.py` and
/// `scheduling_dpmsolver_multistep.py` (from k-diffusion): rho = 7 interpolation from `sigma_max`
/// down to `sigma_min`, in float64.
pub(crate) fn karras_sigmas(sigma_min: f64, sigma_max: f64, n: usize) -> Vec<f64> {
    const RHO: f64 = 7.0;
    let min_inv_rho = sigma_min.powf(1.0 / RHO);
    let max_inv_rho = sigma_max.powf(1.0 / RHO);
    np_linspace(0.0, 1.0, n)
        .into_iter()
        .map(|ramp| (max_inv_rho + ramp * (min_inv_rho - max_inv_rho)).powf(RHO))
        .collect()
}

/// The model's training schedule, indexed by training timestep `t` in `0..num_train_timesteps`.
pub(crate) struct NoiseTable {
    /// ᾱ_t, float32 as diffusers keeps it.
    pub alphas_cumprod: Vec<f32>,
    /// σ_t = sqrt((1 - ᾱ_t) / ᾱ_t), computed in float32 (diffusers: float32 torch ops, then
    /// `np.array`), ascending with `t`.
    pub sigmas: Vec<f32>,
    /// ln σ_t in float32: diffusers' `log_sigmas = np.log(sigmas)` on the float32 array.
    log_sigmas: Vec<f32>,
}

impl NoiseTable {
    pub fn new(config: &SchedulerConfig) -> Self {
        let alphas_cumprod = alphas_cumprod(config);
        // Zero terminal SNR: ᾱ_T is 0, an infinite σ; the σ-based schedulers (Euler, Euler a,
        // DPM++) set it to 2⁻²⁴ first, DDIM and LCM use the 0.
        let mut for_sigmas = alphas_cumprod.clone();
        if let Some(last) = for_sigmas.last_mut()
            && *last == 0.0
        {
            *last = 2f32.powi(-24);
        }
        let sigmas: Vec<f32> = for_sigmas.iter().map(|&a| ((1.0 - a) / a).sqrt()).collect();
        // Rounded from float64 rather than float32 `ln`: numpy's SIMD float32 log is not
        // correctly rounded either, so neither matches it everywhere; this is the exact value.
        let log_sigmas = sigmas.iter().map(|&s| f64::from(s).ln() as f32).collect();
        Self {
            alphas_cumprod,
            sigmas,
            log_sigmas,
        }
    }

    /// `np.interp(t, np.arange(T), sigmas)`: σ at a possibly fractional timestep, in float64.
    pub fn interp_sigma(&self, t: f64) -> f64 {
        let last = self.sigmas.len() - 1;
        if t <= 0.0 {
            return f64::from(self.sigmas[0]);
        }
        if t >= last as f64 {
            return f64::from(self.sigmas[last]);
        }
        let j = t.floor() as usize;
        let lo = f64::from(self.sigmas[j]);
        let hi = f64::from(self.sigmas[j + 1]);
        // numpy's `slope * (x - xp[j]) + fp[j]`, with xp spaced by exactly 1.
        (hi - lo) * (t - j as f64) + lo
    }

    /// `_sigma_to_t` (identical in the Euler and DPM-Solver files): the fractional timestep
    /// whose σ is `sigma`, interpolating linearly in log σ between the two neighbouring
    /// training timesteps. Follows numpy's promotions: float64 except `low - high`, which is a
    /// difference of two float32 table entries and stays float32.
    pub fn sigma_to_t(&self, sigma: f64) -> f64 {
        let log_sigma = sigma.max(1e-10).ln();
        // `cumsum(dists >= 0).argmax()`: the last t with log σ_t <= log_sigma (0 if none),
        // clipped so that t + 1 exists.
        let low_idx = self
            .log_sigmas
            .iter()
            .rposition(|&l| log_sigma - f64::from(l) >= 0.0)
            .unwrap_or(0)
            .min(self.log_sigmas.len() - 2);
        let low = self.log_sigmas[low_idx];
        let high = self.log_sigmas[low_idx + 1];
        let w = ((f64::from(low) - log_sigma) / f64::from(low - high)).clamp(0.0, 1.0);
        (1.0 - w) * low_idx as f64 + w * (low_idx + 1) as f64
    }
}

/// ᾱ_t = Π (1 - β), as every diffusers scheduler's `__init__` builds it: betas from
/// `torch.linspace` in float32 (squared in float32 for `scaled_linear`), then `torch.cumprod`
/// in float32, which on the CPU accumulates in float64 and rounds each partial product.
pub(crate) fn alphas_cumprod(config: &SchedulerConfig) -> Vec<f32> {
    let n = config.num_train_timesteps;
    let betas: Vec<f32> = match config.beta_schedule {
        BetaSchedule::Linear => torch_linspace_f32(config.beta_start, config.beta_end, n),
        BetaSchedule::ScaledLinear => {
            torch_linspace_f32(config.beta_start.sqrt(), config.beta_end.sqrt(), n)
                .into_iter()
                .map(|b| b * b)
                .collect()
        }
    };
    let cumprod = |betas: &[f32]| -> Vec<f32> {
        let mut product = 1.0f64;
        betas
            .iter()
            .map(|beta| {
                product *= f64::from(1.0 - beta);
                product as f32
            })
            .collect()
    };
    let alphas_cumprod = cumprod(&betas);
    if !config.zero_terminal_snr {
        return alphas_cumprod;
    }
    cumprod(&rescale_zero_terminal_snr(&alphas_cumprod))
}

/// diffusers' `rescale_zero_terminal_snr`, in float32 as its torch ops run: √ᾱ shifted so that
/// its last value is 0 and scaled so that its first is unchanged, then back to betas.
fn rescale_zero_terminal_snr(alphas_cumprod: &[f32]) -> Vec<f32> {
    let sqrt: Vec<f32> = alphas_cumprod.iter().map(|a| a.sqrt()).collect();
    let (first, last) = (sqrt[0], sqrt[sqrt.len() - 1]);
    let scale = first / (first - last);
    let bar: Vec<f32> = sqrt
        .iter()
        .map(|s| {
            let s = (s - last) * scale;
            s * s
        })
        .collect();
    std::iter::once(bar[0])
        .chain(bar.windows(2).map(|w| w[1] / w[0]))
        .map(|alpha| 1.0 - alpha)
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::schedulers::SchedulerConfig;
    use crate::schedulers::fixtures::fixtures;

    #[test]
    fn alphas_cumprod_match_torch_bit_for_bit() {
        let expected: Vec<u32> = fixtures()["alphas_cumprod_bits"]
            .as_array()
            .expect("bits")
            .iter()
            .map(|b| b.as_u64().expect("u32") as u32)
            .collect();
        let ours: Vec<u32> = SchedulerConfig::sd15()
            .alphas_cumprod()
            .iter()
            .map(|a| a.to_bits())
            .collect();
        assert_eq!(ours, expected);
    }
}
