//! `Weights`: how a model finds its tensors. A model asks for a diffusers name and a shape; the
//! handle maps the name to the stored key (identity for diffusers folders, the LDM rename table for
//! single files), checks the shape and builds the tensor on the target device in the target dtype.
//! A random source serves the same requests for full-size benchmarks without a checkpoint.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;
use std::sync::Arc;

use burn::tensor::{DType, Device, Distribution, Tensor, TensorData};

use super::safetensors::{SafetensorsFile, to_f32};
use crate::error::{Error, Result};

/// Maps a diffusers-style name (without component prefix) to the key stored in the file.
pub type KeyMap = Arc<dyn Fn(&str) -> String + Send + Sync>;

enum Source {
    File {
        file: Arc<SafetensorsFile>,
        map: KeyMap,
    },
    Random,
}

struct Inner {
    component: &'static str,
    source: Source,
    device: Device,
    dtype: DType,
    used: RefCell<BTreeSet<String>>,
}

/// A cheap, cloneable, prefixed view into one component's weights.
#[derive(Clone)]
pub struct Weights {
    inner: Rc<Inner>,
    prefix: String,
}

/// What a load used and left over, for the log and for tests.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    pub component: &'static str,
    pub loaded: usize,
    pub unused: Vec<String>,
}

impl Weights {
    pub fn from_file(
        component: &'static str,
        file: Arc<SafetensorsFile>,
        map: KeyMap,
        device: &Device,
        dtype: DType,
    ) -> Self {
        Self::new(component, Source::File { file, map }, device, dtype)
    }

    /// Random normal weights (std 0.02, norm scales 1): for timing full-size models.
    pub fn random(component: &'static str, device: &Device, dtype: DType) -> Self {
        Self::new(component, Source::Random, device, dtype)
    }

    fn new(component: &'static str, source: Source, device: &Device, dtype: DType) -> Self {
        Self {
            inner: Rc::new(Inner {
                component,
                source,
                device: device.clone(),
                dtype,
                used: RefCell::new(BTreeSet::new()),
            }),
            prefix: String::new(),
        }
    }

    /// A view one level down: `w.pp("conv_in").tensor("weight", ..)` asks for `conv_in.weight`.
    pub fn pp(&self, name: impl std::fmt::Display) -> Self {
        let prefix = if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        };
        Self {
            inner: self.inner.clone(),
            prefix,
        }
    }

    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    pub fn dtype(&self) -> DType {
        self.inner.dtype
    }

    fn full(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    /// Whether the checkpoint holds this tensor (random sources hold everything).
    pub fn contains(&self, name: &str) -> bool {
        match &self.inner.source {
            Source::File { file, map } => file.entry(&map(&self.full(name))).is_some(),
            Source::Random => true,
        }
    }

    /// A required tensor of the given shape.
    pub fn tensor<const D: usize>(&self, name: &str, shape: [usize; D]) -> Result<Tensor<D>> {
        let full = self.full(name);
        let inner = &self.inner;
        match &inner.source {
            Source::Random => {
                let options = (&inner.device, inner.dtype);
                let is_norm_scale = D == 1 && name == "weight";
                Ok(if is_norm_scale {
                    Tensor::ones(shape, options)
                } else {
                    Tensor::random(shape, Distribution::Normal(0.0, 0.02), options)
                })
            }
            Source::File { file, map } => {
                let key = map(&full);
                let entry = file.entry(&key).ok_or_else(|| Error::MissingTensor {
                    component: inner.component,
                    name: key.clone(),
                })?;
                // LDM files store some linear layers as 1x1 convolutions: accept trailing 1s.
                let stored = &entry.shape;
                let compatible = stored.len() >= D
                    && stored[..D] == shape[..]
                    && stored[D..].iter().all(|&d| d == 1);
                if !compatible {
                    return Err(Error::ShapeMismatch {
                        component: inner.component,
                        name: key,
                        expected: shape.to_vec(),
                        found: stored.clone(),
                    });
                }
                let values = to_f32(&key, entry.dtype, file.bytes(entry))?;
                inner.used.borrow_mut().insert(key);
                let data = TensorData::new(values, shape);
                Ok(Tensor::from_data(data, (&inner.device, inner.dtype)))
            }
        }
    }

    /// A tensor that may be absent (e.g. a bias).
    pub fn optional<const D: usize>(
        &self,
        name: &str,
        shape: [usize; D],
    ) -> Result<Option<Tensor<D>>> {
        if self.contains(name) {
            self.tensor(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Keys of the file under `stored_prefix` that no request touched.
    pub fn report(&self, stored_prefix: &str) -> LoadReport {
        let inner = &self.inner;
        let used = inner.used.borrow();
        let unused = match &inner.source {
            Source::File { file, .. } => file
                .entries()
                .keys()
                .filter(|k| k.starts_with(stored_prefix) && !used.contains(*k))
                .cloned()
                .collect(),
            Source::Random => Vec::new(),
        };
        LoadReport {
            component: inner.component,
            loaded: used.len(),
            unused,
        }
    }
}
