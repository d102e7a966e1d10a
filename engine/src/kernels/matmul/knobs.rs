//! How the cooperative-matrix GEMM ([`super::mma`]) is compiled and where it runs: its
//! process-wide knobs (the bench A/Bs them) and whether linear layers take it.

/// The reduction steps the kernel is built for.
pub const GEMM_STEPS: [usize; 2] = [32, 64];

/// How the GEMM is compiled: its reduction step (one of [`GEMM_STEPS`], or `None` for
/// [`reduction_step`]'s rule) and whether global reads and writes keep cubecl's bounds checks
/// (the kernel guards every access itself and the launcher checks the buffers' lengths, so the
/// checks only cost instructions: unmeasurable on an H100, eighteenth session).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmKnobs {
    pub bk: Option<usize>,
    pub unchecked: bool,
    /// The planes over a tile, rows × columns: `[2, 4]` (8 planes, each 64 × 32 of a 128 ×
    /// 128 tile), `[2, 2]` (4 planes, each 64 × 64: every fragment loaded feeds four
    /// products instead of two or four). (16 planes of 32 × 32, 512 lanes, which held the
    /// driver's compiler to 60–114 registers a lane against 173–255 for 8 planes, lost:
    /// BENCHMARKS.md, forty-ninth session.)
    pub planes: [usize; 2],
    /// Copies of the staging: 2 takes one barrier a step instead of two, where it fits in
    /// workgroup memory.
    pub stages: usize,
    /// Whether the next step's vectors load while this step's products run (in registers that
    /// live across them). Off by default: on an H100 the step replayed took 33.77 ms without
    /// against 35.25 ms with (three interleaved rounds, BENCHMARKS.md twenty-second session) —
    /// fewer registers a lane, more cubes resident to hide the loads.
    pub prefetch: bool,
    /// Whether a product of too few cubes splits its reduction over more ([`split_slices`]), its
    /// f32 partial sums finished (bias, GEGLU, residual) by a second pass. On by default: with
    /// the 8×8 maps' 3×3 layers moved onto the GEMM (`conv::ConvRules`), the SD 1.5 step replayed
    /// took 30.84 ms against 32.08 on an H100 (three interleaved rounds, BENCHMARKS.md,
    /// twenty-sixth session). Two knobs measured there and removed: prefetching on small grids
    /// only (+1.5 ms) and 64 × 64 tiles in 4 planes of 32 × 32 (+3.4 ms).
    pub split_k: bool,
    /// Each lane's offsets into `a` and `b` that stay the same from step to step (its rows, a
    /// GEGLU's interleaved weight rows included) formed once before the reduction instead of at
    /// every step. On by default: on an H200 (forty-second session, three interleaved rounds)
    /// SDXL's step took 154.9 ms against 170.5 and SD 1.5's replayed 29.07 against 29.95; a
    /// GEGLU's 1280 → 10240 product over 2048 rows alone 0.318 ms against 0.526, the same as
    /// without the gate (0.322). A diagnostic reading the GEGLU's weight rows in order (wrong
    /// values) had found the interleaved rows' per-step arithmetic to be the cost.
    pub hoist_rows: bool,
    /// A plane barrier after each 16-deep sub-step's products ([`super::products`]) where a
    /// plane holds 4 accumulators or more: a lane then holds one sub-step's fragments instead
    /// of the whole step's. On by default: SDXL's step replayed took 111.6–112.6 ms against
    /// 114.8–115.8 without in three calls (H200, forty-ninth session, three interleaved
    /// rounds each); its large linears gained (GEGLU 1280 → 10240 over 2048 rows 18.9 → 17.9
    /// ms a step) and 64 × 64 tiles lost (SD 1.5's 1280 → 1280 over 512 rows 0.513 → 0.543),
    /// hence the rule. The registers it saves do not buy a second cube an SM (173–255 a lane
    /// without, 167–255 with, for 128 × 128 tiles), so the gain is the compiler's schedule.
    pub fence: bool,
    /// The tile and reduction split priced by the waves of cubes they run in
    /// ([`super::waves`]) instead of the fill rule's first tile with [`TARGET_CUBES`] cubes and
    /// its split to that count, where the model finds a plan clearly cheaper. On by default: on
    /// an H200 (fiftieth session, three interleaved rounds, steps replayed) SD 1.5's step took
    /// 23.30 ms against 23.61 and SDXL's 110.30 against 110.62; SD 1.5's linears over 512 and
    /// 2048 rows moved from two waves of 64 × 64 cubes to one of 128 × 128 (1280 → 3840 over
    /// 512 rows 64 → 40 µs), SDXL's context projections over 154 rows 45 → 36 µs.
    pub waves: bool,
    /// With `waves`: a grid of one-an-SM cubes whose last wave holds few row tiles runs as two
    /// launches, the whole waves' rows unsplit and the rest split into one more wave
    /// ([`super::waves::tail`]). On by default, where the reduction has 32 steps or more: on an
    /// H200 (fiftieth session) SDXL's 5120 → 1280 over 2048 rows took 180 µs and a 9 µs
    /// finishing pass against 234 µs in one launch.
    pub tails: bool,
    /// With `waves`: where the caller fixed the tile (the channels-last convolutions' 128 × 128,
    /// [`crate::kernels::conv::ConvRules::channels_last_tile`]), the waves model's plan is taken
    /// where it keeps that tile (its split then priced by waves instead of the fill rule's two
    /// cubes an SM), the fill rule's elsewhere. Off: not yet timed. With the tile left to the
    /// waves model outright, SD 1.5's step took 21.69 ms against 22.71 and SDXL's 109.18
    /// against 105.45 on an H200 (fifty-second session); this keeps SDXL's plans as they are
    /// and SD 1.5's 3×3 layers' splits as the model prices them.
    pub waves_fixed_tile: bool,
}

