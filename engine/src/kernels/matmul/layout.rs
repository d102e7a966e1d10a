//! The GEMM's shape on a device ([`MmaGemm`]: plane width, fragment, the tiles it takes) and
//! where a launch's tile and reduction split come from: the fill rule ([`MmaGemm::tiles_for`],
//! [`split_slices`]) or, with [`super::GemmKnobs::waves`], the cheapest plan by the waves model
//! ([`super::waves`]), a long product's last rows split apart where `tails` allows.

use super::super::attention::Fragment;
use super::GemmKnobs;
use super::implicit::ConvInput;
use super::knobs::{
    GEMM_STEPS, MIN_SLICE_STEPS, MIN_SPLIT_STEPS, TARGET_CUBES, reduction_step, split_slices,
};
use super::mma::{MAX_LANES, VEC};
use super::waves::{self, Plan, Tiling};

/// The tiles the GEMM takes, largest first, `(rows, columns)` of a cube's output.
pub const MMA_TILES: [(usize, usize); 3] = [(128, 128), (64, 128), (64, 64)];

/// The GEMM's shape on one device: its plane width and f16×f16→f32 fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmaGemm {
    pub plane: usize,
    pub fragment: Fragment,
}

impl MmaGemm {
    /// Whether the kernel's layout works with this plane and fragment: 8 planes of 32, each
    /// fragment's values an even share of a plane's lanes, the step a multiple of the depth.
    pub fn fits(&self) -> bool {
        let f = self.fragment;
        self.plane * 8 == MAX_LANES
            && f.m > 0
            && f.n > 0
            && f.k > 0
            && GEMM_STEPS.iter().all(|bk| bk.is_multiple_of(f.k))
            && (f.m * f.n).is_multiple_of(self.plane)
            && f.m.is_multiple_of(8)
            && f.n.is_multiple_of(8)
    }

    /// The tile `(rows, columns)` for an `m × n` product over `batch` matrices: the largest
    /// that still gives [`TARGET_CUBES`] cubes, else the smallest.
    pub fn tiles_for(&self, m: usize, n: usize, batch: usize) -> (usize, usize) {
        MMA_TILES
            .into_iter()
            .find(|&(bm, bn)| m.div_ceil(bm) * n.div_ceil(bn) * batch >= TARGET_CUBES)
            .unwrap_or(MMA_TILES[MMA_TILES.len() - 1])
    }

    /// The fragments a plane keeps, `(tm, tn)`, for a `bm × bn` tile with `planes` (rows ×
    /// columns of planes); `None` where they do not divide it.
    pub fn fragments(
        &self,
        (bm, bn): (usize, usize),
        [pm, pn]: [usize; 2],
    ) -> Option<(usize, usize)> {
        let f = self.fragment;
        let (rows, cols) = (pm * f.m, pn * f.n);
        (bm.is_multiple_of(rows) && bn.is_multiple_of(cols) && bm >= rows && bn >= cols)
            .then_some((bm / rows, bn / cols))
    }
}

/// One tile's launch geometry: a plane's fragments, the tile, the grid, the reduction step.
#[derive(Debug, Clone, Copy)]
pub(super) struct Layout {
    pub tm: usize,
    pub tn: usize,
    pub bm: usize,
    pub bn: usize,
    pub nx: usize,
    pub ny: usize,
    pub bk: usize,
    pub steps: usize,
}

