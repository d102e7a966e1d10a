//! Flash attention: softmax(q·kᵀ·scale)·v for every (batch, head) without a score matrix in
//! memory. A cube owns `bq` query rows of one head; it walks the keys in tiles of `bk`, keeps the
//! running row maximum and sum in f32 (online softmax) and the output rows in f32 shared memory,
//! rescaled as the maximum grows. The two products can run on cooperative matrices where the
//! device has an f16×f16→f32 shape (read from the device, never assumed). A second kernel keeps
//! each query row in registers, split over lanes in slices of at most 64 columns: the default on
//! plain lanes, its staged keys and values read as vectors of 4 ([`rows`]; 21.0 → 13.4 ms of an
//! SD 1.5 step under WGSL on an H200, BENCHMARKS.md thirty-fourth session). A third ([`planes`]) gives each plane of a cooperative-matrix device its own query
//! rows and keeps their output in accumulator fragments: the default there for self-attention up
//! to 80 wide (see [`default_plan`]). A fourth ([`wide`]) splits each row's head over the planes
//! of a cube, for heads too wide for one plane's registers (the VAE's 512-wide one). The tiled
//! kernel stays as the measured alternative. q, k and
//! v are read in place from
//! `[b, n, width]` tensors at a column offset, so one fused q/k/v projection feeds it with no split
//! or head relayout, and the output comes back as `[b, n_q, heads · d]`, ready for `to_out`.
//! The twin is [`crate::attention::multi_head_attention`] (burn's attention).

mod choose;
mod elementwise;
mod kernel;
mod knobs;
mod kv_tile;
mod plan;
mod planes;
mod round_trip;
mod rows;
mod wide;

use burn::cubecl;
use burn::cubecl::prelude::*;
use burn::tensor::Tensor;

use super::{Element, buffer_arg, output, resolve, vector_arg};
#[cfg(test)]
use choose::{ours_is_faster, pairs_fit_registers, preferred_with};
use choose::{paired_over_many, preferred};
use kernel::{flash_attention, flash_attention_rows};
pub use knobs::{
    ROWS_KEYS16_WIDEST, ROWS_PAIRS_MIN_QUERIES, set_planes_hold_refs, set_planes_kv_pad,
    set_planes_registers, set_planes_rows, set_planes_rule, set_planes_tile, set_planes_wide,
    set_rows_keys16, set_rows_pairs, set_rows_scalar, set_wide_heads,
};
use knobs::{planes_hold_refs, planes_kv_pad, planes_rows, rows_vector};
pub use plan::{Fragment, Plan, device_fragment, device_fragments};
use plan::{LANES, SHARED_BUDGET};
use planes::flash_attention_planes;
use rows::{RV, flash_attention_rows_vec};
use wide::flash_attention_wide;

/// On a device with cooperative matrices, the widest head ours takes (wider heads go to burn's
/// attention), and the widest the planes kernel takes. Measured on an H100 (BENCHMARKS.md,
/// thirteenth session): at 8×40 over 4096 keys the planes kernel took 1.56 ms, the per-row kernel
/// 3.25 and burn's 4.35; at 8×80 over 1024 keys the planes kernel took 0.59 ms alone against 1.18
/// for the per-row kernel (×5 a step), and on a whole step (fourteenth session, rounds
/// interleaved) 0.5 ms less in every round: 80-wide heads take the planes kernel too. 160-wide
/// heads (16×16 maps) stayed with burn's until the planes kernel's 16-byte loads: with them, the
/// step replayed with the planes kernel up to 160 wide took 31.83 against 32.21 ms on an H100
/// and 37.00 against 37.30 on an H200 (BENCHMARKS.md, twenty-fifth session, three interleaved
/// rounds each). The per-row kernel still stops at 80.
const WIDEST_OURS_WITH_CMMA: usize = 80;
pub const WIDEST_PLANES: usize = 160;
/// Fewest keys for which the planes kernel runs. The per-row kernel looked faster over the 77
/// prompt tokens when each op was timed alone (8×40 over 4096 queries: 0.33 against 0.53 ms),
/// but on whole steps replayed from a captured graph the planes kernel there took 36.27 ms a
/// step against 36.64 (H100, three interleaved rounds, BENCHMARKS.md twenty-second session).
pub const PLANES_MIN_KEYS: usize = 0;
/// Below this many keys (the prompt's 77 tokens) the planes kernel takes its narrowest key
/// tile, which wastes least.
const FEW_KEYS: usize = 256;

/// Elements a wide load of the planes kernel moves (16 bytes of f16).
const WIDE: usize = 8;

/// Elements each load of the planes kernel moves: [`WIDE`] where the plan asks for wide loads
/// and the head width and every operand's column offset and row width are multiples of it (so
/// every row and head starts on 16 bytes, and every buffer holds whole vectors), else one.
fn load_width(wide_loads: bool, d: usize, offsets: [usize; 6]) -> usize {
    match wide_loads && d.is_multiple_of(WIDE) && offsets.iter().all(|x| x.is_multiple_of(WIDE)) {
        true => WIDE,
        false => 1,
    }
}

