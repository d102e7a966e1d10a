//! Flash attention: softmax(q·kᵀ·scale)·v for every (batch, head) without a score matrix in
//! memory. A cube owns `bq` query rows of one head; it walks the keys in tiles of `bk`, keeps the
//! running row maximum and sum in f32 (online softmax) and the output rows in f32 shared memory,
//! rescaled as the maximum grows. The two products run on cooperative matrices where the device
//! has an f16×f16→f32 shape (read from the device, never assumed) and as plain per-lane dot
//! products elsewhere (WGSL: lavapipe, Iris Xe, Meteor Lake). q, k and v are read in place from
//! `[b, n, width]` tensors at a column offset, so one fused q/k/v projection feeds it with no split
//! or head relayout, and the output comes back as `[b, n_q, heads · d]`, ready for `to_out`.
//! The twin is [`crate::attention::multi_head_attention`] (burn's attention).

use burn::cubecl;
use burn::cubecl::ir::features::MmaConfig;
use burn::cubecl::ir::{ElemType, FloatKind};
use burn::cubecl::prelude::*;
use burn::tensor::Tensor;

use super::{Element, buffer_arg, output, resolve};

/// Lanes per cube: a multiple of every plane width (8 to 64).
const LANES: usize = 128;
/// Workgroup memory we allow ourselves: Intel's and most GPUs' floor, whatever the device offers.
const SHARED_BUDGET: usize = 48 * 1024;

/// Query rows × keys per tile, in order of preference.
const TILES: [(usize, usize); 8] = [
    (64, 64),
    (64, 32),
    (32, 32),
    (64, 16),
    (32, 16),
    (16, 16),
    (16, 8),
    (8, 8),
];

/// Where one operand's heads sit: `tensor[b, n, column + head · d + i]`.
#[derive(Debug, Clone, Copy)]
pub struct Heads<'a> {
    pub tensor: &'a Tensor<3>,
    pub column: usize,
}

/// A cooperative-matrix fragment shape `m×n×k` (A is m×k, B k×n).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragment {
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// The tiling of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Query rows per cube.
    pub bq: usize,
    /// Keys per tile.
    pub bk: usize,
    /// The head width padded to the fragment (or to 4 on the SIMT path).
    pub dp: usize,
    pub fragment: Option<Fragment>,
}

impl Plan {
    /// Workgroup bytes: q, k, v and p tiles in the element type, scores and output in f32, and
    /// three f32 per row (max, sum, rescale).
    pub fn shared_bytes(&self, element_bytes: usize) -> usize {
        let (bq, bk, dp) = (self.bq, self.bk, self.dp);
        element_bytes * (bq * dp + 2 * bk * dp + bq * bk) + 4 * (bq * bk + bq * dp + 3 * bq)
    }

    /// The largest tiles that fit `budget` bytes for head width `d`: 64 query rows where they fit
    /// (fewer cubes re-reading k and v), then fewer. `None` when even the smallest tiles do not
    /// fit (the VAE's 512-wide head).
    pub fn choose(
        d: usize,
        element_bytes: usize,
        fragment: Option<Fragment>,
        budget: usize,
    ) -> Option<Self> {
        Self::fitting(d, element_bytes, fragment, budget).into_iter().next()
    }

    /// Every tiling of [`TILES`] that fits, in its order.
    pub fn fitting(
        d: usize,
        element_bytes: usize,
        fragment: Option<Fragment>,
        budget: usize,
    ) -> Vec<Self> {
        if d == 0 {
            return Vec::new();
        }
        let dp = match fragment {
            Some(f) => d.div_ceil(lcm(f.n, f.k)) * lcm(f.n, f.k),
            None => d.div_ceil(4) * 4,
        };
        TILES
            .into_iter()
            .map(|(bq, bk)| Plan {
                bq,
                bk,
                dp,
                fragment,
            })
            .filter(|p| {
                let fits_fragment = fragment.is_none_or(|f| {
                    p.bq % f.m == 0 && p.bk % f.n == 0 && p.bk % f.k == 0
                });
                fits_fragment && p.shared_bytes(element_bytes) <= budget
            })
            .collect()
    }
}

