//! Where a linear layer takes the SIMT product ([`super::linear`]), settled per layer as a
//! [`Place`] and decided per call by the process-wide [`ProductRules`] (the bench compares them
//! in one process).

use burn::tensor::DType;

/// Where a layer's device stands for the SIMT product, settled once per layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// A software adapter: ours always runs (burn's matmul autotune would compile and time up to
    /// 33 candidates per shape through LLVM).
    Software,
    /// A card; `plain`: no cooperative matrices for this dtype's products.
    Card { plain: bool },
    /// Not ours: the CPU backend, a dtype we do not take, or switched off.
    Off,
}

/// Which linears on a card take the SIMT product instead of burn's matmul.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProductRules {
    /// f32 on a card: no cooperative matrix takes f32 (an H100's take f16 and bf16), so this is
    /// the plain-lane product either way; ours or burn's.
    pub f32_cards: bool,
    /// f16 on a card without cooperative matrices (the WGSL path: Iris Xe, Meteor Lake).
    pub f16_cards: bool,
    /// On cards, 8 × 8 lane blocks (128-square tiles) where they fit the layer and fill the GPU
    /// ([`wide_fits`]).
    pub wide: bool,
    /// The staging laid along the reduction and read as vectors of 4 ([`super::Tiling`]). Off:
    /// on an H200 (BENCHMARKS.md, thirty-fourth session) it made the SIMT product faster under
    /// WGSL in f16 (the step 98.09 → 96.22 ms) but still slower than burn's matmul there (91.22),
    /// and slower in f32 (77.6 → 79.5 ms a step).
    pub vector: bool,
    /// With `vector`: the next step's global loads issued before this step's products.
    pub prefetch: bool,
}

impl ProductRules {
    /// The rules in force unless the bench sets others.
    pub const DEFAULT: ProductRules = ProductRules {
        f32_cards: true,
        f16_cards: false,
        wide: true,
        vector: false,
        prefetch: false,
    };

    /// The lane block for a layer at `place` in `dtype` with a product `rows × cols` (a GEGLU's
    /// `cols` counted as its output's), or `None` where burn's matmul takes it.
    pub fn block(&self, place: Place, dtype: DType, rows: usize, cols: usize) -> Option<usize> {
        let card = match place {
            Place::Software => return Some(4),
            Place::Off => return None,
            Place::Card { plain } => match dtype {
                DType::F32 => self.f32_cards,
                DType::F16 => plain && self.f16_cards,
                _ => false,
            },
        };
        card.then_some(if self.wide && wide_fits(rows, cols) {
            8
        } else {
            4
        })
    }
}

/// Fewest 128-square tiles for 8 × 8 lane blocks: about one per SM of an H100 (132).
const WIDE_MIN_TILES: usize = 120;

/// Whether 128-square tiles cover `rows × cols` with at most an eighth more than it (960
/// columns, q, k and v at 320, do; 320 columns or the 154 context rows do not) and are at least
/// [`WIDE_MIN_TILES`]. Measured on an H100 in f32 (BENCHMARKS.md, twenty-first session, each
/// SD 1.5 linear alone): 8 × 8 blocks 10–25 % faster on the shapes of 120 tiles and more, 5–140 %
/// slower on the 8×8 level's 128 rows, the 16×16 level's square layers (40 tiles) and 320
/// columns.
pub fn wide_fits(rows: usize, cols: usize) -> bool {
    let tiles = rows.div_ceil(128) * cols.div_ceil(128);
    let covered = tiles * 128 * 128;
    covered * 8 <= rows * cols * 9 && tiles >= WIDE_MIN_TILES
}

/// The rules in force.
pub fn product_rules() -> ProductRules {
    RULES.read().map(|r| *r).unwrap_or(ProductRules::DEFAULT)
}

/// Sets [`product_rules`] process-wide (calls afterwards route by them).
pub fn set_product_rules(rules: ProductRules) {
    if let Ok(mut r) = RULES.write() {
        *r = rules;
    }
}

static RULES: std::sync::RwLock<ProductRules> = std::sync::RwLock::new(ProductRules::DEFAULT);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_tiles_only_where_they_fit() {
        assert!(wide_fits(8192, 960), "q, k and v at 320 channels");
        assert!(wide_fits(2048, 1920));
        assert!(!wide_fits(8192, 320), "2.5 tiles of columns");
        assert!(!wide_fits(154, 1280), "the context's keys and values");
        assert!(wide_fits(512, 3840), "120 tiles");
        assert!(!wide_fits(512, 1280), "40 tiles do not fill the GPU");
        assert!(!wide_fits(128, 5120));
    }

    #[test]
    fn software_always_cards_by_rule() {
        let rules = ProductRules {
            f32_cards: true,
            f16_cards: false,
            wide: true,
            vector: false,
            prefetch: false,
        };
        let card = Place::Card { plain: false };
        assert_eq!(rules.block(Place::Software, DType::F16, 8192, 640), Some(4));
        assert_eq!(rules.block(Place::Off, DType::F32, 8192, 640), None);
        assert_eq!(rules.block(card, DType::F32, 8192, 640), Some(8));
        assert_eq!(rules.block(card, DType::F32, 8192, 320), Some(4));
        assert_eq!(
            rules.block(card, DType::F16, 8192, 640),
            None,
            "f16 cards off"
        );
        let plain = ProductRules {
            f16_cards: true,
            ..rules
        };
        assert_eq!(
            plain.block(card, DType::F16, 8192, 640),
            None,
            "cooperative matrices"
        );
        assert_eq!(
            plain.block(Place::Card { plain: true }, DType::F16, 8192, 640),
            Some(8)
        );
        let narrow = ProductRules {
            wide: false,
            ..rules
        };
        assert_eq!(narrow.block(card, DType::F32, 8192, 640), Some(4));
    }
}
