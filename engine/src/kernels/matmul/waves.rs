//! A GEMM launch's tile and reduction split chosen by the waves its cubes run in
//! ([`super::GemmKnobs::waves`]).
//!
//! The fill rule ([`super::MmaGemm::tiles_for`], [`super::split_slices`]) asks for at least two
//! cubes an SM and stops there. But NVIDIA's compiler gives our 128 × 128 and 64 × 128 tiles
//! 148–255 registers a lane (BENCHMARKS.md, forty-ninth session): one 256-lane cube an SM, so a
//! launch runs in whole waves of one cube per SM and a grid of 320 cubes on 132 SMs costs three
//! full waves for 2.4 waves of work (SDXL's 5120 → 1280 over 2048 rows: 234 µs, 115 TFLOP/s,
//! against 180 TFLOP/s for the GEGLU's ten waves). This model prices each tile and split as
//! `waves × (steps a slice × a step's time + a cube's fixed time)` plus the split's f32 partial
//! sums through memory, with a step's time read off that session's kernel profile (H200), and
//! the launch takes the cheapest where it beats the fill rule's plan by [`MARGIN`].
//!
//! The figures are one GPU's (Vulkan does not report an SM count; 132 is an H100's and an
//! H200's), and only GPUs with 32-lane planes run this GEMM at all (`MmaGemm::fits`).

/// SMs the model assumes: an H100's or H200's.
pub(super) const UNITS: usize = 132;

/// Microseconds a cube spends outside its reduction steps (rows hoisted, epilogue, launch).
const FIXED_US: f64 = 4.0;

/// A split's fixed cost: the finishing pass's launch.
const SPLIT_US: f64 = 6.0;

/// Bytes a microsecond the split's partial sums move at (an H200's ~4.8 TB/s, less overheads).
const BYTES_PER_US: f64 = 3.5e6;

/// How much cheaper the model must find a plan before it replaces the fill rule's: its figures
/// are within ~20 % of the profile it was read from, so close calls keep the measured rule.
pub(super) const MARGIN: f64 = 0.9;

/// One way to tile a launch: its tile, how many of its cubes an SM holds, its cubes before any
/// split, and its reduction step and step count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tiling {
    pub tile: (usize, usize),
    pub resident: usize,
    pub cubes: usize,
    pub bk: usize,
    pub steps: usize,
}

/// A tiling with its reduction split `(slices, steps a slice)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Plan {
    pub tiling: Tiling,
    pub split: (usize, usize),
}

/// Cubes of a tile an SM holds: one where each plane keeps 4 accumulators or more (the
/// compiler's 148–255 registers a lane), two on 64 × 64 tiles (72–123).
pub(super) fn resident((tm, tn): (usize, usize)) -> usize {
    if tm * tn >= 4 { 1 } else { 2 }
}

/// Microseconds one 64-deep step takes a wave of cubes of `tile` (all SMs busy), from the
/// forty-ninth session's SDXL and SD 1.5 profiles: 128 × 128 1.42, 64 × 128 0.93, a pair of
/// 64 × 64 cubes an SM 0.94.
fn step_us((bm, bn): (usize, usize)) -> f64 {
    match bm * bn {
        a if a >= 128 * 128 => 1.42,
        a if a >= 64 * 128 => 0.93,
        _ => 0.94,
    }
}

/// The model's microseconds for `plan` over `outputs` f32 partial sums a slice (`m · n ·
/// batch`).
pub(super) fn cost(plan: &Plan, outputs: usize) -> f64 {
    let t = plan.tiling;
    let (slices, per) = plan.split;
    let waves = (t.cubes * slices).div_ceil(UNITS * t.resident.max(1));
    let step = step_us(t.tile) * t.bk as f64 / 64.0;
    let mut us = waves as f64 * (per as f64 * step + FIXED_US);
    if slices > 1 {
        // Each slice's partials written, read back, and the output written once.
        let bytes = outputs as f64 * (8.0 * slices as f64 + 2.0);
        us += SPLIT_US + bytes / BYTES_PER_US;
    }
    us
}

/// The splits a tiling may take: whole, and where `split` allows, every slice count that keeps
/// [`super::knobs`]' fewest steps a slice, as `(slices, steps a slice)` with no empty slice.
pub(super) fn splits(
    steps: usize,
    split: bool,
    min_split: usize,
    min_slice: usize,
) -> Vec<(usize, usize)> {
    let mut v = vec![(1, steps)];
    if split && steps >= min_split {
        for wanted in 2..=(steps / min_slice.max(1)) {
            let per = steps.div_ceil(wanted);
            let slices = steps.div_ceil(per);
            if per >= min_slice && !v.contains(&(slices, per)) {
                v.push((slices, per));
            }
        }
    }
    v
}