fn lcm(a: usize, b: usize) -> usize {
    let gcd = |mut x: usize, mut y: usize| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    a / gcd(a, b) * b
}

/// The f16×f16→f32 fragment shape the device offers for cooperative matrices, if any: 16×16×16
/// where offered, else the largest. Empty under WGSL and on lavapipe.
pub fn device_fragment(client: &cubecl::client::Client) -> Option<Fragment> {
    let f16 = ElemType::Float(FloatKind::F16);
    let f32 = ElemType::Float(FloatKind::F32);
    let shapes: Vec<Fragment> = client
        .features()
        .matmul
        .cmma
        .iter()
        .filter(|c: &&MmaConfig| c.a_type == f16 && c.b_type == f16 && c.cd_type == f32)
        .map(|c| Fragment {
            m: c.m as usize,
            n: c.n as usize,
            k: c.k as usize,
        })
        .filter(|f| f.m > 0 && f.n > 0 && f.k > 0 && f.m <= 64 && f.n <= 64 && f.k <= 64)
        .collect();
    let square = Fragment {
        m: 16,
        n: 16,
        k: 16,
    };
    if shapes.contains(&square) {
        return Some(square);
    }
    shapes.into_iter().max_by_key(|f| (f.m * f.n * f.k, f.n))
}

/// Which attention kernel runs for head width `d` in `dtype` on `device`, in words (the bench's
/// op report).
pub fn describe(device: &burn::tensor::Device, dtype: burn::tensor::DType, d: usize) -> String {
    match plans(device, dtype, d).first() {
        Some(p) => format!("ours, {p}"),
        None => "burn attention".into(),
    }
}

impl std::fmt::Display for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.fragment {
            Some(m) => write!(f, "cmma {}x{}x{} q{} k{}", m.m, m.n, m.k, self.bq, self.bk),
            None => write!(f, "per-lane q{} k{}", self.bq, self.bk),
        }
    }
}

