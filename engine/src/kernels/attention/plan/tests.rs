use super::{Fragment, Plan};

/// The planes kernel: a row's lanes divide the key tile and padded width, the cube stays
/// within the lanes and workgroup memory allowed, and widths no tiling fits get none.
#[test]
fn plane_plans_fit() {
    let square = Fragment {
        m: 16,
        n: 16,
        k: 16,
    };
    let first = |d: usize| {
        Plan::on_planes(d, 2, square, 32, 256, 48 * 1024, false)
            .first()
            .copied()
    };
    let p = first(40).expect("fits");
    assert_eq!((p.bq, p.bk, p.dp, p.plane), (64, 64, 48, Some(32)));
    // 16-byte loads with the next tile prefetched first, then each backed out.
    let first_variants: Vec<_> = Plan::on_planes(40, 2, square, 32, 256, 48 * 1024, false)
        .iter()
        .take(4)
        .map(|p| (p.bq, p.bk, p.wide_loads, p.prefetch))
        .collect();
    assert_eq!(
        first_variants,
        [
            (64, 64, true, true),
            (64, 64, true, false),
            (64, 64, false, false),
            (64, 64, false, true)
        ]
    );
    assert!(p.shared_bytes(2) <= 48 * 1024);
    // 80 wide: 64 keys would pass 48 KiB; 16 was the faster of the rest.
    assert_eq!(first(80).map(|p| (p.bq, p.bk)), Some((64, 16)));
    // 160 wide: only two planes over 16 keys fit.
    assert_eq!(first(160).map(|p| (p.bq, p.bk)), Some((32, 16)));
    assert!(first(208).is_none());
    for p in Plan::on_planes(64, 2, square, 32, 128, 48 * 1024, false) {
        assert!(p.bq / 16 * 32 <= 128 && p.to_string().contains("planes"));
    }
    // A plane narrower than the fragment's rows, or an odd split, gets nothing.
    assert!(Plan::on_planes(40, 2, square, 8, 256, 48 * 1024, false).is_empty());
    assert!(Plan::on_planes(40, 2, square, 48, 256, 48 * 1024, false).is_empty());
    // Intel's 8×16×16 on 16-lane planes: two lanes a row, 8 rows a plane.
    let arc = Fragment { m: 8, n: 16, k: 16 };
    let p = Plan::on_planes(40, 2, arc, 16, 256, 48 * 1024, false)[0];
    assert_eq!((p.bq, p.bk), (32, 64));
}

/// Where the device offers per-element operations, the planes plans with tiles in registers
/// come first (four planes over 32 keys first), the round trip's after them; a fragment whose
/// scores cannot be the next left operand (16×8×16: scores 16 × 8, operand 16 × 16) gets
/// none.
#[test]
fn register_plans_come_first_where_offered() {
    let square = Fragment {
        m: 16,
        n: 16,
        k: 16,
    };
    let all = Plan::on_planes(40, 2, square, 32, 256, 48 * 1024, true);
    let first = all[0];
    assert!(first.elementwise && first.wide_loads && first.prefetch);
    assert_eq!((first.bq, first.bk), (64, 32));
    assert!(first.to_string().contains("registers"));
    let split = all
        .iter()
        .position(|p| !p.elementwise)
        .expect("round trip plans");
    assert!(all[split..].iter().all(|p| !p.elementwise));
    assert_eq!(
        all[split..].to_vec(),
        Plan::on_planes(40, 2, square, 32, 256, 48 * 1024, false)
    );
    // 160 wide: the one tiling that fits, in registers first.
    let wide = Plan::on_planes(160, 2, square, 32, 256, 48 * 1024, true);
    assert_eq!(
        (wide[0].bq, wide[0].bk, wide[0].elementwise),
        (32, 16, true)
    );
    let narrow = Fragment { m: 16, n: 8, k: 16 };
    let plans = Plan::on_planes(40, 2, narrow, 32, 256, 48 * 1024, true);
    assert!(!plans.is_empty() && plans.iter().all(|p| !p.elementwise));
}

/// The wide-head kernel's tilings: only past the planes kernel's widths, each plane's slice
/// whole fragments, a row's softmax lanes within one plane, within the lanes and workgroup
/// memory allowed; none where a plane is too narrow for a fragment's rows.
#[test]
fn wide_head_plans_fit() {
    let square = Fragment {
        m: 16,
        n: 16,
        k: 16,
    };
    let plans = Plan::on_planes_wide(512, 2, square, 32, 256, 48 * 1024);
    let tiles: Vec<_> = plans.iter().map(|p| (p.parts, p.bq, p.bk)).collect();
    assert_eq!(tiles, [(8, 32, 16), (4, 16, 32), (8, 16, 16)]);
    for p in &plans {
        assert_eq!(p.dp, 512);
        assert!(p.shared_bytes(2) <= 48 * 1024, "{p}");
        assert!(p.to_string().contains("wide-head"), "{p}");
        assert!(p.plane == Some(32) && p.fragment.is_some() && !p.per_row);
    }
    // 128 lanes a cube at most: only the 4-plane tiling.
    let few = Plan::on_planes_wide(512, 2, square, 32, 128, 48 * 1024);
    assert_eq!(few.iter().map(|p| p.parts).collect::<Vec<_>>(), [4]);
    // An odd width pads each plane's slice to whole fragments.
    let odd = Plan::on_planes_wide(500, 2, square, 32, 256, 48 * 1024);
    assert!(
        odd.iter()
            .all(|p| p.dp >= 500 && (p.dp / p.parts) % 16 == 0)
    );
    assert!(Plan::on_planes_wide(160, 2, square, 32, 256, 48 * 1024).is_empty());
    assert!(Plan::on_planes_wide(512, 2, square, 8, 256, 48 * 1024).is_empty());
    assert!(Plan::on_planes_wide(512, 2, square, 32, 256, 16 * 1024).is_empty());
}

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
        assert!(p.bq.is_multiple_of(16) && p.bk.is_multiple_of(16));
    }
    let arc = Some(Fragment { m: 8, n: 16, k: 16 });
    let p = Plan::choose(40, 2, arc, 48 * 1024).expect("fits");
    assert_eq!(p.dp, 48);
    assert!(Plan::choose(512, 2, square, 48 * 1024).is_none());
    assert_eq!(Plan::choose(40, 4, None, 48 * 1024).map(|p| p.dp), Some(40));
    // Plain lanes: the per-row kernel, a row split over lanes past 64 columns; a head no
    // split fits (prime width) gets tiles.
    for (d, parts) in [(40, 1), (64, 1), (80, 2), (128, 2), (160, 4), (512, 8)] {
        let p = Plan::choose(d, 2, None, 48 * 1024).expect("fits");
        assert!(p.per_row, "d {d}");
        assert_eq!(p.parts, parts, "d {d}");
        assert_eq!(d % p.parts, 0);
        assert!(p.shared_bytes(2) <= 48 * 1024);
    }
    let p = Plan::choose(131, 2, None, 48 * 1024).expect("fits");
    assert!(!p.per_row);
    assert!(
        Plan::fitting(40, 2, square, 48 * 1024)
            .iter()
            .all(|p| !p.per_row)
    );
}
