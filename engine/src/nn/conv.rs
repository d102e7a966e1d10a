//! `nn.Conv2d`: burn's convolution, or our implicit GEMM where it is the faster one.

use burn::tensor::module::conv2d;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Tensor};

use crate::error::Result;
use crate::kernels::conv::{Columns, Epilogue, Geometry};
use crate::kernels::group_norm::ChannelTerms;
use crate::weights::Weights;

/// `nn.Conv2d` with square kernel, equal stride and symmetric padding.
#[derive(Debug, Clone)]
pub struct Conv2d {
    weight: Tensor<4>,
    bias: Option<Tensor<1>>,
    stride: usize,
    padding: usize,
    /// Our kernels' use of this layer (the route settled at the first call, the weights packed
    /// for them).
    ours: crate::kernels::conv::Prepared,
    /// The bias in f32 `[c_out]`, cast at the first deferred call ([`Self::forward_deferred`]):
    /// not once a step per resnet.
    bias_f32: std::sync::Arc<std::sync::OnceLock<Tensor<1>>>,
}

impl Conv2d {
    pub fn load(
        w: &Weights,
        c_in: usize,
        c_out: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
    ) -> Result<Self> {
        // Packed once for our channels-last GEMM where it takes the layer, and held once: the
        // model keeps (for rebuilding with a LoRA) the OIHW view of the packed buffer.
        let (weight, packed) =
            crate::kernels::conv::stored_weight(w.tensor("weight", [c_out, c_in, kernel, kernel])?);
        if packed.is_some() {
            w.keep_instead("weight", weight.clone());
        }
        Ok(Self {
            weight,
            bias: w.optional("bias", [c_out])?,
            stride,
            padding,
            ours: packed.map_or_else(Default::default, crate::kernels::conv::Prepared::with_taps),
            bias_f32: Default::default(),
        })
    }

    /// From an OIHW weight and an optional bias (benchmarks, tests).
    pub fn from_tensors(
        weight: Tensor<4>,
        bias: Option<Tensor<1>>,
        stride: usize,
        padding: usize,
    ) -> Self {
        Self {
            weight,
            bias,
            stride,
            padding,
            ours: Default::default(),
            bias_f32: Default::default(),
        }
    }