/// Where one operand's heads sit: `tensor[b, n, column + head · d + i]`.
#[derive(Debug, Clone, Copy)]
pub struct Heads<'a> {
    pub tensor: &'a Tensor<3>,
    pub column: usize,
}

/// Multi-head attention of `heads` heads of width `d` by our kernel, with the default scale
/// `1/√d`. q rows `[b, n_q, ..]`, k and v rows `[b, n_k, ..]`, each read at its column offset (so
/// q, k and v may be column ranges of one fused projection). `None` where it does not run (CPU
/// backend, dtype, a head too wide for workgroup memory, shapes past the grid, or where burn's
/// attention is the faster one: [`default_plan`]); the caller then uses the twin.
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
    let dtype = q.tensor.dtype();
    let (n_q, n_k) = (q.tensor.dims()[1], k.tensor.dims()[1]);
    // The tiling comes from q's own client: no probe tensor per call in the sampling loop.
    launch(
        q,
        k,
        v,
        heads,
        d,
        |client| {
            let plan = preferred(plans_on(client, dtype, d), d, n_k)?;
            Some(paired_over_many(plan, client, dtype, d, n_q))
        },
        0,
    )
}

/// The tiling [`attention`] runs for head width `d` with `n_q` queries over `n_k` keys
/// ([`preferred`], paired where [`paired_over_many`] says). A fixed rule rather than a timing at
/// run time, so that a seed gives the same image on every run of one machine.
pub fn default_plan(
    device: &burn::tensor::Device,
    dtype: burn::tensor::DType,
    d: usize,
    n_q: usize,
    n_k: usize,
) -> Option<Plan> {
    if !super::available(device) || Element::of(dtype).is_none() {
        return None;
    }
    let probe = resolve(Tensor::<1>::zeros([1], (device, dtype)))?;
    let plan = preferred(plans_on(&probe.client, dtype, d), d, n_k)?;
    Some(paired_over_many(plan, &probe.client, dtype, d, n_q))
}

/// Which attention kernel runs for head width `d` with `n_q` queries over `n_k` keys in `dtype`
/// on `device`, in words (the bench's op report).
pub fn describe(
    device: &burn::tensor::Device,
    dtype: burn::tensor::DType,
    d: usize,
    n_q: usize,
    n_k: usize,
) -> String {
    match (
        default_plan(device, dtype, d, n_q, n_k),
        plans(device, dtype, d).is_empty(),
    ) {
        (Some(p), _) => format!("ours, {p}"),
        (None, false) => "burn attention (faster, or ours not measured, at this width)".into(),
        (None, true) => "burn attention".into(),
    }
}

/// Every tiling that fits the device for head width `d` in `dtype`, best first: the
/// cooperative-matrix ones, then the per-lane ones, each in measured order. Empty where our
/// kernel does not run. The bench times each.
pub fn plans(device: &burn::tensor::Device, dtype: burn::tensor::DType, d: usize) -> Vec<Plan> {
    if !super::available(device) || Element::of(dtype).is_none() {
        return Vec::new();
    }
    match resolve(Tensor::<1>::zeros([1], (device, dtype))) {
        Some(probe) => plans_on(&probe.client, dtype, d),
        None => Vec::new(),
    }
}

/// [`plans`] on a device's client.
fn plans_on(client: &cubecl::client::Client, dtype: burn::tensor::DType, d: usize) -> Vec<Plan> {
    let Some(element) = Element::of(dtype) else {
        return Vec::new();
    };
    if d == 0 {
        return Vec::new();
    }
    let fragment = match element {
        Element::F16 if !super::cooperative_matrices_off() => device_fragment(client),
        Element::F16 => None,
        Element::F32 => None,
    };
    let hardware = &client.properties().hardware;
    let budget = SHARED_BUDGET.min(hardware.max_shared_memory_size);
    let mut all = Vec::new();
    // The planes kernel needs one plane width, known when it compiles, and plane shuffles.
    let fixed_plane = (hardware.plane_size_min == hardware.plane_size_max)
        .then_some(hardware.plane_size_max as usize);
    let shuffles = client
        .features()
        .plane
        .contains(cubecl::ir::features::Plane::Ops);
    if let (Some(f), Some(plane), true) = (fragment, fixed_plane, shuffles) {
        let max_lanes = (hardware.max_units_per_cube as usize).min(256);
        all.extend(Plan::on_planes(
            d,
            dtype.size(),
            f,
            plane,
            max_lanes,
            budget,
            per_element_operations(client),
        ));
        all.extend(Plan::on_planes_wide(
            d,
            dtype.size(),
            f,
            plane,
            max_lanes,
            budget,
        ));
    }
    all.extend(Plan::fitting(d, dtype.size(), fragment, budget));
    if fragment.is_some() {
        all.extend(Plan::fitting(d, dtype.size(), None, budget));
    }
    all
}

