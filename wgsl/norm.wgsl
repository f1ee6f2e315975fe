// RMSNorm family: y = w * (x * rsqrt(mean(x^2) + eps)), any width.
//
// Each row is handled by `tpr` invocations (a power of two <= 256 chosen by the host, about one per
// 4-float unit of the row, so short rows share a workgroup: 256 / tpr rows per workgroup); each
// invocation sums x^2 over a strided share of the row with four independent accumulators, the tpr
// partials are added with a tree in workgroup memory, then the row is scaled. Workgroups are spread
// over x and y (group = wid.x + wid.y * nwg.x) so > 65535 work.
//
// Two variants (`//!IF VEC4` lines, chosen by the host): widths, offsets and strides divisible by 4 bind
// x/y/w/table as vec4 arrays (bf16 tables as vec2<u32>, four values per load); otherwise f32 arrays.
// Offsets and strides in the uniforms are in floats either way.
//
// rms_norm:         y[y_off + r*y_stride + c] = w[c] * x[x_off + r*x_stride + c] * inv_rms(row)
//                   (`//!IF INPLACE` variant: x is read_write and the row is written back to x at
//                   x_off + r*x_stride: the per-head q/k norm, rows = T*heads, width = head_dim)
// embed_norm:       y[t, :] = w * norm(table[ids[t] - row_lo, :]) for ids in [row_lo, row_lo + n_rows)
//                   (one dispatch per table shard; table f32 or bf16 packed two per u32, low half first)

struct Params {
    rows: u32,
    width: u32,
    eps: f32,
    x_off: u32,
    x_stride: u32,
    y_off: u32,
    y_stride: u32,
    // embed_norm only
    row_lo: u32,
    n_rows: u32,
    bf16: u32,
    ids_off: u32,
    tpr: u32,      // invocations per row (power of two, <= 256)
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(5) var<storage, read> ids: array<u32>;

//!IF VEC4
alias V = vec4<f32>;
const UNIT: u32 = 4u;
@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;
//!IF INPLACE
@group(0) @binding(2) var<storage, read_write> x: array<vec4<f32>>;
//!ELSE
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
//!END
@group(0) @binding(3) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> table_f32: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> table_u32: array<vec2<u32>>;

fn sq(v: V) -> f32 {
    return dot(v, v);
}

// Unit e (four values) of the table.
fn table_at(e: u32) -> V {
    if (p.bf16 != 0u) {
        let wd = table_u32[e];
        return vec4<f32>(bitcast<f32>(wd.x << 16u), bitcast<f32>(wd.x & 0xffff0000u),
                         bitcast<f32>(wd.y << 16u), bitcast<f32>(wd.y & 0xffff0000u));
    }
    return table_f32[e];
}
//!ELSE
alias V = f32;
const UNIT: u32 = 1u;
@group(0) @binding(1) var<storage, read> w: array<f32>;
//!IF INPLACE
@group(0) @binding(2) var<storage, read_write> x: array<f32>;
//!ELSE
@group(0) @binding(2) var<storage, read> x: array<f32>;
//!END
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<storage, read> table_f32: array<f32>;
@group(0) @binding(7) var<storage, read> table_u32: array<u32>;

fn sq(v: V) -> f32 {
    return v * v;
}

fn table_at(e: u32) -> V {
    if (p.bf16 != 0u) {
        let word = table_u32[e >> 1u];
        let bits = (word >> ((e & 1u) * 16u)) & 0xffffu;
        return bitcast<f32>(bits << 16u);
    }
    return table_f32[e];
}
//!END

var<workgroup> red: array<f32, WG>;

// Sum of v over each aligned segment of tpr invocations (every invocation gets its segment's sum).
fn seg_sum(tid: u32, v: f32) -> f32 {
    red[tid] = v;
    workgroupBarrier();
    let lane = tid % p.tpr;
    for (var st = p.tpr / 2u; st > 0u; st = st / 2u) {
        if (lane < st) {
            red[tid] += red[tid + st];
        }
        workgroupBarrier();
    }
    let s = red[tid - lane];
    workgroupBarrier();
    return s;
}

fn inv_rms(ss: f32) -> f32 {
    return inverseSqrt(ss / f32(p.width) + p.eps);
}

// Row and lane of this invocation.
fn row_lane(wid: vec3<u32>, nwg: vec3<u32>, tid: u32) -> vec2<u32> {
    let group = wid.x + wid.y * nwg.x;
    return vec2<u32>(group * (WG / p.tpr) + tid / p.tpr, tid % p.tpr);
}

@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_id) lid: vec3<u32>) {
    let tid = lid.x;
    let rl = row_lane(wid, nwg, tid);
    let row = rl.x;
    let lane = rl.y;
    let tpr = p.tpr;
    // rows past the end still take part in the barriers, with nothing to read
    let wu = select(0u, p.width / UNIT, row < p.rows);
    let xb = (p.x_off + row * p.x_stride) / UNIT;
    var a0 = 0.0;
    var a1 = 0.0;
    var a2 = 0.0;
    var a3 = 0.0;
    var c = lane;
    for (; c + 3u * tpr < wu; c += 4u * tpr) {
        let v0 = x[xb + c];
        let v1 = x[xb + c + tpr];
        let v2 = x[xb + c + 2u * tpr];
        let v3 = x[xb + c + 3u * tpr];
        a0 += sq(v0);
        a1 += sq(v1);
        a2 += sq(v2);
        a3 += sq(v3);
    }
    for (; c < wu; c += tpr) {
        a0 += sq(x[xb + c]);
    }
    let inv = inv_rms(seg_sum(tid, (a0 + a1) + (a2 + a3)));
//!IF INPLACE
    for (var c2 = lane; c2 < wu; c2 += tpr) {
        x[xb + c2] = w[c2] * (x[xb + c2] * inv);
    }
//!ELSE
    let yb = (p.y_off + row * p.y_stride) / UNIT;
    for (var c2 = lane; c2 < wu; c2 += tpr) {
        y[yb + c2] = w[c2] * (x[xb + c2] * inv);
    }
//!END
}

