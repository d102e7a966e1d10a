//! Launching the cooperative-matrix GEMM ([`super::mma`]): where it runs, its tile, and the
//! epilogue. Linear layers reach it through [`super::linear_mma`], convolutions through
//! [`gemm_into`] with their input unrolled or [`conv_gemm_into`] reading it in place.

use burn::backend::wgpu::CubeTensor;
use burn::cubecl::prelude::*;
use burn::tensor::{DType, Tensor};

use super::super::attention::device_fragment;
use super::super::{output, resolve, vector_arg};
use super::implicit::{ConvGeometryLaunch, ConvInput, ConvTaps};
use super::knobs::gemm_knobs;
use super::layout::{Layout, MmaGemm, Request, plan};
use super::mma::{MAX_LANES, VEC, gemm_mma};
use super::split_sum::{Finish, finish_split};

/// Workgroup memory a cube may use (Vulkan's guaranteed minimum on the GPUs we target).
const SHARED_BYTES: usize = 48 * 1024;

/// Workgroup memory of one cube: `stages` copies of a `bm × bk` and a `bk × bn` staging (each
/// row one vector wider) and each plane's 16 × 16 f32 scratch.
pub fn shared_bytes(
    bm: usize,
    bn: usize,
    bk: usize,
    planes: usize,
    stages: usize,
    b_nk: bool,
) -> usize {
    let b = if b_nk {
        bn * (bk + VEC)
    } else {
        bk * (bn + VEC)
    };
    stages * (bm * (bk + VEC) + b) * 2 + planes * 16 * 16 * 4
}

/// The GEMM on `device` in `dtype`, where it can run: f16 on a device with cooperative matrices
/// (not switched off), one fixed plane width of 32 and a fragment it can use.
pub fn mma_gemm_on(device: &burn::tensor::Device, dtype: DType) -> Option<MmaGemm> {
    if dtype != DType::F16
        || !super::super::available(device)
        || super::super::plain_lanes(device, dtype)
    {
        return None;
    }
    let probe = resolve(Tensor::<1>::zeros([1], (device, dtype)))?;
    let hardware = &probe.client.properties().hardware;
    if hardware.plane_size_min != hardware.plane_size_max {
        return None;
    }
    let gemm = MmaGemm {
        plane: hardware.plane_size_max as usize,
        fragment: device_fragment(&probe.client)?,
    };
    gemm.fits().then_some(gemm)
}

/// Whether a launch whose planes each hold `tm × tn` accumulators fences its sub-steps
/// ([`super::GemmKnobs::fence`]): only from 4 accumulators a plane, since on 64 × 64 tiles (2 a
/// plane) each fence stood between too little work and lost (BENCHMARKS.md, forty-ninth
/// session).
fn fenced(knob: bool, (tm, tn): (usize, usize)) -> bool {
    knob && tm * tn >= 4
}

/// What the GEMM's epilogue adds to the product (and bias) before the one cast.
#[derive(Debug, Clone, Copy)]
pub enum GemmEpilogue<'a> {
    /// Nothing more.
    Plain,
    /// A residual laid out as the output (`[m, n]` at `z · c_batch`).
    Residual(&'a CubeTensor),
    /// `b`'s `n` rows are a GEGLU's values then gates (`[n, k]` only): the output is
    /// `value · gelu(gate)`, `[m, n / 2]` at `z · c_batch`.
    Geglu,
}

/// `out[z] = a[z] · b[z] (+ bias) (+ epilogue)` over `batch` matrices, f16: `a` `[m, k]`
/// row-major at `z · a_batch` elements, `b` `[k, n]` (or `[n, k]` with `b_nk`) at
/// `z · b_batch`, `out` `[m, n]` at `z · c_batch`; `bias` per output row (`bias_per_row`) or
/// column. `None` where the shapes break the kernel's alignment (`k`, `n` and the batch strides
/// multiples of 8; a GEGLU's half a multiple of the fragment width), a buffer is shorter than
/// the shapes say, or the grid is too large.
#[allow(clippy::too_many_arguments)]
pub fn gemm_into(
    gemm: MmaGemm,
    device: &burn::tensor::Device,
    a: &CubeTensor,
    b: &CubeTensor,
    bias: Option<&CubeTensor>,
    out: &CubeTensor,
    mnk: [usize; 3],
    batch: usize,
    strides: [usize; 3],
    b_nk: bool,
    bias_per_row: bool,
    tiles: Option<(usize, usize)>,
    epilogue: GemmEpilogue<'_>,
) -> Option<()> {
    launch_gemm(
        gemm,
        device,
        [a, b, out],
        bias,
        mnk,
        batch,
        strides,
        b_nk,
        bias_per_row,
        tiles,
        epilogue,
        Implicit::None,
        None,
    )
}

