//! Which tiling a launch takes: the measured rules between the planes, per-row and tiled
//! kernels and burn's attention, and when a lane of the per-row kernel holds two rows.

use burn::cubecl;

use super::knobs::{
    planes_registers, planes_rule, planes_tile, planes_wide, rows_keys16_widest,
    rows_pairs_min_queries, rows_vector, wide_heads,
};
use super::plan::SHARED_BUDGET;
use super::{FEW_KEYS, Plan, WIDEST_OURS_WITH_CMMA};

/// `plan` with two query rows a lane ([`Plan::paired`]) where it is the per-row kernel on
/// vectors over at least [`super::ROWS_PAIRS_MIN_QUERIES`] queries, the device's lanes have the
/// registers ([`pairs_fit_registers`]) and the pair fits its workgroup memory; else `plan`.
pub(super) fn paired_over_many(
    plan: Plan,
    client: &cubecl::client::Client,
    dtype: burn::tensor::DType,
    d: usize,
    n_q: usize,
) -> Plan {
    let hardware = &client.properties().hardware;
    if n_q < rows_pairs_min_queries()
        || !rows_vector(d, plan.parts)
        || !pairs_fit_registers(hardware.plane_size_min as usize)
    {
        return plan;
    }
    let budget = SHARED_BUDGET.min(hardware.max_shared_memory_size);
    plan.paired(dtype.size(), budget).unwrap_or(plan)
}

/// Whether a device whose planes run as narrow as `plane_size_min` lanes gives a lane the
/// ~200 f32 registers two 40-wide rows take. Intel's EUs run planes from 8 lanes (Xe-LP and
/// Xe-HPG: 8–32) or 16 (Xe2: 16–32) and hold 128 f32 a lane in their narrowest mode (Arc's
/// large-register mode aside): there the paired kernel would spill to memory, which a
/// bandwidth-bound iGPU can least afford, so they keep one row a lane (not measured on Intel:
/// no device here). Devices whose planes are never narrower than 32 lanes (NVIDIA, AMD, Apple)
/// have the registers.
pub(super) fn pairs_fit_registers(plane_size_min: usize) -> bool {
    plane_size_min >= 32
}

/// The plan [`super::default_plan`] takes from `all` (cooperative-matrix tilings first where the device
/// has them). With cooperative matrices: the first planes plan for heads up to
/// [`super::WIDEST_PLANES`] over at least [`super::PLANES_MIN_KEYS`] keys, else the first per-row plan up to
/// [`WIDEST_OURS_WITH_CMMA`], else burn's (`None`). On plain lanes: the first plan, or over
/// many keys the first 16-key per-row plan for heads up to [`super::ROWS_KEYS16_WIDEST`] wide.
pub(super) fn preferred(all: Vec<Plan>, d: usize, n_k: usize) -> Option<Plan> {
    preferred_with(all, d, n_k, rows_keys16_widest())
}

/// [`preferred`] with the per-row kernel's 16-key rule ([`super::ROWS_KEYS16_WIDEST`]): on
/// plain lanes, heads up to `keys16_widest` wide over at least [`FEW_KEYS`] keys take 16-key
/// tiles.
pub(super) fn preferred_with(
    all: Vec<Plan>,
    d: usize,
    n_k: usize,
    keys16_widest: usize,
) -> Option<Plan> {
    let cmma = all.iter().any(|p| p.fragment.is_some());
    let (prefetch, widest, min_keys) = planes_rule();
    let wide = planes_wide();
    let registers = planes_registers();
    if cmma && d <= widest && n_k >= min_keys {
        let mut planes = all.iter().filter(|p| {
            p.plane.is_some()
                && p.parts == 1
                && prefetch.is_none_or(|f| p.prefetch == f)
                && wide.is_none_or(|w| p.wide_loads == w)
                && registers.is_none_or(|r| p.elementwise == r)
        });
        // Over a few keys (the 77 prompt tokens) the narrowest key tile wastes least.
        let chosen = match (n_k < FEW_KEYS, planes_tile()) {
            (true, _) => planes.min_by_key(|p| p.bk),
            (false, Some(tile)) => {
                let first = planes.clone().next();
                planes.find(|p| (p.bq, p.bk) == tile).or(first)
            }
            (false, None) => planes.next(),
        };
        if let Some(planes) = chosen {
            return Some(*planes);
        }
    }
    // Past the planes kernel's widths, the wide-head kernel's first tiling.
    if cmma
        && d > widest
        && wide_heads().0
        && let Some(plan) = all.iter().find(|p| p.plane.is_some() && p.parts > 1)
    {
        return Some(*plan);
    }
    if !cmma
        && d <= keys16_widest
        && n_k >= FEW_KEYS
        && let Some(plan) = all.iter().find(|p| p.per_row && p.bk == 16)
    {
        return Some(*plan).filter(|_| ours_is_faster(cmma, d));
    }
    all.into_iter()
        .find(|p| !cmma || p.per_row)
        .filter(|_| ours_is_faster(cmma, d))
}

/// On plain lanes ours beat burn's (unfused) attention at every UNet head width; wider heads
/// (the VAE's 512-wide one, on the per-row kernel) by [`super::set_wide_heads`].
const WIDEST_OURS_PLAIN: usize = 160;

/// The measured rule of [`super::default_plan`], on a device with or without cooperative matrices.
pub(super) fn ours_is_faster(cmma: bool, d: usize) -> bool {
    match cmma {
        true => d <= WIDEST_OURS_WITH_CMMA,
        false => d <= WIDEST_OURS_PLAIN || wide_heads().1,
    }
}