/// Whether the device's cooperative matrices take per-element operations and conversions
/// between uses (`VK_NV_cooperative_matrix2`): cubecl registers workgroup-scope configurations
/// only where that extension is enabled, and NVIDIA's drivers offer its per-element operations
/// and conversions with it. `LATENT_STUDIO_ATTENTION_REGISTERS=off` hides them.
fn per_element_operations(client: &cubecl::client::Client) -> bool {
    let off = std::env::var("LATENT_STUDIO_ATTENTION_REGISTERS").is_ok_and(|v| v == "off");
    !off && !client.features().matmul.cube_mma.is_empty()
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
    attention_knocked(q, k, v, heads, d, plan, 0)
}

/// [`attention_planned`] with parts of the planes kernel left out (bits of
/// [`planes_knock`]), for timing what each costs: its output is meaningless unless `knock` is 0.
pub fn attention_knocked(
    q: Heads<'_>,
    k: Heads<'_>,
    v: Heads<'_>,
    heads: usize,
    d: usize,
    plan: Plan,
    knock: u32,
) -> Option<Tensor<3>> {
    launch(q, k, v, heads, d, |_| Some(plan), knock)
}

pub use planes::knock as planes_knock;

/// Checks the operands, resolves them, asks `choose` for a tiling on their device and launches.
fn launch(
    q: Heads<'_>,
    k: Heads<'_>,
    v: Heads<'_>,
    heads: usize,
    d: usize,
    choose: impl FnOnce(&cubecl::client::Client) -> Option<Plan>,
    knock: u32,
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
    let plan = choose(&client)?;
    if plan.fragment.is_some() && element != Element::F16 {
        return None;
    }
    // Only the vector kernel holds two rows a lane.
    let vector_rows = plan.per_row && rows_vector(d, plan.parts);
    if plan.lane_rows != 1 && !(vector_rows && plan.bq.is_multiple_of(plan.lane_rows)) {
        return None;
    }
    let q_tiles = n_q.div_ceil(plan.bq);
    if q_tiles > 65_535 || b * heads > 65_535 {
        return None;
    }
    let (out, oc) = output([b, n_q, width], dtype, &device)?;
    let count = CubeCount::Static(q_tiles as u32, (b * heads) as u32, 1);
    // Recorded before the launch, so the kernel profile names the launch by this op.
    crate::profile::record(|| crate::profile::OpShape::Attention {
        b,
        heads,
        n_q,
        n_k,
        d,
    });
    let f = plan.fragment.unwrap_or(Fragment { m: 1, n: 1, k: 1 });
    let rows = plan.plane.map_or(1, |plane| planes_rows(&plan, plane, f));
    // The wide-head kernel: the planes split each row's head.
    let wide_head = plan.plane.filter(|_| plan.parts > 1);
    let lanes = match plan.plane {
        Some(plane) if wide_head.is_some() => plan.parts * plane,
        Some(plane) => plan.bq / (rows * f.m) * plane,
        None if plan.per_row => plan.bq / plan.lane_rows * plan.parts,
        None => LANES,
    };
    let cube = CubeDim::new_1d(lanes as u32);
    let scale = (d as f32).powf(-0.5);
    tracing::trace!(?plan, b, heads, d, n_q, n_k, "flash attention");
    let vec = load_width(
        plan.wide_loads,
        d,
        [q.column, k.column, v.column, q_width, k_width, v_width],
    );
    macro_rules! launch {
        ($t:ty) => {
            if let Some(plane) = wide_head {
                flash_attention_wide::launch::<$t>(
                    &client,
                    count,
                    cube,
                    vec,
                    vector_arg(&qc, vec),
                    vector_arg(&kc, vec),
                    vector_arg(&vc, vec),
                    vector_arg(&oc, vec),
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
                    plan.parts,
                    plane,
                    plan.bq / f.m,
                    plan.bk,
                    f.m,
                    f.n,
                    f.k,
                    vec,
                )
            } else if let Some(plane) = plan.plane {
                flash_attention_planes::launch::<$t>(
                    &client,
                    count,
                    cube,
                    vec,
                    vector_arg(&qc, vec),
                    vector_arg(&kc, vec),
                    vector_arg(&vc, vec),
                    vector_arg(&oc, vec),
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
                    plan.bq / (rows * f.m),
                    plane,
                    plan.bk,
                    f.m,
                    f.n,
                    f.k,
                    plan.prefetch,
                    vec,
                    rows,
                    knock,
                    plan.elementwise,
                    planes_kv_pad(),
                    planes_hold_refs(),
                )
            } else if vector_rows {
                flash_attention_rows_vec::launch::<$t>(
                    &client,
                    count,
                    cube,
                    RV,
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
                    plan.bq / plan.lane_rows,
                    plan.parts,
                    plan.bk,
                    plan.lane_rows,
                )
            } else if plan.per_row {
                flash_attention_rows::launch::<$t>(
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
                    plan.bq,
                    plan.parts,
                    plan.bk,
                )
            } else {
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
            }
        };
    }
    match element {
        Element::F32 => launch!(f32),
        Element::F16 => launch!(half::f16),
    }
    Some(out)
}

#[cfg(test)]
mod tests;