/// Cube `(t, bh)`: query rows `t·bq ..` of batch `bh / heads`, head `bh % heads`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn flash_attention<F: Float>(
    q: &[F],
    k: &[F],
    v: &[F],
    out: &mut [F],
    q_at: usize,
    q_row: usize,
    q_batch: usize,
    k_at: usize,
    k_row: usize,
    k_batch: usize,
    v_at: usize,
    v_row: usize,
    v_batch: usize,
    n_q: usize,
    n_k: usize,
    heads: usize,
    scale: f32,
    #[comptime] d: usize,
    #[comptime] dp: usize,
    #[comptime] bq: usize,
    #[comptime] bk: usize,
    #[comptime] cmma: bool,
    #[comptime] fm: usize,
    #[comptime] fn_: usize,
    #[comptime] fk: usize,
) {
    let lane = UNIT_POS as usize;
    let bh = CUBE_POS_Y as usize;
    let batch = bh / heads;
    let col0 = (bh % heads) * d;
    let row0 = CUBE_POS_X as usize * bq;

    let mut q_s = Shared::<[F]>::new_slice(bq * dp);
    let mut k_s = Shared::<[F]>::new_slice(bk * dp);
    let mut v_s = Shared::<[F]>::new_slice(bk * dp);
    let mut p_s = Shared::<[F]>::new_slice(bq * bk);
    let mut s_s = Shared::<[f32]>::new_slice(bq * bk);
    let mut o_s = Shared::<[f32]>::new_slice(bq * dp);
    let mut m_s = Shared::<[f32]>::new_slice(bq);
    let mut l_s = Shared::<[f32]>::new_slice(bq);
    let mut a_s = Shared::<[f32]>::new_slice(bq);

    // The query tile, zero past the last row and the head width; the output starts at zero.
    let q_base = q_at + batch * q_batch + col0;
    let mut i = lane;
    while i < bq * dp {
        let r = i / dp;
        let c = i % dp;
        let row = row0 + r;
        let mut value = F::from_int(0);
        if row < n_q && c < d {
            value = q[q_base + row * q_row + c];
        }
        q_s[i] = value;
        o_s[i] = 0.0f32;
        i += LANES;
    }
    let mut r0 = lane;
    while r0 < bq {
        m_s[r0] = -1.0e30f32;
        l_s[r0] = 0.0f32;
        r0 += LANES;
    }
    sync_cube();

    let k_base = k_at + batch * k_batch + col0;
    let v_base = v_at + batch * v_batch + col0;
    let tiles = n_k.div_ceil(bk);
    for t in 0..tiles {
        let key0 = t * bk;
        let mut i = lane;
        while i < bk * dp {
            let j = i / dp;
            let c = i % dp;
            let key = key0 + j;
            let mut kv = F::from_int(0);
            let mut vv = F::from_int(0);
            if key < n_k && c < d {
                kv = k[k_base + key * k_row + c];
                vv = v[v_base + key * v_row + c];
            }
            k_s[i] = kv;
            v_s[i] = vv;
            i += LANES;
        }
        sync_cube();

        // Scores s = q·kᵀ (unscaled) for the tile.
        if cmma {
            let planes = LANES / PLANE_DIM as usize;
            let mut f = (UNIT_POS / PLANE_DIM) as usize;
            while f < (bq / fm) * (bk / fn_) {
                let fr = f / (bk / fn_);
                let fc = f % (bk / fn_);
                let acc = cmma::Matrix::<f32>::from_value(
                    cmma::MatrixIdent::Accumulator,
                    fm,
                    fn_,
                    fk,
                    cmma::MatrixLayout::Undefined,
                    0.0f32,
                );
                #[unroll]
                for kk in 0..dp / fk {
                    let a_at = fr * fm * dp + kk * fk;
                    let b_at = fc * fn_ * dp + kk * fk;
                    let a = cmma::Matrix::<F>::from_slice(
                        cmma::MatrixIdent::A,
                        fm,
                        fn_,
                        fk,
                        cmma::MatrixLayout::RowMajor,
                        &q_s[a_at..bq * dp],
                        dp as u32,
                    );
                    // kᵀ's column j is k's row j: column-major with the row stride.
                    let b = cmma::Matrix::<F>::from_slice(
                        cmma::MatrixIdent::B,
                        fm,
                        fn_,
                        fk,
                        cmma::MatrixLayout::ColMajor,
                        &k_s[b_at..bk * dp],
                        dp as u32,
                    );
                    cmma::execute(&a, &b, &acc, &acc);
                }
                let s_at = fr * fm * bk + fc * fn_;
                cmma::store(
                    &mut s_s[s_at..bq * bk],
                    &acc,
                    bk as u32,
                    cmma::MatrixLayout::RowMajor,
                );
                f += planes;
            }
        } else {
            let mut i = lane;
            while i < bq * bk {
                let r = i / bk;
                let j = i % bk;
                // Lanes of one row start at different columns (bank spread), wrapping around.
                let mut acc = 0.0f32;
                let mut c = j % d;
                for _ in 0..d {
                    acc += f32::cast_from(q_s[r * dp + c]) * f32::cast_from(k_s[j * dp + c]);
                    c += 1;
                    if c == d {
                        c = 0;
                    }
                }
                s_s[i] = acc;
                i += LANES;
            }
        }
        sync_cube();

        // Online softmax: the new row maximum, the tile's probabilities and the rescale of what
        // came before. One lane per row; lane r starts at column r so the lanes of a plane hit
        // different banks (in order, all rows' column j share one bank: a 32-way conflict).
        let mut valid = n_k - key0;
        if valid > bk {
            valid = bk;
        }
        let mut r = lane;
        while r < bq {
            let old = m_s[r];
            let mut max = old;
            for jj in 0..bk {
                let j = (jj + r) % bk;
                let s = s_s[r * bk + j] * scale;
                if j < valid && s > max {
                    max = s;
                }
            }
            let mut sum = 0.0f32;
            for jj in 0..bk {
                let j = (jj + r) % bk;
                let mut p = 0.0f32;
                if j < valid {
                    p = f32::exp(s_s[r * bk + j] * scale - max);
                }
                p_s[r * bk + j] = F::cast_from(p);
                sum += p;
            }
            let alpha = f32::exp(old - max);
            l_s[r] = l_s[r] * alpha + sum;
            m_s[r] = max;
            a_s[r] = alpha;
            r += LANES;
        }
        sync_cube();

        // o = o·alpha + p·v.
        if cmma {
            let mut i = lane;
            while i < bq * dp {
                o_s[i] = o_s[i] * a_s[i / dp];
                i += LANES;
            }
            sync_cube();
            let planes = LANES / PLANE_DIM as usize;
            let mut f = (UNIT_POS / PLANE_DIM) as usize;
            while f < (bq / fm) * (dp / fn_) {
                let fr = f / (dp / fn_);
                let fc = f % (dp / fn_);
                let o_at = fr * fm * dp + fc * fn_;
                let acc = cmma::Matrix::<f32>::from_slice(
                    cmma::MatrixIdent::Accumulator,
                    fm,
                    fn_,
                    fk,
                    cmma::MatrixLayout::RowMajor,
                    &o_s[o_at..bq * dp],
                    dp as u32,
                );
                #[unroll]
                for kk in 0..bk / fk {
                    let a = cmma::Matrix::<F>::from_slice(
                        cmma::MatrixIdent::A,
                        fm,
                        fn_,
                        fk,
                        cmma::MatrixLayout::RowMajor,
                        &p_s[fr * fm * bk + kk * fk..bq * bk],
                        bk as u32,
                    );
                    let b = cmma::Matrix::<F>::from_slice(
                        cmma::MatrixIdent::B,
                        fm,
                        fn_,
                        fk,
                        cmma::MatrixLayout::RowMajor,
                        &v_s[kk * fk * dp + fc * fn_..bk * dp],
                        dp as u32,
                    );
                    cmma::execute(&a, &b, &acc, &acc);
                }
                cmma::store(
                    &mut o_s[o_at..bq * dp],
                    &acc,
                    dp as u32,
                    cmma::MatrixLayout::RowMajor,
                );
                f += planes;
            }
        } else {
            let mut i = lane;
            while i < bq * dp {
                let r = i / dp;
                let c = i % dp;
                let mut acc = o_s[i] * a_s[r];
                for j in 0..bk {
                    acc += f32::cast_from(p_s[r * bk + j]) * f32::cast_from(v_s[j * dp + c]);
                }
                o_s[i] = acc;
                i += LANES;
            }
        }
        sync_cube();
    }

    let width = heads * d;
    let mut i = lane;
    while i < bq * dp {
        let r = i / dp;
        let c = i % dp;
        let row = row0 + r;
        if row < n_q && c < d {
            out[(batch * n_q + row) * width + col0 + c] = F::cast_from(o_s[i] / l_s[r]);
        }
        i += LANES;
    }
}

