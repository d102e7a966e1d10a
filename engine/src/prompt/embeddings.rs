//! Textual-inversion embeddings, as A1111 uses them: every `.safetensors` file of a folder is an
//! embedding named by its file stem; where the prompt's tokens spell that name, the embedding's
//! vectors take the place of those tokens (in the chunk where they fit, as A1111's
//! `tokenize_line` places them), at the weight of the text around them.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::tokenizer::{ClipTokenizer, MAX_PROMPT_TOKENS};
use crate::weights::SafetensorsFile;

/// One embedding: `vectors` rows of the text encoder's width.
#[derive(Debug)]
pub struct Embedding {
    pub name: String,
    /// `[vectors, width]`, row-major, f32.
    pub data: Vec<f32>,
    pub vectors: usize,
    pub width: usize,
    /// SHA-256 of the file (A1111's `TI hashes` entry is its first 12 hex digits).
    pub hash: String,
    /// SDXL: the vectors for the second text encoder (the file's `clip_g`; `data` is its
    /// `clip_l`).
    pub second: Option<Arc<Embedding>>,
}

/// An embedding's name as token ids, and the embedding.
type Named = (Vec<u32>, Arc<Embedding>);

/// The embeddings of a folder, looked up by the token ids of their names.
#[derive(Debug, Default)]
pub struct Embeddings {
    /// First token of a name → (the name's ids, the embedding), longest names first.
    by_first: HashMap<u32, Vec<Named>>,
    names: Vec<String>,
}

impl PartialEq for Embeddings {
    /// Two libraries are the same when they hold the same names (what a request compares).
    fn eq(&self, other: &Self) -> bool {
        self.names == other.names
    }
}

impl Embeddings {
    /// Loads every `.safetensors` file in `dir` for a text encoder of `width` (and SDXL's second
    /// of `second_width`). Files that are not embeddings for it (another width, another family's
    /// format, several tensors, pickles) are skipped; each skip is one line of the returned
    /// notes.
    pub fn load_dir(
        dir: &Path,
        tokenizer: &ClipTokenizer,
        width: usize,
        second_width: Option<usize>,
    ) -> Result<(Self, Vec<String>)> {
        let entries = std::fs::read_dir(dir).map_err(|e| Error::io("embeddings folder", dir, e))?;
        let mut paths: Vec<_> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        paths.sort();
        let (mut library, mut notes) = (Self::default(), Vec::new());
        for path in paths {
            let ext = path
                .extension()
                .and_then(|e| e.to_str())
                .unwrap_or("")
                .to_lowercase();
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            match ext.as_str() {
                "safetensors" => match load_one(&path, &name, width, second_width) {
                    Ok(embedding) => library.insert(tokenizer, embedding),
                    Err(why) => notes.push(format!("embedding {name} skipped: {why}")),
                },
                "pt" | "bin" | "ckpt" => notes.push(format!(
                    "embedding {name} skipped: pickle files can run code when opened; convert it to .safetensors"
                )),
                _ => {}
            }
        }
        Ok((library, notes))
    }

    /// Adds `embedding` under its name's token ids.
    pub fn insert(&mut self, tokenizer: &ClipTokenizer, embedding: Embedding) {
        let ids = tokenizer.encode(&embedding.name);
        let Some(&first) = ids.first() else { return };
        self.names.push(embedding.name.clone());
        let list = self.by_first.entry(first).or_default();
        list.push((ids, Arc::new(embedding)));
        list.sort_by_key(|(ids, _)| std::cmp::Reverse(ids.len()));
    }

    /// The embedding whose name's ids start at `tokens[at]`, and how many tokens the name takes.
    pub fn find_at(&self, tokens: &[u32], at: usize) -> Option<(&Arc<Embedding>, usize)> {
        self.by_first
            .get(tokens.get(at)?)?
            .iter()
            .find_map(|(ids, e)| tokens[at..].starts_with(ids).then_some((e, ids.len())))
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// A1111's rule for a `.safetensors` embedding: one tensor, `[vectors, width]` or `[width]`; for
/// SDXL (`second_width`), `clip_l` and `clip_g`, one per encoder, with as many vectors each.
fn load_one(
    path: &Path,
    name: &str,
    width: usize,
    second_width: Option<usize>,
) -> std::result::Result<Embedding, String> {
    let file = SafetensorsFile::open(path).map_err(|e| e.to_string())?;
    let keys: Vec<&String> = file.entries().keys().collect();
    let sdxl_file = keys.iter().any(|k| *k == "clip_g") && keys.iter().any(|k| *k == "clip_l");
    let hash = || crate::weights::sha256_file(path).map_err(|e| e.to_string());
    let one = |key: &str, width: usize, hash: String| -> std::result::Result<Embedding, String> {
        let (data, vectors) = read_vectors(&file, key, width)?;
        Ok(Embedding {
            name: name.to_string(),
            data,
            vectors,
            width,
            hash,
            second: None,
        })
    };
    match (second_width, sdxl_file) {
        (None, true) => Err("an SDXL embedding (clip_l and clip_g)".into()),
        (Some(_), false) => {
            Err("no clip_l and clip_g tensors: an SD 1.x/2.x embedding, not an SDXL one".into())
        }
        (Some(second_width), true) => {
            let hash = hash()?;
            let second = one("clip_g", second_width, hash.clone())?;
            let first = one("clip_l", width, hash)?;
            if first.vectors != second.vectors {
                return Err(format!(
                    "clip_l has {} vectors and clip_g {}",
                    first.vectors, second.vectors
                ));
            }
            Ok(Embedding {
                second: Some(Arc::new(second)),
                ..first
            })
        }
        (None, false) => {
            let [key] = keys.as_slice() else {
                return Err(format!("{} tensors; an embedding has one", keys.len()));
            };
            one(key, width, hash()?)
        }
    }
}

/// A tensor of `[vectors, width]` or `[width]` finite values.
fn read_vectors(
    file: &SafetensorsFile,
    key: &str,
    width: usize,
) -> std::result::Result<(Vec<f32>, usize), String> {
    let shape = file.entries()[key].shape.clone();
    let (vectors, w) = match shape.as_slice() {
        [w] => (1, *w),
        [n, w] => (*n, *w),
        _ => return Err(format!("tensor of shape {shape:?}")),
    };
    if w != width {
        return Err(format!(
            "{w} wide, the text encoder is {width} (another model family?)"
        ));
    }
    if vectors == 0 || vectors > MAX_PROMPT_TOKENS {
        return Err(format!(
            "{vectors} vectors (1..={MAX_PROMPT_TOKENS} fit a chunk)"
        ));
    }
    let data = file.read_f32(key).map_err(|e| e.to_string())?;
    if data.iter().any(|v| !v.is_finite()) {
        return Err("NaN or infinite values".into());
    }
    Ok((data, vectors))
}
