//! Bounds for the numbers a user's `config.json` or sidecar supplies. Every field a layer is
//! sized from is checked before anything is built, so a zero or absurd value is a clear error,
//! never a division by zero, an overflow or an allocation of terabytes. The ceilings sit well
//! above every released Stable Diffusion model (SDXL's widest layer is 2048 channels).

use crate::error::Error;

/// Most channels of one layer (also hidden and cross-attention widths).
pub const MAX_WIDTH: usize = 16_384;
/// Most image or latent channels at a model's input or output (9 for inpainting UNets).
pub const MAX_IO_CHANNELS: usize = 64;
/// Most resolution levels of a UNet or VAE.
pub const MAX_LEVELS: usize = 8;
/// Most layers per level or per stack.
pub const MAX_LAYERS: usize = 64;
/// Most normalisation groups or attention heads.
pub const MAX_GROUPS: usize = 1024;

/// `value` in `1..=max`, or an error naming `field`.
pub fn count(field: &str, value: usize, max: usize) -> crate::Result<()> {
    if value == 0 || value > max {
        return Err(Error::Config(format!(
            "{field} is {value}; it must be between 1 and {max}"
        )));
    }
    Ok(())
}

/// Every entry of `values` in `1..=max`, and at least one and at most `most` entries.
pub fn counts(field: &str, values: &[usize], max: usize, most: usize) -> crate::Result<()> {
    count(
        &format!("the number of {field} entries"),
        values.len(),
        most,
    )?;
    values
        .iter()
        .enumerate()
        .try_for_each(|(i, &v)| count(&format!("{field}[{i}]"), v, max))
}

/// A finite `value` with `0 < value <= max`, or an error naming `field`.
pub fn positive(field: &str, value: f64, max: f64) -> crate::Result<()> {
    if !(value.is_finite() && value > 0.0 && value <= max) {
        return Err(Error::Config(format!(
            "{field} is {value}; it must be above 0 and at most {max}"
        )));
    }
    Ok(())
}

/// `width` splits evenly into `parts` (already checked positive), or an error naming both.
pub fn divides(what: &str, width: usize, parts: usize, into: &str) -> crate::Result<()> {
    if parts == 0 || !width.is_multiple_of(parts) {
        return Err(Error::Config(format!(
            "{what} {width} does not split into {parts} {into}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_name_the_field() {
        assert!(count("layers", 1, 4).is_ok());
        let zero = count("layers", 0, 4).expect_err("zero");
        assert!(zero.to_string().contains("layers is 0"), "{zero}");
        assert!(count("layers", 5, 4).is_err());
        assert!(counts("widths", &[], 10, 4).is_err());
        assert!(
            counts("widths", &[1, 0], 10, 4)
                .expect_err("zero")
                .to_string()
                .contains("widths[1]")
        );
        assert!(positive("eps", f64::NAN, 1.0).is_err());
        assert!(positive("eps", 0.0, 1.0).is_err());
        assert!(positive("eps", 1e-5, 1.0).is_ok());
        assert!(divides("width", 320, 0, "groups").is_err());
        assert!(divides("width", 320, 32, "groups").is_ok());
    }
}
