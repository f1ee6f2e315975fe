// RMSNorm family: y = w * (x * rsqrt(mean(x^2) + eps)), one workgroup per row, any width (strided loop).
// Rows are spread over workgroup x and y (row = wid.x + wid.y * nwg.x) so > 65535 rows work.
//
// rms_norm:         y[y_off + r*y_stride + c] = w[c] * x[x_off + r*x_stride + c] * inv_rms(row)
// rms_norm_inplace: the same with x == y (per-head q/k norm: rows = T*heads, width = head_dim)
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
    _pad: u32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> xio: array<f32>;
@group(0) @binding(5) var<storage, read> ids: array<u32>;
@group(0) @binding(6) var<storage, read> table_f32: array<f32>;
@group(0) @binding(7) var<storage, read> table_u32: array<u32>;

var<workgroup> red: array<f32, WG>;
var<workgroup> id_sh: u32;

fn reduce_sum(tid: u32, v: f32) -> f32 {
    red[tid] = v;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st = st / 2u) {
        if (tid < st) {
            red[tid] += red[tid + st];
        }
        workgroupBarrier();
    }
    let s = red[0];
    workgroupBarrier();
    return s;
}

fn inv_rms(ss: f32) -> f32 {
    return inverseSqrt(ss / f32(p.width) + p.eps);
}

@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let tid = lid.x;
    let xb = p.x_off + row * p.x_stride;
    var ss = 0.0;
    for (var c = tid; c < p.width; c += WG) {
        let v = x[xb + c];
        ss += v * v;
    }
    let inv = inv_rms(reduce_sum(tid, ss));
    let yb = p.y_off + row * p.y_stride;
    for (var c = tid; c < p.width; c += WG) {
        y[yb + c] = w[c] * (x[xb + c] * inv);
    }
}

@compute @workgroup_size(256)
fn rms_norm_inplace(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let tid = lid.x;
    let xb = p.x_off + row * p.x_stride;
    var ss = 0.0;
    for (var c = tid; c < p.width; c += WG) {
        let v = xio[xb + c];
        ss += v * v;
    }
    let inv = inv_rms(reduce_sum(tid, ss));
    for (var c = tid; c < p.width; c += WG) {
        xio[xb + c] = w[c] * (xio[xb + c] * inv);
    }
}

fn table_at(e: u32) -> f32 {
    if (p.bf16 != 0u) {
        let word = table_u32[e >> 1u];
        let bits = (word >> ((e & 1u) * 16u)) & 0xffffu;
        return bitcast<f32>(bits << 16u);
    }
    return table_f32[e];
}

@compute @workgroup_size(256)
fn embed_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) lid: vec3<u32>) {
    let t = wid.x + wid.y * nwg.x;
    if (t >= p.rows) {
        return;
    }
    let tid = lid.x;
    if (tid == 0u) {
        id_sh = ids[p.ids_off + t];
    }
    let id = workgroupUniformLoad(&id_sh);
    if (id < p.row_lo || id - p.row_lo >= p.n_rows) {
        return;
    }
    let base = (id - p.row_lo) * p.width;
    var ss = 0.0;
    for (var c = tid; c < p.width; c += WG) {
        let v = table_at(base + c);
        ss += v * v;
    }
    let inv = inv_rms(reduce_sum(tid, ss));
    let yb = p.y_off + t * p.y_stride;
    for (var c = tid; c < p.width; c += WG) {
        y[yb + c] = w[c] * (table_at(base + c) * inv);
    }
}
