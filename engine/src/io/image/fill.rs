//! A1111's "fill" masked content (`masking.fill`): the masked area painted with ever sharper blurs
//! of the picture around it, so inpainting starts from the surrounding colours instead of what
//! was there. Done in 8-bit steps as Pillow does them (premultiplied paste, Gaussian blur as three
//! box blurs a direction, unpremultiply, alpha composite), so it lands within two levels of
//! A1111's (tests/img2img.rs).

use super::{RgbImage, grey};

/// Gaussian radii and how often each blur is composited, sharpest last (A1111's list).
const LAYERS: [(f32, usize); 6] = [
    (256.0, 1),
    (64.0, 1),
    (16.0, 2),
    (4.0, 4),
    (2.0, 2),
    (0.0, 1),
];

/// `image` with the masked area (mask grey ≥ 1, white = fully) filled from its surroundings.
pub fn fill(image: &RgbImage, mask: &RgbImage) -> RgbImage {
    let (w, h) = (image.width, image.height);
    // The picture where the mask is black, premultiplied by the inverted mask (Pillow's paste of
    // an RGBa image through a mask onto transparent black).
    let mut masked = vec![0u8; w * h * 4];
    for (i, (px, m)) in image
        .pixels
        .chunks_exact(3)
        .zip(mask.pixels.chunks_exact(3))
        .enumerate()
    {
        let keep = 255 - u32::from(grey(m));
        for c in 0..3 {
            masked[i * 4 + c] = div255(u32::from(px[c]) * keep);
        }
        masked[i * 4 + 3] = div255(255 * keep);
    }
    let mut out = vec![0u8; w * h * 4];
    for (radius, repeats) in LAYERS {
        let mut layer = masked.clone();
        if radius > 0.0 {
            gaussian_blur(&mut layer, w, h, radius);
        }
        unpremultiply(&mut layer);
        for _ in 0..repeats {
            composite(&mut out, &layer, w);
        }
    }
    RgbImage {
        width: w,
        height: h,
        pixels: out
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect(),
    }
}

/// `x / 255` rounded, as Pillow's `DIV255`.
fn div255(x: u32) -> u8 {
    let t = x + 128;
    (((t >> 8) + t) >> 8) as u8
}

/// The box radius of three passes that approximate a Gaussian of `radius` (Pillow's
/// `_gaussian_blur_radius`, after Gwosdek et al.), in its float and double steps.
fn box_radius(radius: f32) -> f32 {
    let sigma2 = radius * radius / 3.0;
    let big_l = (12.0 * f64::from(sigma2) + 1.0).sqrt() as f32;
    let l = ((f64::from(big_l) - 1.0) / 2.0).floor() as f32;
    let a =
        (2.0 * l + 1.0) * (l * (l + 1.0) - 3.0 * sigma2) / (6.0 * (sigma2 - (l + 1.0) * (l + 1.0)));
    l + a
}

/// Three box blurs along the rows, then three along the columns, of RGBA bytes.
fn gaussian_blur(data: &mut [u8], w: usize, h: usize, radius: f32) {
    let r = box_radius(radius);
    let mut line = Vec::new();
    for _ in 0..3 {
        for y in 0..h {
            line.clear();
            line.extend_from_slice(&data[y * w * 4..(y + 1) * w * 4]);
            box_line(&line, &mut data[y * w * 4..(y + 1) * w * 4], w, r);
        }
    }
    let mut column = vec![0u8; h * 4];
    let mut blurred = vec![0u8; h * 4];
    for x in 0..w {
        for y in 0..h {
            column[y * 4..y * 4 + 4].copy_from_slice(&data[(y * w + x) * 4..][..4]);
        }
        for _ in 0..3 {
            box_line(&column, &mut blurred, h, r);
            column.copy_from_slice(&blurred);
        }
        for y in 0..h {
            data[(y * w + x) * 4..][..4].copy_from_slice(&column[y * 4..y * 4 + 4]);
        }
    }
}