/// A convolution as the GEMM over its input read in place ([`super::implicit`]): `weights`
/// `[c_out, c·k·k]` as stored times each of `batch` images of `x` (`[batch, c, h, w]`), plus a
/// per-channel `bias`, into `out` `[batch, c_out, oh, ow]`. `None` where the kernel's alignment
/// refuses the shapes ([`ConvInput::fits`]) or the grid is too large.
#[allow(clippy::too_many_arguments)]
pub fn conv_gemm_into(
    gemm: MmaGemm,
    device: &burn::tensor::Device,
    weights: &CubeTensor,
    x: &CubeTensor,
    bias: Option<&CubeTensor>,
    out: &CubeTensor,
    c_out: usize,
    batch: usize,
    input: ConvInput,
    tiles: Option<(usize, usize)>,
) -> Option<()> {
    if !input.fits(VEC) {
        return None;
    }
    let [oh, ow] = input.output()?;
    let k = input.geometry.k;
    let (map, k_total) = (oh * ow, input.channels * k * k);
    launch_gemm(
        gemm,
        device,
        [weights, x, out],
        bias,
        [c_out, map, k_total],
        batch,
        [0, input.image_len(), c_out * map],
        false,
        true,
        tiles,
        GemmEpilogue::Plain,
        Implicit::B(input),
        None,
    )
}

/// A convolution as the GEMM over its channels-last input read in place as `a`
/// ([`super::channels_last`]): each of `images` images of `x` (`[images, h, w, c]` in memory)
/// times `weights` `[c_out, k·k·c]` (tap-major: `[c_out, ky, kx, c]`), plus a per-channel
/// `bias` and a `residual` laid out as the output, into `out` `[images·oh·ow, c_out]`
/// (channels-last). `None` where a reduction step would straddle two taps
/// ([`ConvInput::fits_rows`]), the alignment refuses the shapes or the grid is too large.
#[allow(clippy::too_many_arguments)]
pub fn conv_rows_gemm_into(
    gemm: MmaGemm,
    device: &burn::tensor::Device,
    x: &CubeTensor,
    weights: &CubeTensor,
    bias: Option<&CubeTensor>,
    residual: Option<&CubeTensor>,
    out: &CubeTensor,
    c_out: usize,
    images: usize,
    input: ConvInput,
    tiles: Option<(usize, usize)>,
) -> Option<()> {
    let [oh, ow] = input.output()?;
    let k = input.geometry.k;
    let pixels = images.checked_mul(oh * ow)?;
    let epilogue = match residual {
        Some(r) => GemmEpilogue::Residual(r),
        None => GemmEpilogue::Plain,
    };
    launch_gemm(
        gemm,
        device,
        [x, weights, out],
        bias,
        [pixels, c_out, input.channels * k * k],
        1,
        [0, 0, 0],
        true,
        false,
        tiles,
        epilogue,
        Implicit::A(input),
        None,
    )
}

/// Rows `[start, start + len)` (in elements) of a contiguous f16 tensor as a tensor of its own
/// over the same buffer, `[len]`; `None` where the offset breaks the 256-byte alignment
/// storage-buffer bindings need or the range runs past the tensor.
fn row_view(t: &CubeTensor, start: usize, len: usize) -> Option<CubeTensor> {
    let bytes = start.checked_mul(2)?;
    if !bytes.is_multiple_of(256) || start.checked_add(len)? > t.meta.num_elements() || len == 0 {
        return None;
    }
    Some(CubeTensor::new_contiguous(
        t.client.clone(),
        t.device.clone(),
        [len].into(),
        t.handle.clone().offset_start(bytes as u64),
        t.dtype,
    ))
}

/// Which operand, if any, is a convolution's input read in place.
#[derive(Debug, Clone, Copy)]
enum Implicit {
    None,
    /// `b`, channels-first ([`super::implicit`]).
    B(ConvInput),
    /// `a`, channels-last ([`super::channels_last`]).
    A(ConvInput),
}

