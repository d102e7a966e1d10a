//! Scaled dot-product attention in query slices small enough for the device.
//!
//! Attention's scores are `[b, heads, n_q, n_k]`: at 512² SD 1.5's first UNet level alone has
//! 2 × 8 × 4096² f32 scores (1 GiB) under CFG. burn's fused kernels do not materialise them, but
//! its unfused path does, and autotune runs that path too. So queries go in slices whose scores fit
//! one buffer of the device ([`DeviceLimits::max_tensor_bytes`]). Each query row's softmax sees
//! all its keys either way, so slicing does not change the math; a model whose scores fit runs in
//! one piece, exactly as before.

use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{DType, Tensor, activation};

pub use crate::kernels::attention::Heads;
use crate::limits::DeviceLimits;

/// Largest attention score buffer (bytes, f32) the VAE's wide-head attention builds at once on any
/// device, a bound on its memory use (an adapter's own limit may be lower, and then applies).
pub const MAX_SCORE_BYTES: usize = 128 << 20;

/// How many query rows fit one slice when each row's scores take `row_bytes`: at least one, and
/// all `n_q` when they fit together.
pub fn query_rows(limit_bytes: u64, row_bytes: u64, n_q: usize) -> usize {
    let rows = limit_bytes / row_bytes.max(1);
    usize::try_from(rows)
        .unwrap_or(usize::MAX)
        .clamp(1, n_q.max(1))
}

/// Multi-head scaled dot-product attention on `[b, n, heads * d]` projections, in query slices
/// whose scores (in the inputs' dtype, as the unfused path keeps them) fit one buffer of the
/// device. A causal slice of rows `s..e` attends to keys `0..e`: burn aligns the causal mask to the
/// last key, so row `i` of the slice sees keys `0..=s + i`, as in the whole.
///
/// # Shapes
/// q `[b, n_q, h*d]`, k and v `[b, n_k, h*d]` -> `[b, n_q, h*d]`
pub fn multi_head_attention(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    heads: usize,
    causal: bool,
) -> Tensor<3> {
    let limit = DeviceLimits::of(&q.device()).max_tensor_bytes();
    multi_head_attention_within(q, k, v, heads, causal, limit)
}

fn multi_head_attention_within(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    heads: usize,
    causal: bool,
    limit_bytes: u64,
) -> Tensor<3> {
    let [b, n_q, inner] = q.dims();
    let n_k = k.dims()[1];
    // A causal mask is a bool per score, which wgpu stores in 4 bytes.
    let element = if causal {
        4
    } else {
        q.dtype().size().max(1) as u64
    };
    let row_bytes = (b * heads * n_k) as u64 * element;
    let rows = query_rows(limit_bytes, row_bytes, n_q);
    if rows >= n_q {
        return attend(q, k, v, heads, causal);
    }
    let slices = (0..n_q)
        .step_by(rows)
        .map(|start| {
            let end = (start + rows).min(n_q);
            let q = q.clone().slice([0..b, start..end, 0..inner]);
            let keys = if causal { end } else { n_k };
            let k = k.clone().slice([0..b, 0..keys, 0..inner]);
            let v = v.clone().slice([0..b, 0..keys, 0..inner]);
            attend(q, k, v, heads, causal)
        })
        .collect();
    Tensor::cat(slices, 1)
}

/// Multi-head attention on heads read in place (column ranges of `[b, n, width]` tensors, such
/// as one fused q/k/v projection): our flash-attention kernel where it runs, else the column
/// ranges sliced out for [`multi_head_attention`] (the CPU backend, a head too wide for the
/// kernel's workgroup memory).
///
/// # Shapes
/// -> `[b, n_q, heads * d]`
pub fn heads_attention(
    q: Heads<'_>,
    k: Heads<'_>,
    v: Heads<'_>,
    heads: usize,
    d: usize,
    upcast: bool,
) -> Tensor<3> {
    // Ours keeps scores and softmax statistics in f32 whatever the dtype: `upcast` holds.
    if let Some(out) = crate::kernels::attention::attention(q, k, v, heads, d) {
        return out;
    }
    let dtype = q.tensor.dtype();
    let wider = scores_dtype(dtype, upcast) != dtype;
    let columns = |h: Heads<'_>| {
        let [b, n, _] = h.tensor.dims();
        let t = h
            .tensor
            .clone()
            .slice([0..b, 0..n, h.column..h.column + heads * d]);
        if wider { t.cast(DType::F32) } else { t }
    };
    let out = multi_head_attention(columns(q), columns(k), columns(v), heads, false);
    if wider { out.cast(dtype) } else { out }
}

