use super::*;

/// SD's 512² image is recorded; larger decodes (768², a batch of two, SDXL's 1024²) are not.
#[test]
fn only_small_decodes_are_recorded() {
    let sd = VaeConfig::sd15();
    assert!(records(&sd, [1, 4, 64, 64]));
    assert!(records(&sd, [1, 4, 48, 80]));
    assert!(!records(&sd, [1, 4, 96, 96]));
    assert!(!records(&sd, [2, 4, 64, 64]));
    assert!(!records(&VaeConfig::sdxl(), [1, 4, 128, 128]));
}

// That replays equal decodes run launch by launch, through the pipeline and directly, is tested
// where the tiny model's decode kernels are compiled already: `tests/model_cache.rs`.