impl Layout {
    /// The geometry of `tile` for an `m × n × k` product, or `None` where the kernel cannot take
    /// it (fragments not dividing the tile, a grid too large, a step the lanes cannot stage
    /// whole or straddling a convolution's taps).
    #[allow(clippy::too_many_arguments)]
    fn of(
        gemm: MmaGemm,
        knobs: GemmKnobs,
        tile: (usize, usize),
        [m, n, k]: [usize; 3],
        batch: usize,
        b_nk: bool,
        geglu: bool,
        a_rows: Option<ConvInput>,
    ) -> Option<Self> {
        let [pm, pn] = knobs.planes;
        let (tm, mut tn) = gemm.fragments(tile, knobs.planes)?;
        if geglu && !tn.is_multiple_of(2) {
            // Values and gates in fragment pairs.
            tn = 2 * tn.div_ceil(2);
        }
        let f = gemm.fragment;
        let (bm, bn) = (pm * tm * f.m, pn * tn * f.n);
        let lanes = pm * pn * gemm.plane;
        let (nx, ny) = (n.div_ceil(bn), m.div_ceil(bm));
        if nx > 65_535 || ny > 65_535 {
            return None;
        }
        let bk = knobs
            .bk
            .unwrap_or_else(|| reduction_step(b_nk, nx * ny * batch));
        // Every lane stages whole vectors.
        if !(bm * bk / VEC).is_multiple_of(lanes) || !(bn * bk / VEC).is_multiple_of(lanes) {
            return None;
        }
        if a_rows.is_some_and(|c| !c.fits_rows(bk)) {
            return None;
        }
        Some(Self {
            tm,
            tn,
            bm,
            bn,
            nx,
            ny,
            bk,
            steps: k.div_ceil(bk),
        })
    }

    fn cubes(&self, batch: usize) -> usize {
        self.nx * self.ny * batch
    }

    fn tiling(&self, batch: usize) -> Tiling {
        Tiling {
            tile: (self.bm, self.bn),
            resident: waves::resident((self.tm, self.tn)),
            cubes: self.cubes(batch),
            bk: self.bk,
            steps: self.steps,
        }
    }
}

/// What a launch asks of [`plan`].
pub(super) struct Request {
    pub mnk: [usize; 3],
    pub batch: usize,
    pub b_nk: bool,
    pub geglu: bool,
    /// A channels-last convolution's input read in place as `a` (its steps must not straddle
    /// taps).
    pub a_rows: Option<ConvInput>,
    /// Whether the reduction may split (the knob on, each matrix's output whole).
    pub split_ok: bool,
    /// A tile the caller fixed; the waves model then stays out.
    pub tiles: Option<(usize, usize)>,
    /// A split the caller fixed (with `tiles`: a tail's, [`waves::tail`]).
    pub split: Option<(usize, usize)>,
    /// Whether the launch may run as a head and a split tail of rows ([`waves::Tail`]): the
    /// knob on, a linear's `[n, k]` weight (one reduction step for head and tail), nothing read
    /// in place, a bias per column.
    pub tail_ok: bool,
}

/// The launch's layout and split `(slices, steps a slice)`, and where the waves model splits
/// only its last rows, that tail; `None` where the kernel cannot take the fill rule's tile.
pub(super) fn plan(
    gemm: MmaGemm,
    knobs: GemmKnobs,
    r: Request,
) -> Option<(Layout, (usize, usize), Option<waves::Tail>)> {
    let [m, n, _] = r.mnk;
    let layout = |tile| Layout::of(gemm, knobs, tile, r.mnk, r.batch, r.b_nk, r.geglu, r.a_rows);
    let fill = layout(r.tiles.unwrap_or_else(|| gemm.tiles_for(m, n, r.batch)))?;
    let fill_split = match r.split {
        Some(split) => split,
        None if r.split_ok => split_slices(fill.cubes(r.batch), fill.steps),
        None => (1, fill.steps),
    };
    // A tile the caller fixed (the convolutions' 128 × 128) keeps the fill rule's split, or,
    // with `waves_fixed_tile`, the waves model's plan where that plan keeps the tile.
    let repriced = knobs.waves_fixed_tile && r.split.is_none();
    if !knobs.waves || (r.tiles.is_some() && !repriced) {
        return Some((fill, fill_split, None));
    }
    if let Some(tile) = r.tiles {
        let free = Request { tiles: None, ..r };
        return match plan(gemm, knobs, free) {
            Some((lay, split, None)) if (lay.bm, lay.bn) == tile => Some((lay, split, None)),
            _ => Some((fill, fill_split, None)),
        };
    }
    let options: Vec<Layout> = MMA_TILES.into_iter().filter_map(layout).collect();
    let candidates: Vec<Plan> = options
        .iter()
        .flat_map(|l| {
            waves::splits(l.steps, r.split_ok, MIN_SPLIT_STEPS, MIN_SLICE_STEPS)
                .into_iter()
                .map(|split| Plan {
                    tiling: l.tiling(r.batch),
                    split,
                })
        })
        .collect();
    let fill_plan = Plan {
        tiling: fill.tiling(r.batch),
        split: fill_split,
    };
    let chosen = waves::choose(fill_plan, &candidates, m * n * r.batch);
    let lay = options
        .iter()
        .copied()
        .find(|l| l.tiling(r.batch) == chosen.tiling)
        .unwrap_or(fill);
    if r.tail_ok && r.split_ok && r.batch == 1 && chosen.split.0 == 1 {
        let current = waves::cost(&chosen, m * n);
        for l in options {
            if let Some(tail) = waves::tail(&l.tiling(1), l.nx, n, current) {
                return Some((l, (1, l.steps), Some(tail)));
            }
        }
    }
    Some((lay, chosen.split, None))
}

