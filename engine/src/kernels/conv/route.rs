//! Which convolution runs where: the device's route, settled once per layer ([`Prepared`]).

use std::sync::{Arc, OnceLock};

use burn::tensor::{DType, Tensor};

use super::super::attention::{Fragment, device_fragment};
use super::super::resolve;
use super::cmma::BK_MMA;
use super::kernel::{BK, BM, BN, LANES};
use super::rules::conv_rules;
use super::{Epilogue, Geometry, Weights, pack, run, splits};

/// Fewest output channels for which ours runs on a card (a tile holds 64).
pub(super) const MIN_OUT_CHANNELS: usize = 32;

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
            && LANES.is_multiple_of(plane)
            && BM.is_multiple_of(f.m)
            && BN.is_multiple_of(2 * f.n)
            && BK_MMA.is_multiple_of(f.k)
            && (BM / f.m) * (BN / f.n) == 2 * (LANES / plane)
    }
}

/// Where a layer's device stands: whether ours runs at all, and for which shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// The CPU backend, or an f16 device whose fragments or planes our cooperative-matrix kernel
    /// cannot use: burn's convolution.
    Burn,
    /// Cooperative matrices in f16: ours on them as [`ConvRules`] say; burn's cooperative-matrix
    /// kernel elsewhere.
    Mma(Mma),
    /// A card without cooperative matrices (or computing in f32 beside f16-only ones): ours for
    /// the shapes it is faster at.
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
                // f32 on a card whose cooperative matrices take f16 only: burn's convolution is
                // its direct kernel there (25 ms a 3×3 layer of SD 1.5 on an H100, 94 % of an
                // f32 step; BENCHMARKS.md, nineteenth session), so ours on plain lanes, as on a
                // card without cooperative matrices.
                None if dtype != DType::F16 && !super::super::software(device) => Route::Card,
                None => Route::Burn,
            }
        } else if super::super::software(device) {
            Route::Software
        } else {
            Route::Card
        }
    }

    /// The layer shapes ours takes here (module docs).
    /// `card`: a card's plain lanes, where 1×1 layers are taken too (and run as
    /// [`ConvRules::simt_one_by_one_f32`] and `simt_one_by_one_f16` say).
    fn takes(self, kh: usize, kw: usize, c_out: usize, card: bool) -> bool {
        let one_by_one = card && kh == 1 && kw == 1;
        match self {
            Route::Burn => false,
            Route::Mma(_) | Route::Card => {
                (kh == 3 && kw == 3 || one_by_one) && c_out >= MIN_OUT_CHANNELS
            }
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
    /// The SIMT kernel on the weights packed once ([`pack`]); `f32_card`: f32 on a card, where
    /// [`ConvRules::simt_wide`] applies.
    Packed {
        weights: Box<Tensor<2>>,
        f32_card: bool,
        card: bool,
    },
    /// The cooperative-matrix kernel, on the weights as stored, where the map is small.
    Stored(Mma),
}

/// One convolution layer's use of our kernel: whether it runs on the layer's device and, for
/// the SIMT kernel, its packed weights, both settled at the first call (a layer's weights live
/// on one device in one dtype; a cast makes a new layer), and its weights packed tap-major for
/// the channels-last GEMM (at load, [`super::stored_weight`], or at the first call that needs them).
/// Clones share it.
#[derive(Debug, Clone, Default)]
pub struct Prepared(Arc<OnceLock<Use>>, Arc<OnceLock<Tensor<2>>>);

impl Prepared {
    /// Whether the first call packed the weights for the SIMT kernel.
    #[cfg(test)]
    pub(super) fn is_packed(&self) -> bool {
        matches!(self.0.get(), Some(Use::Packed { .. }))
    }

    /// The layer's use of our kernels, settled at its first call.
    fn settle(&self, device: &burn::tensor::Device, dtype: DType, weight: &Tensor<4>) -> &Use {
        let [c_out, _, kh, kw] = weight.dims();
        self.0.get_or_init(|| {
            let route = Route::of(device, dtype);
            let f32_card = route == Route::Card && dtype == DType::F32;
            match route {
                Route::Mma(mma) if !route.takes(kh, kw, c_out, false) => Use::BurnOnMma(mma),
                _ if !route.takes(kh, kw, c_out, route == Route::Card) => Use::Burn,
                Route::Mma(mma) => Use::Stored(mma),
                // Packed once, kept with the layer, in the weights' pool (`device::persistent`).
                _ => Use::Packed {
                    weights: Box::new(crate::device::persistent(device, || pack(weight.clone()))),
                    f32_card,
                    card: route == Route::Card,
                },
            }
        })
    }

    /// A 1×1 layer (stride 1, no padding: the caller's to check) over a map held as tokens
    /// `[b, h·w, c_in]`, written as the map `[b, c_out, h, w]` plus `residual`, where its route
    /// is our GEMM ([`super::one_by_one_from_tokens`]); `None` otherwise.
    pub fn forward_tokens(
        &self,
        tokens: &Tensor<3>,
        weight: &Tensor<4>,
        bias: Option<&Tensor<1>>,
        residual: Option<&Tensor<4>>,
        hw: [usize; 2],
    ) -> Option<Tensor<4>> {
        let device = tokens.device();
        if !super::super::available(&device) || weight.dims()[2..] != [1, 1] {
            return None;
        }
        let [b, _, c_in] = tokens.dims();
        let [h, w] = hw;
        if let Some(mma) = self.channels_last(&device, tokens.dtype(), weight, [b, c_in, h, w]) {
            let epilogue = Epilogue {
                bias,
                channel: None,
                residual,
            };
            let packed = self.taps(&device, weight);
            if let Some(y) =
                super::channels_last::tokens_channels_last(tokens, hw, packed, &epilogue, mma)
            {
                return Some(y);
            }
        }
        match self.settle(&device, tokens.dtype(), weight) {
            Use::BurnOnMma(mma) if conv_rules().gemm_one_by_one => {
                super::one_by_one_from_tokens(tokens, weight, bias, residual, hw, gemm_of(*mma)?)
            }
            _ => None,
        }
    }

    /// A layer whose weights were packed tap-major at load ([`stored_weight`]).
    pub fn with_taps(packed: Tensor<2>) -> Self {
        Self(Default::default(), Arc::new(OnceLock::from(packed)))
    }

    /// The GEMM where this layer runs channels-last at this input ([`ConvRules::
    /// channels_last_min_tiles`]), `None` elsewhere.
    pub fn channels_last_for(
        &self,
        x: &Tensor<4>,
        weight: &Tensor<4>,
        geometry: Geometry,
    ) -> Option<crate::kernels::matmul::MmaGemm> {
        let [b, c_in, h, w] = x.dims();
        let [oh, ow] = geometry.output(h, w)?;
        if weight.dims()[2] != geometry.k {
            return None;
        }
        self.channels_last(&x.device(), x.dtype(), weight, [b, c_in, oh, ow])
    }

    /// [`Self::channels_last_for`] by the output's size `[b, c_in, oh, ow]`.
    fn channels_last(
        &self,
        device: &burn::tensor::Device,
        dtype: DType,
        weight: &Tensor<4>,
        [b, c_in, oh, ow]: [usize; 4],
    ) -> Option<crate::kernels::matmul::MmaGemm> {
        let [c_out, wc_in, kh, _] = weight.dims();
        let rules = conv_rules();
        let tiles = (b * oh * ow).div_ceil(BN) * c_out.div_ceil(BM);
        if rules.channels_last_min_tiles == usize::MAX
            || tiles < rules.channels_last_min_tiles
            || wc_in != c_in
            || !super::channels_last::takes(c_in, c_out)
            || !super::super::available(device)
        {
            return None;
        }
        match self.settle(device, dtype, weight) {
            Use::Stored(mma) => gemm_of(*mma),
            Use::BurnOnMma(mma) if kh == 1 => gemm_of(*mma),
            _ => None,
        }
    }

    /// The weights packed tap-major for the channels-last GEMM, once per layer.
    fn taps(&self, device: &burn::tensor::Device, weight: &Tensor<4>) -> &Tensor<2> {
        self.1.get_or_init(|| {
            crate::device::persistent(device, || {
                let packed = super::channels_last::pack_taps(weight);
                // Materialised now, so each call reads it as it lies.
                let _ = resolve(packed.clone());
                packed
            })
        })
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
        if geometry.k == kw
            && let Some(gemm) = self.channels_last_for(x, weight, geometry)
        {
            let packed = self.taps(&device, weight);
            if let Some(y) = super::channels_last::conv2d_channels_last(
                x.clone(),
                packed,
                geometry,
                epilogue,
                gemm,
            ) {
                return Some(y);
            }
        }
        let prepared = self.settle(&device, x.dtype(), weight);
        let on_gemm = |mma: Mma, implicit: bool| {
            super::conv2d_unrolled_gemm(
                x.clone(),
                weight,
                geometry,
                epilogue,
                gemm_of(mma)?,
                None,
                implicit,
            )
        };
        match prepared {
            Use::Burn => None,
            Use::BurnOnMma(mma) => {
                (kh == 1 && conv_rules().gemm_one_by_one).then_some(())?;
                on_gemm(*mma, false)
            }
            Use::Packed {
                weights,
                f32_card,
                card,
            } => {
                let rules = conv_rules();
                let one_by_one = match (*f32_card, *card) {
                    (true, _) => rules.simt_one_by_one_f32,
                    (false, true) => rules.simt_one_by_one_f16,
                    (false, false) => true,
                };
                if kh == 1 && !one_by_one {
                    return None;
                }
                let deep = *card && !*f32_card && rules.simt_deep_f16;
                let simt = super::Simt {
                    wide: if *f32_card {
                        rules.simt_wide
                    } else {
                        *card && rules.simt_wide_f16
                    },
                    vector: rules.simt_vector,
                    prefetch: rules.simt_prefetch && !deep,
                    deep,
                    pixels8: rules.simt_pixels8,
                };
                run(
                    x.clone(),
                    Weights::Packed(weights, simt),
                    geometry,
                    epilogue,
                    None,
                )
            }
            Use::Stored(mma) => {
                let [b, _, h, w] = x.dims();
                let [oh, ow] = geometry.output(h, w)?;
                let tiles = (b * oh * ow).div_ceil(BN) * c_out.div_ceil(BM);
                let steps = (weight.dims()[1] * kh * kw).div_ceil(BK);
                let rules = conv_rules();
                if tiles <= rules.split_max_tiles && splits(tiles, steps) > 1 {
                    run(
                        x.clone(),
                        Weights::Stored(weight, *mma),
                        geometry,
                        epilogue,
                        None,
                    )
                } else if tiles <= rules.gemm_max_tiles || c_out >= rules.gemm_min_out {
                    on_gemm(*mma, tiles >= rules.implicit_min_tiles)
                } else {
                    None
                }
            }
        }
    }
}

/// Whether a `k`×`k` convolution to `c_out` channels in `dtype` runs through our kernel on
/// `device` (the bench's op report): on cooperative matrices, on maps small enough to split.
pub fn runs_for(device: &burn::tensor::Device, dtype: DType, k: usize, c_out: usize) -> bool {
    let route = Route::of(device, dtype);
    let rules = conv_rules();
    let one_by_one = match dtype {
        DType::F32 => rules.simt_one_by_one_f32,
        _ => rules.simt_one_by_one_f16,
    };
    route.takes(k, k, c_out, route == Route::Card && one_by_one)
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
        assert!(Route::Card.takes(3, 3, 32, false));
        assert!(
            !Route::Card.takes(3, 3, 4, false),
            "narrow outputs stay with burn on a card"
        );
        assert!(
            !Route::Card.takes(1, 1, 320, false),
            "1×1 layers stay with burn unless a card's plain lanes take them"
        );
        assert!(
            Route::Card.takes(1, 1, 320, true),
            "packed on a card; the rules decide per launch"
        );
        assert!(Route::Software.takes(1, 1, 4, false));
        assert!(Route::Software.takes(3, 3, 3, false));
        assert!(!Route::Software.takes(5, 5, 40, false));
        assert!(!Route::Software.takes(3, 1, 40, false));
        assert!(!Route::Burn.takes(3, 3, 320, true));
        let square = Fragment {
            m: 16,
            n: 16,
            k: 16,
        };
        let nvidia = Mma {
            plane: 32,
            fragment: square,
        };
        assert!(Route::Mma(nvidia).takes(3, 3, 1280, false));
        assert!(!Route::Mma(nvidia).takes(1, 1, 1280, false));
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
