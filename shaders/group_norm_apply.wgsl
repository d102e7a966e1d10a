// GroupNorm, pass 2 of 2, with the SiLU that follows it in every resnet fused in: merges the
// per-chunk statistics of `group_norm_stats.wgsl` (Chan's parallel formula), then writes
// `act((x - mean) / sqrt(var + eps) * gamma[c] + beta[c])` for one tile of one (batch, group)
// slice. Statistics and arithmetic are f32 whatever T is, as in the plain path.
//
// Reference: the plain path, `GroupNorm::forward` then `silu`, in engine/src/nn.rs.

// The host swaps this line for `enable f16; alias T = f16;` for f16 tensors.
alias T = f32;

@group(0) @binding(0) var<storage, read_write> x: array<T>;
@group(0) @binding(1) var<storage, read_write> y: array<T>;
@group(0) @binding(2) var<storage, read_write> partial: array<f32>;
@group(0) @binding(3) var<storage, read_write> gamma: array<f32>;
@group(0) @binding(4) var<storage, read_write> beta: array<f32>;
// [elements per slice, chunk length, chunks per slice, h*w, channels per group, groups,
//  apply SiLU (0/1), eps as f32 bits]
@group(0) @binding(5) var<storage, read_write> params: array<u32>;

const LANES: u32 = 256u;
// Elements per thread: a tile is LANES * PER_LANE elements of one slice.
const PER_LANE: u32 = 16u;

var<workgroup> s_count: array<f32, 256>;
var<workgroup> s_mean: array<f32, 256>;
var<workgroup> s_m2: array<f32, 256>;

struct Stats {
    count: f32,
    mean: f32,
    m2: f32,
}

fn merge(a: Stats, b: Stats) -> Stats {
    let count = a.count + b.count;
    if (count == 0.0) {
        return a;
    }
    let delta = b.mean - a.mean;
    let mean = a.mean + delta * (b.count / count);
    let m2 = a.m2 + b.m2 + delta * delta * (a.count * b.count / count);
    return Stats(count, mean, m2);
}

@compute @workgroup_size(256, 1, 1)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let n = params[0];
    let chunk = params[1];
    let chunks = params[2];
    let hw = params[3];
    let per_group = params[4];
    let groups = params[5];
    let act = params[6];
    let eps = bitcast<f32>(params[7]);
    let slice = wg.y;

    // Every workgroup of a slice merges the slice's chunk statistics (a few hundred values, cached).
    var acc = Stats(0.0, 0.0, 0.0);
    for (var k = lane; k < chunks; k = k + LANES) {
        let len = min(chunk, n - k * chunk);
        let at = (slice * chunks + k) * 2u;
        acc = merge(acc, Stats(f32(len), partial[at], partial[at + 1u]));
    }
    s_count[lane] = acc.count;
    s_mean[lane] = acc.mean;
    s_m2[lane] = acc.m2;
    workgroupBarrier();
    for (var stride = LANES / 2u; stride > 0u; stride = stride / 2u) {
        if (lane < stride) {
            let m = merge(
                Stats(s_count[lane], s_mean[lane], s_m2[lane]),
                Stats(s_count[lane + stride], s_mean[lane + stride], s_m2[lane + stride]),
            );
            s_count[lane] = m.count;
            s_mean[lane] = m.mean;
            s_m2[lane] = m.m2;
        }
        workgroupBarrier();
    }
    let mean = s_mean[0];
    // Biased variance, as torch's GroupNorm.
    let inv_std = inverseSqrt(s_m2[0] / f32(n) + eps);
    let first_channel = (slice % groups) * per_group;

    let tile = wg.x * LANES * PER_LANE;
    for (var k = 0u; k < PER_LANE; k = k + 1u) {
        let i = tile + k * LANES + lane;
        if (i < n) {
            let c = first_channel + i / hw;
            var v = (f32(x[slice * n + i]) - mean) * inv_std * gamma[c] + beta[c];
            if (act != 0u) {
                v = v / (1.0 + exp(-v));
            }
            y[slice * n + i] = T(v);
        }
    }
}