#[allow(clippy::too_many_arguments)]
fn launch_gemm(
    gemm: MmaGemm,
    device: &burn::tensor::Device,
    [a, b, out]: [&CubeTensor; 3],
    bias: Option<&CubeTensor>,
    [m, n, k]: [usize; 3],
    batch: usize,
    [a_batch, b_batch, c_batch]: [usize; 3],
    b_nk: bool,
    bias_per_row: bool,
    tiles: Option<(usize, usize)>,
    epilogue: GemmEpilogue<'_>,
    implicit: Implicit,
    forced_split: Option<(usize, usize)>,
) -> Option<()> {
    let aligned = |v: usize| v.is_multiple_of(VEC);
    let geglu = matches!(epilogue, GemmEpilogue::Geglu);
    if geglu && !(b_nk && !bias_per_row && n.is_multiple_of(2 * gemm.fragment.n)) {
        return None;
    }
    let out_cols = if geglu { n / 2 } else { n };
    let sized = |t: &CubeTensor| aligned(t.meta.num_elements());
    let fits = aligned(k) && aligned(n) && aligned(a_batch) && aligned(b_batch) && aligned(c_batch);
    if !(fits && sized(a) && sized(b) && sized(out)) || m == 0 || n == 0 || k == 0 || batch == 0 {
        return None;
    }
    // Every index the kernel forms stays inside its buffer (unchecked launches rely on it).
    let holds = |t: &CubeTensor, stride: usize, len: usize| {
        (batch - 1)
            .checked_mul(stride)
            .and_then(|s| s.checked_add(len))
            .is_some_and(|end| end <= t.meta.num_elements())
    };
    let bias_len = if bias_per_row { m } else { n };
    // An implicit convolution's operand is the input it reads in place.
    let (a_len, b_len) = match implicit {
        Implicit::None => (m * k, n * k),
        Implicit::B(c) => (m * k, c.image_len()),
        Implicit::A(c) => {
            let map = c.output().map_or(0, |[oh, ow]| oh * ow);
            if map == 0 || !m.is_multiple_of(map) {
                return None;
            }
            ((m / map).checked_mul(c.image_len())?, n * k)
        }
    };
    if !(holds(a, a_batch, a_len)
        && holds(b, b_batch, b_len)
        && holds(out, c_batch, m * out_cols)
        && bias.is_none_or(|t| t.meta.num_elements() >= bias_len)
        && match epilogue {
            GemmEpilogue::Residual(r) => sized(r) && holds(r, c_batch, m * n),
            _ => true,
        })
    {
        return None;
    }
    let knobs = gemm_knobs();
    let [pm, pn] = knobs.planes;
    let lanes = pm * pn * gemm.plane;
    if batch > 65_535 || lanes > MAX_LANES {
        return None;
    }
    // A product of few cubes over a long reduction splits it ([`split_slices`]); the slices'
    // f32 sums are finished by [`finish_split`] (which reads a GEGLU's values and gates as the
    // weight's rows lie, so the GEMM then reads its columns in order). Each matrix's output
    // must lie whole at `z · m · n` for the finishing pass.
    let (lay, (slices, per_slice), tail) = plan(
        gemm,
        knobs,
        Request {
            mnk: [m, n, k],
            batch,
            b_nk,
            geglu,
            a_rows: match implicit {
                Implicit::A(c) => Some(c),
                _ => None,
            },
            split_ok: knobs.split_k && (batch == 1 || c_batch == m * out_cols),
            tiles,
            split: forced_split,
            tail_ok: knobs.tails && b_nk && matches!(implicit, Implicit::None) && !bias_per_row,
        },
    )?;
    if let Some(tail) = tail {
        // The head's rows as a launch of their own, then the rest from row views split.
        let rows = tail.head_tiles * lay.bm;
        let views = (
            row_view(a, rows * k, (m - rows) * k)?,
            row_view(out, rows * out_cols, (m - rows) * out_cols)?,
            match epilogue {
                GemmEpilogue::Residual(r) => Some(row_view(r, rows * n, (m - rows) * n)?),
                _ => None,
            },
        );
        let tile = Some((lay.bm, lay.bn));
        let head = (1, lay.steps);
        launch_gemm(
            gemm,
            device,
            [a, b, out],
            bias,
            [rows, n, k],
            1,
            [0; 3],
            b_nk,
            false,
            tile,
            epilogue,
            implicit,
            Some(head),
        )?;
        let (a_t, out_t, residual_t) = views;
        let epilogue_t = match (&residual_t, epilogue) {
            (Some(r), _) => GemmEpilogue::Residual(r),
            (None, e) => e,
        };
        return launch_gemm(
            gemm,
            device,
            [&a_t, b, &out_t],
            bias,
            [m - rows, n, k],
            1,
            [0; 3],
            b_nk,
            false,
            tile,
            epilogue_t,
            implicit,
            Some(tail.split),
        );
    }
    let Layout {
        tm,
        tn,
        bm,
        bn,
        nx,
        ny,
        bk,
        steps: _,
    } = lay;
    let fence = fenced(knobs.fence, (tm, tn));
    let f = gemm.fragment;
    let split = slices > 1;
    let z = if split { slices * batch } else { batch };
    if z > 65_535 {
        return None;
    }

    let stages = if knobs.stages > 1 && shared_bytes(bm, bn, bk, pm * pn, 2, b_nk) <= SHARED_BYTES {
        2
    } else {
        1
    };
    // Never read (the kernel's comptime flags say so): an allocation, no kernel.
    let placeholder = resolve(Tensor::<1>::empty([VEC], (device, DType::F16)))?;
    let bias_c = bias.unwrap_or(&placeholder);
    let residual = match epilogue {
        GemmEpilogue::Residual(r) => r,
        _ => &placeholder,
    };
    let none = ConvTaps::default();
    let (geometry, taps, a_taps) = match implicit {
        Implicit::B(c) => {
            let (g, t) = c.launch()?;
            (g, t, none)
        }
        Implicit::A(c) => {
            let (g, t) = c.launch()?;
            (g, none, t)
        }
        Implicit::None => (ConvGeometryLaunch::new(0, 0, 0, 0, 0, 0, 0), none, none),
    };
    let (_partial, partial) = if split {
        output([slices * batch * m * n], DType::F32, device)?
    } else {
        output([1], DType::F32, device)?
    };
    macro_rules! launch {
        ($launch:path) => {
            $launch(
                &a.client,
                CubeCount::Static(nx as u32, ny as u32, z as u32),
                CubeDim::new_1d(lanes as u32),
                VEC,
                vector_arg(a, VEC),
                vector_arg(b, VEC),
                super::super::buffer_arg(bias_c),
                vector_arg(residual, VEC),
                vector_arg(out, VEC),
                super::super::buffer_arg(&partial),
                m,
                n,
                k,
                a_batch,
                b_batch,
                c_batch,
                batch,
                per_slice,
                geometry,
                tm,
                tn,
                f.m,
                f.n,
                f.k,
                bk,
                gemm.plane,
                pm,
                pn,
                stages,
                knobs.prefetch,
                b_nk,
                bias.is_some() && !split,
                bias_per_row,
                matches!(epilogue, GemmEpilogue::Residual(_)) && !split,
                geglu && !split,
                knobs.hoist_rows,
                fence,
                split,
                taps,
                a_taps,
            )
        };
    }
    if knobs.unchecked {
        // SAFETY: every global index the kernel forms is guarded by the shapes it is given
        // (rows < m, columns < n, reduction < k), and the buffers hold those shapes (checked
        // above); the loops are bounded by the step count.
        unsafe { launch!(gemm_mma::launch_unchecked::<half::f16>) }
    } else {
        launch!(gemm_mma::launch::<half::f16>)
    }
    if split {
        finish_split(
            &partial,
            bias_c,
            residual,
            out,
            [m, n],
            [slices, batch],
            Finish {
                bias: bias.is_some(),
                bias_per_row,
                residual: matches!(epilogue, GemmEpilogue::Residual(_)),
                geglu,
            },
        )?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::super::layout::tests::gemm;

    /// The fence goes where the knob is on and a plane holds 4 accumulators or more: 128 × 128
    /// and 64 × 128 tiles in 8 planes, not 64 × 64 ones.
    #[test]
    fn fences_only_planes_with_four_accumulators() {
        use super::fenced;
        let g = gemm(32, 16, 16, 16);
        let planes = [2, 4];
        let per_plane = |tile| g.fragments(tile, planes).expect("fits");
        assert!(fenced(true, per_plane((128, 128))), "4 × 2 a plane");
        assert!(fenced(true, per_plane((64, 128))), "2 × 2 a plane");
        assert!(!fenced(true, per_plane((64, 64))), "2 × 1 a plane");
        assert!(!fenced(false, per_plane((128, 128))), "the knob off");
    }

    /// Two stages fit 48 KiB at the 32-deep step, not at the 64-deep one of a 128-square tile.
    #[test]
    fn two_stages_fit_the_short_step() {
        use super::{SHARED_BYTES, shared_bytes};
        assert!(shared_bytes(128, 128, 32, 8, 2, true) <= SHARED_BYTES);
        assert!(shared_bytes(128, 128, 32, 8, 2, false) <= SHARED_BYTES);
        assert!(shared_bytes(128, 128, 64, 4, 2, true) > SHARED_BYTES);
        assert!(shared_bytes(64, 64, 64, 4, 2, true) <= SHARED_BYTES);
    }
}
