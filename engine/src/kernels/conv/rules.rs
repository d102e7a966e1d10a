//! Which of our convolution kernels take which layers ([`ConvRules`]): the rules in force,
//! process-wide, set by the bench to compare.

/// Which kernel takes a layer on a device with cooperative matrices (f16), by its count of 64 × 64
/// output tiles and its output channels. Measured on an H100 (BENCHMARKS.md, seventeenth session,
/// each shape alone): our split kernel ([`super::cmma`]) is the fastest on the 8×8 maps (40 tiles,
/// the split fills the GPU); our GEMM on the unrolled input ([`super::conv2d_unrolled_gemm`]) beat
/// burn's convolution on every 16×16 map (0.45 against 0.68 ms for 1280→1280), every stride-2
/// layer, and the 1280-channel layer at 32×32; burn's stays faster on the wide maps of 320 and
/// 640 channels (70 against 52 TFLOP/s at 64×64). On whole steps replayed from a captured graph
/// (twenty-second session, five interleaved rounds): the split kernel at 8×8 (≤ 64 tiles) took
/// 35.76 ms a step against 36.62 with the GEMM there; the GEMM up to 400 tiles (37.29) or on
/// every layer (37.76) lost to burn's on the wide maps. Since the GEMM splits the reduction of a
/// small grid (`matmul::GemmKnobs::split_k`), the 8×8 layers run faster on it than on the split
/// kernel: 30.84 against 31.95 ms a step (H100, twenty-sixth session), so the split kernel no
/// longer takes any layer by default on cooperative matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvRules {
    /// Our split kernel for 3×3 layers of at most this many tiles (when it splits them).
    pub split_max_tiles: usize,
    /// Our GEMM for the other 3×3 layers of at most this many tiles …
    pub gemm_max_tiles: usize,
    /// … or of at least this many output channels.
    pub gemm_min_out: usize,
    /// Our GEMM for 1×1 layers (their input read as it lies).
    pub gemm_one_by_one: bool,
    /// The GEMM reads the input of a 3×3 layer of at least this many tiles in place
    /// ([`crate::kernels::matmul::ConvInput`]) instead of unrolling it first, where its
    /// alignment allows (`usize::MAX`: never). Never by default: on an H100 the replayed step
    /// took 34.1 ms with every GEMM layer reading in place against 31.0 unrolled, and the
    /// same (30.9 against 31.0) with only the wide maps in place and all 3×3 layers on the
    /// GEMM; the VAE decode 37.2 against 35.5 ms (BENCHMARKS.md, twenty-seventh session).
    pub implicit_min_tiles: usize,
    /// In f32 on a card (no cooperative matrices, or f16-only ones), the SIMT kernel's 8 × 8 lane
    /// blocks (128 × 128 tiles) for layers of a multiple of 128 channels instead of 4 × 4
    /// ([`super::kernel::tile_block`]): 4 % off an H100's f32 step. Under WGSL in f16 (H200) the
    /// wide blocks made the step 6 % slower, so f16 and software adapters keep 4 × 4
    /// (BENCHMARKS.md, twentieth session).
    pub simt_wide: bool,
    /// In f32 on a card, the SIMT kernel for 1×1 layers too (else burn's convolution: an im2col
    /// and its matmul, 3–9 TFLOP/s). On an H100 it took 6 % off the f32 step (BENCHMARKS.md,
    /// twenty-first session). f16 has its own rule, below.
    pub simt_one_by_one_f32: bool,
    /// In f16 on a card without cooperative matrices, the SIMT kernel for 1×1 layers too (else
    /// burn's convolution: an im2col and its matmul, with layout copies around it). On an H200
    /// (BENCHMARKS.md, thirty-fifth session, the SD 1.5 step replayed, five interleaved rounds)
    /// it took the step from 90.31 to 88.15 ms under WGSL and from 83.38 to 80.86 under SPIR-V
    /// with the cooperative matrices hidden (burn's autotune on plain lanes too).
    pub simt_one_by_one_f16: bool,
    /// The SIMT kernel's staged operands read as vectors of 4 ([`super::vector`]): a lane's
    /// block in `block / 4` vector loads per operand a reduction index (2 for a 4 × 4 block)
    /// instead of `block` single values per operand (8). On an H200
    /// (BENCHMARKS.md, thirty-fourth session, five interleaved rounds) with `simt_prefetch` it
    /// took the f16 step under WGSL from 115.42 to 98.50 ms and the f32 step (8 × 8 blocks)
    /// from 91.15 to 81.91 ms; without the prefetch 98.88 and (4 × 4) 87.06.
    pub simt_vector: bool,
    /// In f16 on a card, the 8 × 8 lane blocks too (as `simt_wide` in f32): with vector staging
    /// 106.43 ms against 98.50 for 4 × 4 under WGSL (H200, thirty-fourth session), so off. Again
    /// in the thirty-sixth (SPIR-V without cooperative matrices): 82.46 ms 32 deep, 83.45 16 deep
    /// with prefetch, against 77.27; one step's profile put f16's 8 × 8 above f16's 4 × 4 on
    /// every 640- and 1280-channel layer, and 20–40 % above f32's 8 × 8 on the same layers
    /// (1280 → 1280 at 32²: 2.85 ms against 2.04). Mostly the prefetch's registers: 16 deep
    /// without it, 78.98 ms against the default's 76.98 (83.20 with it), still behind on the
    /// 1×1 layers and 16² maps.
    pub simt_wide_f16: bool,
    /// With `simt_vector`, the next step's global loads issued before this step's products.
    pub simt_prefetch: bool,
    /// With `simt_vector`, in f16 on a card: 32 reduction indices staged a step instead of 16
    /// (half the barriers), the next step not prefetched. On an H200 (BENCHMARKS.md,
    /// thirty-fifth session, five interleaved rounds) the f16 step took 78.97 ms against 80.65
    /// under SPIR-V without cooperative matrices and 88.01 against 88.09 under WGSL (with the
    /// prefetch: 80.89 and 88.74); in f32 it lost (84.69, with the prefetch 79.77, against
    /// 76.55), so f32 keeps 16.
    pub simt_deep_f16: bool,
    /// With `simt_vector`, 4 × 8 lane blocks (4 channels by 8 pixels, 64 × 128 tiles) on layers
    /// whose tile is 64 channels of 4 × 4 blocks: a third fewer workgroup-memory loads a product.
    /// Off: on an H200 (BENCHMARKS.md, thirty-fifth session, five interleaved rounds) the step
    /// took 96.65 ms against 87.97 under WGSL in f16, 84.29 against 79.24 under SPIR-V without
    /// cooperative matrices, 76.61 against 75.91 in f32.
    pub simt_pixels8: bool,
    /// On cooperative matrices, layers of at least this many 64 × 64 output tiles (3×3 of at
    /// least [`super::route::MIN_OUT_CHANNELS`] outputs, and 1×1) run channels-last on our GEMM
    /// ([`super::channels_last`]), their input read in place as the product's rows, where the
    /// channels allow (`usize::MAX`: never). Every layer (0) by default, and then the 3×3
    /// weights load packed for it ([`super::stored_weight`]). On an H200 (BENCHMARKS.md, forty-third
    /// session, five interleaved rounds, outputs within f16 rounding of the old rules'): SD
    /// 1.5's replayed step 29.05 ms without, 26.33 above 160 tiles (the maps burn's convolution
    /// took), 26.59 on every layer (first call); with the weights loaded packed, 26.08 on every
    /// layer against 26.81 above 160 tiles and 29.52 without (which then relay the weights out
    /// per call); the VAE decode 33.68 → 25.95–26.72 ms; SDXL's step (launch by launch, ±5 ms
    /// between rounds) unchanged at 158–167 ms, its kernels' sum 171.8 → 145.9 ms.
    pub channels_last_min_tiles: usize,
    /// The channels-last GEMM's tile `(pixels, output channels)` (`None`: the GEMM's rule,
    /// [`crate::kernels::matmul::MmaGemm::tiles_for`], which narrows the tile until the grid
    /// has two cubes an SM). 128 × 128 on every layer by default: on an H200 (BENCHMARKS.md,
    /// forty-third session, five interleaved rounds) SD 1.5's replayed step took 25.87 ms
    /// against 26.12 by the GEMM's rule, 25.86 at 128 × 64, 26.04 at 64 × 64, 27.07 at 64 × 128;
    /// the VAE decode 25.73 against 25.85, 30.26, 34.13 and 31.06 (small layers split their
    /// reduction instead).
    pub channels_last_tile: Option<(usize, usize)>,
}

