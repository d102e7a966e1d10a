//! `Weights`: how a model finds its tensors. A model asks for a diffusers name and a shape; the
//! handle maps the name to the stored key (identity for diffusers folders, the LDM rename table for
//! single files), checks the shape and builds the tensor on the target device in the target dtype.
//! A random source serves the same requests for full-size benchmarks without a checkpoint.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::{DType, Device, Distribution, Tensor, TensorData};

pub mod kept;
pub mod safetensors;

use self::kept::{Kept, TensorMap};
pub use self::safetensors::SafetensorsFile;
use self::safetensors::to_f32;
use crate::error::{Error, Result};
use crate::limits::DeviceLimits;
use ::safetensors::Dtype;

/// The SHA-256 of a weights file, as lowercase hex (read in 1 MiB pieces).
pub fn sha256_file(path: &std::path::Path) -> Result<String> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut file = std::fs::File::open(path).map_err(|e| Error::io("checkpoint", path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| Error::io("checkpoint", path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Cancel and progress for the loads this thread runs (see [`controlled`]).
struct LoadControl {
    cancel: Arc<AtomicBool>,
    progress: Box<dyn FnMut(u64)>,
}

thread_local! {
    static CONTROL: RefCell<Option<LoadControl>> = const { RefCell::new(None) };
}

/// Runs `load` with a cancel flag and a progress callback for every checkpoint tensor it builds on
/// this thread: the flag is checked before each tensor (a set flag ends the load with
/// [`Error::Cancelled`], so a multi-gigabyte load stops within one tensor), and `progress` hears
/// each tensor's bytes once uploaded. A thread-local keeps the models' loaders free of plumbing;
/// loads run on the caller's thread. The previous control, if any, is restored afterwards.
pub fn controlled<T>(
    cancel: Arc<AtomicBool>,
    progress: impl FnMut(u64) + 'static,
    load: impl FnOnce() -> T,
) -> T {
    struct Restore(Option<LoadControl>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            CONTROL.with(|c| *c.borrow_mut() = previous);
        }
    }
    let previous = CONTROL.with(|c| {
        c.borrow_mut().replace(LoadControl {
            cancel,
            progress: Box::new(progress),
        })
    });
    let _restore = Restore(previous);
    load()
}

/// `Err(Cancelled)` when this thread's load was cancelled.
fn check_cancel() -> Result<()> {
    CONTROL.with(|c| match &*c.borrow() {
        Some(control) if control.cancel.load(Ordering::Relaxed) => Err(Error::Cancelled),
        _ => Ok(()),
    })
}

fn report_progress(bytes: u64) {
    CONTROL.with(|c| {
        if let Some(control) = c.borrow_mut().as_mut() {
            (control.progress)(bytes);
        }
    });
}

/// Maps a diffusers-style name (without component prefix) to the key stored in the file.
pub type KeyMap = Arc<dyn Fn(&str) -> String + Send + Sync>;

enum Source {
    File {
        file: Arc<SafetensorsFile>,
        map: KeyMap,
    },
    /// Named f32 values with their shapes (tests and small built-in tensors).
    Values(HashMap<String, (Vec<f32>, Vec<usize>)>),
    Random,
    /// A model's kept device tensors, some replaced by `patches` (a LoRA merged in).
    Kept {
        base: Arc<TensorMap>,
        patches: Arc<TensorMap>,
    },
}

/// Hears every tensor a load builds, exactly as uploaded: its name (as the model asked for it),
/// shape, dtype and little-endian bytes. The disk cache uses it to write converted weights.
pub type Recorder = Rc<RefCell<dyn FnMut(&str, &[usize], DType, &[u8])>>;

struct Inner {
    component: &'static str,
    source: Source,
    device: Device,
    dtype: DType,
    used: RefCell<BTreeSet<String>>,
    /// Bytes uploaded so far.
    bytes: std::cell::Cell<u64>,
    recorder: Option<Recorder>,
    /// Every tensor built, kept by name ([`Weights::keeping`]).
    keep: Option<RefCell<TensorMap>>,
    /// The device's limits, asked at the first tensor (asking opens a lazy device).
    limits: std::cell::OnceCell<DeviceLimits>,
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
    /// Bytes of weights built from the source (random weights are not counted).
    pub bytes: u64,
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

    /// Weights from named f32 values (`name -> (values, shape)`).
    pub fn from_values(
        values: HashMap<String, (Vec<f32>, Vec<usize>)>,
        device: &Device,
        dtype: DType,
    ) -> Self {
        Self::new("values", Source::Values(values), device, dtype)
    }

    /// Sends every tensor this load builds to `recorder` as well (before any view is taken).
    pub fn recording(mut self, recorder: Recorder) -> Self {
        match Rc::get_mut(&mut self.inner) {
            Some(inner) => inner.recorder = Some(recorder),
            None => tracing::warn!("weights already shared; not recording"),
        }
        self
    }

    /// Keeps every tensor this load builds, by name, for [`Self::take_kept`] (so the model can
    /// be built again from them: [`Self::kept`]).
    pub fn keeping(mut self) -> Self {
        match Rc::get_mut(&mut self.inner) {
            Some(inner) => inner.keep = Some(RefCell::new(TensorMap::default())),
            None => tracing::warn!("weights already shared; not keeping"),
        }
        self
    }

    /// The tensors kept so far ([`Self::keeping`]); empty when not keeping.
    pub fn take_kept(&self) -> TensorMap {
        self.inner
            .keep
            .as_ref()
            .map(|k| std::mem::take(&mut *k.borrow_mut()))
            .unwrap_or_default()
    }

    /// Weights served from a model's kept tensors, `patches` in place of the base's where named.
    pub fn kept(
        component: &'static str,
        base: Arc<TensorMap>,
        patches: Arc<TensorMap>,
        device: &Device,
        dtype: DType,
    ) -> Self {
        Self::new(component, Source::Kept { base, patches }, device, dtype)
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
                bytes: std::cell::Cell::new(0),
                recorder: None,
                keep: None,
                limits: std::cell::OnceCell::new(),
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
            Source::Values(values) => values.contains_key(&self.full(name)),
            Source::Random => true,
            Source::Kept { base, patches } => {
                let full = self.full(name);
                patches.contains(&full) || base.contains(&full)
            }
        }
    }

    /// A kept tensor (patched or base), or the error a file source would give.
    fn kept_tensor<const D: usize>(
        &self,
        (base, patches): (&TensorMap, &TensorMap),
        full: &str,
        shape: [usize; D],
    ) -> Result<Tensor<D>> {
        let map = if patches.contains(full) {
            patches
        } else {
            base
        };
        // Host bytes come up as CPU tensors: a build for another device takes them there.
        let on_device = |t: Tensor<D>| match t.device() == self.inner.device {
            true => t,
            false => t.to_device(&self.inner.device),
        };
        map.whole(full, shape)
            .map(on_device)
            .ok_or_else(|| match map.get(full) {
                None => Error::MissingTensor {
                    component: self.inner.component,
                    name: full.to_string(),
                },
                Some(kept) => Error::ShapeMismatch {
                    component: self.inner.component,
                    name: full.to_string(),
                    expected: shape.to_vec(),
                    found: kept.shape(),
                },
            })
    }

    /// Where keeping, keeps `tensor` as `name` in place of the tensor loaded under that name:
    /// a fused layer keeps its parts as views of its own weight, so the model holds each once.
    pub fn keep_instead<const D: usize>(&self, name: &str, tensor: Tensor<D>) {
        self.keep(&self.full(name), || Kept::of(tensor));
    }

    fn keep(&self, full: &str, kept: impl FnOnce() -> Option<Kept>) {
        if let (Some(keep), Some(kept)) = (&self.inner.keep, kept()) {
            keep.borrow_mut().insert(full.to_string(), kept);
        }
    }

    /// A required tensor of the given shape.
    pub fn tensor<const D: usize>(&self, name: &str, shape: [usize; D]) -> Result<Tensor<D>> {
        let full = self.full(name);
        if let Source::Kept { base, patches } = &self.inner.source {
            return self.kept_tensor((base, patches), &full, shape);
        }
        self.check_fits(&full, &shape)?;
        let options = (&self.inner.device, self.inner.dtype);
        let tensor: Tensor<D> = match self.host(name, &shape)? {
            Some(data) => Tensor::from_data(data, options),
            None => random(name, shape, options),
        };
        self.keep(&full, || Kept::of(tensor.clone()));
        Ok(tensor)
    }

    /// A required `[rows, cols]` tensor as row chunks in order, each within the device's largest
    /// tensor ([`DeviceLimits::max_tensor_bytes`]); one chunk where the whole fits. For the token
    /// embedding: SD 1.5's (49408 × 768 in f32, 145 MiB) is above WebGPU's 128 MiB binding limit.
    /// The recorder hears the whole tensor once, so cache files do not depend on the device.
    pub fn tensor_rows(&self, name: &str, shape: [usize; 2]) -> Result<Vec<Tensor<2>>> {
        if let Source::Kept { base, patches } = &self.inner.source {
            let full = self.full(name);
            return match patches.get(&full).or_else(|| base.get(&full)) {
                Some(Kept::Rows(chunks)) => Ok(chunks.clone()),
                _ => self
                    .kept_tensor((base, patches), &full, shape)
                    .map(|t| vec![t]),
            };
        }
        let chunks = self.tensor_rows_built(name, shape)?;
        self.keep(&self.full(name), || Some(Kept::Rows(chunks.clone())));
        Ok(chunks)
    }

    fn tensor_rows_built(&self, name: &str, shape: [usize; 2]) -> Result<Vec<Tensor<2>>> {
        let [rows, cols] = shape;
        let row_bytes = (cols * self.inner.dtype.size()) as u64;
        let per_chunk = self.limits().rows_per_tensor(row_bytes);
        if per_chunk >= rows {
            return Ok(vec![self.tensor(name, shape)?]);
        }
        self.check_fits(&self.full(name), &[1, cols])?;
        let options = (&self.inner.device, self.inner.dtype);
        let starts = (0..rows).step_by(per_chunk);
        let chunk_rows = |start: usize| per_chunk.min(rows - start);
        Ok(match self.host(name, &shape)? {
            Some(data) => {
                let bytes = data.as_bytes();
                let row_len = row_bytes as usize;
                starts
                    .map(|start| {
                        let n = chunk_rows(start);
                        let part = bytes[start * row_len..(start + n) * row_len].to_vec();
                        let part = TensorData::from_bytes_vec(part, [n, cols], self.inner.dtype);
                        Tensor::from_data(part, options)
                    })
                    .collect()
            }
            None => starts
                .map(|start| random(name, [chunk_rows(start), cols], options))
                .collect(),
        })
    }

    /// The device's limits, asked once per load.
    fn limits(&self) -> DeviceLimits {
        *self
            .inner
            .limits
            .get_or_init(|| DeviceLimits::of(&self.inner.device))
    }

    /// A tensor of `shape` fits in one buffer of the device, or [`Error::TensorTooLarge`]: wgpu
    /// would only fail later, at the first read, with a message naming no tensor.
    fn check_fits(&self, full: &str, shape: &[usize]) -> Result<()> {
        let bytes = shape
            .iter()
            .try_fold(self.inner.dtype.size() as u64, |acc, &d| {
                acc.checked_mul(d as u64)
            })
            .unwrap_or(u64::MAX);
        let limit = self.limits().max_tensor_bytes();
        if bytes > limit {
            return Err(Error::TensorTooLarge {
                name: full.to_string(),
                bytes,
                limit,
            });
        }
        Ok(())
    }

    /// The stored tensor's data on the host in the target dtype, counted and told to the recorder;
    /// `None` for random weights.
    fn host(&self, name: &str, shape: &[usize]) -> Result<Option<TensorData>> {
        check_cancel()?;
        let full = self.full(name);
        let inner = &self.inner;
        let data = match &inner.source {
            Source::Random => return Ok(None),
            Source::Kept { .. } => unreachable!("kept tensors are not read from the host"),
            Source::File { file, map } => {
                let key = map(&full);
                let entry = file.entry(&key).ok_or_else(|| Error::MissingTensor {
                    component: inner.component,
                    name: key.clone(),
                })?;
                // LDM files store some linear layers as 1x1 convolutions: accept trailing 1s.
                let stored = &entry.shape;
                let d = shape.len();
                let compatible = stored.len() >= d
                    && stored[..d] == shape[..]
                    && stored[d..].iter().all(|&n| n == 1);
                if !compatible {
                    return Err(Error::ShapeMismatch {
                        component: inner.component,
                        name: key,
                        expected: shape.to_vec(),
                        found: stored.clone(),
                    });
                }
                let bytes = file.bytes(entry);
                // Stored in the target dtype already (an f16 checkpoint, or our disk cache): upload
                // the bytes as they are instead of widening to f32 and narrowing again.
                let data = match (entry.dtype, inner.dtype) {
                    (Dtype::F16, DType::F16) | (Dtype::F32, DType::F32) => {
                        TensorData::from_bytes_vec(bytes.to_vec(), shape.to_vec(), inner.dtype)
                    }
                    _ => TensorData::new(to_f32(&key, entry.dtype, bytes)?, shape.to_vec()),
                };
                inner.used.borrow_mut().insert(key);
                data
            }
            Source::Values(values) => {
                let (v, stored) = values.get(&full).ok_or_else(|| Error::MissingTensor {
                    component: inner.component,
                    name: full.clone(),
                })?;
                if stored[..] != shape[..] {
                    return Err(Error::ShapeMismatch {
                        component: inner.component,
                        name: full,
                        expected: shape.to_vec(),
                        found: stored.clone(),
                    });
                }
                inner.used.borrow_mut().insert(full.clone());
                TensorData::new(v.clone(), shape.to_vec())
            }
        };
        let data = if data.dtype() != inner.dtype {
            data.convert_dtype(inner.dtype)
        } else {
            data
        };
        inner
            .bytes
            .set(inner.bytes.get() + data.as_bytes().len() as u64);
        if let Some(recorder) = &inner.recorder {
            (recorder.borrow_mut())(&full, shape, inner.dtype, data.as_bytes());
        }
        report_progress(data.as_bytes().len() as u64);
        Ok(Some(data))
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
            // A tensor read in parts (OpenCLIP's fused q/k/v) counts as used when every part was.
            Source::File { file, .. } => file
                .entries()
                .keys()
                .filter(|k| k.starts_with(stored_prefix) && !used.contains(*k))
                .filter(|k| {
                    let parts = file.parts_of(k);
                    parts.is_empty() || !parts.iter().all(|p| used.contains(*p))
                })
                .cloned()
                .collect(),
            Source::Values(values) => values
                .keys()
                .filter(|k| k.starts_with(stored_prefix) && !used.contains(*k))
                .cloned()
                .collect(),
            Source::Random | Source::Kept { .. } => Vec::new(),
        };
        LoadReport {
            component: inner.component,
            loaded: used.len(),
            bytes: inner.bytes.get(),
            unused,
        }
    }
}

/// Random normal weights (std 0.02); a 1-D `weight` is a norm scale and is ones.
fn random<const D: usize>(name: &str, shape: [usize; D], options: (&Device, DType)) -> Tensor<D> {
    if D == 1 && name == "weight" {
        Tensor::ones(shape, options)
    } else {
        Tensor::random(shape, Distribution::Normal(0.0, 0.02), options)
    }
}
