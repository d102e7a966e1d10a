use super::*;

/// Cores partition every axis: in order, no gap or overlap, from 0 to `len`, each at most a
/// tile, as few as can be, lengths within one of each other.
#[test]
fn cores_partition_every_axis() {
    for tile in [1, 2, 3, 4, 6, 7, 8, 16, 64] {
        for len in 0..=5 * tile + 17 {
            let spans = core_spans(len, tile);
            let what = format!("len {len}, tile {tile}: {spans:?}");
            assert_eq!(spans.len(), len.div_ceil(tile).max(1), "{what}");
            assert_eq!(spans[0].start, 0, "{what}");
            assert_eq!(spans.last().map(|s| s.end), Some(len), "{what}");
            for pair in spans.windows(2) {
                assert_eq!(pair[0].end, pair[1].start, "{what}");
            }
            let lens: Vec<usize> = spans.iter().map(|s| s.len()).collect();
            let (min, max) = (lens.iter().min(), lens.iter().max());
            assert!(max <= Some(&tile), "{what}");
            assert!(max.zip(min).is_some_and(|(a, b)| a - b <= 1), "{what}");
        }
    }
    assert_eq!(core_spans(20, 6), vec![0..5, 5..10, 10..15, 15..20]);
    assert_eq!(core_spans(16, 6), vec![0..5, 5..10, 10..16]);
    assert_eq!(core_spans(5, 64), vec![0..5]);
}

/// The halo a core needs beyond its edges at the input of `blocks[first]`, found by walking
/// one output pixel's dependencies back through every layer, for every output pixel of cores
/// at several alignments.
fn brute_force_halo(blocks: &[BlockConvs], first: usize) -> usize {
    // The layers from blocks[first] on, then conv_out; `true` is a ×2 upsampling.
    let mut steps = Vec::new();
    for block in &blocks[first..] {
        steps.extend(std::iter::repeat_n(false, block.convs));
        if block.upsample {
            steps.extend([true, false]);
        }
    }
    steps.push(false);
    let scale = 1i64 << steps.iter().filter(|up| **up).count();
    let mut worst = 0;
    for start in 20..24i64 {
        for len in 1..4 {
            let core = start..start + len;
            for p in core.start * scale..core.end * scale {
                let (mut lo, mut hi) = (p, p); // inclusive, at the current resolution
                for up in steps.iter().rev() {
                    (lo, hi) = if *up {
                        (lo.div_euclid(2), hi.div_euclid(2))
                    } else {
                        (lo - 1, hi + 1)
                    };
                }
                worst = worst.max(core.start - lo).max(hi - (core.end - 1));
            }
        }
    }
    worst as usize
}

/// The halos are the receptive field exactly: enough, and no more, at every block.
#[test]
fn halos_are_the_receptive_field() {
    let sd = decoder_blocks(&VaeConfig::sd15());
    assert_eq!(block_halos(&sd), vec![13, 12, 10, 7]);
    assert_eq!(halo_latents(&VaeConfig::sd15()), 13);
    let tiny = VaeConfig {
        block_out_channels: vec![16, 32, 32, 32],
        layers_per_block: 1,
        norm_num_groups: 8,
        ..VaeConfig::sd15()
    };
    assert_eq!(halo_latents(&tiny), 9);
    let odd = vec![
        BlockConvs {
            convs: 1,
            upsample: true,
        },
        BlockConvs {
            convs: 0,
            upsample: true,
        },
        BlockConvs {
            convs: 3,
            upsample: true,
        },
        BlockConvs {
            convs: 2,
            upsample: false,
        },
    ];
    for blocks in [sd, decoder_blocks(&tiny), odd] {
        let halos = block_halos(&blocks);
        for (i, halo) in halos.iter().enumerate() {
            assert_eq!(*halo, brute_force_halo(&blocks, i), "{blocks:?}, block {i}");
        }
    }
}