/// The dtype burn's attention takes for a model in `dtype`: f32 for an f16 model whose
/// config asks for `upcast_attention` (its f16 scores overflow), else the model's.
fn scores_dtype(dtype: DType, upcast: bool) -> DType {
    match (dtype, upcast) {
        (DType::F16 | DType::BF16, true) => DType::F32,
        _ => dtype,
    }
}

/// One call of burn's attention on `[b, n, heads * d]` projections.
fn attend(q: Tensor<3>, k: Tensor<3>, v: Tensor<3>, heads: usize, causal: bool) -> Tensor<3> {
    let [b, n_q, inner] = q.dims();
    let n_k = k.dims()[1];
    let d = inner / heads;
    crate::profile::record(|| crate::profile::OpShape::Attention {
        b,
        heads,
        n_q,
        n_k,
        d,
    });
    let split = |t: Tensor<3>, n: usize| t.reshape([b, n, heads, d]).swap_dims(1, 2);
    let options = AttentionModuleOptions {
        scale: None,
        softcap: None,
        is_causal: causal,
    };
    let out = attention(
        split(q, n_q),
        split(k, n_k),
        split(v, n_k),
        None,
        None,
        options,
    );
    out.swap_dims(1, 2).reshape([b, n_q, inner])
}

/// Single-head attention as plain matmuls with an f32 softmax, for the VAE's mid block: one head
/// as wide as the layer (512 in SD 1.5) is a shape the fused attention kernels are not built for
/// (on an H200 the first 512² decode did not finish in minutes through them). Queries go in slices
/// whose `[b, rows, n]` f32 scores stay under [`MAX_SCORE_BYTES`] and the device's limit.
///
/// # Shapes
/// q, k, v `[b, n, d]` -> `[b, n, d]`
pub fn wide_head_attention(q: Tensor<3>, k: Tensor<3>, v: Tensor<3>) -> Tensor<3> {
    let limit = DeviceLimits::of(&q.device())
        .max_tensor_bytes()
        .min(MAX_SCORE_BYTES as u64);
    wide_head_attention_within(q, k, v, limit)
}

