//! Bit-exact reimplementation of PyTorch's CPU `torch.randn`.
//!
//! ComfyUI, diffusers and A1111 make seeds portable by drawing the initial
//! latent noise (and the per-step noise of ancestral/SDE samplers) on the CPU:
//!
//! ```python
//! g = torch.Generator("cpu").manual_seed(seed)
//! torch.randn(shape, generator=g, dtype=torch.float32)
//! ```
//!
//! [`TorchRng`] reproduces that stream bit for bit (checked against torch
//! 2.15.0, see `tests/fixtures/make_noise_fixtures.py`), so a seed typed into
//! this studio gives the same picture as in those tools. The pieces mirrored
//! are:
//!
//! * `aten/src/ATen/core/MT19937RNGEngine.h`: a textbook MT19937 whose
//!   constructor takes a `u64` seed but only uses `seed & 0xffffffff`.
//! * `aten/src/ATen/CPUGeneratorImpl.cpp`: `random()` is one MT draw,
//!   `random64()` is two draws with the first as the high half; the generator
//!   also caches the second Box-Muller output of the scalar normal sampler.
//! * `aten/src/ATen/core/DistributionsHelper.h` and
//!   `aten/src/ATen/core/TransformationHelper.h`: uniform floats take the low
//!   24 bits of `random()`, uniform doubles the low 53 bits of `random64()`.
//! * `aten/src/ATen/native/cpu/DistributionTemplates.h` (`normal_kernel`):
//!   fewer than 16 elements go through the scalar `normal_distribution<double>`;
//!   16 or more through `normal_fill`, which fills the whole buffer with
//!   uniforms first and then applies Box-Muller to blocks of 16.
//! * `aten/src/ATen/native/cpu/avx_mathfun.h`: on x86-64 CPUs with AVX2 (and
//!   on AVX-512 CPUs, since `REGISTER_DISPATCH` leaves the AVX-512 slot empty
//!   and the dispatcher falls back to AVX2) the blocks of 16 use the Cephes
//!   style `log256_ps`/`sincos256_ps` polynomials in single precision, not
//!   libm. See [`NormalKernel`].

use std::f64::consts::PI;

/// Which of PyTorch's CPU `normal_fill` kernels to mirror for float32 draws
/// of 16 or more values. Draws of fewer than 16 values are the same for both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NormalKernel {
    /// The AVX2 `NormalFill16<float>` (`normal_fill_16_AVX2` in older
    /// releases): what official PyTorch builds run on any x86-64 CPU with
    /// AVX2+FMA, AVX-512 ones included, i.e. what ComfyUI/diffusers produce on
    /// typical Linux and Windows PCs. Emulated in portable scalar code, so it
    /// gives the same bits on every platform this crate runs on.
    #[default]
    Avx2,
    /// The generic `normal_fill` (float `logf`/`cosf`/`sinf` from libm): what
    /// PyTorch runs on aarch64 (Apple Silicon) or with
    /// `ATEN_CPU_CAPABILITY=default`. Bit exactness depends on the host libm
    /// agreeing with the one PyTorch used (it does for glibc on Linux).
    Scalar,
}

/// A `torch.Generator("cpu")` seeded with `manual_seed(seed)`.
///
/// State carries across calls exactly as on one torch generator, so calling
/// [`TorchRng::randn`] repeatedly matches repeated `torch.randn(...,
/// generator=g)` calls (as ancestral samplers do).
#[derive(Clone)]
pub struct TorchRng {
    mt: Mt19937,
    /// Second Box-Muller output of the scalar path, kept for the next scalar
    /// draw like `CPUGeneratorImpl::next_double_normal_sample_`.
    next_double_normal: Option<f64>,
    kernel: NormalKernel,
}

