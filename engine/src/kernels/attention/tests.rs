use burn::tensor::{DType, Tensor};

use super::super::testing::{read, relative, tensor, values, wgpu};
use super::{Fragment, Heads, Plan};
use crate::attention::multi_head_attention;

/// Ours runs every head width without cooperative matrices (burn's attention there is the
/// unfused one) and up to 80 with them; the first tiling of each kind is the measured best:
/// on plain lanes, rows in registers, one lane per 64 columns or fewer.
#[test]
fn default_plan_rule() {
    let fragment = Fragment {
        m: 16,
        n: 16,
        k: 16,
    };
    let square = Some(fragment);
    for d in [40, 64, 80, 128, 160] {
        let cmma = Plan::choose(d, 2, square, 48 * 1024).expect("fits");
        assert_eq!((cmma.bq, cmma.bk), (32, 16));
        let lane = Plan::choose(d, 2, None, 48 * 1024).expect("fits");
        // With cooperative matrices and no planes plan: the per-row plan up to 80 wide,
        // burn's beyond.
        let mut all = Plan::fitting(d, 2, square, 48 * 1024);
        all.extend(Plan::fitting(d, 2, None, 48 * 1024));
        let on_cmma = super::preferred(all, d, 4096);
        assert_eq!(on_cmma, (d <= 80).then_some(lane), "d {d}");
        assert_eq!(
            super::preferred_with(Plan::fitting(d, 2, None, 48 * 1024), d, 4096, 0),
            Some(lane)
        );
        let parts = d.div_ceil(64);
        let parts = if d == 160 { 4 } else { parts };
        let rows = if parts >= 4 { 32 } else { 64 };
        assert_eq!(
            (lane.bq, lane.bk, lane.per_row, lane.parts),
            (rows, 8, true, parts)
        );
    }
    // Where the planes kernel fits, it takes heads up to 160 wide over any number of keys
    // (twenty-second and twenty-fifth sessions); under 256 keys (the 77 prompt tokens) its
    // narrowest key tile; in registers 64 query rows over 32 keys where the width fits them
    // (forty-sixth and forty-eighth sessions).
    for (d, n_k) in [
        (40, 4096),
        (40, 77),
        (64, 256),
        (64, 4096),
        (64, 77),
        (80, 1024),
        (80, 77),
        (160, 256),
        (160, 77),
    ] {
        for registers in [false, true] {
            let planes = Plan::on_planes(d, 2, fragment, 32, 256, 48 * 1024, registers);
            let narrowest = planes.iter().min_by_key(|p| p.bk).copied();
            let mut all = planes.clone();
            all.extend(Plan::fitting(d, 2, square, 48 * 1024));
            all.extend(Plan::fitting(d, 2, None, 48 * 1024));
            let chosen = super::preferred(all, d, n_k).expect("ours");
            let want = match n_k < 256 {
                true => narrowest,
                false => planes.first().copied(),
            };
            assert_eq!(Some(chosen), want, "d {d} keys {n_k}");
            assert!(
                chosen.plane.is_some() && !chosen.per_row,
                "d {d} keys {n_k}"
            );
            // Tiles in registers wherever the device offers them.
            assert_eq!(chosen.elementwise, registers, "d {d} keys {n_k}");
            // With the key/value rows padded, SD's 40-, 64- and 80-wide heads still fit 64
            // query rows over 32 keys in registers.
            if registers && n_k >= 256 && d <= 80 {
                assert_eq!((chosen.bq, chosen.bk), (64, 32), "d {d} keys {n_k}");
            }
        }
    }
    // Past the planes kernel's widths (the VAE's 512-wide head): the wide-head kernel's first
    // tiling on cooperative matrices; on plain lanes the VAE's sliced matmuls (the per-row
    // kernel fits, but ran 6× slower there: BENCHMARKS.md, forty-seventh session).
    let mut all = Plan::on_planes_wide(512, 2, fragment, 32, 256, 48 * 1024);
    let wide = all[0];
    all.extend(Plan::fitting(512, 2, square, 48 * 1024));
    all.extend(Plan::fitting(512, 2, None, 48 * 1024));
    assert_eq!(super::preferred(all, 512, 4096), Some(wide));
    assert!(wide.parts == 8 && wide.plane.is_some() && !wide.per_row);
    let plain = Plan::fitting(512, 2, None, 48 * 1024);
    assert!(plain.first().is_some_and(|p| p.per_row && p.parts == 8));
    assert_eq!(super::preferred(plain, 512, 4096), None);
    // The 16-key rule on plain lanes: heads up to the width it names, over many keys.
    for (d, n_k, keys) in [(40, 4096, 16), (80, 1024, 16), (40, 77, 8), (160, 1024, 8)] {
        let plain = Plan::fitting(d, 2, None, 48 * 1024);
        let chosen = super::preferred_with(plain, d, n_k, super::ROWS_KEYS16_WIDEST).expect("ours");
        assert_eq!(
            (chosen.per_row, chosen.bk),
            (true, keys),
            "d {d} keys {n_k}"
        );
    }
    // Two rows a lane: slices up to 40 wide (SD 1.x's heads), never 64 (SDXL's), never a
    // tiled or planes plan; twice the rows a cube on the same lanes.
    for (d, pairs) in [
        (40, true),
        (80, true),
        (160, true),
        (64, false),
        (128, false),
    ] {
        let plain = Plan::choose(d, 2, None, 48 * 1024).expect("fits");
        let paired = plain.paired(2, 48 * 1024);
        assert_eq!(paired.is_some(), pairs, "d {d}");
        if let Some(p) = paired {
            assert_eq!(
                p.bq / p.lane_rows * p.parts,
                plain.bq * plain.parts,
                "d {d}"
            );
            assert!(p.paired(2, 48 * 1024).is_none(), "pairs once");
        }
    }
    // Intel's planes of 8 or 16 lanes keep one row a lane (128 registers a lane there).
    assert!(!super::pairs_fit_registers(8) && !super::pairs_fit_registers(16));
    assert!(super::pairs_fit_registers(32) && super::pairs_fit_registers(64));
    let tiled = Plan::fitting(40, 2, None, 48 * 1024)
        .into_iter()
        .find(|p| !p.per_row)
        .expect("tiled");
    assert!(tiled.paired(2, 48 * 1024).is_none());
    let vae = Plan::choose(512, 2, None, 48 * 1024).expect("fits");
    assert!(vae.per_row && !super::ours_is_faster(false, 512));
}

