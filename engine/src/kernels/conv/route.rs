//! Which convolution runs where: the device's route, settled once per layer ([`Prepared`]).

use std::sync::{Arc, OnceLock};

use burn::tensor::{DType, Tensor};

use super::super::attention::{Fragment, device_fragment};
use super::super::resolve;
use super::cmma::BK_MMA;
use super::kernel::{BK, BM, BN, LANES};
use super::{Epilogue, Geometry, Weights, pack, run, splits};

/// Fewest output channels for which ours runs on a card (a tile holds 64).
const MIN_OUT_CHANNELS: usize = 32;

/// Most 64 × 64 tiles for which our cooperative-matrix convolution runs (split) instead of
/// burn's: the 8×8 and 16×16 maps of SD at 512². Measured on an H200 (BENCHMARKS.md, sixteenth
/// session, call 7, each shape alone), ours reading its input unrolled: at 8×8 (40 tiles) 0.275
/// against burn's 0.664 ms (1280→1280); at 16×16 (80–160 tiles) level with burn's (0.685
/// against 0.678 ms), the whole step faster with them in two calls (46.3/46.8 against
/// 47.1/49.1 ms), which also spares burn's autotune those shapes; at 32×32 burn's is faster
/// (2.38 against 1.22 ms for 1280→1280).
pub const MMA_MAX_TILES: usize = 160;

/// The tile limit in force: [`MMA_MAX_TILES`] unless the bench set another
/// ([`set_mma_max_tiles`]) to time a routing rule in the same process.
pub fn mma_max_tiles() -> usize {
    MAX_TILES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Sets [`mma_max_tiles`] process-wide (calls afterwards route by it).
pub fn set_mma_max_tiles(tiles: usize) {
    MAX_TILES.store(tiles, std::sync::atomic::Ordering::Relaxed);
}

static MAX_TILES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(MMA_MAX_TILES);

/// Fewest tiles from which a 3×3 layer on cooperative matrices that ours does not take runs as
/// the unrolled input through burn's matmul ([`super::conv2d_unrolled_matmul`]) instead of burn's
/// convolution: `usize::MAX` (never) unless the bench set it ([`set_unrolled_matmul_from`]).
pub fn unrolled_matmul_from() -> usize {
    UNROLLED_FROM.load(std::sync::atomic::Ordering::Relaxed)
}

/// Sets [`unrolled_matmul_from`] process-wide (calls afterwards route by it).
pub fn set_unrolled_matmul_from(tiles: usize) {
    UNROLLED_FROM.store(tiles, std::sync::atomic::Ordering::Relaxed);
}

static UNROLLED_FROM: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(usize::MAX);

/// Whether the unrolled layers ([`unrolled_matmul_from`]) and the 1×1 layers run on our
/// cooperative-matrix GEMM ([`super::conv2d_unrolled_gemm`]) rather than burn's matmul and
/// convolution: off unless the bench set it ([`set_unrolled_gemm`]).
pub fn unrolled_gemm() -> bool {
    UNROLLED_GEMM.load(std::sync::atomic::Ordering::Relaxed)
}

/// Sets [`unrolled_gemm`] process-wide.
pub fn set_unrolled_gemm(on: bool) {
    UNROLLED_GEMM.store(on, std::sync::atomic::Ordering::Relaxed);
}

static UNROLLED_GEMM: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The GEMM's shape from the convolution's (same plane width and fragment), where it fits.
fn gemm_of(mma: Mma) -> Option<crate::kernels::matmul::MmaGemm> {
    let gemm = crate::kernels::matmul::MmaGemm {
        plane: mma.plane,
        fragment: mma.fragment,
    };
    gemm.fits().then_some(gemm)
}

/// The cooperative-matrix kernel's shape on one device ([`cmma`]): its plane width, fixed when
/// the kernel compiles, and its f16×f16→f32 fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mma {
    pub plane: usize,
    pub fragment: Fragment,
}

impl Mma {
    /// The device's, where it has an f16 fragment and one plane width that give each plane two
    /// fragments of the 64 × 64 tile.
    fn of(client: &burn::cubecl::client::Client) -> Option<Self> {
        let hardware = &client.properties().hardware;
        if hardware.plane_size_min != hardware.plane_size_max {
            return None;
        }
        let mma = Mma {
            plane: hardware.plane_size_max as usize,
            fragment: device_fragment(client)?,
        };
        mma.fits().then_some(mma)
    }