/// One box blur of a line of `n` RGBA pixels with a fractional radius: the whole pixels within
/// `⌊r⌋` at weight `ww`, the two just beyond at `fw`, edges repeated; 24-bit fixed point.
fn box_line(input: &[u8], output: &mut [u8], n: usize, r: f32) {
    let whole = r as usize;
    let ww = ((1u32 << 24) as f32 / (r * 2.0 + 1.0)) as u64;
    let fw = ((1u64 << 24) - (2 * whole as u64 + 1) * ww) / 2;
    let at = |i: isize, c: usize| u64::from(input[(i.clamp(0, n as isize - 1) as usize) * 4 + c]);
    for c in 0..4 {
        // Window sums by prefix sums over the line extended by its edge pixels.
        let lo = -(whole as isize) - 1;
        let hi = n as isize + whole as isize;
        let mut prefix = Vec::with_capacity((hi - lo + 2) as usize);
        prefix.push(0u64);
        for i in lo..=hi {
            let last = *prefix.last().unwrap_or(&0);
            prefix.push(last + at(i, c));
        }
        let sum =
            |from: isize, to: isize| prefix[(to - lo + 1) as usize] - prefix[(from - lo) as usize];
        for x in 0..n as isize {
            let r = whole as isize;
            let bulk = sum(x - r, x + r) * ww + (at(x - r - 1, c) + at(x + r + 1, c)) * fw;
            output[x as usize * 4 + c] = ((bulk + (1 << 23)) >> 24).min(255) as u8;
        }
    }
}

/// Pillow's RGBa → RGBA: colour × 255 / alpha, truncated.
fn unpremultiply(data: &mut [u8]) {
    for p in data.chunks_exact_mut(4) {
        let a = u32::from(p[3]);
        if a != 0 && a != 255 {
            for v in &mut p[..3] {
                *v = (u32::from(*v) * 255 / a).min(255) as u8;
            }
        }
    }
}

/// `src` over `dst` (Pillow's `alpha_composite`, its vectorised arithmetic: coefficients rounded
/// to 8 bits; the last `w % 4` pixels of a row take its scalar path with 7 more bits).
fn composite(dst: &mut [u8], src: &[u8], w: usize) {
    let shift = |v: u32| ((v >> 8) + v) >> 8;
    for (i, (d, s)) in dst.chunks_exact_mut(4).zip(src.chunks_exact(4)).enumerate() {
        let (sa, da) = (u32::from(s[3]), u32::from(d[3]));
        let blend = da * (255 - sa);
        let outa = sa * 255 + blend;
        if i % w >= w - w % 4 {
            if sa == 0 {
                continue;
            }
            let coef1 = sa * 255 * 255 * 128 / outa;
            let coef2 = 255 * 128 - coef1;
            for c in 0..3 {
                let t = u32::from(s[c]) * coef1 + u32::from(d[c]) * coef2;
                d[c] = (shift(t + (0x80 << 7)) >> 7) as u8;
            }
        } else {
            let coef1 = if outa == 0 {
                0
            } else {
                ((sa * 255 * 255) as f32 / outa as f32).round_ties_even() as u32
            };
            let coef2 = 255 - coef1;
            for c in 0..3 {
                d[c] = shift(u32::from(s[c]) * coef1 + u32::from(d[c]) * coef2 + 128) as u8;
            }
        }
        d[3] = shift(outa + 128) as u8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unmasked_picture_comes_back_and_a_hole_takes_its_surroundings() {
        let (w, h) = (8, 8);
        let image = RgbImage {
            width: w,
            height: h,
            pixels: (0..w * h)
                .flat_map(|i| [if i % w < 4 { 200 } else { 40 }, 90, 10])
                .collect(),
        };
        let none = RgbImage {
            width: w,
            height: h,
            pixels: vec![0; w * h * 3],
        };
        assert_eq!(fill(&image, &none).pixels, image.pixels);
        // A hole in the left half takes the left half's red, not the right's.
        let mut hole = none.clone();
        hole.pixels[(3 * w + 1) * 3..(3 * w + 2) * 3].fill(255);
        let filled = fill(&image, &hole);
        let p = &filled.pixels[(3 * w + 1) * 3..][..3];
        assert!(p[0] > 150 && p[1].abs_diff(90) <= 2, "{p:?}");
    }
}