/// Whether a plan's split keeps its cubes within one wave. A split over several waves of
/// 128 × 128 cubes priced well here and lost on the GPU (SDXL's 5120 → 1280 over 2048 rows split
/// four ways: 243 µs and an 18 µs finishing pass against 234 µs unsplit on 64 × 128 tiles, H200,
/// fiftieth session), so splits only fill a wave, as the fill rule's do.
fn split_in_one_wave(plan: &Plan) -> bool {
    let t = plan.tiling;
    plan.split.0 == 1 || t.cubes * plan.split.0 <= UNITS * t.resident.max(1)
}

/// The plan to launch: the cheapest of `candidates` by [`cost`] (splits within one wave) where it
/// beats `fill` (the fill rule's plan) by [`MARGIN`], else `fill`.
pub(super) fn choose(fill: Plan, candidates: &[Plan], outputs: usize) -> Plan {
    let best = candidates
        .iter()
        .copied()
        .filter(split_in_one_wave)
        .min_by(|a, b| cost(a, outputs).total_cmp(&cost(b, outputs)));
    match best {
        Some(b) if cost(&b, outputs) < MARGIN * cost(&fill, outputs) => b,
        _ => fill,
    }
}

/// Fewest reduction steps a slice of a tail ([`tail`]) sums: the tail's slices run in the
/// wave after the head's, so a short one is what the split saves.
const MIN_TAIL_STEPS: usize = 4;

/// Fewest reduction steps a product must have to run as a head and a split tail: on SDXL's
/// 1280 → 1280 over 2048 rows (20 steps) the two launches took 82 µs and an 8 µs finishing pass
/// against 69 µs in one, while its 5120 → 1280 (80 steps) took 180 and 9 against 234 (H200,
/// fiftieth session): a short product's second launch costs more than its last wave.
const MIN_TAIL_REDUCTION: usize = 32;

/// A launch in two: the head's whole waves of row tiles unsplit, then the rows left over split
/// into one more wave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tail {
    /// Row tiles of the head (whole waves of `nx` cubes a row).
    pub head_tiles: usize,
    /// The tail's split `(slices, steps a slice)`.
    pub split: (usize, usize),
}

/// Where a grid of `nx × ny` one-an-SM cubes over `steps` leaves a last wave of few row tiles:
/// those rows split so that they fill one wave, the rest unsplit (the data-parallel waves and
/// a stream-K-like last one). SDXL's 5120 → 1280 over 2048 rows on 128 × 128 tiles: 13 row
/// tiles of 10 in one wave, 3 left over split 4 ways (120 cubes of 20 steps) instead of 3 waves
/// of 64 × 128. `None` unless the model prices it below [`MARGIN`] of `current` (µs).
pub(super) fn tail(t: &Tiling, nx: usize, n: usize, current: f64) -> Option<Tail> {
    let (ny, steps) = (t.cubes / nx.max(1), t.steps);
    if t.resident != 1 || nx == 0 || nx > UNITS || t.cubes <= UNITS || steps < MIN_TAIL_REDUCTION {
        return None;
    }
    let per_wave = UNITS / nx;
    let head_tiles = (ny / per_wave) * per_wave;
    let rest = ny - head_tiles;
    if rest == 0 || head_tiles == 0 {
        return None;
    }
    let tail_cubes = rest * nx;
    let slices = (UNITS / tail_cubes).min(steps / MIN_TAIL_STEPS);
    if slices < 2 {
        return None;
    }
    let per = steps.div_ceil(slices);
    let split = (steps.div_ceil(per), per);
    let step = step_us(t.tile) * t.bk as f64 / 64.0;
    let waves = (head_tiles / per_wave) as f64;
    let outputs = rest * t.tile.0 * n;
    let us = waves * (steps as f64 * step + FIXED_US)
        + (per as f64 * step + FIXED_US)
        + SPLIT_US
        + outputs as f64 * (8.0 * split.0 as f64 + 2.0) / BYTES_PER_US;
    (us < MARGIN * current).then_some(Tail { head_tiles, split })
}

#[cfg(test)]
mod tests {
    use super::{Plan, Tiling, choose, cost, resident, splits};

    /// A linear's tilings over `m × n` at the 64-deep step (8 planes: 128², 64 × 128, 64²).
    fn tilings(m: usize, n: usize, k: usize) -> Vec<Tiling> {
        [
            ((128, 128), (4, 2)),
            ((64, 128), (2, 2)),
            ((64, 64), (2, 1)),
        ]
        .into_iter()
        .map(|(tile, frags)| Tiling {
            tile,
            resident: resident(frags),
            cubes: m.div_ceil(tile.0) * n.div_ceil(tile.1),
            bk: 64,
            steps: k.div_ceil(64),
        })
        .collect()
    }

