//! VAE compilation: the decoder's GroupNorm(+SiLU) layers through our CubeCL kernels instead of
//! burn's op chains. It must never change whether, or what, the studio generates: at first use for
//! each latent shape and dtype the fused path is checked against the plain path on a small crop of
//! the real latents, and any failure (a kernel that does not compile or launch, numbers beyond
//! tolerance) switches this model to the plain path for good with one warning.

use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::{DType, Tensor};

use crate::nn::Kernels;
use crate::vae::AutoencoderKL;

/// Side of the latent crop the check decodes (16 latents = 128 pixels in SD).
const CHECK_SIDE: usize = 16;

/// Largest relative difference (max |fused - plain| / max |plain|) the check accepts.
pub fn tolerance(dtype: DType) -> f32 {
    if dtype == DType::F32 { 1e-3 } else { 1e-2 }
}

#[derive(Default)]
struct State {
    verified: HashSet<([usize; 4], DType)>,
    /// Why the fused path was abandoned, once it was.
    disabled: Option<String>,
}

/// What VAE compilation has learned for one loaded model: the shapes verified, or why the fused
/// path was abandoned. Whether a decode uses it is the request's choice
/// ([`crate::pipeline::DecodeOptions::compile`]), not this shared model's.
#[derive(Default)]
pub struct VaeCompiler {
    /// Test hook: the check fails as if the kernels had not compiled.
    force_failure: AtomicBool,
    state: Mutex<State>,
}

impl std::fmt::Debug for VaeCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VaeCompiler")
            .field("fallback", &self.fallback_reason())
            .finish()
    }
}

impl VaeCompiler {
    /// Makes every check fail, as a kernel that does not compile would (for tests and `--vae-compile`
    /// fault drills via the app's `LATENT_STUDIO_TEST_FAIL_VAE_COMPILE=1`).
    pub fn force_failure(&self, fail: bool) {
        self.force_failure.store(fail, Ordering::Relaxed);
    }

    /// How many (shape, dtype) pairs the fused path has been verified for.
    pub fn verified_shapes(&self) -> usize {
        self.lock().verified.len()
    }

    /// Why the fused path was abandoned, if it was.
    pub fn fallback_reason(&self) -> Option<String> {
        self.lock().disabled.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state inconsistent: recover it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Which kernels a decode of `latents` uses: `Fused` when compilation is `on`, available and
    /// verified for this shape and dtype (verifying it now if it was not), else `Plain` (off: no
    /// compile or check work at all). The tiled decode runs its whole-latent layers through these
    /// (`crate::vae_tiling`). `abandoned` hears the reason once, when a check turns compilation
    /// off for this model (the pipeline makes it its one warning).
    pub fn kernels(
        &self,
        on: bool,
        vae: &AutoencoderKL,
        latents: &Tensor<4>,
        abandoned: &mut dyn FnMut(String),
    ) -> Kernels {
        if !on || !crate::kernels::available(&latents.device()) {
            return Kernels::Plain;
        }
        let key = (latents.dims(), latents.dtype());
        let verdict = {
            let state = self.lock();
            if state.disabled.is_some() {
                return Kernels::Plain;
            }
            state.verified.contains(&key)
        };
        if verdict {
            return Kernels::Fused;
        }
        match self.check(vae, latents) {
            Ok(true) => {
                self.lock().verified.insert(key);
                Kernels::Fused
            }
            // Nothing to compare against: decode plain, judge the kernels another time.
            Ok(false) => Kernels::Plain,
            Err(reason) => {
                let mut state = self.lock();
                if state.disabled.is_none() {
                    // The notice is the one warning: the CLI prints it, the studio shows and logs it.
                    tracing::debug!("VAE compilation disabled: {reason}");
                    state.disabled = Some(reason.clone());
                    drop(state);
                    abandoned(reason);
                }
                Kernels::Plain
            }
        }
    }

    /// Decodes a small crop of the latents both ways and compares. `Ok(false)`: inconclusive, the
    /// plain decode itself is not finite (an f16 overflow the pipeline's NaN guard retries in f32;
    /// blaming the fused kernels for it would turn compilation off for nothing).
    fn check(&self, vae: &AutoencoderKL, latents: &Tensor<4>) -> Result<bool, String> {
        let [_, c, h, w] = latents.dims();
        let crop = latents
            .clone()
            .slice([0..1, 0..c, 0..h.min(CHECK_SIDE), 0..w.min(CHECK_SIDE)]);
        let read = |t: Tensor<4>| -> Result<Vec<f32>, String> {
            t.cast(DType::F32)
                .into_data()
                .try_to_vec::<f32>()
                .map_err(|e| format!("reading the check decode failed: {e:?}"))
        };
        let plain = read(vae.decode_with(crop.clone(), Kernels::Plain))?;
        if plain.iter().any(|v| !v.is_finite()) {
            return Ok(false);
        }
        if self.force_failure.load(Ordering::Relaxed) {
            return Err(
                "the fused GroupNorm kernels failed to compile (forced by a test hook)".into(),
            );
        }
        let fused = catch_unwind(AssertUnwindSafe(|| {
            read(vae.decode_with(crop, Kernels::Fused))
        }))
        .map_err(|panic| {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown error".into());
            format!("the fused GroupNorm kernels failed: {what}")
        })??;
        let rel = relative_difference(&fused, &plain);
        let tol = tolerance(latents.dtype());
        if rel.is_nan() || rel > tol {
            return Err(format!(
                "the fused path differs from the plain path by {rel:.2e} (tolerance {tol:.0e})"
            ));
        }
        tracing::debug!(rel, shape = ?latents.dims(), "VAE compilation verified");
        Ok(true)
    }
}

/// max |a - b| / max |b|; NaN when either holds a non-finite value.
pub fn relative_difference(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::NAN;
    }
    let mut diff = 0.0f32;
    let mut scale = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        if !x.is_finite() || !y.is_finite() {
            return f32::NAN;
        }
        diff = diff.max((x - y).abs());
        scale = scale.max(y.abs());
    }
    diff / scale.max(1e-12)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_difference_flags_mismatch_and_non_finite() {
        assert_eq!(relative_difference(&[1.0, -2.0], &[1.0, -2.0]), 0.0);
        assert!((relative_difference(&[1.0, -2.1], &[1.0, -2.0]) - 0.05).abs() < 1e-6);
        assert!(relative_difference(&[f32::NAN], &[1.0]).is_nan());
        assert!(relative_difference(&[1.0], &[1.0, 2.0]).is_nan());
    }
}