fn at(tensor: &Tensor<3>) -> Heads<'_> {
    Heads { tensor, column: 0 }
}

/// burn's attention in f32 on the CPU backend: on lavapipe it would compile and tune kernels
/// of its own for every shape, the larger part of this test's time.
fn reference(q: Tensor<3>, k: Tensor<3>, v: Tensor<3>, heads: usize) -> Vec<f32> {
    let cpu = |t: Tensor<3>| {
        let dims = t.dims();
        tensor(read(t), dims, &burn::tensor::Device::flex(), DType::F32)
    };
    read(multi_head_attention(cpu(q), cpu(k), cpu(v), heads, false))
}

/// The per-lane path (what lavapipe runs: the per-row kernel on vectors, or on single values
/// where a lane's columns are not a multiple of 4) against burn's attention: SD's head widths and
/// an odd one, query and key counts off the tiles (77 prompt tokens, an 8×8 map), batch 2, in f32 and
/// f16, and q/k/v as column ranges of one fused projection.
#[test]
fn flash_attention_matches_burn_attention() {
    let device = wgpu();
    // Each (width, dtype) is a kernel lavapipe compiles (seconds each): both dtypes at 40,
    // the rest in the dtype they run in (f16, as SD does) or, for the odd width, f32.
    for (b, heads, d, n_q, n_k, dtypes) in [
        (2, 2, 40, 70, 77, &[DType::F32, DType::F16][..]),
        (1, 1, 80, 64, 64, &[DType::F16]),
        (2, 1, 160, 17, 33, &[DType::F16]),
        // 6 wide: not a multiple of the vectors, so the per-row kernel on single values.
        (1, 3, 6, 5, 130, &[DType::F32]),
        (2, 2, 64, 100, 3, &[DType::F16]),
    ] {
        let width = heads * d;
        for &dtype in dtypes {
            let tol = if dtype == DType::F32 { 1e-4 } else { 1e-2 };
            let make = |n: usize, offset: f32, cols: usize| {
                let vals: Vec<f32> = values(b * n * cols, offset)
                    .into_iter()
                    .map(|x| x * 0.5)
                    .collect();
                tensor(vals, [b, n, cols], &device, dtype)
            };
            let (q, k, v) = (
                make(n_q, 0.1, width),
                make(n_k, -0.2, width),
                make(n_k, 0.3, width),
            );
            let twin = reference(q.clone(), k.clone(), v.clone(), heads);
            let ours = super::attention(at(&q), at(&k), at(&v), heads, d).expect("runs");
            assert_eq!(ours.dtype(), dtype);
            let rel = relative(&read(ours), &twin);
            assert!(
                rel <= tol,
                "b{b} h{heads} d{d} q{n_q} k{n_k} {dtype:?}: rel {rel}"
            );
            // The per-row kernel ran; the tiled one (the alternative where no row split
            // fits) at one narrow and one wide head, to bound lavapipe's shader compiles.
            let tiled = super::plans(&device, dtype, d)
                .into_iter()
                .find(|p| !p.per_row)
                .expect("a tiled plan");
            if (d, dtype) == (40, DType::F32) || (d, dtype) == (160, DType::F16) {
                let ours = super::attention_planned(at(&q), at(&k), at(&v), heads, d, tiled)
                    .expect("runs");
                let rel = relative(&read(ours), &twin);
                assert!(rel <= tol, "tiled b{b} h{heads} d{d} {dtype:?}: rel {rel}");
            }
            // Every row count of the tiled kernel that fits once (its softmax splits a row
            // over 128 / rows lanes: 16, 8, 4; 64 rows pass lavapipe's workgroup memory in
            // f32), over 77 keys (a partial last tile).
            if (b, d, dtype) == (2, 40, DType::F32) {
                let mut rows = Vec::new();
                for plan in super::plans(&device, dtype, d) {
                    if plan.per_row || rows.contains(&plan.bq) {
                        continue;
                    }
                    rows.push(plan.bq);
                    let ours = super::attention_planned(at(&q), at(&k), at(&v), heads, d, plan)
                        .expect("runs");
                    let rel = relative(&read(ours), &twin);
                    assert!(rel <= tol, "tiled {plan:?}: rel {rel}");
                }
                assert!(rows.len() >= 3, "{rows:?}");
            }

            // Self-attention from one fused projection [q | k | v].
            let qkv = make(n_q, 0.05, 3 * width);
            let part = |i: usize| {
                qkv.clone()
                    .slice([0..b, 0..n_q, i * width..(i + 1) * width])
            };
            let twin = reference(part(0), part(1), part(2), heads);
            let col = |c: usize| Heads {
                tensor: &qkv,
                column: c * width,
            };
            let ours = super::attention(col(0), col(1), col(2), heads, d).expect("runs");
            let rel = relative(&read(ours), &twin);
            assert!(
                rel <= tol,
                "fused b{b} h{heads} d{d} q{n_q} {dtype:?}: rel {rel}"
            );
        }
    }
}