impl TorchRng {
    /// Equivalent of `torch.Generator("cpu").manual_seed(seed)`, mirroring the
    /// AVX2 kernel (see [`NormalKernel::Avx2`]).
    ///
    /// Python's `manual_seed` also accepts negative seeds; pass those as
    /// `seed as u64` (two's complement), which is what torch does with them.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self::with_kernel(seed, NormalKernel::default())
    }

    /// Like [`TorchRng::new`] but mirroring the given `normal_fill` kernel.
    #[must_use]
    pub fn with_kernel(seed: u64, kernel: NormalKernel) -> Self {
        Self {
            mt: Mt19937::new(seed),
            next_double_normal: None,
            kernel,
        }
    }

    /// Next `torch.randn(numel, generator=g, dtype=torch.float32)` values
    /// (any shape with `numel` elements: the result is laid out contiguously).
    pub fn randn(&mut self, numel: usize) -> Vec<f32> {
        let mut out = vec![0.0; numel];
        self.fill_randn(&mut out);
        out
    }

    /// [`TorchRng::randn`] writing into an existing buffer of `out.len()` values.
    pub fn fill_randn(&mut self, out: &mut [f32]) {
        // `normal_kernel` picks the vectorised fill for contiguous float
        // tensors of at least 16 elements, else the scalar sampler.
        if out.len() >= 16 {
            self.normal_fill(out);
        } else {
            for v in out.iter_mut() {
                *v = self.normal_f64() as f32;
            }
        }
    }

    /// `uniform_real_distribution<float>(0, 1)`: low 24 bits of one draw.
    fn uniform_f32(&mut self) -> f32 {
        (self.mt.next_u32() & 0x00ff_ffff) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// `uniform_real_distribution<double>(0, 1)`: low 53 bits of `random64()`.
    fn uniform_f64(&mut self) -> f64 {
        let hi = u64::from(self.mt.next_u32());
        let lo = u64::from(self.mt.next_u32());
        let bits = (hi << 32) | lo;
        (bits & ((1u64 << 53) - 1)) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// `at::normal_distribution<double>(0, 1)` from `DistributionsHelper.h`:
    /// Box-Muller in double precision, caching the sine half.
    fn normal_f64(&mut self) -> f64 {
        if let Some(cached) = self.next_double_normal.take() {
            return cached;
        }
        let u1 = self.uniform_f64();
        let u2 = self.uniform_f64();
        let r = (-2.0 * (-u2).ln_1p()).sqrt();
        let theta = 2.0 * PI * u1;
        self.next_double_normal = Some(r * theta.sin());
        r * theta.cos()
    }

    /// `normal_fill` from `DistributionTemplates.h`.
    fn normal_fill(&mut self, data: &mut [f32]) {
        debug_assert!(data.len() >= 16);
        // Uniforms for the whole buffer are drawn before any transform.
        for v in data.iter_mut() {
            *v = self.uniform_f32();
        }
        let mut blocks = data.chunks_exact_mut(16);
        for block in &mut blocks {
            self.kernel.box_muller_16(block.try_into().unwrap());
        }
        if !blocks.into_remainder().is_empty() {
            // A ragged tail is handled by redrawing the *last 16* positions
            // from fresh uniforms (overwriting part of the final full block)
            // and transforming them again.
            let n = data.len();
            let tail: &mut [f32; 16] = (&mut data[n - 16..]).try_into().unwrap();
            for v in tail.iter_mut() {
                *v = self.uniform_f32();
            }
            self.kernel.box_muller_16(tail);
        }
    }
}

/// `torch.randn(numel, generator=torch.Generator("cpu").manual_seed(seed))`.
#[must_use]
pub fn randn(seed: u64, numel: usize) -> Vec<f32> {
    TorchRng::new(seed).randn(numel)
}

impl NormalKernel {
    /// Box-Muller on 16 uniforms in `[0, 1)`: element `j` and `j + 8` become
    /// the cosine and sine outputs of the pair `(data[j], data[j + 8])`.
    fn box_muller_16(self, data: &mut [f32; 16]) {
        for j in 0..8 {
            let (u1, u2) = (1.0 - data[j], data[j + 8]); // (0, 1] for log
            let (c, s) = match self {
                NormalKernel::Avx2 => {
                    // Both constants are rounded to f32 before use
                    // (`_mm256_set1_ps`), and theta is an f32 product.
                    let radius = (-2.0 * avx::log(u1)).sqrt();
                    let theta = (2.0 * PI) as f32 * u2;
                    let (sin, cos) = avx::sincos(theta);
                    (radius * cos, radius * sin)
                }
                NormalKernel::Scalar => {
                    // Here theta is computed in double and rounded once.
                    let radius = (-2.0 * u1.ln()).sqrt();
                    let theta = (2.0 * PI * f64::from(u2)) as f32;
                    (radius * theta.cos(), radius * theta.sin())
                }
            };
            // randn has mean 0 and std 1, so `n * std + mean` is exact.
            data[j] = c;
            data[j + 8] = s;
        }
    }
}

/// Scalar emulation of `log256_ps` and `sincos256_ps` from
/// `aten/src/ATen/native/cpu/avx_mathfun.h` (Cephes single-precision
/// polynomials), lane by lane.
///
/// The AVX2 kernels are built with `-mavx2 -mfma` by GCC, whose default
/// `-ffp-contract=fast` fuses a multiply whose only use is an add into an FMA
/// even across intrinsic calls. Each `mul_add` below is such a fusion, as
/// found in the disassembly of the shipped `libtorch_cpu.so` (torch 2.15.0);
/// with plain `*` and `+` about 1% of randn values come out 1-2 ulp off.
mod avx {
    // The header's decimal (double) literals rounded to f32; the test
    // `avx_mathfun_constants_match_libtorch` pins their bit patterns.
    pub(super) const SQRTHF: f32 = 0.707_106_77;
    pub(super) const LOG_P: [f32; 9] = [
        7.037_683_6e-2,
        -1.151_461e-1,
        1.167_699_84e-1,
        -1.242_014_1e-1,
        1.424_932_3e-1,
        -1.666_805_7e-1,
        2.000_071_4e-1,
        -2.499_999_4e-1,
        3.333_333e-1,
    ];
    pub(super) const LOG_Q1: f32 = -2.121_944_4e-4;
    pub(super) const LOG_Q2: f32 = 0.693_359_4;

    pub(super) const MINUS_DP1: f32 = -0.785_156_25;
    pub(super) const MINUS_DP2: f32 = -2.418_756_5e-4;
    pub(super) const MINUS_DP3: f32 = -3.774_895e-8;
    pub(super) const SINCOF: [f32; 3] = [-1.951_529_6e-4, 8.332_161e-3, -1.666_665_5e-1];
    pub(super) const COSCOF: [f32; 3] = [2.443_315_7e-5, -1.388_731_6e-3, 4.166_664_6e-2];
    pub(super) const FOPI: f32 = 1.273_239_5; // 4 / pi

    /// `log256_ps` for one lane. Only called with `1 - u` for uniform `u`, so
    /// `x` lies in `[2^-24, 1]` and the header's handling of zero, negative and
    /// denormal inputs never applies.
    pub(super) fn log(x: f32) -> f32 {
        debug_assert!((f32::MIN_POSITIVE..=1.0).contains(&x));
        // Split into exponent and a mantissa in [0.5, 1).
        let bits = x.to_bits();
        let mut e = ((bits >> 23) as i32 - 0x7f) as f32 + 1.0;
        let mut x = f32::from_bits((bits & !0x7f80_0000) | 0.5f32.to_bits());
        // Recentre around 1 so the polynomial argument is in [-0.29, 0.41].
        if x < SQRTHF {
            e -= 1.0;
            x = (x - 1.0) + x;
        } else {
            x -= 1.0;
        }

        let z = x * x;
        let mut y = LOG_P[0];
        for &p in &LOG_P[1..] {
            y = y.mul_add(x, p);
        }
        y *= x;
        y = y.mul_add(z, e * LOG_Q1);
        y = z.mul_add(-0.5, y);
        let x = x + y;
        e.mul_add(LOG_Q2, x)
    }

    /// `sincos256_ps` for one lane: returns `(sin(x), cos(x))`. Only called
    /// with `x` in `[0, 2pi)`, where the octant index below cannot overflow.
    pub(super) fn sincos(x: f32) -> (f32, f32) {
        let mut sign_sin = x.to_bits() & 0x8000_0000;
        let x = x.abs();
        // Octant index j = (trunc(|x| * 4/pi) + 1) & !1, as integers.
        let j = ((x * FOPI) as i32 + 1) & !1;
        let y = j as f32;
        let swap_sign_sin = ((j & 4) as u32) << 29;
        // In octants 2/3 and 6/7 (after the rounding up of j) the sine and
        // cosine polynomials trade places.
        let swapped = j & 2 != 0;
        let sign_cos = ((!(j - 2) & 4) as u32) << 29;
        sign_sin ^= swap_sign_sin;

        // Extended precision reduction: x = ((x - y*DP1) - y*DP2) - y*DP3.
        let x = y.mul_add(MINUS_DP1, x);
        let x = y.mul_add(MINUS_DP2, x);
        let x = y.mul_add(MINUS_DP3, x);

        let z = x * x;
        let mut yc = COSCOF[0];
        yc = yc.mul_add(z, COSCOF[1]);
        yc = yc.mul_add(z, COSCOF[2]);
        yc *= z;
        yc = yc.mul_add(z, -(z * 0.5));
        yc += 1.0;

        let mut ys = SINCOF[0];
        ys = ys.mul_add(z, SINCOF[1]);
        ys = ys.mul_add(z, SINCOF[2]);
        ys *= z;
        ys = ys.mul_add(x, x);

        // The intrinsics select with and/andnot masks and add the unused
        // polynomial's `v - v` (+0.0), which only matters for signed zeros.
        let (s, c) = if swapped {
            (yc + 0.0, 0.0 + ys)
        } else {
            (0.0 + ys, yc + 0.0)
        };
        (
            f32::from_bits(s.to_bits() ^ sign_sin),
            f32::from_bits(c.to_bits() ^ sign_cos),
        )
    }
}

/// MT19937 as in `aten/src/ATen/core/MT19937RNGEngine.h`.
#[derive(Clone)]
struct Mt19937 {
    state: [u32; Mt19937::N],
    next: usize,
}

impl Mt19937 {
    const N: usize = 624;
    const M: usize = 397;
    const MATRIX_A: u32 = 0x9908_b0df;

    fn new(seed: u64) -> Self {
        // torch stores the full u64 seed but initialises from its low 32 bits
        // (`init_with_uint32`), so seeds equal modulo 2^32 give equal streams.
        let mut state = [0u32; Self::N];
        state[0] = seed as u32;
        for j in 1..Self::N {
            let prev = state[j - 1];
            state[j] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(j as u32);
        }
        Self {
            state,
            next: Self::N,
        }
    }

    fn twist(&mut self) {
        let s = &mut self.state;
        for i in 0..Self::N {
            let y = (s[i] & 0x8000_0000) | (s[(i + 1) % Self::N] & 0x7fff_ffff);
            let mag = if y & 1 == 0 { 0 } else { Self::MATRIX_A };
            s[i] = s[(i + Self::M) % Self::N] ^ (y >> 1) ^ mag;
        }
        self.next = 0;
    }

    fn next_u32(&mut self) -> u32 {
        if self.next == Self::N {
            self.twist();
        }
        let mut y = self.state[self.next];
        self.next += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// Produced by `tests/fixtures/make_noise_fixtures.py` from real torch.
    const FIXTURES: &str = include_str!("../../tests/fixtures/noise_cases.json");

    fn fnv1a64(values: &[f32]) -> u64 {
        values
            .iter()
            .flat_map(|v| v.to_bits().to_le_bytes())
            .fold(0xcbf2_9ce4_8422_2325, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            })
    }

    fn bits(v: &Value) -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|b| u32::try_from(b.as_u64().unwrap()).unwrap())
            .collect()
    }

    fn check_kernel(kernel: NormalKernel, name: &str) {
        let root: Value = serde_json::from_str(FIXTURES).unwrap();
        let mut checked = 0;
        let mut failures = Vec::new();
        let runs = root["runs"].as_array().unwrap();
        let cases = runs.iter().flat_map(|r| r["cases"].as_array().unwrap());
        for case in cases.filter(|c| c["kernel"] == name) {
            let seed = case["seed"].as_u64().unwrap();
            let mut rng = TorchRng::with_kernel(seed, kernel);
            for (i, call) in case["calls"].as_array().unwrap().iter().enumerate() {
                let numel = call["numel"].as_u64().unwrap() as usize;
                let got = rng.randn(numel);
                checked += 1;
                let ok = if let Some(want) = call.get("bits") {
                    let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                    got == bits(want)
                } else {
                    let stride = call["stride"].as_u64().unwrap() as usize;
                    let sample: Vec<u32> =
                        got.iter().step_by(stride).map(|v| v.to_bits()).collect();
                    sample == bits(&call["sample"])
                        && fnv1a64(&got) == call["fnv1a64"].as_u64().unwrap()
                };
                if !ok {
                    failures.push(format!("seed {seed} call #{i} (numel {numel})"));
                }
            }
        }
        assert!(checked > 0, "no {name} cases in fixture");
        assert!(failures.is_empty(), "{name} mismatches: {failures:#?}");
    }

    #[test]
    fn avx2_kernel_matches_torch_bit_for_bit() {
        check_kernel(NormalKernel::Avx2, "avx2");
    }

    /// The scalar kernel calls the host libm and the fixture was made with
    /// glibc's, so this only runs where that is the libm in use.
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn scalar_kernel_matches_torch_bit_for_bit() {
        check_kernel(NormalKernel::Scalar, "scalar");
    }

    #[test]
    fn mt19937_matches_the_cpp_standard() {
        // [rand.predef]: the 10000th output of a default-constructed
        // std::mt19937 (seed 5489) is 4123659995.
        let mut mt = Mt19937::new(5489);
        let out = (0..10_000).map(|_| mt.next_u32()).last();
        assert_eq!(out, Some(4_123_659_995));
    }

    #[test]
    fn only_the_low_32_seed_bits_matter() {
        assert_eq!(randn(7, 40), randn((1 << 40) + 7, 40));
        assert_eq!(randn(u64::MAX, 5), randn(u32::MAX.into(), 5));
        assert_ne!(randn(0, 5), randn((1 << 32) | 1, 5));
    }

    #[test]
    fn split_calls_differ_from_one_call_but_resume_the_stream() {
        // Two 8-value scalar draws equal one 16-value scalar sequence...
        let mut a = TorchRng::new(3);
        let mut joined = a.randn(8);
        joined.extend(a.randn(8));
        let mut b = TorchRng::new(3);
        let singles: Vec<f32> = (0..16).flat_map(|_| b.randn(1)).collect();
        assert_eq!(joined, singles);
        // ...but not the vectorised 16-value draw, which is a different path.
        assert_ne!(joined, randn(3, 16));
    }

    #[test]
    fn avx_mathfun_constants_match_libtorch() {
        // Bit patterns read out of the AVX2 `NormalFill16<float>` in
        // libtorch_cpu.so (torch 2.15.0). Decimal literals in the C header are
        // doubles rounded to float, which is easy to get wrong by hand.
        let expected: [(f32, u32); 23] = [
            (avx::LOG_P[0], 0x3d90_21bb),
            (avx::LOG_P[1], 0xbdeb_d1b8),
            (avx::LOG_P[2], 0x3def_251a),
            (avx::LOG_P[3], 0xbdfe_5d4f),
            (avx::LOG_P[4], 0x3e11_e9bf),
            (avx::LOG_P[5], 0xbe2a_ae50),
            (avx::LOG_P[6], 0x3e4c_ceac),
            (avx::LOG_P[7], 0xbe7f_fffc),
            (avx::LOG_P[8], 0x3eaa_aaaa),
            (avx::LOG_Q1, 0xb95e_8083),
            (avx::LOG_Q2, 0x3f31_8000),
            (avx::SQRTHF, 0x3f35_04f3),
            (avx::FOPI, 0x3fa2_f983),
            (avx::MINUS_DP1, 0xbf49_0000),
            (avx::MINUS_DP2, 0xb97d_a000),
            (avx::MINUS_DP3, 0xb322_2169),
            (avx::COSCOF[0], 0x37cc_f5ce),
            (avx::COSCOF[1], 0xbab6_061a),
            (avx::COSCOF[2], 0x3d2a_aaa5),
            (avx::SINCOF[0], 0xb94c_a1f9),
            (avx::SINCOF[1], 0x3c08_839e),
            (avx::SINCOF[2], 0xbe2a_aaa3),
            ((2.0 * PI) as f32, 0x40c9_0fdb),
        ];
        for (i, (value, want)) in expected.into_iter().enumerate() {
            assert_eq!(value.to_bits(), want, "constant #{i}");
        }
    }
}