@compute @workgroup_size(256)
fn embed_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) lid: vec3<u32>) {
    let tid = lid.x;
    let rl = row_lane(wid, nwg, tid);
    let t = rl.x;
    let lane = rl.y;
    let tpr = p.tpr;
    var in_shard = false;
    var id = 0u;
    if (t < p.rows) {
        id = ids[p.ids_off + t];
        in_shard = id >= p.row_lo && id - p.row_lo < p.n_rows;
    }
    // tokens of other shards (or past the end) still take part in the barriers, reading nothing
    let wu = select(0u, p.width / UNIT, in_shard);
    let base = (id - p.row_lo) * (p.width / UNIT);
    var a0 = 0.0;
    var a1 = 0.0;
    var a2 = 0.0;
    var a3 = 0.0;
    var c = lane;
    for (; c + 3u * tpr < wu; c += 4u * tpr) {
        let v0 = table_at(base + c);
        let v1 = table_at(base + c + tpr);
        let v2 = table_at(base + c + 2u * tpr);
        let v3 = table_at(base + c + 3u * tpr);
        a0 += sq(v0);
        a1 += sq(v1);
        a2 += sq(v2);
        a3 += sq(v3);
    }
    for (; c < wu; c += tpr) {
        a0 += sq(table_at(base + c));
    }
    let inv = inv_rms(seg_sum(tid, (a0 + a1) + (a2 + a3)));
    let yb = (p.y_off + t * p.y_stride) / UNIT;
    for (var c2 = lane; c2 < wu; c2 += tpr) {
        y[yb + c2] = w[c2] * (table_at(base + c2) * inv);
    }
}
