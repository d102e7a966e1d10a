//! latent2rgb for live previews: one lane per pixel turns the first batch item's latent channels
//! into RGB with the family's factors and bias and packs it as an RGBA8 word, so the preview
//! readback moves 4 bytes per pixel. Its twins live with the previews (`preview/packed.rs`):
//! the same with burn ops, and the host reference both are tested against.

use burn::cubecl;
use burn::cubecl::client::Client;
use burn::cubecl::prelude::*;
use burn::cubecl::server::Handle;
use burn::tensor::{DType, Tensor};

use super::{buffer_arg, grid, resolve};

const LANES: usize = 256;

// `clamp` is not among the functions a `#[cube]` kernel can call.
#[allow(clippy::manual_clamp)]
#[cube]
fn to_byte(v: f32) -> u32 {
    let mut t = (v + 1.0) * 0.5;
    if t < 0.0 {
        t = 0.0;
    }
    if t > 1.0 {
        t = 1.0;
    }
    u32::cast_from(f32::round(t * 255.0))
}

/// Lane `i` writes pixel `i`'s word; `coeffs` holds `channels` rows of `(r, g, b)` factors, then
/// the bias.
#[cube(launch)]
fn latent2rgb_pixels(
    latent: &[f32],
    rgba: &mut [u32],
    coeffs: &[f32],
    pixels: usize,
    channels: usize,
) {
    let cube = CUBE_POS_X as usize + CUBE_POS_Y as usize * CUBE_COUNT_X as usize;
    let i = cube * LANES + UNIT_POS as usize;
    if i >= pixels {
        terminate!();
    }
    let mut r = coeffs[channels * 3];
    let mut g = coeffs[channels * 3 + 1];
    let mut b = coeffs[channels * 3 + 2];
    for k in 0..channels {
        let v = latent[k * pixels + i];
        r += v * coeffs[k * 3];
        g += v * coeffs[k * 3 + 1];
        b += v * coeffs[k * 3 + 2];
    }
    rgba[i] = to_byte(r) | (to_byte(g) << 8) | (to_byte(b) << 16) | (255u32 << 24);
}

/// The packed preview of `x0`'s first item: the client and the buffer of `h·w` RGBA8 words.
/// `factors[channel]` maps a latent channel to `[r, g, b]`, then `bias` is added (the preview's
/// factors, passed as numbers so the kernels do not depend on the preview). `None` where the
/// kernel does not run (then the caller packs with burn ops).
pub fn latent2rgb(
    x0: &Tensor<4>,
    factors: &[[f32; 3]],
    bias: [f32; 3],
) -> Option<(Client, Handle)> {
    if !super::available(&x0.device()) {
        return None;
    }
    let [_, c, h, w] = x0.dims();
    let c = c.min(factors.len());
    let pixels = h * w;
    if c == 0 || pixels == 0 {
        return None;
    }
    let (gx, gy) = grid(pixels.div_ceil(LANES))?;
    let x = resolve(x0.clone().slice([0..1, 0..c]).cast(DType::F32))?;
    let client = x.client.clone();
    let mut coeffs: Vec<f32> = factors[..c].iter().flatten().copied().collect();
    coeffs.extend(bias);
    let bytes: Vec<u8> = coeffs.iter().flat_map(|v| v.to_le_bytes()).collect();
    let coeffs = client.create_from_slice(&bytes);
    let out = client.empty(pixels * 4);
    // SAFETY: the lengths are those of the buffers just created.
    let (coeffs_arg, out_arg) = unsafe {
        (
            BufferArg::from_raw_parts(coeffs, (c + 1) * 3),
            BufferArg::from_raw_parts(out.clone(), pixels),
        )
    };
    latent2rgb_pixels::launch(
        &client,
        CubeCount::Static(gx, gy, 1),
        CubeDim::new_1d(LANES as u32),
        buffer_arg(&x),
        out_arg,
        coeffs_arg,
        pixels,
        c,
    );
    Some((client, out))
}