    fn plans(ts: &[Tiling]) -> Vec<Plan> {
        ts.iter()
            .flat_map(|&t| {
                splits(t.steps, true, 32, 8)
                    .into_iter()
                    .map(move |split| Plan { tiling: t, split })
            })
            .collect()
    }

    /// SD 1.5's 5120 → 1280 over 512 rows: the fill rule's 64 × 64 tiles split twice run 320
    /// cubes, two waves of 264; 40 cubes of 128 × 128 split three ways fill one wave of 132.
    /// SDXL's over 2048 rows keeps its plan: a split over several waves is never taken.
    #[test]
    fn long_reductions_split_to_one_full_wave() {
        let ts = tilings(512, 1280, 5120);
        let fill = Plan {
            tiling: ts[2],
            split: (2, 40),
        };
        let chosen = choose(fill, &plans(&ts), 512 * 1280);
        assert_eq!((chosen.tiling.tile, chosen.split), ((128, 128), (3, 27)));
        assert!(cost(&chosen, 512 * 1280) < 0.9 * cost(&fill, 512 * 1280));
        let ts = tilings(2048, 1280, 5120);
        let fill = Plan {
            tiling: ts[1],
            split: (1, 80),
        };
        assert_eq!(choose(fill, &plans(&ts), 2048 * 1280), fill);
    }

    /// Short reductions and full grids keep the fill rule's plan: SDXL's GEGLU (ten waves of
    /// 128 × 128) and its 1280 → 1280 products (20 steps, nothing to split).
    #[test]
    fn full_grids_and_short_reductions_keep_the_fill_plan() {
        let ts = tilings(2048, 10240, 1280);
        let fill = Plan {
            tiling: ts[0],
            split: (1, 20),
        };
        assert_eq!(choose(fill, &plans(&ts), 2048 * 10240), fill);
        let ts = tilings(2048, 1280, 1280);
        let fill = Plan {
            tiling: ts[1],
            split: (1, 20),
        };
        assert_eq!(choose(fill, &plans(&ts), 2048 * 1280), fill);
    }

    /// A small grid's split stops at one wave: 64 × 64 tiles of an 8×8 map's 1280 → 1280
    /// convolution (40 cubes, 180 steps) split 7 ways run 280 cubes, a wave and a bit of 264.
    #[test]
    fn small_grids_split_within_one_wave() {
        let t = Tiling {
            tile: (64, 64),
            resident: 2,
            cubes: 40,
            bk: 64,
            steps: 180,
        };
        let fill = Plan {
            tiling: t,
            split: (7, 26),
        };
        let candidates: Vec<Plan> = splits(180, true, 32, 8)
            .into_iter()
            .map(|split| Plan { tiling: t, split })
            .collect();
        let chosen = choose(fill, &candidates, 1280 * 128);
        assert!(chosen.split.0 * 40 <= 264, "{chosen:?}");
        assert!(chosen.split.0 >= 5, "{chosen:?}");
    }

    /// SDXL's 5120 → 1280 over 2048 rows takes a head of 13 row tiles and a tail of 3 split 4
    /// ways; its 1280 → 1280 (20 steps), its GEGLU (whole waves) and a grid of one wave take
    /// none.
    #[test]
    fn last_waves_of_few_rows_split() {
        use super::tail;
        let t = |cubes, steps| Tiling {
            tile: (128, 128),
            resident: 1,
            cubes,
            bk: 64,
            steps,
        };
        let want = super::Tail {
            head_tiles: 13,
            split: (4, 20),
        };
        assert_eq!(tail(&t(160, 80), 10, 1280, 235.0), Some(want));
        assert_eq!(tail(&t(160, 20), 10, 1280, 67.8), None, "a short reduction");
        assert_eq!(
            tail(&t(16 * 80, 80), 80, 10240, 1200.0),
            None,
            "no room beside 80"
        );
        assert_eq!(tail(&t(120, 80), 30, 3840, 150.0), None, "one wave");
        let two = Tiling {
            resident: 2,
            ..t(640, 20)
        };
        assert_eq!(tail(&two, 20, 1280, 68.4), None, "two cubes an SM");
        assert_eq!(tail(&t(160, 20), 10, 1280, 40.0), None, "not cheaper");
    }

    /// Every split covers every step once, with no empty slice and none below the fewest.
    #[test]
    fn splits_cover_the_reduction() {
        assert_eq!(splits(20, true, 32, 8), vec![(1, 20)], "too short to split");
        assert_eq!(
            splits(80, false, 32, 8),
            vec![(1, 80)],
            "splitting not allowed"
        );
        for steps in 1..400 {
            for (slices, per) in splits(steps, true, 32, 8) {
                assert!(slices * per >= steps && (slices - 1) * per < steps);
                assert!(slices == 1 || per >= 8);
            }
        }
    }
}