impl ConvRules {
    /// The rules in force unless the bench sets others.
    pub const DEFAULT: ConvRules = ConvRules {
        split_max_tiles: 0,
        gemm_max_tiles: 160,
        gemm_min_out: 1280,
        gemm_one_by_one: true,
        implicit_min_tiles: usize::MAX,
        simt_wide: true,
        simt_one_by_one_f32: true,
        simt_one_by_one_f16: true,
        simt_vector: true,
        simt_wide_f16: false,
        simt_prefetch: true,
        simt_deep_f16: true,
        simt_pixels8: false,
        channels_last_min_tiles: 0,
        channels_last_tile: Some((128, 128)),
    };
    /// The sixteenth session's: our split kernel up to 160 tiles, burn's above, no GEMM.
    pub const SPLIT_ONLY: ConvRules = ConvRules {
        split_max_tiles: 160,
        gemm_max_tiles: 0,
        gemm_min_out: usize::MAX,
        gemm_one_by_one: false,
        implicit_min_tiles: usize::MAX,
        simt_wide: true,
        simt_one_by_one_f32: false,
        simt_one_by_one_f16: false,
        simt_vector: false,
        simt_wide_f16: false,
        simt_prefetch: false,
        simt_deep_f16: false,
        simt_pixels8: false,
        channels_last_min_tiles: usize::MAX,
        channels_last_tile: None,
    };
}

/// The rules in force.
pub fn conv_rules() -> ConvRules {
    RULES.read().map(|r| *r).unwrap_or(ConvRules::DEFAULT)
}

/// Sets [`conv_rules`] process-wide (calls afterwards route by them; the bench compares).
pub fn set_conv_rules(rules: ConvRules) {
    if let Ok(mut r) = RULES.write() {
        *r = rules;
    }
}

static RULES: std::sync::RwLock<ConvRules> = std::sync::RwLock::new(ConvRules::DEFAULT);