/// Halos grow and clip at the border; a convolution costs a ring only where it is not at the
/// border.
#[test]
fn rects_grow_clip_and_lose_a_ring_per_convolution() {
    let size = [16, 20];
    let core = Rect {
        rows: 0..5,
        cols: 10..15,
    };
    let held = core.grown(3, size);
    assert_eq!(
        held,
        Rect {
            rows: 0..8,
            cols: 7..18
        }
    );
    assert_eq!(
        held.after_conv3x3(size),
        Rect {
            rows: 0..7,
            cols: 8..17
        }
    );
    let whole = Rect {
        rows: 0..16,
        cols: 0..20,
    };
    assert_eq!(core.grown(99, size), whole);
    assert_eq!(
        whole.after_conv3x3(size),
        whole,
        "the border keeps its zero padding"
    );
    assert!(held.contains(&core) && !core.contains(&held));
    assert_eq!(held.locate(&core), [0..5, 3..8]);
    assert_eq!(
        core.scaled(2),
        Rect {
            rows: 0..10,
            cols: 20..30
        }
    );
}

/// SD 1.5's largest decoder buffer is 256 channels at full resolution (256 MiB at 512²), so
/// under WebGPU's 128 MiB a 512² decode tiles, in tiles of 40 latents (a 320-pixel core plus
/// 20-pixel halos: 362² × 256 channels in f32 is just under 128 MiB); without a limit the
/// setting is unchanged.
#[test]
fn tiles_shrink_to_fit_the_device() {
    let vae = VaeConfig::sd15();
    assert_eq!(
        largest_decoder_buffer_bytes(&vae, [1, 4, 64, 64]),
        256 << 20
    );
    let fitted = TilingConfig::default().fit_to(&vae, 1, 128 << 20);
    assert_eq!(fitted.tile_latents, 40);
    assert_eq!(fitted.auto_max_buffer_bytes, 128 << 20);
    assert!(tile_buffer_bytes(&vae, 1, 40) <= 128 << 20);
    assert!(tile_buffer_bytes(&vae, 1, 41) > 128 << 20);
    assert!(fitted.should_tile(&vae, [1, 4, 64, 64]));
    let host = TilingConfig::default().fit_to(&vae, 1, u64::MAX);
    assert_eq!(host, TilingConfig::default());
}

#[test]
fn modes_parse_and_decide() {
    assert_eq!("auto".parse(), Ok(TilingMode::Auto));
    assert_eq!("on".parse(), Ok(TilingMode::Always));
    assert_eq!("off".parse(), Ok(TilingMode::Never));
    assert!("maybe".parse::<TilingMode>().is_err());
    let vae = VaeConfig::sd15();
    let auto = TilingConfig::default();
    // 512x512 and 768x768 decode whole; SDXL's 1024x1024 and 1152x896 and 1024x1536 are tiled.
    assert!(!auto.should_tile(&vae, [1, 4, 64, 64]));
    assert!(!auto.should_tile(&vae, [1, 4, 96, 96]));
    assert!(auto.should_tile(&vae, [1, 4, 128, 128]));
    assert!(auto.should_tile(&vae, [1, 4, 112, 144]));
    assert!(auto.should_tile(&vae, [1, 4, 192, 128]));
    assert_eq!(auto.tile_count([1, 4, 192, 128]), 6);
    // A small buffer limit tiles 768x768 too (its full-resolution activations are 576 MiB).
    let small = TilingConfig {
        auto_max_buffer_bytes: 128 << 20,
        ..auto
    };
    assert!(small.should_tile(&vae, [1, 4, 96, 96]));
    let always = TilingConfig::with_mode(TilingMode::Always);
    assert!(always.should_tile(&vae, [1, 4, 65, 8]));
    assert!(
        !always.should_tile(&vae, [1, 4, 64, 64]),
        "one tile is no tiling"
    );
    let never = TilingConfig::with_mode(TilingMode::Never);
    assert!(!never.should_tile(&vae, [1, 4, 1024, 1024]));
}