fn wide_head_attention_within(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    limit_bytes: u64,
) -> Tensor<3> {
    let [b, n, d] = q.dims();
    let n_k = k.dims()[1];
    let rows = query_rows(limit_bytes, (4 * b * n_k) as u64, n);
    let kt = k.swap_dims(1, 2);
    let attend = |q: Tensor<3>| {
        let dtype = q.dtype();
        let scores = q.matmul(kt.clone()).cast(DType::F32) * (d as f64).powf(-0.5);
        activation::softmax(scores, 2).cast(dtype).matmul(v.clone())
    };
    if rows >= n {
        return attend(q);
    }
    let slices = (0..n)
        .step_by(rows)
        .map(|start| attend(q.clone().slice([0..b, start..(start + rows).min(n), 0..d])))
        .collect();
    Tensor::cat(slices, 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, Distribution};

    fn worst(a: Tensor<3>, b: Tensor<3>) -> f32 {
        let (a, b) = (
            a.into_data().try_to_vec::<f32>().unwrap(),
            b.into_data().try_to_vec::<f32>().unwrap(),
        );
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    fn random(n: usize, width: usize) -> Tensor<3> {
        Tensor::<3>::random(
            [2, n, width],
            Distribution::Normal(0.0, 1.0),
            &Device::flex(),
        )
    }

    /// `upcast_attention` widens half-precision models only.
    #[test]
    fn upcast_widens_half_precision_only() {
        assert_eq!(scores_dtype(DType::F16, true), DType::F32);
        assert_eq!(scores_dtype(DType::BF16, true), DType::F32);
        assert_eq!(scores_dtype(DType::F16, false), DType::F16);
        assert_eq!(scores_dtype(DType::F32, true), DType::F32);
    }

    /// SD 2.1's scores pass f16's range in an f16 model (diffusers' `upcast_attention`): with
    /// the upcast, burn's attention (the path where our kernel does not run, as on the CPU)
    /// takes them in f32 and returns the f32 answer in f16. (The CPU backend's own f16
    /// attention keeps its scores in f32 too, so this checks the upcast path's answer and
    /// dtype; which models take it is [`upcast_widens_half_precision_only`]'s.)
    #[test]
    fn upcast_attention_keeps_scores_past_f16() {
        use burn::tensor::TensorData;
        let device = Device::flex();
        let (n, d) = (8, 64);
        // Scores 100·100·64/8 = 80 000 (past f16's 65 504) for the first half of the keys and
        // 79 200 for the second: the softmax takes the first half only, whose values are 0..4.
        let f16 = |data: Vec<f32>| {
            Tensor::<3>::from_data(TensorData::new(data, [1, n, d]), (&device, DType::F32))
                .cast(DType::F16)
        };
        let q = f16(vec![100.0; n * d]);
        let k = f16((0..n)
            .flat_map(|i| [if i < n / 2 { 100.0 } else { 99.0 }; 64])
            .collect());
        let v = f16((0..n).flat_map(|i| [i as f32; 64]).collect());
        let at = |tensor| Heads { tensor, column: 0 };
        let out = heads_attention(at(&q), at(&k), at(&v), 1, d, true);
        assert_eq!(out.dtype(), DType::F16);
        let out = out
            .cast(DType::F32)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        assert!(out.iter().all(|&x| (x - 1.5).abs() < 1e-2), "{out:?}");
    }

    /// Slicing the queries (down to a few rows, with a ragged last slice) gives the one-shot result.
    #[test]
    fn sliced_wide_head_attention_matches_one_shot() {
        let (q, k, v) = (random(37, 8), random(37, 8), random(37, 8));
        let whole = wide_head_attention_within(q.clone(), k.clone(), v.clone(), u64::MAX);
        let sliced = wide_head_attention_within(q, k, v, 4 * 2 * 37 * 5); // 5 rows per slice
        let worst = worst(whole, sliced);
        assert!(worst < 1e-5, "{worst}");
    }

    /// Multi-head attention in slices of 3 query rows (ragged last slice), plain and causal (where
    /// a slice's keys stop at its last row), and cross-attention to fewer keys, match one piece.
    #[test]
    fn sliced_multi_head_attention_matches_one_shot() {
        let heads = 2;
        for (n_q, n_k, causal) in [(17, 17, false), (17, 17, true), (17, 5, false)] {
            let (q, k, v) = (random(n_q, 8), random(n_k, 8), random(n_k, 8));
            let whole = multi_head_attention_within(
                q.clone(),
                k.clone(),
                v.clone(),
                heads,
                causal,
                u64::MAX,
            );
            let three_rows = (3 * 2 * heads * n_k * 4) as u64;
            let sliced = multi_head_attention_within(q, k, v, heads, causal, three_rows);
            let worst = worst(whole, sliced);
            assert!(
                worst < 1e-5,
                "n_q {n_q}, n_k {n_k}, causal {causal}: {worst}"
            );
        }
    }

    #[test]
    fn query_rows_fit_the_limit() {
        assert_eq!(query_rows(1000, 100, 64), 10);
        assert_eq!(query_rows(1000, 100, 4), 4, "never more than the queries");
        assert_eq!(query_rows(10, 100, 64), 1, "at least one row");
        assert_eq!(query_rows(u64::MAX, 0, 64), 64);
    }
}
