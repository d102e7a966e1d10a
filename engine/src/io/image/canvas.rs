//! Outpainting's canvas: the picture extended on some sides, the new bands filled with its edge
//! pixels (as A1111's resize-and-fill fills its bands), and a mask that repaints the bands and a
//! little of the picture beside them, so the new content joins the old without a seam.

use super::RgbImage;
use crate::error::{Error, Result};

/// Pixels added on each side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sides {
    pub left: usize,
    pub right: usize,
    pub top: usize,
    pub bottom: usize,
}

impl Sides {
    pub fn is_empty(&self) -> bool {
        *self == Sides::default()
    }

    /// These sides grown so that a `width`×`height` picture extended by them has sides that
    /// are multiples of `multiple` (the VAE's 8): the extra pixels go to the right or bottom
    /// when those grow, else to the left or top.
    pub fn to_multiple(mut self, width: usize, height: usize, multiple: usize) -> Self {
        let pad = |n: usize| (multiple - n % multiple) % multiple;
        let (dx, dy) = (
            pad(width + self.left + self.right),
            pad(height + self.top + self.bottom),
        );
        match self.right > 0 || self.left == 0 {
            true => self.right += dx,
            false => self.left += dx,
        }
        match self.bottom > 0 || self.top == 0 {
            true => self.bottom += dy,
            false => self.top += dy,
        }
        self
    }
}

impl std::str::FromStr for Sides {
    type Err = Error;

    /// `left,right,top,bottom` in pixels.
    fn from_str(s: &str) -> Result<Self> {
        let parts: Vec<usize> = s
            .split(',')
            .map(|p| p.trim().parse::<usize>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| {
                Error::InvalidInput(format!("`{s}` is not left,right,top,bottom pixels"))
            })?;
        let [left, right, top, bottom] = parts[..] else {
            return Err(Error::InvalidInput(format!(
                "`{s}` is not four numbers: left,right,top,bottom"
            )));
        };
        Ok(Sides {
            left,
            right,
            top,
            bottom,
        })
    }
}

/// The largest side a canvas may grow to.
const MAX_SIDE: usize = 8192;

/// `image` extended by `by` (edge pixels repeated into the new bands) and its inpainting mask:
/// white over the bands and `overlap` pixels of the picture beside each extended side, black
/// elsewhere.
pub fn extend_canvas(image: &RgbImage, by: Sides, overlap: usize) -> Result<(RgbImage, RgbImage)> {
    let (w, h) = (image.width, image.height);
    let (nw, nh) = (w + by.left + by.right, h + by.top + by.bottom);
    if w == 0 || h == 0 || image.pixels.len() != w * h * 3 {
        return Err(Error::InvalidInput("the picture to extend is empty".into()));
    }
    if nw > MAX_SIDE || nh > MAX_SIDE {
        return Err(Error::InvalidInput(format!(
            "the extended canvas would be {nw}x{nh}, more than {MAX_SIDE} pixels a side"
        )));
    }
    let mut pixels = Vec::with_capacity(nw * nh * 3);
    let mut mask = Vec::with_capacity(nw * nh * 3);
    // Inside the picture, the repainted margin beside each extended side.
    let margin = |added: usize| if added > 0 { overlap } else { 0 };
    let (x0, x1) = (
        by.left + margin(by.left),
        by.left + w - margin(by.right).min(w),
    );
    let (y0, y1) = (
        by.top + margin(by.top),
        by.top + h - margin(by.bottom).min(h),
    );
    for y in 0..nh {
        let sy = y.saturating_sub(by.top).min(h - 1);
        for x in 0..nw {
            let sx = x.saturating_sub(by.left).min(w - 1);
            pixels.extend_from_slice(&image.pixels[(sy * w + sx) * 3..][..3]);
            let kept = (x0..x1).contains(&x) && (y0..y1).contains(&y);
            mask.extend_from_slice(&[if kept { 0 } else { 255 }; 3]);
        }
    }
    let canvas = RgbImage {
        width: nw,
        height: nh,
        pixels,
    };
    let mask = RgbImage {
        width: nw,
        height: nh,
        pixels: mask,
    };
    Ok((canvas, mask))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_canvas_grows_with_edge_pixels_and_a_mask_over_the_bands() {
        // 2x2: red, green / blue, white.
        let image = RgbImage {
            width: 2,
            height: 2,
            pixels: vec![255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 255, 255],
        };
        let by = "0,3,1,0".parse::<Sides>().unwrap();
        let (canvas, mask) = extend_canvas(&image, by, 1).unwrap();
        assert_eq!((canvas.width, canvas.height), (5, 3));
        let px = |img: &RgbImage, x: usize, y: usize| {
            img.pixels[(y * img.width + x) * 3..][..3].to_vec()
        };
        assert_eq!(
            px(&canvas, 0, 0),
            [255, 0, 0],
            "top band repeats the first row"
        );
        assert_eq!(
            px(&canvas, 4, 2),
            [255, 255, 255],
            "right band repeats the last column"
        );
        assert_eq!(
            px(&canvas, 1, 1),
            [0, 255, 0],
            "the picture moved down by one"
        );
        // Kept: x 0..1 (the right side's margin of 1 takes x = 1), y 2..3 (the top margin y = 1).
        let kept: Vec<(usize, usize)> = (0..3)
            .flat_map(|y| (0..5).map(move |x| (x, y)))
            .filter(|&(x, y)| px(&mask, x, y)[0] == 0)
            .collect();
        assert_eq!(kept, [(0, 2)]);
        assert!("1,2,3".parse::<Sides>().is_err());
        assert!(extend_canvas(&image, Sides { right: 9000, ..by }, 0).is_err());
    }
}
