//! The bench's switches for the planes kernel (one process, one autotune, rules A/B'd on whole
//! steps). The studio and the CLI never set them: each reads as the measured default.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

use super::plan::{Fragment, Plan};
use super::{PLANES_MIN_KEYS, WIDEST_PLANES};

/// The bench's A/B switch for the planes kernel (one process, one autotune): whether the default
/// plan must prefetch (0: whichever comes first, 1: no, 2: yes), the widest head it takes and the
/// fewest keys it runs over.
static PLANES_PREFETCH: AtomicU8 = AtomicU8::new(0);
static PLANES_WIDEST: AtomicUsize = AtomicUsize::new(WIDEST_PLANES);
static PLANES_FEWEST_KEYS: AtomicUsize = AtomicUsize::new(PLANES_MIN_KEYS);

/// Sets the planes rule [`super::default_plan`] follows: `prefetch` forces the planes plan with or
/// without the next tile's prefetch (`None`: the measured order), `widest` the widest head the
/// planes kernel takes, `min_keys` the fewest keys it runs over. For measuring only; the studio
/// and the CLI never call it.
pub fn set_planes_rule(prefetch: Option<bool>, widest: usize, min_keys: usize) {
    let code = match prefetch {
        None => 0,
        Some(false) => 1,
        Some(true) => 2,
    };
    PLANES_PREFETCH.store(code, Ordering::Relaxed);
    PLANES_WIDEST.store(widest, Ordering::Relaxed);
    PLANES_FEWEST_KEYS.store(min_keys, Ordering::Relaxed);
}

/// Whether the planes kernel pads its staged key and value rows ([`super::kv_tile::KV_PAD`]).
static PLANES_KV_PAD: AtomicBool = AtomicBool::new(true);

/// Makes the planes kernel stage its key and value rows padded (the default) or packed, for
/// measuring only.
pub fn set_planes_kv_pad(pad: bool) {
    PLANES_KV_PAD.store(pad, Ordering::Relaxed);
}

/// Elements of padding a staged key or value row of the planes kernel takes.
pub(super) fn planes_kv_pad() -> usize {
    match PLANES_KV_PAD.load(Ordering::Relaxed) {
        true => super::kv_tile::KV_PAD,
        false => 0,
    }
}

/// Whether the planes kernel's tiles in registers keep their rows' references in registers
/// between round trips instead of loading them before every tile. On by default: on an H200
/// (BENCHMARKS.md, forty-eighth session, three interleaved rounds, identical outputs) SD 1.5's
/// step replayed took 23.92 ms against 24.05, SDXL's 115.32 against 115.76.
static PLANES_HOLD_REFS: AtomicBool = AtomicBool::new(true);

/// Makes the planes kernel hold its rows' references in registers between round trips (`true`,
/// the default) or load them before every tile in registers (`false`). For measuring only.
pub fn set_planes_hold_refs(hold: bool) {
    PLANES_HOLD_REFS.store(hold, Ordering::Relaxed);
}

pub(super) fn planes_hold_refs() -> bool {
    PLANES_HOLD_REFS.load(Ordering::Relaxed)
}

/// The bench's switch between the planes kernel's loads (0: the preferred, 1: single elements,
/// 2: 16 bytes).
static PLANES_WIDE: AtomicU8 = AtomicU8::new(0);

/// Makes [`super::default_plan`] take the planes kernel with 16-byte loads or single elements
/// (`None`: [`Plan`]'s order). For measuring only.
pub fn set_planes_wide(wide: Option<bool>) {
    PLANES_WIDE.store(wide.map_or(0, |w| 1 + u8::from(w)), Ordering::Relaxed);
}

/// The bench's forced tiling of the planes kernel over many keys, `bq · 4096 + bk` (0: none).
static PLANES_TILE: AtomicUsize = AtomicUsize::new(0);

/// Makes [`super::default_plan`] take the planes kernel's `(query rows, keys)` tiling over many
/// keys where the head width has it (`None`: [`Plan`]'s order). For measuring only.
pub fn set_planes_tile(tile: Option<(usize, usize)>) {
    let code = tile.map_or(0, |(q, k)| q * 4096 + k.min(4095));
    PLANES_TILE.store(code, Ordering::Relaxed);
}

pub(super) fn planes_tile() -> Option<(usize, usize)> {
    match PLANES_TILE.load(Ordering::Relaxed) {
        0 => None,
        c => Some((c / 4096, c % 4096)),
    }
}

/// The bench's switch for tiles in registers (0: [`Plan`]'s order, 1: never, 2: where offered).
static PLANES_REGISTERS: AtomicU8 = AtomicU8::new(0);

/// Makes [`super::default_plan`] take the planes kernel with whole tiles' probabilities in
/// registers ([`super::elementwise`]) or without (`None`: [`Plan`]'s order). For measuring only.
pub fn set_planes_registers(registers: Option<bool>) {
    PLANES_REGISTERS.store(registers.map_or(0, |r| 1 + u8::from(r)), Ordering::Relaxed);
}

pub(super) fn planes_registers() -> Option<bool> {
    match PLANES_REGISTERS.load(Ordering::Relaxed) {
        0 => None,
        c => Some(c == 2),
    }
}

pub(super) fn planes_wide() -> Option<bool> {
    match PLANES_WIDE.load(Ordering::Relaxed) {
        0 => None,
        c => Some(c == 2),
    }
}

pub(super) fn planes_rule() -> (Option<bool>, usize, usize) {
    let prefetch = match PLANES_PREFETCH.load(Ordering::Relaxed) {
        1 => Some(false),
        2 => Some(true),
        _ => None,
    };
    (
        prefetch,
        PLANES_WIDEST.load(Ordering::Relaxed),
        PLANES_FEWEST_KEYS.load(Ordering::Relaxed),
    )
}