    /// Whether the fragments tile the block two a plane (the kernel's layout).
    pub(super) fn fits(&self) -> bool {
        let (f, plane) = (self.fragment, self.plane);
        plane > 0
            && f.m > 0
            && f.n > 0
            && f.k > 0
            && LANES % plane == 0
            && BM % f.m == 0
            && BN % (2 * f.n) == 0
            && BK_MMA % f.k == 0
            && (BM / f.m) * (BN / f.n) == 2 * (LANES / plane)
    }
}

/// Where a layer's device stands: whether ours runs at all, and for which shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// The CPU backend, f32 on cooperative matrices, or a device whose fragments or planes
    /// our cooperative-matrix kernel cannot use: burn's convolution.
    Burn,
    /// Cooperative matrices in f16: ours on them for 3×3 layers on the smallest maps (at most
    /// [`MMA_MAX_TILES`] tiles, the reduction split); burn's cooperative-matrix kernel elsewhere.
    Mma(Mma),
    /// A card without cooperative matrices: ours for the shapes it is faster at.
    Card,
    /// A software adapter: ours for every 3×3 and 1×1 layer.
    Software,
}

impl Route {
    fn of(device: &burn::tensor::Device, dtype: DType) -> Self {
        if !super::super::available(device) {
            Route::Burn
        } else if !super::super::plain_lanes(device, dtype) {
            let probe = (dtype == DType::F16)
                .then(|| resolve(Tensor::<1>::zeros([1], (device, dtype))))
                .flatten();
            match probe.and_then(|p| Mma::of(&p.client)) {
                Some(mma) => Route::Mma(mma),
                None => Route::Burn,
            }
        } else if super::super::software(device) {
            Route::Software
        } else {
            Route::Card
        }
    }

    /// The layer shapes ours takes here (module docs).
    fn takes(self, kh: usize, kw: usize, c_out: usize) -> bool {
        match self {
            Route::Burn => false,
            Route::Mma(_) | Route::Card => kh == 3 && kw == 3 && c_out >= MIN_OUT_CHANNELS,
            Route::Software => kh == kw && (kh == 3 || kh == 1) && c_out > 0,
        }
    }
}

/// How a layer runs, settled at its first call.
#[derive(Debug, Clone)]
enum Use {
    Burn,
    /// Burn's, on a device with cooperative matrices (our GEMM may take it: [`unrolled_gemm`]).
    BurnOnMma(Mma),
    /// The SIMT kernel on the weights packed once ([`pack`]).
    Packed(Tensor<2>),
    /// The cooperative-matrix kernel, on the weights as stored, where the map is small.
    Stored(Mma),
}

/// One convolution layer's use of our kernel: whether it runs on the layer's device and, for
/// the SIMT kernel, its packed weights, both settled at the first call (a layer's weights live
/// on one device in one dtype; a cast makes a new layer). Clones share it.
#[derive(Debug, Clone, Default)]
pub struct Prepared(Arc<OnceLock<Use>>);

impl Prepared {
    /// Whether the first call packed the weights for the SIMT kernel.
    #[cfg(test)]
    pub(super) fn is_packed(&self) -> bool {
        matches!(self.0.get(), Some(Use::Packed(_)))
    }