#[cfg(test)]
pub(super) mod tests {
    use super::{Fragment, GemmKnobs, MmaGemm, Request, plan};

    /// A device's GEMM shape: `plane` lanes, an `m × n × k` fragment.
    pub(in super::super) fn gemm(plane: usize, m: usize, n: usize, k: usize) -> MmaGemm {
        MmaGemm {
            plane,
            fragment: Fragment { m, n, k },
        }
    }

    /// The layouts the kernel takes: 8 planes of 32 and fragments that split evenly over a
    /// plane's lanes (NVIDIA's 16×16×16 and 16×8×16); not Intel's 8-row or 16-lane planes.
    #[test]
    fn fits_the_kernels_layout() {
        assert!(gemm(32, 16, 16, 16).fits(), "NVIDIA");
        assert!(gemm(32, 16, 8, 16).fits());
        assert!(
            !gemm(16, 8, 16, 16).fits(),
            "16-lane planes: 16 planes, not 8"
        );
        assert!(!gemm(64, 16, 16, 16).fits());
        assert!(
            !gemm(32, 16, 16, 48).fits(),
            "the step is not a multiple of k"
        );
        assert!(!gemm(32, 4, 16, 16).fits());
    }

    /// The largest tile that still fills the GPU, else the smallest.
    #[test]
    fn tiles_fill_the_gpu() {
        let g = gemm(32, 16, 16, 16);
        assert_eq!(
            g.tiles_for(8192, 2560, 1),
            (128, 128),
            "64 × 20 tiles of 128"
        );
        assert_eq!(
            g.tiles_for(8192, 320, 1),
            (64, 128),
            "3 columns of 128 need 64-row tiles"
        );
        assert_eq!(g.tiles_for(1280, 256, 2), (64, 64), "a 16×16 convolution");
        assert_eq!(g.tiles_for(16, 16, 1), (64, 64));
    }

    /// A plane's fragments for each tile and arrangement; none where they do not divide it.
    #[test]
    fn fragments_per_plane() {
        let g = gemm(32, 16, 16, 16);
        assert_eq!(g.fragments((128, 128), [2, 4]), Some((4, 2)));
        assert_eq!(g.fragments((64, 64), [2, 4]), Some((2, 1)));
        assert_eq!(g.fragments((128, 128), [2, 2]), Some((4, 4)));
        assert_eq!(g.fragments((64, 64), [2, 2]), Some((2, 2)));
        assert_eq!(g.fragments((16, 64), [2, 2]), None);
    }

    fn request(mnk: [usize; 3], tiles: Option<(usize, usize)>) -> Request {
        Request {
            mnk,
            batch: 1,
            b_nk: true,
            geglu: false,
            a_rows: None,
            split_ok: true,
            tiles,
            split: None,
            tail_ok: false,
        }
    }

