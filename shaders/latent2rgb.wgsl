// latent2rgb: the cheapest live preview. Projects the predicted clean latent x0 (`channels` planes of
// `pixels` values, f32, contiguous) to RGB with per-family factors, maps [-1, 1] to 0..=255 and
// writes one packed RGBA8 word per pixel (r | g << 8 | b << 16 | 255 << 24), so the readback moves
// 4 bytes per pixel instead of 12 or 16.
//
// Reference twin: `latent2rgb_reference_rgba8` in engine/src/shaders.rs (same formula on the host).

// All bindings are read_write: CubeCL sub-allocates small tensors from shared buffers, and wgpu
// forbids one buffer being bound read-only and read-write in the same dispatch.
@group(0) @binding(0) var<storage, read_write> latent: array<f32>;
@group(0) @binding(1) var<storage, read_write> rgba: array<u32>;
// [pixels, channels]
@group(0) @binding(2) var<storage, read_write> dims: array<u32>;
// factors[channel][r, g, b] row-major, then the bias [r, g, b]
@group(0) @binding(3) var<storage, read_write> coeffs: array<f32>;

const GROUP: u32 = 256u;

fn to_byte(v: f32) -> u32 {
    // WGSL's round() is half-to-even, like the reference's round_ties_even.
    return u32(round(clamp((v + 1.0) * 0.5, 0.0, 1.0) * 255.0));
}

@compute @workgroup_size(256, 1, 1)
fn main(
    @builtin(workgroup_id) group: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let pixels = dims[0];
    let channels = dims[1];
    // Large images dispatch a 2-D grid of groups (65,535 per dimension at most).
    let i = (group.y * groups.x + group.x) * GROUP + lane;
    if (i >= pixels) {
        return;
    }
    var r = coeffs[channels * 3u];
    var g = coeffs[channels * 3u + 1u];
    var b = coeffs[channels * 3u + 2u];
    for (var k = 0u; k < channels; k = k + 1u) {
        let v = latent[k * pixels + i];
        r = r + v * coeffs[k * 3u];
        g = g + v * coeffs[k * 3u + 1u];
        b = b + v * coeffs[k * 3u + 2u];
    }
    rgba[i] = to_byte(r) | (to_byte(g) << 8u) | (to_byte(b) << 16u) | (255u << 24u);
}
