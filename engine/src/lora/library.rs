//! A folder of LoRA files, named by their stems as prompts name them. Opened files are kept
//! (by path, size and modification time), so a second generation with the same LoRA neither
//! parses nor hashes it again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::tags::{self, Tags};
use super::{Lora, LoraSet, LoraUse};
use crate::error::{Error, Result};

/// How deep below the folder files are looked for.
const MAX_DEPTH: usize = 3;

/// Opened LoRAs kept (their factors are in memory), the least recently used leaving first.
const MAX_OPENED: usize = 8;

/// An opened file: its size and modification time when read, when it was last asked for.
struct Opened {
    len: u64,
    modified: Option<SystemTime>,
    used: u64,
    lora: Arc<Lora>,
}

#[derive(Default)]
pub struct LoraLibrary {
    dir: Option<PathBuf>,
    opened: Mutex<(u64, HashMap<PathBuf, Opened>)>,
}

impl LoraLibrary {
    pub fn new(dir: Option<PathBuf>) -> Self {
        Self {
            dir,
            opened: Mutex::default(),
        }
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Another folder; opened files stay known.
    pub fn set_dir(&mut self, dir: Option<PathBuf>) {
        self.dir = dir;
    }

    /// The names of the folder's LoRAs, sorted (what the studio lists).
    pub fn names(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(dir) = &self.dir {
            walk(dir, 0, &mut |p| {
                if let Some(stem) = p.file_stem() {
                    out.push(stem.to_string_lossy().into_owned());
                }
                false
            });
        }
        out.sort_by_key(|n| n.to_lowercase());
        out.dedup();
        out
    }

    /// The LoRA named `name`, opened once per file version.
    pub fn open(&self, name: &str) -> Result<Arc<Lora>> {
        let dir = self.dir.as_deref();
        let path = dir
            .and_then(|d| find(d, name))
            .ok_or_else(|| super::not_found(name, dir))?;
        let meta = std::fs::metadata(&path).map_err(|e| Error::io("LoRA", &path, e))?;
        let stamp = (meta.len(), meta.modified().ok());
        let mut guard = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        let (clock, opened) = &mut *guard;
        *clock += 1;
        if let Some(o) = opened.get_mut(&path)
            && (o.len, o.modified) == stamp
        {
            o.used = *clock;
            return Ok(o.lora.clone());
        }
        let lora = Arc::new(Lora::open(&path)?);
        if opened.len() >= MAX_OPENED
            && let Some(oldest) = opened
                .iter()
                .min_by_key(|(_, o)| o.used)
                .map(|(p, _)| p.clone())
        {
            opened.remove(&oldest);
        }
        let entry = Opened {
            len: stamp.0,
            modified: stamp.1,
            used: *clock,
            lora: lora.clone(),
        };
        opened.insert(path, entry);
        Ok(lora)
    }

    /// The LoRAs `prompt`'s tags ask for, opened, and the tags that were not applied.
    pub fn resolve(&self, prompt: &str) -> Result<(LoraSet, Vec<String>)> {
        let Tags { loras, ignored } = tags::parse(prompt);
        let mut set = Vec::with_capacity(loras.len());
        for tag in loras {
            set.push(LoraUse {
                lora: self.open(&tag.name)?,
                te: tag.te,
                unet: tag.unet,
            });
        }
        Ok((LoraSet(set), ignored))
    }
}

/// `dir/name.safetensors`, else the first `name.safetensors` below `dir`.
pub(super) fn find(dir: &Path, name: &str) -> Option<PathBuf> {
    let direct = dir.join(format!("{name}.safetensors"));
    if direct.is_file() {
        return Some(direct);
    }
    let mut found = None;
    walk(dir, 0, &mut |p| {
        let hit = p.file_stem().is_some_and(|s| s.to_string_lossy() == name);
        if hit {
            found = Some(p.to_path_buf());
        }
        hit
    });
    found
}

/// Calls `visit` on every `.safetensors` file below `dir` (sorted, depth-limited) until it
/// returns true.
fn walk(dir: &Path, depth: usize, visit: &mut dyn FnMut(&Path) -> bool) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for p in paths {
        if p.is_dir() {
            if depth < MAX_DEPTH && walk(&p, depth + 1, visit) {
                return true;
            }
        } else if p
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("safetensors"))
            && visit(&p)
        {
            return true;
        }
    }
    false
}
