//! How one launch is tiled: the cooperative-matrix fragment the device offers and the query and
//! key tile sizes that fit its workgroup memory.

use burn::cubecl;
use burn::cubecl::ir::features::MmaConfig;
use burn::cubecl::ir::{ElemType, FloatKind};

use super::planes::{PROB_PAD, SCORE_PAD};
use super::wide::ROW_PAD;

/// Lanes per cube: a multiple of every plane width (8 to 64).
pub(super) const LANES: usize = 128;
/// Workgroup memory we allow ourselves: Intel's and most GPUs' floor, whatever the device offers.
pub(super) const SHARED_BUDGET: usize = 48 * 1024;

/// Query rows × keys per tile on cooperative matrices, best first. Measured on an H200 (every
/// SD 1.5 shape, BENCHMARKS.md): 32×16 was fastest or within 4 % of it everywhere; larger key
/// tiles lose on the 77-token cross-attention, 64 query rows leave too few cubes at 1024 queries.
const CMMA_TILES: [(usize, usize); 6] =
    [(32, 16), (16, 16), (32, 32), (64, 32), (64, 16), (64, 64)];

/// Planes per cube × keys per tile of the planes kernel ([`super::planes`]), best first as
/// measured on an H100 with the output resident (BENCHMARKS.md, thirteenth session): at 8×40
/// over 4096 keys 64×64 took 1.56 ms, 64×16 1.89, 32×32 2.08, 64×32 2.11, 32×64 3.82; at 8×80
/// (where 64×64 passes 48 KiB) 64×16 took 0.59 ms, 64×32 0.77, 32×32 0.94.
/// The last, two planes over 16 keys, is the one that fits SD's 160-wide heads (not yet measured).
const PLANE_TILES: [(usize, usize); 7] = [
    (4, 64),
    (4, 16),
    (2, 32),
    (4, 32),
    (2, 64),
    (8, 32),
    (2, 16),
];

/// The same with whole tiles' probabilities in registers ([`super::elementwise`]), best first.
/// On an H200 (BENCHMARKS.md, forty-first session; whole steps replayed, three interleaved
/// rounds) two planes over 32 keys took SD 1.5's step from 30.75 ms (the round trip's tiles) to
/// 29.66 and SDXL's from 178.39 to 171.96; 64 query rows over 32 keys lost on SD 1.5 then
/// (30.58) and won on SDXL's 64-wide heads (forty-sixth session: 136.77 against 138.40). With
/// the staged key/value rows padded ([`super::kv_tile::KV_PAD`], forty-eighth session) 64 rows
/// over 32 keys win at every width that fits them: SD 1.5's step replayed 23.80 ms against
/// 25.55 with 32 rows; SDXL's 114.37 against 117.04 (32 rows), 117.25 (64 keys), 117.29 (128
/// rows).
const REGISTER_TILES: [(usize, usize); 7] = [
    (4, 32),
    (2, 32),
    (4, 64),
    (4, 16),
    (2, 64),
    (8, 32),
    (2, 16),
];

/// The wide-head kernel's tilings ([`super::wide`]): `(planes a head splits over, query-row
/// fragments a cube, keys a tile)`, in the order tried first; at 512 wide each keeps a plane's
/// output and query fragments at 8 each.
const WIDE_TILES: [(usize, usize, usize); 3] = [(8, 2, 16), (4, 1, 32), (8, 1, 16)];

/// The planes kernel's compilations, `(wide_loads, prefetch)` ([`Plan::wide_loads`],
/// [`Plan::prefetch`]), best first for each tiling. On SD 1.5 steps replayed on an H200
/// (BENCHMARKS.md, twenty-fifth session, three interleaved rounds): 16-byte loads with the next
/// key/value tile prefetched 32.71 ms, without the prefetch 34.23; single elements without it
/// 33.75 (the kernel until then: with single elements the prefetch's registers cost more than
/// its overlap, 35.40 ms, as in the fourteenth session).
const PLANE_VARIANTS: [(bool, bool); 4] =
    [(true, true), (true, false), (false, false), (false, true)];

/// The same for per-lane products (no cooperative matrices): 16×8 was fastest or within 5 %.
/// Small tiles also suit small iGPUs, whose workgroup memory is shared by fewer lanes.
const LANE_TILES: [(usize, usize); 8] = [
    (16, 8),
    (16, 16),
    (32, 16),
    (8, 8),
    (32, 32),
    (64, 16),
    (64, 32),
    (64, 64),
];