/// The plane arrangements the kernel is built for.
pub const GEMM_PLANES: [[usize; 2]; 2] = [[2, 4], [2, 2]];

impl Default for GemmKnobs {
    fn default() -> Self {
        DEFAULT_KNOBS
    }
}

const DEFAULT_KNOBS: GemmKnobs = GemmKnobs {
    bk: None,
    unchecked: true,
    planes: [2, 4],
    stages: 1,
    prefetch: false,
    split_k: true,
    hoist_rows: true,
    fence: true,
    waves: true,
    tails: true,
    waves_fixed_tile: false,
};

/// Cubes below which a launch counts as small: two per SM of an H100 (132 SMs).
pub(super) const TARGET_CUBES: usize = 264;

/// Fewest reduction steps a slice of a split product sums.
pub(super) const MIN_SLICE_STEPS: usize = 8;

/// Fewest reduction steps a product must have to split: the linears' 1280-deep products (20
/// steps) gained nothing split (H100, twenty-sixth session); a 3×3 convolution's unrolled
/// 11 520-deep one has 180.
pub(super) const MIN_SPLIT_STEPS: usize = 32;

/// Whether a launch of `cubes` cubes leaves the GPU short of work (see [`GemmKnobs`]).
fn small_grid(cubes: usize) -> bool {
    cubes < TARGET_CUBES
}

/// The slices a product of `cubes` cubes over `steps` reduction steps splits into: enough to
/// reach [`TARGET_CUBES`], each summing at least [`MIN_SLICE_STEPS`] steps, and as `(slices,
/// steps per slice)` with no empty slice; `(1, steps)` where it does not split.
pub fn split_slices(cubes: usize, steps: usize) -> (usize, usize) {
    if cubes == 0 || steps < MIN_SPLIT_STEPS || !small_grid(cubes) {
        return (1, steps);
    }
    let wanted = TARGET_CUBES.div_ceil(cubes);
    let most = (steps / MIN_SLICE_STEPS).max(1);
    let per_slice = steps.div_ceil(wanted.min(most));
    (steps.div_ceil(per_slice), per_slice)
}

/// Launches of at most this many cubes take the 64-deep step when `b` lies `[k, n]`.
const SMALL_GRID: usize = 132;

/// The reduction step for a launch of `cubes` cubes: 64 (half the barriers a product) for a
/// linear layer's `[n, k]` weights and for small grids, 32 for large grids over a `[k, n]`
/// operand (an unrolled convolution input). Measured on an H100 (BENCHMARKS.md, eighteenth
/// session, every SD 1.5 shape alone): the 64-deep step took the linears from 32.6 to 27.5 ms a
/// step and the 8×8 and stride-2 convolutions 25–30 % faster, but the wide maps' convolutions
/// (160 cubes and more) 10–100 % slower.
pub fn reduction_step(b_nk: bool, cubes: usize) -> usize {
    if b_nk || cubes <= SMALL_GRID { 64 } else { 32 }
}

