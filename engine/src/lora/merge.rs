//! A LoRA set merged into one network's weights: for every layer the set touches, the base weight
//! plus `Σ strength · alpha/rank · up · down`, computed in f32 on the model's device and stored in
//! the model's dtype (diffusers' `fuse_lora`).

use std::collections::{BTreeMap, HashMap};

use burn::tensor::{DType, Device, Tensor, TensorData};

use super::keys::{Name, Net, flatten};
use super::{Layer, Lora, LoraUse};
use crate::error::{Error, Result};
use crate::kernels::matmul::{self, WeightLayout};
use crate::weights::kept::{Kept, TensorMap};

/// The LoRAs a model's networks are built with, in the order they were asked for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoraSet(pub Vec<LoraUse>);

impl LoraSet {
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|u| u.te == 0.0 && u.unet == 0.0)
    }

    /// A1111's `Lora hashes` value: `name: hash12, …`.
    pub fn a1111_hashes(&self) -> String {
        self.0
            .iter()
            .map(|u| format!("{}: {}", u.lora.name, u.lora.short_hash()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// How a LoRA's layer names find the model's weights: diffusers module paths as they are, kohya's
/// flattened paths through every weight's flattened name and, where the model gives one, its
/// alias (the LDM spelling some SD 1.x LoRAs use).
struct Resolver {
    /// Module path (and its alias) → weight name.
    dotted: HashMap<String, String>,
    /// The same, flattened.
    flat: HashMap<String, String>,
}

impl Resolver {
    fn new(base: &TensorMap, alias: &dyn Fn(&str) -> Option<String>) -> Self {
        let (mut dotted, mut flat) = (HashMap::new(), HashMap::new());
        for name in base.names() {
            let Some(module) = name.strip_suffix(".weight") else {
                continue;
            };
            for m in std::iter::once(module.to_string()).chain(alias(module)) {
                flat.entry(flatten(&m)).or_insert_with(|| name.to_string());
                dotted.entry(m).or_insert_with(|| name.to_string());
            }
        }
        Self { dotted, flat }
    }

    fn weight(&self, name: &Name) -> Option<String> {
        match name {
            Name::Dotted(module) => self.dotted.get(module).cloned(),
            Name::Flat(flat) => self.flat.get(flat).cloned(),
        }
    }
}

/// The weights of `net` that `set` changes, merged, by name: what [`crate::weights::Weights::kept`]
/// serves in place of `base`'s. `alias` gives a module's other spelling (LDM names), if any.
pub fn patches(
    net: Net,
    base: &TensorMap,
    set: &LoraSet,
    alias: &dyn Fn(&str) -> Option<String>,
    device: &Device,
    dtype: DType,
) -> Result<TensorMap> {
    let mut deltas: BTreeMap<String, Tensor<2>> = BTreeMap::new();
    let mut resolver = None;
    for u in &set.0 {
        let strength = u.strength(net);
        if strength == 0.0 || !u.lora.touches(net) {
            continue;
        }
        let resolver = resolver.get_or_insert_with(|| Resolver::new(base, alias));
        let layers: Vec<&Layer> = u.lora.layers.iter().filter(|l| l.net == net).collect();
        let unmatched: Vec<&Layer> = layers
            .iter()
            .copied()
            .filter(|l| resolver.weight(&l.name).is_none())
            .collect();
        if let Some(first) = unmatched.first() {
            return Err(Error::Lora {
                name: u.lora.name.clone(),
                reason: format!(
                    "{} of its {} {} layers match nothing in this model (first: `{}`); \
                     is it made for another model family?",
                    unmatched.len(),
                    layers.len(),
                    net.label(),
                    first.name
                ),
            });
        }
        for layer in layers {
            let Some(weight) = resolver.weight(&layer.name) else {
                continue;
            };
            let shape = base.get(&weight).map(Kept::shape).unwrap_or_default();
            let delta = u.lora.delta(layer, &shape, strength, device)?;
            let sum = match deltas.remove(&weight) {
                Some(d) => d + delta,
                None => delta,
            };
            deltas.insert(weight, sum);
        }
    }
    let mut out = TensorMap::default();
    for (name, delta) in deltas {
        let Some(kept) = base.get(&name) else {
            continue;
        };
        let Some(w) = kept.as_shape(delta.dims()) else {
            continue;
        };
        let merged = (w.cast(DType::F32) + delta).cast(dtype);
        // Kept in the weight's own shape, so the rebuilt layer holds no reshaped view.
        let merged = match kept.shape()[..] {
            [a, b, c, d] => Kept::of(merged.reshape([a, b, c, d])),
            [a, b, c] => Kept::of(merged.reshape([a, b, c])),
            _ => Kept::of(merged),
        };
        if let Some(merged) = merged {
            out.insert(name, merged);
        }
    }
    Ok(out)
}

impl Lora {
    /// `strength · alpha/rank · up · down` as `[out, in·kh·kw]` f32 on `device`, checked against
    /// the model weight's `shape`.
    fn delta(
        &self,
        layer: &Layer,
        shape: &[usize],
        strength: f32,
        device: &Device,
    ) -> Result<Tensor<2>> {
        let err = |reason: String| Error::Lora {
            name: self.name.clone(),
            reason: format!("layer `{}`: {reason}", layer.name),
        };
        let entry = |key: &str| {
            self.shape(key)
                .map(<[usize]>::to_vec)
                .ok_or_else(|| err(format!("`{key}` is missing")))
        };
        let (down_shape, up_shape) = (entry(&layer.down)?, entry(&layer.up)?);
        let rank = down_shape.first().copied().unwrap_or(0);
        let d_in: usize = down_shape.iter().skip(1).product();
        let d_out = up_shape.first().copied().unwrap_or(0);
        let up_rank: usize = up_shape.iter().skip(1).product();
        if rank == 0 || d_in == 0 || d_out == 0 || up_rank != rank || down_shape.len() < 2 {
            return Err(err(format!(
                "its factors {down_shape:?} and {up_shape:?} do not multiply"
            )));
        }
        let numel: usize = shape.iter().product();
        if shape.first() != Some(&d_out) || numel != d_out * d_in {
            return Err(err(format!(
                "it updates a {d_out}×{d_in} weight, and the model's is {shape:?}; \
                 is it made for another model family?"
            )));
        }
        let scale = strength * layer.alpha.map_or(1.0, |a| a / rank as f32);
        let down = self.read_f32(&layer.down)?;
        let up = self.read_f32(&layer.up)?;
        let options = (device, DType::F32);
        let down = Tensor::<2>::from_data(TensorData::new(down, [rank, d_in]), options);
        let up = Tensor::<2>::from_data(TensorData::new(up, [d_out, rank]), options);
        // Our tiled product where the device runs kernels: one kernel for every shape, where
        // burn's matmul autotunes each of a LoRA's dozens of shapes at its first merge (20 s on
        // an H200). The CPU backend has no kernels of ours.
        let product = matmul::linear(
            up.clone(),
            &down,
            WeightLayout::InOut,
            None,
            matmul::LinearEpilogue::Plain,
            matmul::Tiling::default(),
        )
        .unwrap_or_else(|| up.matmul(down));
        Ok(product * scale)
    }
}
