// Elementwise kernels. One invocation per element; elements spread over x and y
// (index = gid.x + gid.y * nwg.x * 256) so counts past 65535 workgroups work.
//
// silu_mul:    out[r*I + i] = silu(g[g_off + r*g_rs + i*g_es]) * u[u_off + r*u_rs + i*u_es]
//              (a fused [P, 2I] gate|up buffer: bind it as g and u, u_off = I, g_rs = u_rs = 2I)
// scale:       x[i] = x[i] / c   (op 0)   or   x[i] = x[i] * c   (op 1)
// argmax_partial / argmax_final: two-pass argmax over V logits, ties -> lowest index, one u32 out.
//              Partials of 1024 logits (one vec4 per invocation when V % 4 == 0: argmax_partial_vec4,
//              else four independent scalar loads), then one workgroup over the partials.
//              Non-finite check: partial k sets part_i[n_partials + k] = 1 when its logits hold a NaN
//              or an Inf; when flag_idx1 != 0 the final pass then sets out_u[flag_idx1 - 1] = 1
//              (it never clears it: the run-time status word of model::status).

struct Params {
    n: u32,      // elements (silu_mul: P*I; scale: n; argmax: V)
    a: u32,      // silu_mul: I; scale: op; argmax: chunk
    b: u32,      // silu_mul: g_off; argmax: n_partials
    c: u32,      // silu_mul: g_rs; argmax: out_idx
    d: u32,      // silu_mul: g_es; argmax: flag_idx1
    e: u32,      // silu_mul: u_off
    f: u32,      // silu_mul: u_rs
    g: u32,      // silu_mul: u_es
    fc: f32,     // scale: the constant
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> in0: array<f32>;
@group(0) @binding(2) var<storage, read> in1: array<f32>;
@group(0) @binding(5) var<storage, read_write> io: array<f32>;
@group(0) @binding(6) var<storage, read_write> part_v: array<f32>;
@group(0) @binding(7) var<storage, read_write> part_i: array<u32>;
@group(0) @binding(8) var<storage, read_write> out_u: array<u32>;
@group(0) @binding(9) var<storage, read> part_v_r: array<f32>;
@group(0) @binding(10) var<storage, read> part_i_r: array<u32>;
@group(0) @binding(11) var<storage, read> logits4: array<vec4<f32>>;

fn flat(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

@compute @workgroup_size(256)
fn silu_mul(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = flat(gid, nwg);
    if (idx >= p.n) {
        return;
    }
    let r = idx / p.a;
    let i = idx % p.a;
    let gv = in0[p.b + r * p.c + i * p.d];
    let uv = in1[p.e + r * p.f + i * p.g];
    io[idx] = gv / (1.0 + exp(-gv)) * uv;
}

@compute @workgroup_size(256)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = flat(gid, nwg);
    if (idx >= p.n) {
        return;
    }
    if (p.a == 0u) {
        io[idx] = io[idx] / p.fc;
    } else {
        io[idx] = io[idx] * p.fc;
    }
}

var<workgroup> rv: array<f32, WG>;
var<workgroup> ri: array<u32, WG>;
var<workgroup> am_bad: atomic<u32>;

// NaN or +-Inf, tested on the bits (`v != v` may be folded away by compilers that assume no NaN).
fn non_finite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) >= 0x7f800000u;
}

fn better(va: f32, ia: u32, vb: f32, ib: u32) -> bool {
    // NaN never wins; an unset slot (index 0xffffffff) always loses.
    if (ia == 0xffffffffu) {
        return false;
    }
    if (ib == 0xffffffffu) {
        return true;
    }
    return va > vb || (va == vb && ia < ib);
}

fn reduce_best(tid: u32, v: f32, i: u32) {
    rv[tid] = v;
    ri[tid] = i;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st = st / 2u) {
        if (tid < st) {
            if (better(rv[tid + st], ri[tid + st], rv[tid], ri[tid])) {
                rv[tid] = rv[tid + st];
                ri[tid] = ri[tid + st];
            }
        }
        workgroupBarrier();
    }
}

// Partial k covers logits [k*chunk, min((k+1)*chunk, V)) with chunk = 4 * WG: four per invocation
// (independent loads); partials spread over x and y.
@compute @workgroup_size(256)
fn argmax_partial(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_id) lid: vec3<u32>) {
    let part = wid.x + wid.y * nwg.x;
    if (part >= p.b) {
        return;
    }
    let tid = lid.x;
    let lo = part * p.a;
    let hi = min(lo + p.a, p.n);
    var bv = 0.0;
    var bi = 0xffffffffu;
    var vals: array<f32, 4>;
    if (tid == 0u) {
        atomicStore(&am_bad, 0u);
    }
    workgroupBarrier();
    for (var k = 0u; k < 4u; k++) {
        let i = lo + tid + k * WG;
        vals[k] = 0.0;
        if (i < hi) {
            vals[k] = in0[i];
        }
    }
    var bad = false;
    for (var k = 0u; k < 4u; k++) {
        let i = lo + tid + k * WG;
        let v = vals[k];
        bad = bad || non_finite(v);
        if (i < hi && v == v && better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    if (bad) {
        atomicOr(&am_bad, 1u);
    }
    reduce_best(tid, bv, bi);
    if (tid == 0u) {
        part_v[part] = rv[0];
        part_i[part] = ri[0];
        part_i[p.b + part] = atomicLoad(&am_bad);
    }
}

// The same with one vec4 load per invocation (V % 4 == 0, logits bound as vec4 at binding 11).
@compute @workgroup_size(256)
fn argmax_partial_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_id) lid: vec3<u32>) {
    let part = wid.x + wid.y * nwg.x;
    if (part >= p.b) {
        return;
    }
    let tid = lid.x;
    let u = part * (p.a / 4u) + tid;
    var bv = 0.0;
    var bi = 0xffffffffu;
    if (tid == 0u) {
        atomicStore(&am_bad, 0u);
    }
    workgroupBarrier();
    if (4u * u < p.n) {
        let v4 = logits4[u];
        var bad = false;
        for (var k = 0u; k < 4u; k++) {
            let v = v4[k];
            bad = bad || non_finite(v);
            if (v == v && better(v, 4u * u + k, bv, bi)) {
                bv = v;
                bi = 4u * u + k;
            }
        }
        if (bad) {
            atomicOr(&am_bad, 1u);
        }
    }
    reduce_best(tid, bv, bi);
    if (tid == 0u) {
        part_v[part] = rv[0];
        part_i[part] = ri[0];
        part_i[p.b + part] = atomicLoad(&am_bad);
    }
}

@compute @workgroup_size(256)
fn argmax_final(@builtin(local_invocation_id) lid: vec3<u32>) {
    let tid = lid.x;
    var bv = 0.0;
    var bi = 0xffffffffu;
    if (tid == 0u) {
        atomicStore(&am_bad, 0u);
    }
    workgroupBarrier();
    var bad = 0u;
    for (var k = tid; k < p.b; k += WG) {
        let v = part_v_r[k];
        let i = part_i_r[k];
        bad |= part_i_r[p.b + k];
        if (better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    if (bad != 0u) {
        atomicOr(&am_bad, 1u);
    }
    reduce_best(tid, bv, bi);
    if (tid == 0u) {
        var r = ri[0];
        if (r == 0xffffffffu) {
            r = 0u; // all NaN
        }
        out_u[p.c] = r;
        if (p.d != 0u && atomicLoad(&am_bad) != 0u) {
            out_u[p.d - 1u] = 1u;
        }
    }
}