    /// # Shapes
    /// `[b, c_in, h, w] -> [b, c_out, h', w']`
    ///
    /// The bias is added after the convolution, not passed to it: in burn 0.22 / CubeCL 0.11 a
    /// bias adds a full-tile accumulator stage to the implicit-GEMM (cooperative-matrix) kernels,
    /// which then pass the 48 KiB workgroup-memory limit on most SD shapes and drop out of
    /// autotune, leaving the direct kernel (10x slower per UNet step on an H200). The add is
    /// fused with what follows. Where our kernel runs, the bias is added in its epilogue.
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        self.forward_adding(x, None, None)
    }

    /// [`Self::forward`] plus `channel` `[b, c_out]` at every pixel (the time embedding) and
    /// `residual` `[b, c_out, h', w']`: in our kernel's epilogue where it has them (no pass over
    /// the map of their own; the channels-last GEMM adds a residual that lies channels-last, and
    /// `channel` with a burn op), as burn ops otherwise.
    pub fn forward_adding(
        &self,
        x: Tensor<4>,
        channel: Option<Columns<'_>>,
        residual: Option<&Tensor<4>>,
    ) -> Tensor<4> {
        self.run(x, false, channel, residual, false).0
    }

    /// [`Self::forward_adding`] without a residual, with the bias and `channel` left to the
    /// caller where the map comes back channels-last (burn's convolution on a GPU, or ours
    /// channels-last): the map without them and their sum as `[b, c_out]` (f32), for the
    /// GroupNorm that follows to add on its way ([`crate::nn::GroupNorm::forward_shifted`])
    /// instead of a pass over the map of its own. Elsewhere (our other kernels' epilogue, the
    /// CPU) they are added here.
    pub fn forward_deferred(
        &self,
        x: Tensor<4>,
        channel: Option<Columns<'_>>,
    ) -> (Tensor<4>, Option<ChannelTerms>) {
        self.run(x, false, channel, None, true)
    }

    /// A 1×1 layer over a map held as tokens `[b, h·w, c_in]`, plus `residual`
    /// `[b, c_out, h, w]`: on our GEMM where it takes 1×1 layers, reading the tokens as they
    /// lie and writing the map (no transpose of its own); otherwise the tokens are laid out as
    /// the map first.
    ///
    /// # Shapes
    /// tokens `[b, h·w, c_in]` -> `[b, c_out, h, w]`
    pub fn forward_tokens(
        &self,
        tokens: Tensor<3>,
        [h, w]: [usize; 2],
        residual: Option<&Tensor<4>>,
    ) -> Tensor<4> {
        let [b, _, c_in] = tokens.dims();
        // The layer's route, settled once (as `forward` settles it), decides: no probe per call.
        if self.stride == 1
            && self.padding == 0
            && let Some(y) = self.ours.forward_tokens(
                &tokens,
                &self.weight,
                self.bias.as_ref(),
                residual,
                [h, w],
            )
        {
            return y;
        }
        let map = tokens.swap_dims(1, 2).reshape([b, c_in, h, w]);
        self.forward_adding(map, None, residual)
    }

    /// [`Self::forward`] of `x` upsampled ×2 by nearest neighbour: read in place by our kernel
    /// where it runs, materialised for burn's convolution otherwise.
    ///
    /// # Shapes
    /// `[b, c_in, h, w] -> [b, c_out, 2h, 2w]` (3×3, stride 1, padding 1)
    pub fn forward_upsampled(&self, x: Tensor<4>) -> Tensor<4> {
        self.run(x, true, None, None, false).0
    }

    fn run(
        &self,
        x: Tensor<4>,
        upsample: bool,
        channel: Option<Columns<'_>>,
        residual: Option<&Tensor<4>>,
        defer_bias: bool,
    ) -> (Tensor<4>, Option<ChannelTerms>) {
        crate::profile::record(|| {
            let [b, c_in, h, w] = x.dims();
            let up = if upsample { 2 } else { 1 };
            let (h, w) = (h * up, w * up);
            let [c_out, _, k, _] = self.weight.dims();
            crate::profile::OpShape::Conv {
                b,
                c_in,
                c_out,
                h,
                w,
                k,
                stride: self.stride,
                padding: self.padding,
                bias: self.bias.is_some(),
            }
        });
        let epilogue = Epilogue {
            bias: self.bias.as_ref(),
            channel,
            residual,
        };
        let [_, _, k, _] = self.weight.dims();
        let geometry = Geometry {
            k,
            stride: self.stride,
            padding: self.padding,
            upsample,
        };
        let gpu = !crate::device::is_cpu(&x.device());
        // Channels-last on our GEMM, the bias and channel term can be left to the norm after.
        if defer_bias
            && residual.is_none()
            && self
                .ours
                .channels_last_for(&x, &self.weight, geometry)
                .is_some()
        {
            let bare = Epilogue::default();
            if let Some(y) = self.ours.forward(&x, &self.weight, geometry, &bare) {
                return (y, self.deferred(channel));
            }
        }
        if let Some(y) = self.ours.forward(&x, &self.weight, geometry, &epilogue) {
            return (y, None);
        }
        let x = match upsample {
            // burn's convolution on a GPU computes channels-last: upsampled in that layout, the
            // map is read as it lies (one copy, not the upsample's and then the relayout's).
            true if gpu => nearest_x2_channels_last(x),
            true => nearest_x2(x),
            false => x,
        };
        let options = ConvOptions::new([self.stride; 2], [self.padding; 2], [1, 1], 1);
        let y = conv2d(x, self.weight.clone(), None, options);
        if defer_bias && gpu && residual.is_none() {
            return (y, self.deferred(channel));
        }
        (epilogue.apply(y), None)
    }

    /// The bias (f32) and `channel` terms left to the norm, as they lie (the norm's kernels read
    /// them in place); `None` where there are none.
    fn deferred(&self, channel: Option<Columns<'_>>) -> Option<ChannelTerms> {
        let bias = self.bias.as_ref().map(|bias| {
            self.bias_f32
                .get_or_init(|| {
                    let device = bias.device();
                    crate::device::persistent(&device, || {
                        let f32 = bias.clone().cast(DType::F32);
                        // Materialised now, beside the weights, so each call reads it as it lies.
                        let _ = crate::kernels::resolve(f32.clone());
                        f32
                    })
                })
                .clone()
        });
        let columns = channel.map(|t| (t.tensor.clone(), t.column));
        (bias.is_some() || columns.is_some()).then_some(ChannelTerms { bias, columns })
    }

    /// A copy with its weights in `dtype`.
    pub fn cast(&self, dtype: DType) -> Self {
        Self {
            weight: self.weight.clone().cast(dtype),
            bias: self.bias.clone().map(|b| b.cast(dtype)),
            stride: self.stride,
            padding: self.padding,
            ours: Default::default(),
            bias_f32: Default::default(),
        }
    }
}

/// [`nearest_x2`] materialised channels-last (`[b, 2h, 2w, c]` in memory, `[b, c, 2h, 2w]` as a
/// tensor). From a channels-last map (what burn's convolution writes) it is one copy.
pub fn nearest_x2_channels_last(x: Tensor<4>) -> Tensor<4> {
    let [b, c, h, w] = x.dims();
    x.permute([0, 2, 3, 1])
        .reshape([b, h, 1, w, 1, c])
        .expand([b, h, 2, w, 2, c])
        .reshape([b, 2 * h, 2 * w, c])
        .permute([0, 3, 1, 2])
}