/// The knobs every launch takes (the bench compares them).
pub fn gemm_knobs() -> GemmKnobs {
    GEMM_KNOBS
        .lock()
        .map(|k| *k)
        .unwrap_or_else(|p| *p.into_inner())
}

/// Sets [`gemm_knobs`] process-wide; a step outside [`GEMM_STEPS`], planes outside
/// [`GEMM_PLANES`] or stages other than 1 and 2 are ignored.
pub fn set_gemm_knobs(knobs: GemmKnobs) {
    if knobs.bk.is_some_and(|bk| !GEMM_STEPS.contains(&bk))
        || !GEMM_PLANES.contains(&knobs.planes)
        || !(1..=2).contains(&knobs.stages)
    {
        return;
    }
    match GEMM_KNOBS.lock() {
        Ok(mut k) => *k = knobs,
        Err(p) => *p.into_inner() = knobs,
    }
}

static GEMM_KNOBS: std::sync::Mutex<GemmKnobs> = std::sync::Mutex::new(DEFAULT_KNOBS);

/// Whether linear layers take the GEMM where it runs: on unless switched off
/// ([`set_mma_linears`], `LATENT_STUDIO_MATMUL=burn`). With the GEGLU gate and the residual in
/// its epilogue a UNet step's kernels took 37.7 ms on an H100 against 41.1 ms with burn's matmul
/// (BENCHMARKS.md, eighteenth session).
pub fn mma_linears() -> bool {
    MMA_LINEARS.load(std::sync::atomic::Ordering::Relaxed) && !super::switched_off()
}

/// Sets [`mma_linears`] process-wide (the bench times both).
pub fn set_mma_linears(on: bool) {
    MMA_LINEARS.store(on, std::sync::atomic::Ordering::Relaxed);
}

static MMA_LINEARS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

#[cfg(test)]
mod tests {
    use super::{GemmKnobs, reduction_step, split_slices};

    /// Small grids split to about two cubes an SM, never below four steps a slice, with no
    /// empty slice; full grids and short reductions stay whole.
    #[test]
    fn splits_fill_small_grids() {
        assert_eq!(
            split_slices(160, 20),
            (1, 20),
            "a 1280-deep linear stays whole"
        );
        assert_eq!(
            split_slices(40, 80),
            (7, 12),
            "the 8×8 level's 5120-deep product"
        );
        assert_eq!(
            split_slices(40, 180),
            (7, 26),
            "a 3×3 1280→1280 layer at 8×8"
        );
        assert_eq!(split_slices(160, 180), (2, 90), "the same at 16×16");
        assert_eq!(split_slices(200, 40), (2, 20));
        assert_eq!(split_slices(40, 31), (1, 31), "too short to split");
        assert_eq!(split_slices(384, 180), (1, 180), "the GPU is full");
        assert_eq!(split_slices(0, 20), (1, 20));
        for cubes in 1..300 {
            for steps in 1..100 {
                let (slices, per) = split_slices(cubes, steps);
                assert!(slices >= 1 && per >= 1);
                assert!(
                    (slices - 1) * per < steps,
                    "no empty slice ({cubes}, {steps})"
                );
                assert!(
                    slices * per >= steps,
                    "every step summed ({cubes}, {steps})"
                );
            }
        }
    }

    /// Linears and small grids take the deep step; wide maps' convolutions the short one.
    #[test]
    fn reduction_step_by_operand_and_grid() {
        assert_eq!(reduction_step(true, 1280), 64, "a linear layer");
        assert_eq!(reduction_step(false, 40), 64, "an 8×8 convolution");
        assert_eq!(reduction_step(false, 320), 32, "a 64×64 convolution");
        let knobs = GemmKnobs::default();
        assert!(knobs.bk.is_none() && knobs.unchecked && !knobs.prefetch);
        assert!(knobs.split_k && knobs.hoist_rows && knobs.fence && knobs.waves && knobs.tails);
        assert_eq!((knobs.planes, knobs.stages), ([2, 4], 1));
    }
}