/// The widest slice of a head one lane of the per-row kernel holds: `2·w` f32 in registers,
/// which at 64 (144 with the scores) still fits the register file of an Intel EU thread in SIMD8
/// (128 × 32 bytes) with little spill, and of every discrete GPU. Wider heads split each row
/// over several lanes.
const ROW_MAX_WIDTH: usize = 64;
/// Most lanes of one row.
const ROW_MAX_PARTS: usize = 8;
/// The widest slice of a row a lane holds when it owns two rows ([`Plan::paired`]): 40 (SD
/// 1.x's heads of 40, 80 and 160 split into slices of 40) keeps q, the output and 16 scores of
/// both rows at 192 f32, within what a discrete GPU gives a lane.
const PAIR_MAX_SLICE: usize = 40;
/// Query rows per cube of the per-row kernel; at most 256 lanes a cube. Measured on an H200
/// (WGSL, every SD 1.5 shape, BENCHMARKS.md): 64 rows where a row has one or two lanes, 32 where
/// it has four (128 lanes a cube either way) were fastest or within 10 % of it.
const ROW_TILES: [usize; 2] = [64, 32];
/// Keys per staged tile of the per-row kernel (also the scores each lane keeps in registers),
/// best first: with scalar staging 8 was 7–30 % faster than 16 on the 8×40 and 77-key shapes and
/// 12 % slower on 8×80 over 1024 keys; 8 also lets the VAE's 512-wide head fit. With the vector
/// kernel, heads up to 80 wide over many keys take 16 (`knobs::ROWS_KEYS16_WIDEST`).
const ROW_KEYS: [usize; 2] = [8, 16];

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
    /// Query rows held in registers, q and the output, by `parts` lanes each (plain lanes):
    /// the per-row kernels, `bq / lane_rows · parts` lanes per cube.
    pub per_row: bool,
    /// Lanes per query row of the per-row kernel (1 for heads up to 64 wide); with `plane`, the
    /// planes each query row's head splits over (more than 1: the wide-head kernel,
    /// [`super::wide`]).
    pub parts: usize,
    /// Query rows each lane group of the per-row kernel owns (1, or 2: [`Plan::paired`]);
    /// `bq / lane_rows · parts` lanes a cube.
    pub lane_rows: usize,
    /// The planes kernel ([`super::planes`]) for planes of this many lanes, each owning
    /// `fragment.m` query rows (`bq / m` planes a cube).
    pub plane: Option<usize>,
    /// The planes kernel loads the next key/value tile into registers while it multiplies this
    /// one (planes plans only).
    pub prefetch: bool,
    /// The planes kernel moves q, k, v and its output 8 elements a load where the head width
    /// and the operands' offsets allow (else one).
    pub wide_loads: bool,
    /// The planes kernel takes the probabilities of whole tiles in registers
    /// ([`super::elementwise`]: NVIDIA's per-element operations on cooperative matrices).
    pub elementwise: bool,
}

impl Plan {
    /// Workgroup bytes: q, k, v and p tiles in the element type, scores and output in f32,
    /// two f32 per row (max, sum) and two per lane (partial maxima and sums); per row, only the k and v tiles in f32.
    pub fn shared_bytes(&self, element_bytes: usize) -> usize {
        let (bq, bk, dp) = (self.bq, self.bk, self.dp);
        if self.plane.is_some() && self.parts > 1 {
            return element_bytes * (bk * (dp + ROW_PAD) + bq * (bk + PROB_PAD))
                + 4 * (self.parts * bq * (bk + SCORE_PAD) + 2 * bq);
        }
        if self.plane.is_some() {
            let kv_row = dp + super::knobs::planes_kv_pad();
            return element_bytes * (bq * dp + 2 * bk * kv_row + bq * (bk + PROB_PAD))
                + 4 * bq * (bk.max(dp) + SCORE_PAD);
        }
        if self.per_row {
            let partial = if self.parts > 1 {
                bk * bq * self.parts
            } else {
                0
            };
            return 4 * (2 * bk * dp + partial);
        }
        element_bytes * (bq * dp + 2 * bk * dp + bq * bk)
            + 4 * (bq * bk + bq * dp + 2 * bq + 2 * LANES)
    }

