//! An artist's image in: decoded with the `image` crate (PNG, JPEG, WebP) and fitted to the
//! request's size with Lanczos resampling in one of A1111's three resize modes.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use image::imageops::{self, FilterType};

use super::RgbImage;
use crate::error::{Error, Result};

/// How an image of another size becomes the request's size (A1111's img2img "Resize mode").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ResizeMode {
    /// Stretch to the size, ignoring the aspect ratio.
    #[default]
    JustResize,
    /// Scale to cover the size, then cut the overflow from both sides equally.
    CropAndResize,
    /// Scale to fit inside the size and fill the bands beside it with the image's edge pixels.
    ResizeAndFill,
}

impl ResizeMode {
    pub const ALL: [ResizeMode; 3] = [
        ResizeMode::JustResize,
        ResizeMode::CropAndResize,
        ResizeMode::ResizeAndFill,
    ];

    /// The identifier of settings and the command line.
    pub fn id(self) -> &'static str {
        match self {
            ResizeMode::JustResize => "just-resize",
            ResizeMode::CropAndResize => "crop-and-resize",
            ResizeMode::ResizeAndFill => "resize-and-fill",
        }
    }

    /// The label A1111 shows.
    pub fn a1111_name(self) -> &'static str {
        match self {
            ResizeMode::JustResize => "Just resize",
            ResizeMode::CropAndResize => "Crop and resize",
            ResizeMode::ResizeAndFill => "Resize and fill",
        }
    }
}

impl fmt::Display for ResizeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

impl FromStr for ResizeMode {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|m| m.id() == s || m.a1111_name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                Error::InvalidInput(format!(
                    "unknown resize mode `{s}` (expected just-resize, crop-and-resize or resize-and-fill)"
                ))
            })
    }
}

/// The largest image side read: larger files are refused before their pixels are decoded.
const MAX_SIDE: u32 = 16384;

/// Reads a PNG, JPEG or WebP file (the format from its bytes, not its name) as 8-bit RGB; alpha is
/// dropped, as A1111 converts to RGB.
pub fn load_image(path: &Path) -> Result<RgbImage> {
    let cannot = |e: &dyn fmt::Display| {
        Error::InvalidInput(format!("cannot read image {}: {e}", path.display()))
    };
    let bytes = std::fs::read(path).map_err(|e| Error::io("image", path, e))?;
    let reader = || {
        image::ImageReader::new(std::io::Cursor::new(&bytes))
            .with_guessed_format()
            .map_err(|e| cannot(&e))
    };
    // The size first, from the header: a huge image is refused before its pixels are decoded.
    let (w, h) = reader()?.into_dimensions().map_err(|e| cannot(&e))?;
    if w == 0 || h == 0 || w > MAX_SIDE || h > MAX_SIDE {
        return Err(cannot(&format!(
            "{w}x{h} is outside 1..={MAX_SIDE} pixels a side"
        )));
    }
    let decoded = reader()?.decode().map_err(|e| cannot(&e))?;
    Ok(from_image(decoded.to_rgb8()))
}

/// A1111's generation parameters stored in an image file: a PNG's `parameters` text, or the
/// EXIF `UserComment` of a JPEG or WebP (how A1111 saves those). `None` when there are none.
pub fn image_parameters(path: &Path) -> Result<Option<String>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io("image", path, e))?;
    if bytes.starts_with(b"\x89PNG") {
        return super::png_parameters(path);
    }
    let cannot = |e: &dyn fmt::Display| {
        Error::InvalidInput(format!("cannot read image {}: {e}", path.display()))
    };
    let reader = image::ImageReader::new(std::io::Cursor::new(&bytes))
        .with_guessed_format()
        .map_err(|e| cannot(&e))?;
    let mut decoder = reader.into_decoder().map_err(|e| cannot(&e))?;
    let exif = image::ImageDecoder::exif_metadata(&mut decoder).map_err(|e| cannot(&e))?;
    // Cameras write comments too: only A1111's (a `Steps:` line) are parameters.
    Ok(exif
        .as_deref()
        .and_then(super::user_comment)
        .filter(|text| text.contains("Steps: ")))
}