/// ×2 nearest-neighbour upsampling by broadcasting: the same values as burn's `interpolate`
/// (it only copies), as a copy kernel that does not depend on the shape. burn's interpolation
/// kernel is compiled for each input shape, and the tiled VAE decode has tiles of many shapes: on
/// lavapipe that was 19 more kernel compilations (~6 s) for the tiny model's 12 tiles.
pub fn nearest_x2(x: Tensor<4>) -> Tensor<4> {
    let [b, c, h, w] = x.dims();
    x.reshape([b, c, h, 1, w, 1])
        .expand([b, c, h, 2, w, 2])
        .reshape([b, c, 2 * h, 2 * w])
}

#[cfg(test)]
mod tests {
    use burn::tensor::{DType, Device, DeviceKind, Distribution, Tensor, TensorData};

    use super::Conv2d;
    use crate::nn::{GroupNorm, Kernels};

    /// Both upsamplings give the same map, whatever the memory order.
    #[test]
    fn channels_last_upsample_equals_the_plain_one() {
        let (b, c, h, w) = (2, 3, 4, 5);
        let values: Vec<f32> = (0..b * c * h * w).map(|i| i as f32).collect();
        let x = Tensor::<4>::from_data(TensorData::new(values, [b, c, h, w]), &Device::flex());
        let plain = super::nearest_x2(x.clone()).into_data();
        let last = super::nearest_x2_channels_last(x).into_data();
        assert_eq!(plain.shape().to_vec(), vec![b, c, 2 * h, 2 * w]);
        assert_eq!(plain, last);
    }

    /// Where burn's convolution runs on a GPU (a 5×5 layer: ours takes 3×3 and 1×1), the bias
    /// and a per-image channel term (columns of a wider tensor, as the UNet's time embeddings)
    /// come back for the next GroupNorm, which adds them on its way over the channels-last map:
    /// the same as the convolution with its bias and the term, normalised (CPU twin), in f32
    /// and f16.
    #[test]
    fn a_bias_left_to_the_norm_equals_the_biased_convolution() {
        let device = Device::wgpu(DeviceKind::DefaultDevice);
        let cpu = Device::flex();
        let normal = Distribution::Normal(0.0, 1.0);
        let (weight, bias) = (
            Tensor::<4>::random([64, 16, 5, 5], normal, &cpu),
            Tensor::<1>::random([64], Distribution::Uniform(-2.0, 2.0), &cpu),
        );
        let x = Tensor::<4>::random([2, 16, 9, 7], normal, &cpu);
        let gamma = Tensor::<1>::random([64], Distribution::Uniform(0.5, 1.5), &cpu);
        let beta = Tensor::<1>::random([64], normal, &cpu);
        let temb = Tensor::<2>::random([2, 80], normal, &cpu);
        let columns = |tensor| super::Columns { tensor, column: 16 };
        let plain = Conv2d::from_tensors(weight.clone(), Some(bias.clone()), 1, 2);
        let norm = GroupNorm::from_tensors(gamma.clone(), beta.clone(), 32, 1e-5);
        let want = norm.forward_with(
            plain.forward_adding(x.clone(), Some(columns(&temb)), None),
            true,
            Kernels::Plain,
        );
        let want: Vec<f32> = want.into_data().convert::<f32>().try_to_vec().unwrap();
        for dtype in [DType::F32, DType::F16] {
            let on = |t: &Tensor<4>| Tensor::from_data(t.to_data(), (&device, dtype));
            let conv = Conv2d::from_tensors(
                on(&weight),
                Some(Tensor::from_data(bias.to_data(), (&device, dtype))),
                1,
                2,
            );
            let norm = GroupNorm::from_tensors(
                Tensor::from_data(gamma.to_data(), &device),
                Tensor::from_data(beta.to_data(), &device),
                32,
                1e-5,
            );
            let on_temb = Tensor::<2>::from_data(temb.to_data(), (&device, dtype));
            let term = super::Columns {
                tensor: &on_temb,
                column: 16,
            };
            let (y, left) = conv.forward_deferred(on(&x), Some(term));
            assert!(left.is_some(), "the bias and term are left to the norm");
            let strided = crate::kernels::resolve_strided(y.clone()).unwrap();
            assert!(crate::kernels::group_norm::is_channels_last(&strided));
            let got = norm.forward_shifted(y, left, true, Kernels::Fused);
            let got: Vec<f32> = got.cast(DType::F32).into_data().try_to_vec().unwrap();
            let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
            let diff = got
                .iter()
                .zip(&want)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            let tol = if dtype == DType::F32 { 1e-4 } else { 1e-2 };
            assert!(diff / scale <= tol, "{dtype:?}: {}", diff / scale);
        }
    }
}
