//! The tensors a model was built from, kept on the device by name, so that the model can be built
//! again with some of them replaced (a LoRA merged into its layers) without reading the
//! checkpoint again. The modules share these buffers wherever they use a tensor as loaded; only
//! the layers that fuse several tensors into one (q/k/v, the time projections) hold copies.

use std::collections::HashMap;

use burn::tensor::Tensor;

/// One kept tensor: whole (flattened, with the shape it was asked for) or in row chunks (a token
/// table above the device's buffer limit, [`super::Weights::tensor_rows`]).
#[derive(Debug, Clone)]
pub enum Kept {
    Whole(Tensor<1>, Vec<usize>),
    Rows(Vec<Tensor<2>>),
}

impl Kept {
    /// The shape the model asked for (rows: the chunks' rows summed).
    pub fn shape(&self) -> Vec<usize> {
        match self {
            Kept::Whole(_, shape) => shape.clone(),
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

    /// The whole tensor `name` in `shape` (same element count as kept).
    pub fn whole<const D: usize>(&self, name: &str, shape: [usize; D]) -> Option<Tensor<D>> {
        match self.0.get(name)? {
            Kept::Whole(t, kept)
                if kept.iter().product::<usize>() == shape.iter().product::<usize>() =>
            {
                Some(t.clone().reshape(shape))
            }
            _ => None,
        }
    }
}
