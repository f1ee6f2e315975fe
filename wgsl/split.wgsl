// Column split of a [T, C] f32 matrix into four packed matrices: columns [e_{i-1}, e_i) of row t
// go to out_i[t * (e_i - e_{i-1}) + c - e_{i-1}] (e_{-1} = 0, e_3 = C). One invocation per
// source element; elements spread over x and y (index = gid.x + gid.y * nwg.x * 256).

struct Params {
    n: u32,           // T * C elements
    cols: u32,        // C
    _p0: u32,
    _p1: u32,
    ends: vec4<u32>,  // e_0 .. e_3 (e_3 = C)
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> out0: array<f32>;
@group(0) @binding(3) var<storage, read_write> out1: array<f32>;
@group(0) @binding(4) var<storage, read_write> out2: array<f32>;
@group(0) @binding(5) var<storage, read_write> out3: array<f32>;

@compute @workgroup_size(256)
fn split_columns(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * WG;
    if (idx >= p.n) {
        return;
    }
    let t = idx / p.cols;
    let c = idx % p.cols;
    let e = p.ends;
    let v = src[idx];
    if (c < e.x) {
        out0[t * e.x + c] = v;
    } else if (c < e.y) {
        out1[t * (e.y - e.x) + (c - e.x)] = v;
    } else if (c < e.z) {
        out2[t * (e.z - e.y) + (c - e.y)] = v;
    } else {
        out3[t * (e.w - e.z) + (c - e.z)] = v;
    }
}
