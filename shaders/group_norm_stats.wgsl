// GroupNorm, pass 1 of 2: per-chunk statistics. Each workgroup reads one chunk of one (batch,
// group) slice, which is contiguous in NCHW, and writes the chunk's mean and M2 (sum of squared
// deviations from that mean). Two passes over the chunk (it is small enough to stay in cache) keep
// the variance accurate where sum-of-squares would cancel catastrophically.
//
// Pass 2 (`group_norm_apply.wgsl`) merges the chunks with Chan's formula and normalises.
// Reference: the plain path, `GroupNorm::forward` in engine/src/nn.rs.

// The host swaps this line for `enable f16; alias T = f16;` for f16 tensors.
alias T = f32;

// All bindings are read_write: CubeCL sub-allocates small tensors from shared buffers, and wgpu
// forbids one buffer being bound read-only and read-write in the same dispatch.
@group(0) @binding(0) var<storage, read_write> x: array<T>;
// [slice][chunk] -> (mean, m2)
@group(0) @binding(1) var<storage, read_write> partial: array<f32>;
// [elements per slice, chunk length, chunks per slice]
@group(0) @binding(2) var<storage, read_write> params: array<u32>;

const LANES: u32 = 256u;
var<workgroup> shared_sum: array<f32, 256>;

fn workgroup_total(lane: u32, value: f32) -> f32 {
    shared_sum[lane] = value;
    workgroupBarrier();
    for (var stride = LANES / 2u; stride > 0u; stride = stride / 2u) {
        if (lane < stride) {
            shared_sum[lane] = shared_sum[lane] + shared_sum[lane + stride];
        }
        workgroupBarrier();
    }
    let total = shared_sum[0];
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(256, 1, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let n = params[0];
    let chunk = params[1];
    let chunks = params[2];
    let slice = wg.y;
    let start = wg.x * chunk;
    let len = min(chunk, n - start);
    let base = slice * n + start;

    var sum = 0.0;
    for (var i = lane; i < len; i = i + LANES) {
        sum = sum + f32(x[base + i]);
    }
    let mean = workgroup_total(lane, sum) / f32(len);

    var m2 = 0.0;
    for (var i = lane; i < len; i = i + LANES) {
        let d = f32(x[base + i]) - mean;
        m2 = m2 + d * d;
    }
    let total_m2 = workgroup_total(lane, m2);

    if (lane == 0u) {
        let at = (slice * chunks + wg.x) * 2u;
        partial[at] = mean;
        partial[at + 1u] = total_m2;
    }
}