/// Multi-head attention of `heads` heads of width `d` by our kernel, with the default scale
/// `1/√d`. q rows `[b, n_q, ..]`, k and v rows `[b, n_k, ..]`, each read at its column offset (so
/// q, k and v may be column ranges of one fused projection). `None` where it does not run (CPU
/// backend, dtype, a head too wide for workgroup memory, shapes past the grid); the caller then
/// uses the twin.
///
/// # Shapes
/// -> `[b, n_q, heads * d]`
pub fn attention(
    q: Heads<'_>,
    k: Heads<'_>,
    v: Heads<'_>,
    heads: usize,
    d: usize,
) -> Option<Tensor<3>> {
    let plan = plans(&q.tensor.device(), q.tensor.dtype(), d).into_iter().next()?;
    attention_planned(q, k, v, heads, d, plan)
}

/// Every tiling that fits the device for head width `d` in `dtype`, best first (by rule: the
/// cooperative-matrix ones, larger tiles first, then the per-lane ones). Empty where our kernel
/// does not run. The bench times each.
pub fn plans(device: &burn::tensor::Device, dtype: burn::tensor::DType, d: usize) -> Vec<Plan> {
    let Some(element) = Element::of(dtype) else {
        return Vec::new();
    };
    if !super::available(device) || d == 0 {
        return Vec::new();
    }
    let Some(client) = resolve(Tensor::<1>::zeros([1], (device, dtype))).map(|t| t.client) else {
        return Vec::new();
    };
    let fragment = match element {
        Element::F16 => device_fragment(&client),
        Element::F32 => None,
    };
    let budget = SHARED_BUDGET.min(client.properties().hardware.max_shared_memory_size);
    let mut all = Plan::fitting(d, dtype.size(), fragment, budget);
    if fragment.is_some() {
        all.extend(Plan::fitting(d, dtype.size(), None, budget));
    }
    all
}

