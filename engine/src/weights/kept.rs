//! The tensors a model was built from, kept on the device by name, so that the model can be built
//! again with some of them replaced (a LoRA merged into its layers) without reading the
//! checkpoint again. The modules share these buffers wherever they use a tensor as loaded; only
//! the layers that fuse several tensors into one (q/k/v, the time projections) hold copies.

use std::collections::HashMap;

use burn::tensor::{Bytes, Device, Tensor, TensorData};

/// One kept tensor, as it was built (a UNet rebuilt from reshaped views ran its step 2.5 ms
/// slower on an H200), or in row chunks (a token table above the device's buffer limit,
/// [`super::Weights::tensor_rows`]).
#[derive(Debug, Clone)]
pub enum Kept {
    R1(Tensor<1>),
    R2(Tensor<2>),
    R3(Tensor<3>),
    R4(Tensor<4>),
    Rows(Vec<Tensor<2>>),
    /// In host memory as bytes its clones share ([`TensorMap::to_host`]): an upload copies
    /// them once, into the device's staging. (A CPU tensor kept in a shared map is copied out
    /// first on every upload: burn's CPU backend hands out its bytes only when it holds them
    /// alone.)
    Host(TensorData),
}

impl Kept {
    /// A tensor of rank 1 to 4, kept as it is; `None` for other ranks.
    pub fn of<const D: usize>(t: Tensor<D>) -> Option<Self> {
        let d = t.dims();
        Some(match D {
            1 => Kept::R1(t.reshape([d[0]])),
            2 => Kept::R2(t.reshape([d[0], d[1]])),
            3 => Kept::R3(t.reshape([d[0], d[1], d[2]])),
            4 => Kept::R4(t.reshape([d[0], d[1], d[2], d[3]])),
            _ => return None,
        })
    }

    /// The tensor in `shape` (same element count): itself where the shape is its own.
    pub fn as_shape<const D: usize>(&self, shape: [usize; D]) -> Option<Tensor<D>> {
        let numel: usize = shape.iter().product();
        if self.shape().iter().product::<usize>() != numel {
            return None;
        }
        Some(match self {
            Kept::R1(t) => t.clone().reshape(shape),
            Kept::R2(t) => t.clone().reshape(shape),
            Kept::R3(t) => t.clone().reshape(shape),
            Kept::R4(t) => t.clone().reshape(shape),
            Kept::Rows(_) => return None,
            // The CPU backend adopts the shared bytes: no copy.
            Kept::Host(data) => {
                let (bytes, dtype) = (data.bytes().clone(), data.dtype());
                Tensor::from_data(
                    TensorData::from_bytes(bytes, shape, dtype),
                    (&Device::flex(), dtype),
                )
            }
        })
    }

    /// The shape the model asked for (rows: the chunks' rows summed).
    pub fn shape(&self) -> Vec<usize> {
        match self {
            Kept::R1(t) => t.dims().to_vec(),
            Kept::R2(t) => t.dims().to_vec(),
            Kept::R3(t) => t.dims().to_vec(),
            Kept::R4(t) => t.dims().to_vec(),
            Kept::Rows(chunks) => {
                let rows = chunks.iter().map(|c| c.dims()[0]).sum();
                let cols = chunks.first().map_or(0, |c| c.dims()[1]);
                vec![rows, cols]
            }
            Kept::Host(data) => data.shape().iter().copied().collect(),
        }
    }
}

/// A component's kept tensors by the names its loader asked for (diffusers names).
#[derive(Debug, Clone, Default)]
pub struct TensorMap(HashMap<String, Kept>);

impl TensorMap {
    pub fn insert(&mut self, name: String, kept: Kept) {
        self.0.insert(name, kept);
    }

    /// Every tensor of `other` in place of this map's of the same name.
    pub fn overlay(&mut self, other: TensorMap) {
        self.0.extend(other.0);
    }

