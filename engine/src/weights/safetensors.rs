//! Memory-mapped safetensors files: the header is parsed and validated once, tensor bytes are read
//! straight from the map when a weight is built, so a checkpoint is never read into memory twice.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::error::{Error, Result};

/// Where one tensor's bytes sit inside the map.
#[derive(Debug, Clone)]
pub struct TensorEntry {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// One opened `.safetensors` file.
pub struct SafetensorsFile {
    path: PathBuf,
    mmap: Mmap,
    entries: BTreeMap<String, TensorEntry>,
    /// The header's `__metadata__` strings (empty when it has none).
    metadata: BTreeMap<String, String>,
    /// Where the tensor data starts (after the 8-byte length and the header).
    data_start: usize,
    /// Named row ranges of stored tensors ([`Self::split_rows`]), with the stored name each
    /// came from: readable by [`Self::entry`], not listed by [`Self::entries`].
    parts: BTreeMap<String, (TensorEntry, String)>,
}

impl std::fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsFile")
            .field("path", &self.path)
            .field("tensors", &self.entries.len())
            .finish()
    }
}

impl SafetensorsFile {
    pub fn open(path: &Path) -> Result<Self> {
        refuse_pickle(path)?;
        let file = File::open(path).map_err(|e| Error::io("checkpoint", path, e))?;
        let len = file
            .metadata()
            .map_err(|e| Error::io("checkpoint", path, e))?
            .len();
        if len == 0 {
            return Err(invalid(path, "the file is empty"));
        }
        // SAFETY: the map is read-only; a file truncated underneath us by another program is
        // outside what any reader of mmapped weights can defend against (candle, diffusers alike).
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io("checkpoint", path, e))?;
        let (header_len, metadata) =
            SafeTensors::read_metadata(&mmap).map_err(|e| invalid(path, &describe(&e)))?;
        let base = 8 + header_len;
        let strings: BTreeMap<String, String> = metadata
            .metadata()
            .as_ref()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        let entries = metadata
            .tensors()
            .into_iter()
            .map(|(name, info)| {
                let (start, end) = info.data_offsets;
                // The safetensors crate validates offsets today; checking again here keeps
                // `bytes` from panicking on a lying header whatever that crate's version does.
                let range = base
                    .checked_add(start)
                    .zip(base.checked_add(end))
                    .filter(|&(s, e)| s <= e && e <= mmap.len());
                let Some((start, end)) = range else {
                    return Err(invalid(
                        path,
                        &format!("the header lies about the offsets of `{name}`"),
                    ));
                };
                let entry = TensorEntry {
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start,
                    end,
                };
                Ok((name, entry))
            })
            .collect::<Result<_>>()?;
        let data_start = base.min(mmap.len());
        Ok(Self {
            path: path.to_path_buf(),
            mmap,
            entries,
            metadata: strings,
            data_start,
            parts: BTreeMap::new(),
        })
    }

    /// Makes equal row ranges of the stored tensor `source` readable under `names`, in order:
    /// OpenCLIP stores q, k and v as one `in_proj_weight`, and rows of a row-major tensor are
    /// a contiguous byte range, so each part is a view of the map, not a copy.
    pub fn split_rows(&mut self, source: &str, names: &[String]) -> Result<()> {
        let entry = self
            .entries
            .get(source)
            .ok_or_else(|| Error::MissingTensor {
                component: "checkpoint",
                name: source.to_string(),
            })?;
        let n = names.len();
        let rows = entry.shape.first().copied().unwrap_or(0);
        let bytes = entry.end - entry.start;
        if n == 0 || rows == 0 || rows % n != 0 || bytes % n != 0 {
            return Err(invalid(
                &self.path,
                &format!(
                    "`{source}` of shape {:?} does not split into {n} equal parts",
                    entry.shape
                ),
            ));
        }
        let size = bytes / n;
        let mut shape = entry.shape.clone();
        shape[0] = rows / n;
        let parts: Vec<(String, (TensorEntry, String))> = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let part = TensorEntry {
                    dtype: entry.dtype,
                    shape: shape.clone(),
                    start: entry.start + i * size,
                    end: entry.start + (i + 1) * size,
                };
                (name.clone(), (part, source.to_string()))
            })
            .collect();
        self.parts.extend(parts);
        Ok(())
    }

    /// The names a stored tensor was split into ([`Self::split_rows`]); empty if it was not.
    pub fn parts_of(&self, source: &str) -> Vec<&str> {
        self.parts
            .iter()
            .filter(|(_, (_, from))| from == source)
            .map(|(name, _)| name.as_str())
            .collect()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn entries(&self) -> &BTreeMap<String, TensorEntry> {
        &self.entries
    }

    /// A stored tensor, or a part of one ([`Self::split_rows`]).
    pub fn entry(&self, name: &str) -> Option<&TensorEntry> {
        self.entries
            .get(name)
            .or_else(|| self.parts.get(name).map(|(entry, _)| entry))
    }

    /// The header's `__metadata__` strings.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// Everything after the header: the bytes A1111 hashes for a LoRA's `Lora hashes` entry
    /// (its "addnet" hash).
    pub fn data(&self) -> &[u8] {
        &self.mmap[self.data_start..]
    }

    /// Raw little-endian bytes of a tensor.
    pub fn bytes(&self, entry: &TensorEntry) -> &[u8] {
        &self.mmap[entry.start..entry.end]
    }

    /// A float tensor's values as f32, whatever its stored float dtype.
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        let entry = self.entry(name).ok_or_else(|| Error::MissingTensor {
            component: "checkpoint",
            name: name.to_string(),
        })?;
        to_f32(name, entry.dtype, self.bytes(entry))
    }
}

