//! The tensors a model was built from, kept on the device by name, so that the model can be built
//! again with some of them replaced (a LoRA merged into its layers) without reading the
//! checkpoint again. The modules share these buffers wherever they use a tensor as loaded; only
//! the layers that fuse several tensors into one (q/k/v, the time projections) hold copies.

use std::collections::HashMap;

use burn::tensor::Tensor;

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

    /// The whole tensor `name` in `shape` (same element count as kept).
    pub fn whole<const D: usize>(&self, name: &str, shape: [usize; D]) -> Option<Tensor<D>> {
        self.0.get(name)?.as_shape(shape)
    }
}