fn from_image(img: image::RgbImage) -> RgbImage {
    RgbImage {
        width: img.width() as usize,
        height: img.height() as usize,
        pixels: img.into_raw(),
    }
}

fn to_image(img: &RgbImage) -> Result<image::RgbImage> {
    image::RgbImage::from_raw(img.width as u32, img.height as u32, img.pixels.clone()).ok_or_else(
        || {
            Error::InvalidInput(format!(
                "an image of {} bytes is not {}x{} RGB",
                img.pixels.len(),
                img.width,
                img.height
            ))
        },
    )
}

/// `image` fitted to `width`×`height` as `mode` says (Lanczos-3 resampling, as A1111's PIL
/// `LANCZOS`). An image already at the size is returned as it is.
pub fn resize(image: &RgbImage, width: usize, height: usize, mode: ResizeMode) -> Result<RgbImage> {
    if width == 0 || height == 0 {
        return Err(Error::InvalidInput(format!(
            "cannot resize to {width}x{height}"
        )));
    }
    if (image.width, image.height) == (width, height) {
        return Ok(image.clone());
    }
    let src = to_image(image)?;
    let (sw, sh) = (image.width as f64, image.height as f64);
    let (w, h) = (width as u32, height as u32);
    let scaled = |ratio: f64| {
        let nw = ((sw * ratio).round() as u32).max(1);
        let nh = ((sh * ratio).round() as u32).max(1);
        imageops::resize(&src, nw, nh, FilterType::Lanczos3)
    };
    let out = match mode {
        ResizeMode::JustResize => imageops::resize(&src, w, h, FilterType::Lanczos3),
        ResizeMode::CropAndResize => {
            let big = scaled((width as f64 / sw).max(height as f64 / sh));
            let x = (big.width().saturating_sub(w)) / 2;
            let y = (big.height().saturating_sub(h)) / 2;
            imageops::crop_imm(&big, x, y, w.min(big.width()), h.min(big.height())).to_image()
        }
        ResizeMode::ResizeAndFill => {
            let small = scaled((width as f64 / sw).min(height as f64 / sh));
            let (iw, ih) = (small.width().min(w), small.height().min(h));
            let (x0, y0) = ((w - iw) / 2, (h - ih) / 2);
            // Every pixel outside the placed image takes its nearest edge pixel (A1111 stretches
            // the first and last row or column over the bands).
            image::RgbImage::from_fn(w, h, |x, y| {
                let sx = x.clamp(x0, x0 + iw - 1) - x0;
                let sy = y.clamp(y0, y0 + ih - 1) - y0;
                *small.get_pixel(sx, sy)
            })
        }
    };
    let out = from_image(out);
    debug_assert_eq!((out.width, out.height), (width, height));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A w×h image whose left half is black and right half white.
    fn halves(w: usize, h: usize) -> RgbImage {
        let mut pixels = Vec::with_capacity(w * h * 3);
        for _ in 0..h {
            for x in 0..w {
                let v = if x < w / 2 { 0 } else { 255 };
                pixels.extend([v, v, v]);
            }
        }
        RgbImage {
            width: w,
            height: h,
            pixels,
        }
    }

    fn px(img: &RgbImage, x: usize, y: usize) -> u8 {
        img.pixels[(y * img.width + x) * 3]
    }

    #[test]
    fn every_mode_gives_the_size_asked() {
        let img = halves(40, 20);
        for mode in ResizeMode::ALL {
            for (w, h) in [(16, 16), (64, 24), (8, 40), (40, 20)] {
                let out = resize(&img, w, h, mode).unwrap();
                assert_eq!((out.width, out.height, out.pixels.len()), (w, h, w * h * 3));
            }
        }
        assert!(resize(&img, 0, 8, ResizeMode::JustResize).is_err());
    }

    #[test]
    fn modes_keep_or_cut_the_sides_as_a1111() {
        // 40×20 into 20×20. Just resize squeezes: both halves stay, each 10 wide.
        let img = halves(40, 20);
        let just = resize(&img, 20, 20, ResizeMode::JustResize).unwrap();
        assert!(px(&just, 2, 10) < 10 && px(&just, 17, 10) > 245);
        // Crop and resize scales to 40×20 → cut 10 from each side: the middle 20 columns remain,
        // still half black, half white.
        let crop = resize(&img, 20, 20, ResizeMode::CropAndResize).unwrap();
        assert!(px(&crop, 2, 10) < 10 && px(&crop, 17, 10) > 245);
        // Resize and fill scales to 20×10 and fills the bands above and below from the edge
        // rows: the columns keep their colour from top to bottom.
        let fill = resize(&img, 20, 20, ResizeMode::ResizeAndFill).unwrap();
        for y in [0, 5, 10, 19] {
            assert!(px(&fill, 1, y) < 10 && px(&fill, 18, y) > 245, "row {y}");
        }
        // A tall target from a wide image: crop keeps only the middle (the black/white edge).
        let tall = resize(&img, 10, 40, ResizeMode::CropAndResize).unwrap();
        assert!(px(&tall, 0, 20) < 10 && px(&tall, 9, 20) > 245);
    }

    #[test]
    fn modes_parse_from_ids_and_a1111_names() {
        for mode in ResizeMode::ALL {
            assert_eq!(mode.id().parse::<ResizeMode>().unwrap(), mode);
            assert_eq!(mode.a1111_name().parse::<ResizeMode>().unwrap(), mode);
        }
        assert!("stretch".parse::<ResizeMode>().is_err());
    }

    /// A JPEG with A1111's EXIF comment (an APP1 segment after the start marker) gives its
    /// parameters; a PNG its text; a WebP its EXIF chunk; a JPEG or WebP without EXIF none.
    #[test]
    fn parameters_come_from_png_text_and_jpeg_and_webp_exif() {
        let dir = std::env::temp_dir().join(format!("latent-exif-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let img = halves(8, 8);
        let plain = dir.join("plain.jpg");
        to_image(&img)
            .unwrap()
            .save_with_format(&plain, image::ImageFormat::Jpeg)
            .unwrap();
        assert_eq!(image_parameters(&plain).unwrap(), None);
        let jpeg = std::fs::read(&plain).unwrap();
        // The JPEG with an APP1 segment holding `comment` after the start marker.
        let tagged = |name: &str, comment: Vec<u8>| {
            let mut app1 = b"Exif\0\0".to_vec();
            app1.extend(super::super::exif::tests::exif_block(true, &comment));
            let mut bytes = jpeg[..2].to_vec();
            bytes.extend([0xFF, 0xE1]);
            bytes.extend(((app1.len() + 2) as u16).to_be_bytes());
            bytes.extend(&app1);
            bytes.extend(&jpeg[2..]);
            let path = dir.join(name);
            std::fs::write(&path, bytes).unwrap();
            path
        };
        let text = "a fox\nSteps: 20, Sampler: Euler a, CFG scale: 7, Seed: 3, Size: 8x8";
        let mut comment = b"UNICODE\0".to_vec();
        comment.extend(text.encode_utf16().flat_map(u16::to_be_bytes));
        let a1111 = tagged("tagged.jpg", comment);
        assert_eq!(image_parameters(&a1111).unwrap().as_deref(), Some(text));
        assert_eq!(load_image(&a1111).unwrap().width, 8, "still an image");
        // A camera's comment is no parameters.
        let camera = tagged("camera.jpg", b"ASCII\0\0\0holiday 2026".to_vec());
        assert_eq!(image_parameters(&camera).unwrap(), None);
        let png = dir.join("p.png");
        std::fs::write(&png, super::super::encode_png(&img, Some(text)).unwrap()).unwrap();
        assert_eq!(image_parameters(&png).unwrap().as_deref(), Some(text));

        // A WebP as A1111 saves one: the extended format (a VP8X chunk with the EXIF flag), the
        // image (here the lossless VP8L the image crate writes), an EXIF chunk.
        let mut lossless = Vec::new();
        image::codecs::webp::WebPEncoder::new_lossless(&mut lossless)
            .encode(&img.pixels, 8, 8, image::ExtendedColorType::Rgb8)
            .unwrap();
        let webp = |exif: Option<&[u8]>| {
            let mut body = b"WEBP".to_vec();
            if let Some(exif) = exif {
                body.extend(b"VP8X");
                body.extend(10u32.to_le_bytes());
                body.extend([0x08, 0, 0, 0]); // the EXIF flag
                body.extend(&7u32.to_le_bytes()[..3]); // canvas width − 1
                body.extend(&7u32.to_le_bytes()[..3]); // canvas height − 1
                body.extend(&lossless[12..]); // the VP8L chunk
                body.extend(b"EXIF");
                body.extend((exif.len() as u32).to_le_bytes());
                body.extend(exif);
                if exif.len() % 2 == 1 {
                    body.push(0);
                }
            } else {
                body.extend(&lossless[12..]);
            }
            let mut file = b"RIFF".to_vec();
            file.extend((body.len() as u32).to_le_bytes());
            file.extend(body);
            file
        };
        let mut comment = b"UNICODE\0".to_vec();
        comment.extend(text.encode_utf16().flat_map(u16::to_be_bytes));
        let exif = super::super::exif::tests::exif_block(false, &comment);
        let tagged = dir.join("tagged.webp");
        std::fs::write(&tagged, webp(Some(&exif))).unwrap();
        assert_eq!(image_parameters(&tagged).unwrap().as_deref(), Some(text));
        let loaded = load_image(&tagged).unwrap();
        assert_eq!((loaded.width, loaded.height), (8, 8));
        assert_eq!(loaded.pixels, img.pixels, "lossless");
        let plain = dir.join("plain.webp");
        std::fs::write(&plain, webp(None)).unwrap();
        assert_eq!(image_parameters(&plain).unwrap(), None);
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Pillow's JPEG and WebP (libjpeg, libwebp) with A1111's EXIF comment, as
    /// tests/fixtures/make_exif_fixtures.py writes them: the parameters and the pixels come back.
    #[test]
    fn pillow_jpeg_and_webp_give_their_parameters() {
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
        for name in ["a1111-exif.jpg", "a1111-exif.webp"] {
            let path = fixtures.join(name);
            let text = image_parameters(&path).unwrap().unwrap_or_default();
            assert!(
                text.starts_with("a lighthouse in a storm, ink\n"),
                "{name}: {text}"
            );
            let p = crate::io::parameters::Parameters::parse_a1111(&text).unwrap();
            assert_eq!(
                (p.seed, p.steps, p.width, p.height),
                (1234567, 27, 512, 640)
            );
            let image = load_image(&path).unwrap();
            assert_eq!((image.width, image.height), (8, 8), "{name}");
        }
        // The WebP is lossless: the ramp exactly.
        let webp = load_image(&fixtures.join("a1111-exif.webp")).unwrap();
        assert_eq!(&webp.pixels[..6], &[0, 0, 128, 32, 0, 128]);
    }

    #[test]
    fn files_load_by_content_and_bad_files_are_errors() {
        let dir = std::env::temp_dir().join(format!("latent-input-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let img = halves(12, 6);
        // A PNG named .jpg still loads: the format comes from the bytes.
        let path = dir.join("named-wrong.jpg");
        std::fs::write(&path, super::super::encode_png(&img, None).unwrap()).unwrap();
        assert_eq!(load_image(&path).unwrap(), img);
        let jpeg = dir.join("real.jpg");
        to_image(&img)
            .unwrap()
            .save_with_format(&jpeg, image::ImageFormat::Jpeg)
            .unwrap();
        let back = load_image(&jpeg).unwrap();
        assert_eq!((back.width, back.height), (12, 6));
        let bad = dir.join("bad.png");
        std::fs::write(&bad, b"\x89PNG\r\n\x1a\nnot really").unwrap();
        let err = load_image(&bad).unwrap_err().to_string();
        assert!(err.contains("bad.png"), "{err}");
        assert!(load_image(&dir.join("missing.png")).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