    pub fn get(&self, name: &str) -> Option<&Kept> {
        self.0.get(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A copy of every tensor on `device` (a parked text encoder's weights brought up for one
    /// request, [`crate::TextEncoders`]). The copies are the map's own: views kept of one buffer
    /// (a fused layer's parts) become separate tensors.
    pub fn to_device(&self, device: &burn::tensor::Device) -> TensorMap {
        let moved = |kept: &Kept| match kept {
            Kept::R1(t) => Kept::R1(t.clone().to_device(device)),
            Kept::R2(t) => Kept::R2(t.clone().to_device(device)),
            Kept::R3(t) => Kept::R3(t.clone().to_device(device)),
            Kept::R4(t) => Kept::R4(t.clone().to_device(device)),
            Kept::Host(data) => uploaded(data, device),
            // Chunked again for the target's buffer limit, in equal chunks (the embedding finds
            // a row's chunk by division); the host holds the whole table.
            Kept::Rows(rows) => {
                let whole = match rows.as_slice() {
                    [one] => one.clone(),
                    _ => Tensor::cat(rows.clone(), 0),
                };
                let [n, cols] = whole.dims();
                let per = crate::limits::DeviceLimits::of(device)
                    .rows_per_tensor((cols * whole.dtype().size()) as u64)
                    .max(1);
                let chunks = (0..n).step_by(per).map(|start| {
                    let rows = per.min(n - start);
                    whole.clone().narrow(0, start, rows).to_device(device)
                });
                Kept::Rows(chunks.collect())
            }
        };
        TensorMap(self.0.iter().map(|(k, v)| (k.clone(), moved(v))).collect())
    }

    /// A copy of every tensor in host memory, as bytes of its own that its clones share
    /// ([`Kept::Host`]; row chunks as CPU tensors). burn's `to_device` from wgpu to the CPU
    /// adopts the read-back bytes as they come, and those can be a mapped staging buffer of the
    /// device's pool: such a "host" copy kept device memory in use for as long as it lived
    /// (measured on lavapipe: a map's device memory was not freed until its host copy was
    /// dropped), so the bytes are copied out. Tensors already on the CPU are copied out once
    /// too (this map keeps them), so that later uploads copy them once instead of twice.
    pub fn to_host(&self) -> TensorMap {
        self.clone().into_host()
    }

    /// A map given up to host memory ([`Self::into_host`]), copied instead where someone else
    /// still holds it (which no caller means to: it warns).
    pub fn given_to_host(map: std::sync::Arc<TensorMap>) -> std::sync::Arc<TensorMap> {
        let host = std::sync::Arc::try_unwrap(map).map_or_else(
            |shared| {
                tracing::warn!("tensors shared elsewhere: copied to host bytes");
                shared.to_host()
            },
            TensorMap::into_host,
        );
        std::sync::Arc::new(host)
    }

    /// [`Self::to_host`] for a map the caller gives up: a CPU tensor no one else holds becomes
    /// host bytes without a copy (a parked network's tensors, once its host-built modules are
    /// gone). The parts of a fused weight (q, k and v kept as its slices) are copied out, in
    /// name order so that one layer's fused buffer at a time is held twice.
    pub fn into_host(self) -> TensorMap {
        let host = Device::flex();
        let owned = |kept: Kept| match kept {
            Kept::R1(t) => Kept::Host(host_data(t)),
            Kept::R2(t) => Kept::Host(host_data(t)),
            Kept::R3(t) => Kept::Host(host_data(t)),
            Kept::R4(t) => Kept::Host(host_data(t)),
            Kept::Rows(rows) => Kept::Rows(
                rows.into_iter()
                    .map(|t| match crate::device::is_cpu(&t.device()) {
                        true => t,
                        false => owned_on(&t, &host),
                    })
                    .collect(),
            ),
            Kept::Host(data) => Kept::Host(data),
        };
        let mut entries: Vec<_> = self.0.into_iter().collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        TensorMap(entries.into_iter().map(|(k, v)| (k, owned(v))).collect())
    }

    /// The whole tensor `name` in `shape` (same element count as kept).
    pub fn whole<const D: usize>(&self, name: &str, shape: [usize; D]) -> Option<Tensor<D>> {
        self.0.get(name)?.as_shape(shape)
    }
}

/// `t` read back and built on `device` from bytes of its own ([`TensorMap::to_host`]).
fn owned_on<const D: usize>(t: &Tensor<D>, device: &Device) -> Tensor<D> {
    let data = t.clone().into_data();
    let dtype = data.dtype();
    let owned = TensorData::from_bytes_vec(data.as_bytes().to_vec(), data.shape().clone(), dtype);
    Tensor::from_data(owned, (device, dtype))
}

/// `t`'s values in bytes of their own, shared by the copy's clones ([`Kept::Host`]).
fn shared_copy<const D: usize>(t: &Tensor<D>) -> TensorData {
    let data = t.clone().into_data();
    let bytes = Bytes::from_bytes_vec(data.as_bytes().to_vec()).shared();
    TensorData::from_bytes(bytes, data.shape().clone(), data.dtype())
}

/// `t`'s values as shared host bytes: a CPU tensor held nowhere else gives its own bytes (burn's
/// CPU backend copies them out only when they are shared), a device's are copied out of the
/// read-back staging ([`TensorMap::to_host`]).
fn host_data<const D: usize>(t: Tensor<D>) -> TensorData {
    if !crate::device::is_cpu(&t.device()) {
        return shared_copy(&t);
    }
    let (bytes, shape, dtype) = t.into_data().into_parts();
    TensorData::from_bytes(bytes.shared(), shape, dtype)
}

/// A host tensor on `device` at its own rank; the shared bytes are copied once, by the
/// device's upload.
fn uploaded(data: &TensorData, device: &Device) -> Kept {
    let on = (device, data.dtype());
    match data.shape().len() {
        1 => Kept::R1(Tensor::from_data(data.clone(), on)),
        2 => Kept::R2(Tensor::from_data(data.clone(), on)),
        3 => Kept::R3(Tensor::from_data(data.clone(), on)),
        4 => Kept::R4(Tensor::from_data(data.clone(), on)),
        rank => unreachable!("host bytes come from `Kept` tensors of rank 1 to 4, not {rank}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host copy is on the CPU backend with every value and shape, rows included. (That it
    /// holds no device memory is measured where the memory is the test's alone, on a device of
    /// its own: `tests/sdxl_refiner.rs`, whose evicted UNet frees its weights only with this copy;
    /// a second lavapipe device in this binary made its other tests 2.5× slower.)
    #[test]
    fn a_host_copy_keeps_every_value_on_the_cpu() {
        let device = crate::kernels::testing::wgpu();
        let mut map = TensorMap::default();
        for i in 0..4 {
            let t = Tensor::<2>::ones([64, 64], &device) * (i as f32);
            map.insert(format!("t{i}"), Kept::of(t).expect("rank 2"));
        }
        let rows = vec![Tensor::<2>::ones([3, 64], &device); 2];
        map.insert("rows".into(), Kept::Rows(rows));
        let host = map.to_host();
        drop(map);
        let t3 = host.whole::<2>("t3", [64, 64]).expect("t3");
        assert!(crate::device::is_cpu(&t3.device()));
        let values = t3.into_data().try_to_vec::<f32>().expect("f32");
        assert!(values.iter().all(|v| *v == 3.0));
        assert_eq!(host.get("rows").map(Kept::shape), Some(vec![6, 64]));
        assert_eq!(host.len(), 5);
    }

    /// Host bytes are shared by the map's clones (an upload copies them once), come back to the
    /// device with every value at their rank, and a CPU-built map given up keeps its values.
    #[test]
    fn host_bytes_are_shared_and_go_back_to_the_device_whole() {
        let device = crate::kernels::testing::wgpu();
        let mut map = TensorMap::default();
        let values: Vec<f32> = (0..96).map(|i| i as f32 * 0.5).collect();
        let t = Tensor::<3>::from_data(TensorData::new(values.clone(), [2, 3, 16]), &device);
        map.insert("t".into(), Kept::of(t).expect("rank 3"));
        let host = map.to_host();
        let Some(Kept::Host(data)) = host.get("t") else {
            panic!("not host bytes");
        };
        let copy = host.clone();
        let Some(Kept::Host(again)) = copy.get("t") else {
            panic!("not host bytes");
        };
        assert_eq!(
            data.as_bytes().as_ptr(),
            again.as_bytes().as_ptr(),
            "a clone shares the bytes"
        );
        assert_eq!(host.get("t").map(Kept::shape), Some(vec![2, 3, 16]));
        let back = host.to_device(&device);
        let Some(Kept::R3(t)) = back.get("t") else {
            panic!("not rank 3 on the device");
        };
        assert!(!crate::device::is_cpu(&t.device()));
        assert_eq!(
            t.clone().into_data().try_to_vec::<f32>().ok(),
            Some(values.clone())
        );
        let flat = host.whole::<2>("t", [6, 16]).expect("6 x 16");
        assert_eq!(
            flat.into_data().try_to_vec::<f32>().ok(),
            Some(values.clone())
        );

        let cpu = Device::flex();
        let mut built = TensorMap::default();
        let data = TensorData::new(values.clone(), [6, 16]);
        let at = data.as_bytes().as_ptr();
        let t = Tensor::<2>::from_data(data, &cpu);
        built.insert("t".into(), Kept::of(t).expect("rank 2"));
        let given = built.into_host();
        let Some(Kept::Host(data)) = given.get("t") else {
            panic!("not host bytes");
        };
        assert_eq!(data.as_bytes().as_ptr(), at, "given up without a copy");
        let t = given.whole::<2>("t", [6, 16]).expect("6 x 16");
        assert_eq!(t.into_data().try_to_vec::<f32>().ok(), Some(values));
    }
}
