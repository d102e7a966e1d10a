//! What a convolution adds to its result before the one cast and write: the bias, a
//! per-(image, channel) term read as columns of a wider tensor, and a residual.

use burn::tensor::Tensor;

/// What a convolution adds to its result before the cast (all in the output's dtype).
#[derive(Debug, Clone, Copy, Default)]
pub struct Epilogue<'a> {
    /// `[c_out]`.
    pub bias: Option<&'a Tensor<1>>,
    /// `[b, c_out]` (columns of a wider `[b, n]`), added to every pixel of image `b`, channel
    /// `c` (the time embedding).
    pub channel: Option<Columns<'a>>,
    /// `[b, c_out, oh, ow]` (the resnet's shortcut).
    pub residual: Option<&'a Tensor<4>>,
}

/// Columns `column ..` of a `[rows, width]` tensor, read in place: the UNet projects the time
/// embedding for every resnet in one product and each convolution reads its own columns.
#[derive(Debug, Clone, Copy)]
pub struct Columns<'a> {
    pub tensor: &'a Tensor<2>,
    pub column: usize,
}

impl<'a> Columns<'a> {
    /// All of `tensor`.
    pub fn all(tensor: &'a Tensor<2>) -> Self {
        Self { tensor, column: 0 }
    }

    /// The `n` columns as a tensor of their own (a copy where they are not all of it).
    pub fn take(&self, n: usize) -> Tensor<2> {
        let [rows, width] = self.tensor.dims();
        if self.column == 0 && width == n {
            return self.tensor.clone();
        }
        self.tensor
            .clone()
            .slice([0..rows, self.column..self.column + n])
    }
}

impl Epilogue<'_> {
    /// `y` plus these terms with burn ops: the twin of our epilogue, and the path burn's
    /// convolution takes.
    pub fn apply(&self, y: Tensor<4>) -> Tensor<4> {
        let [b, c, _, _] = y.dims();
        let mut y = y;
        if let Some(bias) = self.bias {
            y = y + bias.clone().reshape([1, c, 1, 1]);
        }
        if let Some(t) = self.channel {
            y = y + t.take(c).reshape([b, c, 1, 1]);
        }
        if let Some(r) = self.residual {
            y = y + r.clone();
        }
        y
    }
}