/// [`attention`] with a given tiling (one of [`plans`]).
pub fn attention_planned(
    q: Heads<'_>,
    k: Heads<'_>,
    v: Heads<'_>,
    heads: usize,
    d: usize,
    plan: Plan,
) -> Option<Tensor<3>> {
    let device = q.tensor.device();
    if !super::available(&device) {
        return None;
    }
    let dtype = q.tensor.dtype();
    let element = Element::of(dtype)?;
    if k.tensor.dtype() != dtype || v.tensor.dtype() != dtype || heads == 0 {
        return None;
    }
    let [b, n_q, q_width] = q.tensor.dims();
    let [bk_, n_k, k_width] = k.tensor.dims();
    let [bv, n_v, v_width] = v.tensor.dims();
    let width = heads * d;
    let fits = |h: &Heads<'_>, w: usize| h.column + width <= w;
    if bk_ != b || bv != b || n_v != n_k || n_q == 0 || n_k == 0 || b == 0 {
        return None;
    }
    if !fits(&q, q_width) || !fits(&k, k_width) || !fits(&v, v_width) {
        return None;
    }
    let qc = resolve(q.tensor.clone())?;
    let kc = resolve(k.tensor.clone())?;
    let vc = resolve(v.tensor.clone())?;
    let client = qc.client.clone();
    if plan.fragment.is_some() && element != Element::F16 {
        return None;
    }
    let q_tiles = n_q.div_ceil(plan.bq);
    if q_tiles > 65_535 || b * heads > 65_535 {
        return None;
    }
    let (out, oc) = output([b, n_q, width], dtype, &device)?;
    let count = CubeCount::Static(q_tiles as u32, (b * heads) as u32, 1);
    let cube = CubeDim::new_1d(LANES as u32);
    let scale = (d as f32).powf(-0.5);
    let f = plan.fragment.unwrap_or(Fragment { m: 1, n: 1, k: 1 });
    tracing::trace!(?plan, b, heads, d, n_q, n_k, "flash attention");
    macro_rules! launch {
        ($t:ty) => {
            flash_attention::launch::<$t>(
                &client,
                count,
                cube,
                buffer_arg(&qc),
                buffer_arg(&kc),
                buffer_arg(&vc),
                buffer_arg(&oc),
                q.column,
                q_width,
                n_q * q_width,
                k.column,
                k_width,
                n_k * k_width,
                v.column,
                v_width,
                n_k * v_width,
                n_q,
                n_k,
                heads,
                scale,
                d,
                plan.dp,
                plan.bq,
                plan.bk,
                plan.fragment.is_some(),
                f.m,
                f.n,
                f.k,
            )
        };
    }
    match element {
        Element::F32 => launch!(f32),
        Element::F16 => launch!(half::f16),
    }
    crate::profile::record(|| crate::profile::OpShape::Attention {
        b,
        heads,
        n_q,
        n_k,
        d,
    });
    Some(out)
}

#[cfg(test)]
mod tests {
    use burn::tensor::{DType, Tensor};

