//! SDXL's conditioning in the pipeline: the prompt through both encoders, the empty-negative
//! rule, and the size and crop values ("micro-conditioning") of the added embedding.

use burn::tensor::Tensor;

use crate::checkpoint::ModelConfig;
use crate::error::Result;
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

    /// The keys and values a parameters text records for this conditioning of a `width` ×
    /// `height` image: none where it is the image's own ([`Self::of_image`]), else all three,
    /// sizes as A1111 writes `Size` (width x height) and the crop as left x top.
    pub fn parameters(&self, width: usize, height: usize) -> Vec<(String, String)> {
        if *self == Self::of_image(width, height) {
            return Vec::new();
        }
        let wxh = |[h, w]: [usize; 2]| format!("{w}x{h}");
        vec![
            (ORIGINAL_KEY.to_string(), wxh(self.original)),
            (CROP_KEY.to_string(), wxh(self.crop_top_left)),
            (TARGET_KEY.to_string(), wxh(self.target)),
        ]
    }

    /// The conditioning a parameters text records ([`Self::parameters`]) for a `width` ×
    /// `height` image: `None` where it names none, an error for a value that is not `WxH`
    /// within [`MAX_VALUE`]. A missing key takes the image's own value.
    pub fn from_parameters(
        extra: &[(String, String)],
        width: usize,
        height: usize,
    ) -> Option<crate::error::Result<Self>> {
        let get = |key: &str| extra.iter().find(|(k, _)| k == key).map(|(_, v)| v.trim());
        if [ORIGINAL_KEY, CROP_KEY, TARGET_KEY]
            .iter()
            .all(|k| get(k).is_none())
        {
            return None;
        }
        let read = |key: &str, value: &str, zero: bool| {
            wxh_values(value, zero)
                .map_err(|e| crate::error::Error::InvalidInput(format!("`{key}: {value}`: {e}")))
        };
        let parse = || -> crate::error::Result<Self> {
            let mut c = Self::of_image(width, height);
            if let Some(v) = get(ORIGINAL_KEY) {
                c.original = read(ORIGINAL_KEY, v, false)?;
            }
            if let Some(v) = get(CROP_KEY) {
                c.crop_top_left = read(CROP_KEY, v, true)?;
            }
            if let Some(v) = get(TARGET_KEY) {
                c.target = read(TARGET_KEY, v, false)?;
            }
            Ok(c)
        };
        Some(parse())
    }

    /// diffusers' `add_time_ids`: original, crop and target, in that order.
    pub fn time_ids(&self) -> [f32; 6] {
        let [a, b] = self.original;
        let [c, d] = self.crop_top_left;
        let [e, f] = self.target;
        [a, b, c, d, e, f].map(|v| v as f32)
    }
}

/// The parameters text's keys for [`SizeConditioning`] (A1111 has none; SD.Next and ComfyUI
/// keep these values in their own formats).
pub const ORIGINAL_KEY: &str = "SDXL original size";
pub const CROP_KEY: &str = "SDXL crop";
pub const TARGET_KEY: &str = "SDXL target size";

/// The largest size or crop value taken, in pixels (SDXL was trained on sizes up to ~4096).
pub const MAX_VALUE: usize = 16384;

/// `WxH` (or, for a crop, `LEFTxTOP`) as `[second, first]`: `[height, width]` or `[top,
/// left]`, the order diffusers' time ids take. Zero is allowed only where `zero` (a crop).
pub fn parse_wxh(s: &str, zero: bool) -> crate::error::Result<[usize; 2]> {
    wxh_values(s, zero).map_err(crate::error::Error::InvalidInput)
}

fn wxh_values(s: &str, zero: bool) -> std::result::Result<[usize; 2], String> {
    let (a, b) = s
        .trim()
        .split_once(['x', 'X'])
        .ok_or_else(|| "expected WIDTHxHEIGHT, e.g. 1024x1024".to_string())?;
    let num = |v: &str| -> std::result::Result<usize, String> {
        let n: usize = v
            .trim()
            .parse()
            .map_err(|_| format!("`{}` is not a whole number of pixels", v.trim()))?;
        if (n == 0 && !zero) || n > MAX_VALUE {
            let least = if zero { 0 } else { 1 };
            return Err(format!("{n} is outside {least}..={MAX_VALUE}"));
        }
        Ok(n)
    };
    Ok([num(b)?, num(a)?])
}

/// Whether the negative prompt conditions on zeros: an SDXL model (or refiner) whose folder says
/// `force_zeros_for_empty_prompt` and a negative with nothing to encode (diffusers' `None`: the
/// studio's empty field is the artist leaving it out).
pub fn zero_negative(config: &ModelConfig, negative: &str) -> bool {
    config.text_encoder_2.is_some()
        && config.force_zeros_for_empty_prompt
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

#[cfg(test)]
mod tests {
    use super::{SizeConditioning, parse_wxh};
    use crate::parameters::Parameters;
    use crate::pipeline::Txt2ImgRequest;

    #[test]
    fn sizes_read_as_width_by_height() {
        assert_eq!(parse_wxh("2048x1536", false).ok(), Some([1536, 2048]));
        assert_eq!(
            parse_wxh(" 64 X 32 ", true).ok(),
            Some([32, 64]),
            "a crop: left x top"
        );
        assert_eq!(parse_wxh("0x0", true).ok(), Some([0, 0]));
        for bad in [
            "0x1024",
            "1024",
            "x",
            "1024x",
            "-1x4",
            "1.5x2",
            "16385x1024",
        ] {
            assert!(parse_wxh(bad, false).is_err(), "{bad}");
        }
    }

    /// The conditioning survives the PNG's parameters text; the image's own size and no crop
    /// write nothing (A1111's text stays as A1111 writes it).
    #[test]
    fn round_trips_through_the_parameters_text() {
        let mut req = Txt2ImgRequest {
            width: 1024,
            height: 768,
            ..Default::default()
        };
        let text = |req: &Txt2ImgRequest| Parameters::for_request(req, 1, None, None).to_a1111();
        req.size_conditioning = Some(SizeConditioning::of_image(1024, 768));
        assert!(!text(&req).contains("SDXL"), "{}", text(&req));
        let read = |t: &str| Parameters::parse_a1111(t).expect("parses");
        assert!(read(&text(&req)).size_conditioning().is_none());

        let c = SizeConditioning {
            original: [2048, 4096],
            crop_top_left: [32, 64],
            target: [768, 1024],
        };
        req.size_conditioning = Some(c);
        let t = text(&req);
        assert!(
            t.contains(
                "SDXL original size: 4096x2048, SDXL crop: 64x32, SDXL target size: 1024x768"
            ),
            "{t}"
        );
        assert_eq!(read(&t).size_conditioning().map(Result::ok), Some(Some(c)));
        // A key left out takes the image's own value.
        let partial = t.replace(", SDXL crop: 64x32", "");
        let expected = SizeConditioning {
            crop_top_left: [0, 0],
            ..c
        };
        assert_eq!(
            read(&partial).size_conditioning().map(Result::ok),
            Some(Some(expected))
        );
        let bad = t.replace("4096x2048", "4096");
        assert!(
            matches!(read(&bad).size_conditioning(), Some(Err(e)) if e.to_string().contains("SDXL original size"))
        );
    }
}
