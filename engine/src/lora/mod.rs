//! LoRA: low-rank updates to a model's layers, as artists download them (kohya-ss / A1111 and
//! diffusers / PEFT files; LoCon's convolution layers too). They are merged into the weights on
//! the device (`W + strength · alpha/rank · up · down`), which costs nothing per step; the
//! checkpoint is not read again: the model keeps the tensors it was built from
//! ([`crate::weights::kept`]) and builds the patched layers from them
//! ([`crate::StableDiffusion::networks`]).
//!
//! `keys.rs`: what a key names. `merge.rs`: the patches. `tags.rs`: `<lora:name:w>` in prompts.
//! `library.rs`: a folder of LoRAs, opened files cached.

pub mod keys;
mod library;
pub mod merge;
pub mod tags;

pub use library::LoraLibrary;
pub use merge::{LoraSet, patches};
pub use tags::{LoraTag, Tags};

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::weights::SafetensorsFile;
use keys::{Name, Net, Part, Refusal};

/// One layer's update: the keys of its two factors and its alpha.
#[derive(Debug, Clone)]
pub struct Layer {
    pub net: Net,
    pub name: Name,
    down: String,
    up: String,
    alpha: Option<f32>,
}

/// An opened LoRA file.
pub struct Lora {
    /// The file's stem: the name prompts use.
    pub name: String,
    /// A1111's hash of the file's tensor data (the "addnet" SHA-256, lowercase hex).
    pub hash: String,
    pub layers: Vec<Layer>,
    path: PathBuf,
    /// The layers' factors by key, copied out of the file: the file is not kept open (on
    /// Windows an open mapping would stop the artist from replacing it).
    factors: HashMap<String, Factor>,
}

/// One stored factor: shape, dtype and little-endian bytes.
struct Factor {
    shape: Vec<usize>,
    dtype: safetensors::Dtype,
    bytes: Vec<u8>,
}

impl std::fmt::Debug for Lora {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lora")
            .field("name", &self.name)
            .field("layers", &self.layers.len())
            .finish()
    }
}

impl Lora {
    pub fn open(path: &Path) -> Result<Self> {
        let file = SafetensorsFile::open(path)?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let invalid = |reason: String| Error::Lora {
            name: name.clone(),
            reason,
        };
        let peft_alpha = PeftAlphas::read(&file).map_err(&invalid)?;
        #[derive(Default)]
        struct Parts {
            down: Option<String>,
            up: Option<String>,
            alpha: Option<f32>,
        }
        let mut parts: BTreeMap<(Net, Name), Parts> = BTreeMap::new();
        for key in file.entries().keys() {
            let (net, layer, part) = keys::classify(key).map_err(|r| {
                invalid(match r {
                    Refusal::Family(family) => format!("it is made for {family}"),
                    Refusal::Algorithm(algorithm) => {
                        format!("{algorithm} networks are not supported yet (key `{key}`)")
                    }
                    Refusal::Unknown => format!("`{key}` is not a LoRA key of a known format"),
                })
            })?;
            let entry = parts.entry((net, layer)).or_default();
            match part {
                Part::Down => entry.down = Some(key.clone()),
                Part::Up => entry.up = Some(key.clone()),
                Part::Alpha => {
                    let v = file.read_f32(key)?;
                    entry.alpha = match v.as_slice() {
                        [a] if a.is_finite() => Some(*a),
                        _ => return Err(invalid(format!("`{key}` is not one finite number"))),
                    };
                }
            }
        }
        let mut layers = Vec::with_capacity(parts.len());
        for ((net, layer), p) in parts {
            let (Some(down), Some(up)) = (p.down, p.up) else {
                return Err(invalid(format!(
                    "layer `{layer}` lacks its down or up matrix"
                )));
            };
            let alpha = p.alpha.or_else(|| peft_alpha.of(net, &layer));
            layers.push(Layer {
                net,
                name: layer,
                down,
                up,
                alpha,
            });
        }
        if layers.is_empty() {
            return Err(invalid("it holds no LoRA layers".into()));
        }
        let hash = {
            use sha2::{Digest, Sha256};
            Sha256::digest(file.data())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        };
        let mut factors = HashMap::new();
        for key in layers.iter().flat_map(|l| [&l.down, &l.up]) {
            if let Some(entry) = file.entry(key) {
                let factor = Factor {
                    shape: entry.shape.clone(),
                    dtype: entry.dtype,
                    bytes: file.bytes(entry).to_vec(),
                };
                factors.insert(key.clone(), factor);
            }
        }
        Ok(Self {
            name,
            hash,
            layers,
            path: path.to_path_buf(),
            factors,
        })
    }