    use super::super::testing::{read, relative, tensor, values, wgpu};
    use super::{Fragment, Heads, Plan};
    use crate::attention::multi_head_attention;

    /// Tiles fit the budget for SD's head widths, pad to the fragment, and the VAE's 512-wide
    /// head is left to the twin.
    #[test]
    fn plans_fit_workgroup_memory() {
        let square = Some(Fragment {
            m: 16,
            n: 16,
            k: 16,
        });
        for d in [40, 64, 80, 128, 160] {
            let p = Plan::choose(d, 2, square, 48 * 1024).expect("fits");
            assert_eq!(p.dp % 16, 0);
            assert!(p.dp >= d && p.dp < d + 16);
            assert!(p.shared_bytes(2) <= 48 * 1024);
            assert!(p.bq % 16 == 0 && p.bk % 16 == 0);
        }
        let arc = Some(Fragment { m: 8, n: 16, k: 16 });
        let p = Plan::choose(40, 2, arc, 48 * 1024).expect("fits");
        assert_eq!(p.dp, 48);
        assert!(Plan::choose(512, 2, square, 48 * 1024).is_none());
        assert_eq!(Plan::choose(40, 4, None, 48 * 1024).map(|p| p.dp), Some(40));
    }

    fn at(tensor: &Tensor<3>) -> Heads<'_> {
        Heads { tensor, column: 0 }
    }

    fn reference(q: Tensor<3>, k: Tensor<3>, v: Tensor<3>, heads: usize) -> Vec<f32> {
        let f32 = |t: Tensor<3>| t.cast(DType::F32);
        read(multi_head_attention(f32(q), f32(k), f32(v), heads, false))
    }

    /// The per-lane path (what lavapipe runs) against burn's attention: SD's head widths and odd
    /// ones, query and key counts off the tiles (77 prompt tokens, an 8×8 map), batch 2, in f32 and
    /// f16, and q/k/v as column ranges of one fused projection.
    #[test]
    fn flash_attention_matches_burn_attention() {
        let device = wgpu();
        for (b, heads, d, n_q, n_k) in [
            (2, 2, 40, 70, 77),
            (1, 1, 80, 64, 64),
            (2, 1, 160, 17, 33),
            (1, 3, 8, 5, 130),
            (2, 2, 64, 100, 3),
        ] {
            let width = heads * d;
            for dtype in [DType::F32, DType::F16] {
                let tol = if dtype == DType::F32 { 1e-4 } else { 1e-2 };
                let make = |n: usize, offset: f32, cols: usize| {
                    let vals: Vec<f32> = values(b * n * cols, offset)
                        .into_iter()
                        .map(|x| x * 0.5)
                        .collect();
                    tensor(vals, [b, n, cols], &device, dtype)
                };
                let (q, k, v) = (make(n_q, 0.1, width), make(n_k, -0.2, width), make(n_k, 0.3, width));
                let twin = reference(q.clone(), k.clone(), v.clone(), heads);
                let ours = super::attention(at(&q), at(&k), at(&v), heads, d).expect("runs");
                assert_eq!(ours.dtype(), dtype);
                let rel = relative(&read(ours), &twin);
                assert!(rel <= tol, "b{b} h{heads} d{d} q{n_q} k{n_k} {dtype:?}: rel {rel}");

                // Self-attention from one fused projection [q | k | v].
                let qkv = make(n_q, 0.05, 3 * width);
                let part = |i: usize| qkv.clone().slice([0..b, 0..n_q, i * width..(i + 1) * width]);
                let twin = reference(part(0), part(1), part(2), heads);
                let col = |c: usize| Heads {
                    tensor: &qkv,
                    column: c * width,
                };
                let ours = super::attention(col(0), col(1), col(2), heads, d).expect("runs");
                let rel = relative(&read(ours), &twin);
                assert!(rel <= tol, "fused b{b} h{heads} d{d} q{n_q} {dtype:?}: rel {rel}");
            }
        }
    }
}