    /// `x` through our kernel with `weight` (OIHW) and the `epilogue`, where it runs (see the
    /// module docs); `None` for burn's `conv2d`.
    pub fn forward(
        &self,
        x: &Tensor<4>,
        weight: &Tensor<4>,
        geometry: Geometry,
        epilogue: &Epilogue<'_>,
    ) -> Option<Tensor<4>> {
        let device = x.device();
        let [c_out, _, kh, kw] = weight.dims();
        if !super::super::available(&device) || geometry.k != kh {
            return None;
        }
        let prepared = self.0.get_or_init(|| {
            let route = Route::of(&device, x.dtype());
            match route {
                Route::Mma(mma) if !route.takes(kh, kw, c_out) => Use::BurnOnMma(mma),
                _ if !route.takes(kh, kw, c_out) => Use::Burn,
                Route::Mma(mma) => Use::Stored(mma),
                _ => Use::Packed(pack(weight.clone())),
            }
        });
        match prepared {
            Use::Burn => None,
            Use::BurnOnMma(mma) => {
                if !(unrolled_gemm() && kh == 1) {
                    return None;
                }
                super::conv2d_unrolled_gemm(
                    x.clone(),
                    weight,
                    geometry,
                    epilogue,
                    gemm_of(*mma)?,
                    None,
                )
            }
            Use::Packed(packed) => {
                run(x.clone(), Weights::Packed(packed), geometry, epilogue, None)
            }
            Use::Stored(mma) => {
                let [b, _, h, w] = x.dims();
                let [oh, ow] = geometry.output(h, w)?;
                let tiles = (b * oh * ow).div_ceil(BN) * c_out.div_ceil(BM);
                let steps = (weight.dims()[1] * kh * kw).div_ceil(BK);
                if tiles >= unrolled_matmul_from() {
                    if unrolled_gemm() {
                        let gemm = gemm_of(*mma)?;
                        return super::conv2d_unrolled_gemm(
                            x.clone(),
                            weight,
                            geometry,
                            epilogue,
                            gemm,
                            None,
                        );
                    }
                    return super::conv2d_unrolled_matmul(x.clone(), weight, geometry, epilogue);
                }
                (tiles <= mma_max_tiles() && splits(tiles, steps) > 1).then_some(())?;
                run(
                    x.clone(),
                    Weights::Stored(weight, *mma),
                    geometry,
                    epilogue,
                    None,
                )
            }
        }
    }
}

/// Whether a `k`×`k` convolution to `c_out` channels in `dtype` runs through our kernel on
/// `device` (the bench's op report): on cooperative matrices, on maps small enough to split.
pub fn runs_for(device: &burn::tensor::Device, dtype: DType, k: usize, c_out: usize) -> bool {
    Route::of(device, dtype).takes(k, k, c_out)
}

/// Our cooperative-matrix convolution on `device` in `dtype`, where it runs (f16, a fragment
/// and plane width it can use); `None` elsewhere.
pub fn mma_on(device: &burn::tensor::Device, dtype: DType) -> Option<Mma> {
    match Route::of(device, dtype) {
        Route::Mma(mma) => Some(mma),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{Fragment, Mma, Route};

    /// Which layers ours takes on each kind of device (module docs).
    #[test]
    fn routes_by_adapter() {
        assert!(Route::Card.takes(3, 3, 32));
        assert!(
            !Route::Card.takes(3, 3, 4),
            "narrow outputs stay with burn on a card"
        );
        assert!(
            !Route::Card.takes(1, 1, 320),
            "1×1 layers stay with burn on a card"
        );
        assert!(Route::Software.takes(1, 1, 4));
        assert!(Route::Software.takes(3, 3, 3));
        assert!(!Route::Software.takes(5, 5, 40));
        assert!(!Route::Software.takes(3, 1, 40));
        assert!(!Route::Burn.takes(3, 3, 320));
        let square = Fragment {
            m: 16,
            n: 16,
            k: 16,
        };
        let nvidia = Mma {
            plane: 32,
            fragment: square,
        };
        assert!(Route::Mma(nvidia).takes(3, 3, 1280));
        assert!(!Route::Mma(nvidia).takes(1, 1, 1280));
    }

    /// The cooperative-matrix kernel's layout: two fragments a plane over the 64 × 64 tile.
    #[test]
    fn mma_shapes_that_tile_the_block() {
        let f = |m, n, k| Fragment { m, n, k };
        let fits = |plane, fragment| Mma { plane, fragment }.fits();
        assert!(fits(32, f(16, 16, 16)), "NVIDIA");
        assert!(
            fits(16, f(8, 16, 16)),
            "Intel Arc, were its plane width fixed"
        );
        assert!(
            !fits(64, f(16, 16, 16)),
            "four planes of 64 would need four fragments each"
        );
        assert!(!fits(32, f(16, 16, 48)), "the step is not a multiple of k");
        assert!(
            !fits(16, f(16, 16, 16)),
            "sixteen planes for sixteen fragments"
        );
        assert!(!fits(0, f(16, 16, 16)));
    }
}