/// Query-row fragments each plane of the planes kernel owns (1: the measured default); the
/// bench's switch, 0 for the default.
static PLANES_ROWS: AtomicUsize = AtomicUsize::new(0);

/// Makes the planes kernel give each plane `rows` fragments of query rows (`None`: one), where
/// the tiling and plane width allow. For measuring only.
pub fn set_planes_rows(rows: Option<usize>) {
    PLANES_ROWS.store(rows.unwrap_or(0), Ordering::Relaxed);
}

/// The row fragments a plane of `plane` lanes owns under `plan` (1 unless the bench asked for
/// more and `plan` divides into them).
pub(super) fn planes_rows(plan: &Plan, plane: usize, f: Fragment) -> usize {
    let rows = PLANES_ROWS.load(Ordering::Relaxed).max(1);
    let fits = plan.bq.is_multiple_of(rows * f.m) && plane.is_multiple_of(rows * f.m);
    if fits { rows } else { 1 }
}

/// The bench's switch for the per-row kernel's staging (0: the default, vectors of 4; 1: single
/// f32 values, the kernel before the thirty-fourth session).
static ROWS_SCALAR: AtomicU8 = AtomicU8::new(0);

/// Makes the per-row kernel read its staged keys and values one f32 at a time (`true`) or as
/// vectors of 4 (`false`, the default; [`super::rows`]). For measuring only.
pub fn set_rows_scalar(scalar: bool) {
    ROWS_SCALAR.store(u8::from(scalar), Ordering::Relaxed);
}

/// Whether the per-row kernel runs on vectors for a head `d` wide split over `parts` lanes (a
/// lane's columns a multiple of 4, and the bench has not asked for single values).
pub(super) fn rows_vector(d: usize, parts: usize) -> bool {
    ROWS_SCALAR.load(Ordering::Relaxed) == 0
        && parts > 0
        && d.is_multiple_of(parts)
        && (d / parts).is_multiple_of(super::rows::RV)
}

/// The per-row kernel's key tile: heads up to this width over at least [`super::FEW_KEYS`] keys
/// take 16-key tiles, the rest the plans' order (8 keys first). On an H200 (BENCHMARKS.md,
/// thirty-fifth session, the SD 1.5 step replayed, five interleaved rounds) 16-key tiles up to 80
/// wide took the f16 step from 85.57 to 84.85 ms under SPIR-V without cooperative matrices and
/// from 91.76 to 91.34 under WGSL; alone, 160-wide heads ran faster over 8 keys (thirty-fourth).
pub const ROWS_KEYS16_WIDEST: usize = 80;

static ROWS_KEYS16: AtomicUsize = AtomicUsize::new(ROWS_KEYS16_WIDEST);

/// Makes the per-row kernel take 16-key tiles for heads up to `widest` wide over many keys
/// (`0`: the plans' order everywhere; default [`ROWS_KEYS16_WIDEST`]). For measuring only.
pub fn set_rows_keys16(widest: usize) {
    ROWS_KEYS16.store(widest, Ordering::Relaxed);
}

pub(super) fn rows_keys16_widest() -> usize {
    ROWS_KEYS16.load(Ordering::Relaxed)
}

/// The fewest queries for which the per-row kernel gives each lane two rows
/// ([`super::Plan::paired`]; `usize::MAX`: never). On an H200 (BENCHMARKS.md, thirty-sixth
/// session, the SD 1.5 step replayed, five interleaved rounds) pairs from 4096 queries (the 64²
/// level's 40-wide heads) took the f16 step from 79.13 to 77.08 ms under SPIR-V without
/// cooperative matrices, from 87.73 to 85.29 under WGSL and the f32 step from 75.94 to 72.81;
/// from 1024 or 256 queries (the 80- and 160-wide heads, split over 2 and 4 lanes: half the
/// lanes a launch) they gave back 0.7–0.9 ms of that.
pub const ROWS_PAIRS_MIN_QUERIES: usize = 4096;

static ROWS_PAIRS: AtomicUsize = AtomicUsize::new(ROWS_PAIRS_MIN_QUERIES);

/// Makes the per-row kernel give each lane two query rows where there are at least
/// `min_queries` (`usize::MAX`: never). For measuring only.
pub fn set_rows_pairs(min_queries: usize) {
    ROWS_PAIRS.store(min_queries, Ordering::Relaxed);
}

pub(super) fn rows_pairs_min_queries() -> usize {
    ROWS_PAIRS.load(Ordering::Relaxed)
}

/// Whether heads wider than the planes kernel takes (the VAE's 512-wide one) run ours: bit 0
/// on cooperative matrices (the wide-head kernel, [`super::wide`]), bit 1 on plain lanes (the
/// per-row kernel, each row over 8 lanes). Else the VAE's sliced matmuls. Plain lanes off: on an
/// H200 (BENCHMARKS.md, forty-seventh session) the per-row kernel took 18.9 ms for the 512²
/// decode's head in f32 against 3.2 for the sliced matmuls, and the f32 decode 96.1 ms against
/// 80.6.
static WIDE_HEADS: AtomicU8 = AtomicU8::new(1);

/// Sets which devices run ours for heads wider than the planes kernel takes: with cooperative
/// matrices (`cmma`) and on plain lanes (`plain`). For measuring only.
pub fn set_wide_heads(cmma: bool, plain: bool) {
    WIDE_HEADS.store(u8::from(cmma) | (u8::from(plain) << 1), Ordering::Relaxed);
}

/// [`set_wide_heads`]' switches, `(cmma, plain)`.
pub(super) fn wide_heads() -> (bool, bool) {
    let code = WIDE_HEADS.load(Ordering::Relaxed);
    (code & 1 != 0, code & 2 != 0)
}