/// Decodes stored float bytes to f32. Integer and bool tensors are not weights.
pub fn to_f32(name: &str, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>> {
    let out = match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F64 => bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32)
            .collect(),
        other => {
            return Err(Error::UnsupportedDtype {
                name: name.to_string(),
                dtype: format!("{other:?}"),
            });
        }
    };
    Ok(out)
}

/// Pickles can execute code on load; refuse them by extension and by magic bytes.
fn refuse_pickle(path: &Path) -> Result<()> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase());
    if matches!(
        ext.as_deref(),
        Some("ckpt" | "pt" | "pth" | "bin" | "pkl" | "pickle")
    ) {
        return Err(Error::PickleRefused {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

fn invalid(path: &Path, reason: &str) -> Error {
    Error::InvalidSafetensors {
        reason: reason.to_string(),
        path: path.to_path_buf(),
    }
}

fn describe(e: &safetensors::SafeTensorError) -> String {
    use safetensors::SafeTensorError as E;
    match e {
        E::HeaderTooSmall => "the file is too short to hold a header".into(),
        E::InvalidHeaderLength => {
            "the header length points past the end of the file (truncated?)".into()
        }
        E::MetadataIncompleteBuffer => {
            "the tensor data does not match the file size (truncated or padded file)".into()
        }
        E::InvalidOffset(name) => format!("the header lies about the offsets of `{name}`"),
        E::TensorInvalidInfo => "a tensor's byte size does not match its shape and dtype".into(),
        E::HeaderTooLarge => "the header length is over 100 MB (a corrupted file?)".into(),
        E::InvalidHeader(_) => "the header is not UTF-8 text".into(),
        E::InvalidHeaderDeserialization(e) => {
            format!(
                "the header is not safetensors JSON ({e}): not a safetensors file, or a corrupted one"
            )
        }
        E::ValidationOverflow => "a tensor's shape is impossibly large (its size overflows)".into(),
        E::MisalignedSlice => "a tensor's shape does not fill a whole number of bytes".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn tiny_file() -> Vec<u8> {
        let header = br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header);
        out.extend_from_slice(&1.5f32.to_le_bytes());
        out.extend_from_slice(&(-2.0f32).to_le_bytes());
        out
    }

    #[test]
    fn reads_valid_file() {
        let dir = tempdir();
        let p = write(&dir, "ok.safetensors", &tiny_file());
        let f = SafetensorsFile::open(&p).unwrap();
        assert_eq!(f.read_f32("w").unwrap(), vec![1.5, -2.0]);
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let dir = tempdir();
        let missing = dir.join("nope.safetensors");
        assert!(matches!(
            SafetensorsFile::open(&missing),
            Err(Error::Io { .. })
        ));

        let empty = write(&dir, "empty.safetensors", b"");
        let e = SafetensorsFile::open(&empty).unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");

        let full = tiny_file();
        let truncated = write(&dir, "trunc.safetensors", &full[..full.len() - 3]);
        let e = SafetensorsFile::open(&truncated).unwrap_err();
        assert!(matches!(e, Error::InvalidSafetensors { .. }), "{e}");

        let mut bytes = tiny_file();
        // Claim the tensor ends at byte 12 while its shape says 8 bytes.
        let pos = bytes.windows(5).position(|w| w == b"[0,8]").unwrap();
        bytes[pos + 3] = b'9';
        let liar = write(&dir, "liar.safetensors", &bytes);
        let e = SafetensorsFile::open(&liar).unwrap_err();
        assert!(matches!(e, Error::InvalidSafetensors { .. }), "{e}");

        let mut huge = tiny_file();
        huge[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let e = SafetensorsFile::open(&write(&dir, "huge.safetensors", &huge)).unwrap_err();
        assert!(matches!(e, Error::InvalidSafetensors { .. }), "{e}");

        let pickle = write(&dir, "model.ckpt", b"\x80\x02}q\x00.");
        assert!(matches!(
            SafetensorsFile::open(&pickle),
            Err(Error::PickleRefused { .. })
        ));
    }

    #[test]
    fn integer_tensors_are_not_weights() {
        let e = to_f32("ids", Dtype::I64, &[0; 8]).unwrap_err();
        assert!(matches!(e, Error::UnsupportedDtype { .. }));
    }

    pub(crate) fn tempdir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "latent-engine-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