    /// The per-row plans for head width `d`: each row split over the fewest lanes that divide
    /// the head into slices of at most [`ROW_MAX_WIDTH`].
    fn per_row(d: usize) -> Vec<Self> {
        let Some(parts) =
            (1..=ROW_MAX_PARTS).find(|p| d.is_multiple_of(*p) && d / p <= ROW_MAX_WIDTH && d > 0)
        else {
            return Vec::new();
        };
        // The row count that makes 128 lanes comes first.
        let mut tiles = ROW_TILES;
        tiles.sort_by_key(|&rows| (rows * parts).abs_diff(128));
        ROW_KEYS
            .iter()
            .flat_map(|&bk| tiles.map(move |rows| (rows, bk)))
            .filter(|&(rows, _)| rows * parts <= 256)
            .map(|(rows, bk)| Plan {
                bq: rows,
                bk,
                dp: d,
                fragment: None,
                per_row: true,
                parts,
                lane_rows: 1,
                plane: None,
                prefetch: false,
                wide_loads: false,
                elementwise: false,
            })
            .collect()
    }

    /// This per-row plan with two query rows a lane group (twice the rows a cube, the same
    /// lanes): each staged key and value vector a lane reads serves two rows, halving the
    /// workgroup-memory loads a product. Only where a lane's slice is at most
    /// [`PAIR_MAX_SLICE`] wide (its registers: `2 · 2 · slice` f32 for q and the output, plus
    /// two rows of scores) and the tiles fit `budget` bytes.
    pub fn paired(&self, element_bytes: usize, budget: usize) -> Option<Self> {
        let slice = self.dp / self.parts.max(1);
        let paired = Plan {
            bq: 2 * self.bq,
            lane_rows: 2,
            ..*self
        };
        (self.per_row
            && self.lane_rows == 1
            && slice <= PAIR_MAX_SLICE
            && paired.shared_bytes(element_bytes) <= budget)
            .then_some(paired)
    }

    /// The planes kernel's tilings for head width `d` on planes of `plane` lanes with cooperative
    /// matrices of shape `fragment`, best first; empty where the shapes do not divide (each row
    /// takes `plane / m` lanes, a power of two dividing the padded width and the key tile).
    pub fn on_planes(
        d: usize,
        element_bytes: usize,
        fragment: Fragment,
        plane: usize,
        max_lanes: usize,
        budget: usize,
        elementwise: bool,
    ) -> Vec<Self> {
        let f = fragment;
        if d == 0 || plane == 0 || f.m == 0 || !plane.is_multiple_of(f.m) {
            return Vec::new();
        }
        let lpr = plane / f.m;
        let dp = d.div_ceil(lcm(f.n, f.k)) * lcm(f.n, f.k);
        if !lpr.is_power_of_two() || !dp.is_multiple_of(lpr) {
            return Vec::new();
        }
        // Tiles in registers (first, where offered) need the scores' fragment to be the next
        // product's left operand and a row's lanes to divide it.
        let registers = elementwise && f.n == f.k && f.n.is_multiple_of(lpr);
        let in_registers = REGISTER_TILES
            .iter()
            .filter(|_| registers)
            .map(|&t| (t, true));
        let round_trip = PLANE_TILES.iter().map(|&t| (t, false));
        in_registers
            .chain(round_trip)
            .flat_map(|((planes, bk), elementwise)| {
                PLANE_VARIANTS.map(|(wide_loads, prefetch)| Plan {
                    bq: planes * f.m,
                    bk,
                    dp,
                    fragment: Some(f),
                    per_row: false,
                    parts: 1,
                    lane_rows: 1,
                    plane: Some(plane),
                    prefetch,
                    wide_loads,
                    elementwise,
                })
            })
            .filter(|p| {
                p.bk % f.n == 0
                    && p.bk % f.k == 0
                    && p.bk % lpr == 0
                    && (p.bq / f.m) * plane <= max_lanes
                    && p.shared_bytes(element_bytes) <= budget
            })
            .collect()
    }