    /// A1111's short hash (`Lora hashes` in the parameters text): 12 hex digits.
    pub fn short_hash(&self) -> &str {
        &self.hash[..12.min(self.hash.len())]
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A factor's stored shape.
    fn shape(&self, key: &str) -> Option<&[usize]> {
        self.factors.get(key).map(|f| f.shape.as_slice())
    }

    /// A factor's values as f32.
    fn read_f32(&self, key: &str) -> Result<Vec<f32>> {
        let factor = self.factors.get(key).ok_or_else(|| Error::Lora {
            name: self.name.clone(),
            reason: format!("`{key}` is missing"),
        })?;
        crate::weights::safetensors::to_f32(key, factor.dtype, &factor.bytes)
    }

    /// Whether any layer belongs to `net`.
    pub fn touches(&self, net: Net) -> bool {
        self.layers.iter().any(|l| l.net == net)
    }
}

/// A LoRA at its strengths, as a request uses it.
#[derive(Debug, Clone)]
pub struct LoraUse {
    pub lora: Arc<Lora>,
    pub te: f32,
    pub unet: f32,
}

impl LoraUse {
    pub fn strength(&self, net: Net) -> f32 {
        match net {
            Net::TextEncoder | Net::TextEncoder2 => self.te,
            Net::Unet => self.unet,
        }
    }
}

impl PartialEq for LoraUse {
    fn eq(&self, other: &Self) -> bool {
        self.lora.hash == other.lora.hash && self.te == other.te && self.unet == other.unet
    }
}

/// diffusers' adapter metadata (`lora_adapter_metadata`): `lora_alpha` per network, with PEFT's
/// `alpha_pattern` overrides. Files without it use alpha = rank (diffusers' default).
#[derive(Default)]
struct PeftAlphas(BTreeMap<(Net, String), f32>);

impl PeftAlphas {
    fn read(file: &SafetensorsFile) -> std::result::Result<Self, String> {
        let Some(raw) = file.metadata().get("lora_adapter_metadata") else {
            return Ok(Self::default());
        };
        let json: serde_json::Value = serde_json::from_str(raw)
            .map_err(|e| format!("its adapter metadata is not JSON: {e}"))?;
        let mut out = BTreeMap::new();
        let Some(object) = json.as_object() else {
            return Ok(Self::default());
        };
        for (key, value) in object {
            let Some((net, field)) = key.split_once('.') else {
                continue;
            };
            let net = match net {
                "unet" => Net::Unet,
                "text_encoder" => Net::TextEncoder,
                "text_encoder_2" => Net::TextEncoder2,
                _ => continue,
            };
            match field {
                "lora_alpha" => {
                    if let Some(a) = value.as_f64() {
                        out.insert((net, String::new()), a as f32);
                    }
                }
                "alpha_pattern" => {
                    for (pattern, a) in value.as_object().into_iter().flatten() {
                        if let Some(a) = a.as_f64() {
                            out.insert((net, pattern.clone()), a as f32);
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(Self(out))
    }

    /// PEFT's rule: a pattern applies to a module it names exactly or ends (after a dot).
    fn of(&self, net: Net, layer: &Name) -> Option<f32> {
        let Name::Dotted(module) = layer else {
            return None;
        };
        let pattern = self.0.iter().find(|((n, p), _)| {
            *n == net && !p.is_empty() && (module == p || module.ends_with(&format!(".{p}")))
        });
        pattern
            .or_else(|| self.0.get_key_value(&(net, String::new())))
            .map(|(_, a)| *a)
    }
}

/// Where a LoRA named in a prompt was looked for.
pub fn not_found(name: &str, dir: Option<&Path>) -> Error {
    Error::Lora {
        name: name.to_string(),
        reason: match dir {
            Some(d) => format!("no such file in the LoRA folder {}", d.display()),
            None => "no LoRA folder is set".to_string(),
        },
    }
}
