//! Finished images as 8-bit RGB PNGs carrying a `parameters` tEXt chunk (saved by
//! [`super::atomic`]).
//! `input.rs`: reading an artist's image (PNG, JPEG, WebP) and fitting it to a size (img2img).

mod canvas;
mod exif;
mod fill;
mod input;

pub use canvas::{Sides, extend_canvas};
pub use exif::user_comment;
pub use fill::fill;
pub use input::{ResizeMode, image_parameters, load_image, resize};
// Where they were before `io/atomic.rs`.
pub use super::atomic::{next_numbered_path, save_atomic};

use std::path::Path;

use crate::error::{Error, Result};

/// An 8-bit RGB image, rows top to bottom.
#[derive(Debug, Clone, PartialEq)]
pub struct RgbImage {
    pub width: usize,
    pub height: usize,
    pub pixels: Vec<u8>,
}

/// Pillow's `convert("L")` of an RGB pixel (ITU-R 601-2 luma, 16-bit fixed point): how masks
/// are read, for inpainting and for A1111's fill alike.
pub(crate) fn grey(p: &[u8]) -> u8 {
    ((u32::from(p[0]) * 19595 + u32::from(p[1]) * 38470 + u32::from(p[2]) * 7471 + 0x8000) >> 16)
        as u8
}

/// Encodes a PNG with an optional A1111 `parameters` text chunk.
pub fn encode_png(image: &RgbImage, parameters: Option<&str>) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, image.width as u32, image.height as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    if let Some(text) = parameters {
        // Latin-1 tEXt is what A1111 reads first; prompts outside Latin-1 need iTXt (UTF-8).
        let chunk = if text.chars().all(|c| (c as u32) < 256) {
            enc.add_text_chunk("parameters".into(), text.into())
        } else {
            enc.add_itxt_chunk("parameters".into(), text.into())
        };
        chunk.map_err(|e| Error::InvalidInput(format!("cannot store parameters: {e}")))?;
    }
    let mut writer = enc
        .write_header()
        .map_err(|e| Error::InvalidInput(format!("cannot encode PNG: {e}")))?;
    writer
        .write_image_data(&image.pixels)
        .map_err(|e| Error::InvalidInput(format!("cannot encode PNG: {e}")))?;
    writer
        .finish()
        .map_err(|e| Error::InvalidInput(format!("cannot encode PNG: {e}")))?;
    Ok(out)
}

fn not_png(e: png::DecodingError) -> Error {
    Error::InvalidInput(format!("not a readable PNG: {e}"))
}

/// A PNG's `parameters` text chunk (tEXt or iTXt), where the reader has seen it.
fn parameters_text(info: &png::Info<'_>) -> Option<String> {
    info.uncompressed_latin1_text
        .iter()
        .find(|c| c.keyword == "parameters")
        .map(|c| c.text.clone())
        .or_else(|| {
            info.utf8_text
                .iter()
                .find(|c| c.keyword == "parameters")
                .and_then(|c| c.get_text().ok())
        })
}

/// The `parameters` text of the PNG at `path`, reading its chunks up to the image data without
/// decoding a pixel (A1111, ComfyUI and this studio write the text first). Text placed after the
/// image data costs a full decode.
pub fn png_parameters(path: &Path) -> Result<Option<String>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io("PNG", path, e))?;
    let reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .map_err(not_png)?;
    if let Some(text) = parameters_text(reader.info()) {
        return Ok(Some(text));
    }
    let bytes = std::fs::read(path).map_err(|e| Error::io("PNG", path, e))?;
    Ok(decode_png(&bytes)?.1)
}

/// Decodes a PNG to RGB8 and its `parameters` text, if any.
pub fn decode_png(bytes: &[u8]) -> Result<(RgbImage, Option<String>)> {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().map_err(not_png)?;
    let mut buf = vec![0; reader.output_buffer_size().unwrap_or(0)];
    let frame = reader.next_frame(&mut buf).map_err(not_png)?;
    // Chunks after the pixels (some tools put the text there); a damaged trailer keeps the image.
    let _ = reader.finish();
    let text = parameters_text(reader.info());
    let channels = frame.color_type.samples();
    let (w, h) = (frame.width as usize, frame.height as usize);
    let mut pixels = Vec::with_capacity(w * h * 3);
    for px in buf[..frame.buffer_size()].chunks_exact(channels) {
        match channels {
            1 | 2 => pixels.extend_from_slice(&[px[0]; 3]),
            _ => pixels.extend_from_slice(&px[..3]),
        }
    }
    Ok((
        RgbImage {
            width: w,
            height: h,
            pixels,
        },
        text,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> RgbImage {
        RgbImage {
            width: 3,
            height: 2,
            pixels: (0..18).map(|i| i * 10).collect(),
        }
    }

    #[test]
    fn png_round_trips_pixels_and_parameters() {
        for text in ["a cat\nSteps: 20, Seed: 1", "日本の猫\nSteps: 20, Seed: 1"] {
            let bytes = encode_png(&image(), Some(text)).unwrap();
            let (img, params) = decode_png(&bytes).unwrap();
            assert_eq!(img, image());
            assert_eq!(params.as_deref(), Some(text));
        }
    }

    /// CRC-32 (PNG's) of a chunk's type and data, for hand-made chunks.
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= b as u32;
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    /// Metadata only where the text comes first, a full decode where it follows the pixels, an
    /// error (never a panic) for a file that is not a PNG.
    #[test]
    fn png_parameters_read_the_text_wherever_it_is() {
        let dir = std::env::temp_dir().join(format!("latent-png-text-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = dir.join("first.png");
        std::fs::write(
            &first,
            encode_png(&image(), Some("a cat\nSteps: 20")).unwrap(),
        )
        .unwrap();
        assert_eq!(
            png_parameters(&first).unwrap().as_deref(),
            Some("a cat\nSteps: 20")
        );

        // The same text as a tEXt chunk placed just before IEND.
        let plain = encode_png(&image(), None).unwrap();
        let iend = plain.len() - 12;
        let mut chunk = b"tEXtparameters\0a dog".to_vec();
        let crc = crc32(&chunk);
        let mut after = plain[..iend].to_vec();
        after.extend_from_slice(&((chunk.len() - 4) as u32).to_be_bytes());
        after.append(&mut chunk);
        after.extend_from_slice(&crc.to_be_bytes());
        after.extend_from_slice(&plain[iend..]);
        let last = dir.join("last.png");
        std::fs::write(&last, &after).unwrap();
        assert_eq!(png_parameters(&last).unwrap().as_deref(), Some("a dog"));

        let none = dir.join("none.png");
        std::fs::write(&none, &plain).unwrap();
        assert_eq!(png_parameters(&none).unwrap(), None);
        let junk = dir.join("junk.png");
        std::fs::write(&junk, b"not a png at all").unwrap();
        assert!(png_parameters(&junk).is_err());
        assert!(png_parameters(&dir.join("absent.png")).is_err());
    }
}
