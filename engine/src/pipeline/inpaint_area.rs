//! A1111's "Inpaint area: Only masked": the masked part of the picture, with some padding and
//! widened to the request's aspect ratio, is cut out, scaled to the request's size, inpainted
//! there (so a small mask gets the full resolution), scaled back and pasted into the picture,
//! which keeps its own size (`masking.get_crop_region_v2`, `expand_crop_region`, `uncrop`).

use crate::error::{Error, Result};
use crate::image_io::{ResizeMode, RgbImage, resize};

/// Which part of the picture an inpainting run redraws.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum InpaintArea {
    /// The whole picture at the request's size (A1111's default).
    #[default]
    WholePicture,
    /// The mask's bounding box grown by `padding` pixels, at the request's size.
    OnlyMasked { padding: usize },
}

impl InpaintArea {
    /// A1111's default padding (`inpaint_full_res_padding`).
    pub const DEFAULT_PADDING: usize = 32;

    /// A1111's label, as its parameters text writes it.
    pub fn a1111_name(self) -> &'static str {
        match self {
            InpaintArea::WholePicture => "Whole picture",
            InpaintArea::OnlyMasked { .. } => "Only masked",
        }
    }
}

/// `[x1, y1, x2, y2)` in the picture's pixels.
pub type Region = [usize; 4];

/// PIL's `getbbox` of the non-zero pixels of a `width`-wide grey image, grown by `padding` within
/// the picture (`get_crop_region_v2`); `None` for an empty mask.
pub fn mask_box(grey: &[u8], width: usize, padding: usize) -> Option<Region> {
    let height = grey.len() / width.max(1);
    let (mut x1, mut y1, mut x2, mut y2) = (usize::MAX, usize::MAX, 0, 0);
    for (i, &v) in grey.iter().enumerate() {
        if v != 0 {
            let (x, y) = (i % width, i / width);
            (x1, y1) = (x1.min(x), y1.min(y));
            (x2, y2) = (x2.max(x + 1), y2.max(y + 1));
        }
    }
    (x1 != usize::MAX).then(|| {
        [
            x1.saturating_sub(padding),
            y1.saturating_sub(padding),
            (x2 + padding).min(width),
            (y2 + padding).min(height),
        ]
    })
}

/// `expand_crop_region`: the region widened (or heightened) around its centre to the ratio of
/// `proc_w`×`proc_h`, moved back inside the `image_w`×`image_h` picture.
pub fn expand_to_ratio(
    region: Region,
    proc_w: usize,
    proc_h: usize,
    image_w: usize,
    image_h: usize,
) -> Region {
    let [x1, y1, x2, y2] = region.map(|v| v as i64);
    let (mut x1, mut y1, mut x2, mut y2) = (x1, y1, x2, y2);
    let ratio_crop = (x2 - x1) as f64 / (y2 - y1) as f64;
    let ratio_proc = proc_w as f64 / proc_h as f64;
    let fit = |lo: &mut i64, hi: &mut i64, wanted: f64, limit: i64| {
        let diff = (wanted - (*hi - *lo) as f64) as i64;
        *lo -= diff.div_euclid(2);
        *hi += diff - diff.div_euclid(2);
        if *hi >= limit {
            let over = *hi - limit;
            *hi -= over;
            *lo -= over;
        }
        if *lo < 0 {
            *hi -= *lo;
            *lo = 0;
        }
        if *hi >= limit {
            *hi = limit;
        }
    };
    if ratio_crop > ratio_proc {
        fit(
            &mut y1,
            &mut y2,
            (x2 - x1) as f64 / ratio_proc,
            image_h as i64,
        );
    } else {
        fit(
            &mut x1,
            &mut x2,
            (y2 - y1) as f64 * ratio_proc,
            image_w as i64,
        );
    }
    [x1, y1, x2, y2].map(|v| v.max(0) as usize)
}

/// The part of `image` inside `region`.
pub fn crop(image: &RgbImage, region: Region) -> Result<RgbImage> {
    let [x1, y1, x2, y2] = region;
    if x2 <= x1 || y2 <= y1 || x2 > image.width || y2 > image.height {
        return Err(Error::InvalidInput(format!(
            "crop {region:?} outside a {}x{} image",
            image.width, image.height
        )));
    }
    let (w, h) = (x2 - x1, y2 - y1);
    let mut pixels = Vec::with_capacity(w * h * 3);
    for y in y1..y2 {
        let row = (y * image.width + x1) * 3;
        pixels.extend_from_slice(&image.pixels[row..row + w * 3]);
    }
    Ok(RgbImage {
        width: w,
        height: h,
        pixels,
    })
}

/// A1111's `uncrop`: `generated` scaled to the region (crop and resize, Lanczos) and pasted into
/// a copy of `picture` there.
pub fn uncrop(generated: &RgbImage, picture: &RgbImage, region: Region) -> Result<RgbImage> {
    let [x1, y1, x2, y2] = region;
    let part = resize(generated, x2 - x1, y2 - y1, ResizeMode::CropAndResize)?;
    let mut out = picture.clone();
    for y in 0..part.height {
        let src = y * part.width * 3;
        let dst = ((y1 + y) * out.width + x1) * 3;
        out.pixels[dst..dst + part.width * 3]
            .copy_from_slice(&part.pixels[src..src + part.width * 3]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_box_is_grown_by_the_padding_within_the_picture() {
        let (w, h) = (10, 6);
        let mut grey = vec![0u8; w * h];
        grey[2 * w + 3] = 255;
        grey[3 * w + 5] = 9;
        assert_eq!(mask_box(&grey, w, 0), Some([3, 2, 6, 4]));
        assert_eq!(mask_box(&grey, w, 3), Some([0, 0, 9, 6]));
        assert_eq!(mask_box(&[0; 12], 4, 2), None);
    }

    #[test]
    fn the_region_takes_the_processing_ratio_as_a1111_expands_it() {
        // A1111's docstring: a 128x32 mask region processed at 512x512 becomes 128x128.
        assert_eq!(
            expand_to_ratio([100, 100, 228, 132], 512, 512, 1024, 1024),
            [100, 52, 228, 180]
        );
        // Against an edge it moves inside the picture.
        assert_eq!(
            expand_to_ratio([0, 0, 128, 32], 512, 512, 1024, 1024),
            [0, 0, 128, 128]
        );
        assert_eq!(
            expand_to_ratio([900, 990, 1000, 1000], 512, 256, 1000, 1000),
            [900, 950, 1000, 1000]
        );
        // Wider processing: the region grows sideways, an odd difference's extra pixel right.
        assert_eq!(
            expand_to_ratio([10, 10, 21, 20], 300, 100, 100, 100),
            [1, 10, 31, 20]
        );
    }

    #[test]
    fn uncrop_pastes_the_scaled_part_and_keeps_the_rest() {
        let picture = RgbImage {
            width: 8,
            height: 8,
            pixels: vec![10; 8 * 8 * 3],
        };
        let generated = RgbImage {
            width: 4,
            height: 4,
            pixels: vec![200; 4 * 4 * 3],
        };
        let out = uncrop(&generated, &picture, [2, 2, 6, 6]).unwrap();
        let at = |x: usize, y: usize| out.pixels[(y * 8 + x) * 3];
        assert_eq!((at(1, 1), at(2, 2), at(5, 5), at(6, 6)), (10, 200, 200, 10));
        let part = crop(&out, [2, 2, 6, 6]).unwrap();
        assert!(part.pixels.iter().all(|&v| v == 200));
    }
}