/// Two query rows a lane ([`Plan::paired`]) against burn's attention, a row over 1, 2 and 4
/// lanes (40, 80 and 160 wide: the partial scores of both rows pooled), each over several cubes
/// whose second rows are live, the last cube cut short, and a key count off the tiles.
#[test]
fn paired_rows_match_burn_attention() {
    let device = wgpu();
    let dtype = DType::F16;
    for (b, heads, d, n_q, n_k) in [
        (2, 2, 40, 330, 77),
        (1, 1, 80, 200, 64),
        (2, 1, 160, 100, 33),
    ] {
        let width = heads * d;
        let make = |n: usize, offset: f32| {
            let vals: Vec<f32> = values(b * n * width, offset)
                .into_iter()
                .map(|x| x * 0.5)
                .collect();
            tensor(vals, [b, n, width], &device, dtype)
        };
        let (q, k, v) = (make(n_q, 0.1), make(n_k, -0.2), make(n_k, 0.3));
        let twin = reference(q.clone(), k.clone(), v.clone(), heads);
        let plan = super::default_plan(&device, dtype, d, n_q, n_k).expect("ours");
        let paired = match plan.lane_rows {
            2 => plan,
            _ => plan.paired(2, 32 * 1024).expect("pairs"),
        };
        assert_eq!(paired.lane_rows, 2);
        // More than one cube, and rows past the first half of the last one.
        let rows = paired.bq / 2;
        assert!(n_q > paired.bq && n_q % paired.bq > rows, "d {d}: {paired}");
        let ours =
            super::attention_planned(at(&q), at(&k), at(&v), heads, d, paired).expect("runs");
        let rel = relative(&read(ours), &twin);
        assert!(rel <= 1e-2, "paired b{b} h{heads} d{d} {paired}: rel {rel}");
    }
}

/// The planes kernel moves 8 elements a load only where the plan asks and every head and row
/// starts on 16 bytes: an odd head width, column offset or row width falls back to single
/// elements (the same kernel, compiled for width 1), never a misaligned vector.
#[test]
fn wide_loads_only_where_every_operand_is_aligned() {
    use super::load_width;
    let sd = [0, 320, 640, 960, 960, 960]; // a fused q/k/v projection, 8 heads of 40
    assert_eq!(load_width(true, 40, sd), 8);
    assert_eq!(
        load_width(false, 40, sd),
        1,
        "the plan asks for single elements"
    );
    assert_eq!(load_width(true, 36, sd), 1, "a head of 36");
    assert_eq!(
        load_width(true, 40, [0, 324, 640, 960, 960, 960]),
        1,
        "k at column 324"
    );
    assert_eq!(
        load_width(true, 40, [0, 0, 0, 77, 77, 77]),
        1,
        "rows of 77 elements"
    );
}