    /// The waves model replaces the fill rule's plan only where it is on and no tile is fixed:
    /// SD 1.5's 5120 → 1280 over 512 rows goes from 64 × 64 split twice to 128 × 128 split three
    /// ways.
    #[test]
    fn waves_replace_the_fill_plan_only_when_asked() {
        let gemm = MmaGemm {
            plane: 32,
            fragment: Fragment {
                m: 16,
                n: 16,
                k: 16,
            },
        };
        let off = GemmKnobs::default();
        let on = GemmKnobs {
            waves: true,
            tails: true,
            ..off
        };
        let off = GemmKnobs {
            waves: false,
            ..off
        };
        let shape = [512, 1280, 5120];
        let (fill, split, _) = plan(gemm, off, request(shape, None)).expect("fits");
        assert_eq!(((fill.bm, fill.bn), split), ((64, 64), (2, 40)));
        let (waves, split, _) = plan(gemm, on, request(shape, None)).expect("fits");
        assert_eq!(
            ((waves.bm, waves.bn, waves.bk), split),
            ((128, 128, 64), (3, 27))
        );
        let (fixed, split, _) = plan(gemm, on, request(shape, Some((64, 64)))).expect("fits");
        assert_eq!(((fixed.bm, fixed.bn), split), ((64, 64), (2, 40)));
        // SDXL's 5120 → 1280 over 2048 rows: a head of 13 row tiles of 128 and a split tail,
        // where the launch allows it; its 1280 → 1280 (20 steps) stays one launch.
        let tailed = |knobs, mnk| {
            let r = Request {
                tail_ok: true,
                ..request(mnk, None)
            };
            plan(gemm, knobs, r).expect("fits")
        };
        let (head, split, tail) = tailed(on, [2048, 1280, 5120]);
        assert_eq!(((head.bm, head.bn), split), ((128, 128), (1, 80)));
        assert_eq!(tail.map(|t| (t.head_tiles, t.split)), Some((13, (4, 20))));
        assert!(tailed(off, [2048, 1280, 5120]).2.is_none(), "the knob off");
        assert!(
            tailed(on, [2048, 1280, 1280]).2.is_none(),
            "a short reduction"
        );
        let untailed = plan(gemm, on, request([2048, 1280, 5120], None)).expect("fits");
        assert!(untailed.2.is_none(), "not where the launch refuses it");
        let (geglu, _, _) = plan(
            gemm,
            on,
            Request {
                geglu: true,
                ..request([2048, 10240, 1280], None)
            },
        )
        .expect("fits");
        assert_eq!(
            (geglu.bm, geglu.bn),
            (128, 128),
            "a full grid keeps its tile"
        );
    }

    /// With `waves_fixed_tile`, a convolution's fixed 128 × 128 tile takes the waves model's
    /// split where the model keeps that tile (SD 1.5's 3×3 1280 → 1280 at 16²: three slices
    /// instead of the fill rule's seven), and the fill rule's plan where the model would change
    /// the tile (SDXL's at 32²: 64 × 128 unsplit, slower on the H200).
    #[test]
    fn a_fixed_tile_takes_the_waves_split_where_the_model_keeps_it() {
        let gemm = gemm(32, 16, 16, 16);
        let on = GemmKnobs {
            waves_fixed_tile: true,
            ..GemmKnobs::default()
        };
        let tile = Some((128, 128));
        let split_of = |knobs, mnk| {
            let (l, split, _) = plan(gemm, knobs, request(mnk, tile)).expect("fits");
            ((l.bm, l.bn), split)
        };
        let sd15_16 = [512, 1280, 11_520];
        assert_eq!(
            split_of(GemmKnobs::default(), sd15_16),
            ((128, 128), (7, 26))
        );
        assert_eq!(split_of(on, sd15_16), ((128, 128), (3, 60)));
        assert_eq!(split_of(on, [128, 1280, 11_520]), ((128, 128), (13, 14)));
        let sdxl_32 = [2048, 1280, 11_520];
        assert_eq!(
            split_of(on, sdxl_32),
            split_of(GemmKnobs::default(), sdxl_32)
        );
        assert_eq!(split_of(on, sdxl_32), ((128, 128), (2, 90)));
        // A split the caller fixed (a tail's) is never repriced.
        let forced = Request {
            split: Some((2, 90)),
            ..request(sd15_16, tile)
        };
        let (_, split, _) = plan(gemm, on, forced).expect("fits");
        assert_eq!(split, (2, 90));
    }
}