    /// The wide-head kernel's tilings ([`super::wide`]) for heads wider than the planes kernel
    /// takes ([`super::WIDEST_PLANES`]), best first: each plane's slice a whole number of
    /// fragments and vectors, a row's softmax lanes within one plane and dividing the key tile,
    /// the query block staged through the key tile, the cube within `max_lanes` and `budget`.
    pub fn on_planes_wide(
        d: usize,
        element_bytes: usize,
        fragment: Fragment,
        plane: usize,
        max_lanes: usize,
        budget: usize,
    ) -> Vec<Self> {
        let f = fragment;
        if d <= super::WIDEST_PLANES || plane == 0 || f.m == 0 || f.n == 0 || f.k == 0 {
            return Vec::new();
        }
        WIDE_TILES
            .iter()
            .filter_map(|&(planes, rows, bk)| {
                let unit = planes * lcm(lcm(f.n, f.k), 8);
                let dp = d.div_ceil(unit) * unit;
                let (bq, lanes) = (rows * f.m, planes * plane);
                let lpr = lanes / bq.max(1);
                let fits = lanes <= max_lanes
                    && lanes.is_multiple_of(bq)
                    && lpr.is_power_of_two()
                    && lpr <= plane
                    && bk.is_multiple_of(lpr)
                    && bk.is_multiple_of(f.n)
                    && bk.is_multiple_of(f.k)
                    && plane.is_multiple_of(f.m)
                    && bq * (dp / planes + ROW_PAD) <= bk * (dp + ROW_PAD);
                let plan = Plan {
                    bq,
                    bk,
                    dp,
                    fragment: Some(f),
                    per_row: false,
                    parts: planes,
                    lane_rows: 1,
                    plane: Some(plane),
                    prefetch: false,
                    wide_loads: true,
                    elementwise: false,
                };
                (fits && plan.shared_bytes(element_bytes) <= budget).then_some(plan)
            })
            .collect()
    }

    /// The preferred tiles that fit `budget` bytes for head width `d`. `None` when even the
    /// smallest tiles do not fit (the VAE's 512-wide head).
    pub fn choose(
        d: usize,
        element_bytes: usize,
        fragment: Option<Fragment>,
        budget: usize,
    ) -> Option<Self> {
        Self::fitting(d, element_bytes, fragment, budget)
            .into_iter()
            .next()
    }

    /// Every tiling that fits, best first ([`CMMA_TILES`] or [`LANE_TILES`]).
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
        let tiles: &[(usize, usize)] = match fragment {
            Some(_) => &CMMA_TILES,
            None => &LANE_TILES,
        };
        let tiles = tiles.iter().copied().map(|(bq, bk)| Plan {
            bq,
            bk,
            dp,
            fragment,
            per_row: false,
            parts: 1,
            lane_rows: 1,
            plane: None,
            prefetch: false,
            wide_loads: false,
            elementwise: false,
        });
        // On plain lanes the per-row kernel comes first.
        let per_row = match fragment {
            None => Self::per_row(d),
            Some(_) => Vec::new(),
        };
        per_row
            .into_iter()
            .chain(tiles)
            .filter(|p| {
                let fits_fragment =
                    fragment.is_none_or(|f| p.bq % f.m == 0 && p.bk % f.n == 0 && p.bk % f.k == 0);
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

/// Every f16×f16→f32 fragment shape the device offers for cooperative matrices, as reported
/// (at most 64 a side). Empty under WGSL and on lavapipe.
pub fn device_fragments(client: &cubecl::client::Client) -> Vec<Fragment> {
    let f16 = ElemType::Float(FloatKind::F16);
    let f32 = ElemType::Float(FloatKind::F32);
    client
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
        .collect()
}

/// The f16×f16→f32 fragment shape the kernels take ([`device_fragments`]): 16×16×16 where
/// offered, else the largest.
pub fn device_fragment(client: &cubecl::client::Client) -> Option<Fragment> {
    let shapes = device_fragments(client);
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

impl std::fmt::Display for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.fragment {
            Some(m) if self.plane.is_some() && self.parts > 1 => write!(
                f,
                "cmma wide-head planes x{} {}x{}x{} q{} k{}",
                self.parts, m.m, m.n, m.k, self.bq, self.bk
            ),
            Some(m) if self.plane.is_some() => {
                let prefetch = if self.prefetch { " prefetch" } else { "" };
                let wide = if self.wide_loads { " wide" } else { "" };
                let registers = if self.elementwise { " registers" } else { "" };
                write!(
                    f,
                    "cmma planes{wide}{prefetch}{registers} {}x{}x{} q{} k{}",
                    m.m, m.n, m.k, self.bq, self.bk
                )
            }
            Some(m) => write!(f, "cmma {}x{}x{} q{} k{}", m.m, m.n, m.k, self.bq, self.bk),
            None if self.per_row => {
                let pairs = if self.lane_rows > 1 { " pairs" } else { "" };
                let parts = match self.parts {
                    1 => String::new(),
                    n => format!(" x{n}"),
                };
                write!(f, "per-row{pairs} q{} k{}{parts}", self.bq, self.bk)
            }
            None => write!(f, "per-lane q{} k{}", self.bq, self.bk),
        }
    }
}

#[cfg(test)]
mod tests;
