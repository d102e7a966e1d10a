//! SDXL's conditioning in the pipeline: the prompt through both encoders, the empty-negative
//! rule, and the size and crop values ("micro-conditioning") of the added embedding.

use burn::tensor::Tensor;

use crate::error::Result;
use crate::model::StableDiffusion;
use crate::unet::UNet2DConditionModel;

/// diffusers' `original_size`, `crops_coords_top_left` and `target_size` for SDXL, in pixels:
/// sizes as `[height, width]`, the crop as `[top, left]`. A request without them conditions on
/// its own size and no crop, as diffusers and ComfyUI do by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeConditioning {
    pub original: [usize; 2],
    pub crop_top_left: [usize; 2],
    pub target: [usize; 2],
}

impl SizeConditioning {
    /// An image of `width` × `height` seen whole: diffusers' defaults.
    pub fn of_image(width: usize, height: usize) -> Self {
        Self {
            original: [height, width],
            crop_top_left: [0, 0],
            target: [height, width],
        }
    }

    /// diffusers' `add_time_ids`: original, crop and target, in that order.
    pub fn time_ids(&self) -> [f32; 6] {
        let [a, b] = self.original;
        let [c, d] = self.crop_top_left;
        let [e, f] = self.target;
        [a, b, c, d, e, f].map(|v| v as f32)
    }
}

/// Whether the negative prompt conditions on zeros: an SDXL model whose folder says
/// `force_zeros_for_empty_prompt` and a negative with nothing to encode (diffusers' `None`: the
/// studio's empty field is the artist leaving it out).
pub fn zero_negative(model: &StableDiffusion, negative: &str) -> bool {
    model.text_encoder_2.is_some()
        && model.config.force_zeros_for_empty_prompt
        && crate::lora::tags::strip(negative).trim().is_empty()
}

/// The added conditioning for a batch of `pooled` rows (`[b, projection]`), every row with the
/// same size and crop values, as diffusers makes the negative's by default.
pub fn added(
    unet: &UNet2DConditionModel,
    pooled: &Tensor<2>,
    size: SizeConditioning,
) -> Result<Tensor<2>> {
    let rows = pooled.dims()[0];
    unet.added_conditioning(pooled, &vec![size.time_ids(); rows])
}
