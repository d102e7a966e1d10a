//! A1111's parameters in a JPEG's or WebP's EXIF: the `UserComment` tag (0x9286) of the Exif IFD,
//! which A1111 writes with piexif as `UNICODE\0` + UTF-16 (big-endian; Pillow stores the same
//! bytes typed BYTE rather than UNDEFINED), other tools as
//! `ASCII\0\0\0` + text or UTF-16 little-endian. A small reader of the TIFF structure: only the
//! two IFDs on the way, every offset checked against the buffer.

/// The `UserComment` of a raw EXIF block (a TIFF header first, or `Exif\0\0` then one).
pub fn user_comment(exif: &[u8]) -> Option<String> {
    let tiff = exif.strip_prefix(b"Exif\0\0").unwrap_or(exif);
    let big = match tiff.get(..4)? {
        b"MM\0*" => true,
        b"II*\0" => false,
        _ => return None,
    };
    let u16_at = |at: usize| -> Option<u16> {
        let b: [u8; 2] = tiff.get(at..at + 2)?.try_into().ok()?;
        Some(if big {
            u16::from_be_bytes(b)
        } else {
            u16::from_le_bytes(b)
        })
    };
    let u32_at = |at: usize| -> Option<usize> {
        let b: [u8; 4] = tiff.get(at..at + 4)?.try_into().ok()?;
        Some(if big {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        } as usize)
    };
    // One IFD's entry for `tag`: (type, count, value or offset field's position).
    let find = |ifd: usize, tag: u16| -> Option<(u16, usize, usize)> {
        let n = usize::from(u16_at(ifd)?);
        (0..n.min(1024)).find_map(|i| {
            let entry = ifd + 2 + i * 12;
            (u16_at(entry)? == tag)
                .then(|| Some((u16_at(entry + 2)?, u32_at(entry + 4)?, entry + 8)))?
        })
    };
    let ifd0 = u32_at(4)?;
    let (_, _, at) = find(ifd0, 0x8769)?;
    let exif_ifd = u32_at(at)?;
    let (kind, count, at) = find(exif_ifd, 0x9286)?;
    // UNDEFINED (7) bytes as the standard and piexif write it; Pillow writes BYTE (1); inline
    // when at most four.
    if !matches!(kind, 1 | 7) || count < 8 {
        return None;
    }
    let data = if count <= 4 {
        tiff.get(at..at + count)?
    } else {
        tiff.get(u32_at(at)?..)?.get(..count)?
    };
    let (code, text) = data.split_at(8);
    match code {
        b"UNICODE\0" => Some(utf16(text)),
        b"ASCII\0\0\0" | b"\0\0\0\0\0\0\0\0" => Some(
            String::from_utf8_lossy(text)
                .trim_end_matches('\0')
                .to_string(),
        ),
        _ => None,
    }
}

/// UTF-16 of unknown byte order: A1111 (piexif) writes big-endian; a text whose ASCII letters
/// put their zero bytes second is little-endian.
fn utf16(bytes: &[u8]) -> String {
    let pairs = bytes.chunks_exact(2);
    let zeros_first = pairs.clone().filter(|p| p[0] == 0).count();
    let zeros_second = pairs.clone().filter(|p| p[1] == 0).count();
    let units: Vec<u16> = pairs
        .map(|p| match zeros_second > zeros_first {
            true => u16::from_le_bytes([p[0], p[1]]),
            false => u16::from_be_bytes([p[0], p[1]]),
        })
        .collect();
    String::from_utf16_lossy(&units)
        .trim_end_matches('\0')
        .to_string()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A TIFF block with IFD0 → Exif IFD → UserComment of `comment` (code + bytes).
    pub(crate) fn exif_block(big: bool, comment: &[u8]) -> Vec<u8> {
        let p16 = |v: u16| {
            if big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        };
        let p32 = |v: u32| {
            if big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        };
        let mut t = Vec::new();
        t.extend(if big { *b"MM\0*" } else { *b"II*\0" });
        t.extend(p32(8));
        // IFD0 at 8: one entry (ExifIFD pointer, LONG) then no next IFD: 2 + 12 + 4 = 18 bytes.
        t.extend(p16(1));
        t.extend(p16(0x8769));
        t.extend(p16(4));
        t.extend(p32(1));
        t.extend(p32(26));
        t.extend(p32(0));
        // Exif IFD at 26: one entry (UserComment, UNDEFINED) pointing past itself.
        t.extend(p16(1));
        t.extend(p16(0x9286));
        t.extend(p16(7));
        t.extend(p32(comment.len() as u32));
        t.extend(p32(44));
        t.extend(p32(0));
        t.extend(comment);
        t
    }

    fn unicode(text: &str, big: bool) -> Vec<u8> {
        let mut c = b"UNICODE\0".to_vec();
        for u in text.encode_utf16() {
            c.extend(if big {
                u.to_be_bytes()
            } else {
                u.to_le_bytes()
            });
        }
        c
    }

    #[test]
    fn reads_a1111s_unicode_and_other_writers_comments() {
        let text = "a fox, (snow:1.2)\nSteps: 20, Sampler: Euler a, Seed: 7, Size: 512x512 — ü";
        for big in [true, false] {
            for le_text in [false, true] {
                let block = exif_block(big, &unicode(text, !le_text));
                assert_eq!(
                    user_comment(&block).as_deref(),
                    Some(text),
                    "{big} {le_text}"
                );
            }
        }
        let mut ascii = b"ASCII\0\0\0".to_vec();
        ascii.extend(b"a cat\nSteps: 4");
        let block = exif_block(false, &ascii);
        let mut with_header = b"Exif\0\0".to_vec();
        with_header.extend(&block);
        assert_eq!(
            user_comment(&with_header).as_deref(),
            Some("a cat\nSteps: 4")
        );
    }

    #[test]
    fn damaged_blocks_are_none_not_a_panic() {
        let block = exif_block(true, &unicode("x", true));
        for cut in 0..block.len() {
            let _ = user_comment(&block[..cut]);
        }
        assert_eq!(user_comment(b"not exif at all"), None);
        let mut bad = block.clone();
        bad[32..36].copy_from_slice(&u32::MAX.to_be_bytes()); // the count
        assert_eq!(user_comment(&bad), None);
    }
}
