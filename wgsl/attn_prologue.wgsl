// Attention prologue of a chunk of T >= 1 tokens, f32, in one dispatch: q_norm on the raw q rows (in
// place), the k and v short convs (residual inside) of every KV head with the conv history in a ring,
// then k_norm, writing k_new / v_new for attention.wgsl's `attn` and `attn_append`. The fused one-token
// kernel (attention.wgsl, `//!IF FUSED`) keeps the same ring, so a sequence can mix both.
//
//   q[t, hh, :]    = q_norm * q[t, hh, :] * rsqrt(mean(q^2) + eps)
//   k_new[t, c]    = k_norm(k_raw[t, c] + sum_{k<K} wk[c, k] * kin[pos0 + t - (K-1) + k, c])  (per KV head)
//   v_new[t, c]    =        v_raw[t, c] + sum_{k<K} wv[c, k] * vin[pos0 + t - (K-1) + k, c]
//
// Layouts: q [T, H, D], k_raw / v_raw / k_new / v_new [T, C] (C = KVH * D), `consts` = the layer's
// attention constants [rel_proj (d_rel * extent) | q_norm D | k_norm D | k conv w [C, K] | v conv w
// [C, K]], caches [cap + K, C] of which only the conv ring (the last K rows) is touched here: ring row
// p % K holds the raw input of absolute position p (zeros before the sequence: the host clears the ring
// with the conv states). pos.x = pos0; pos.y = the sequence slot, whose cache rows start at row
// pos.y * slot_rows.
//
// Workgroups [0, KVH): KV head g, invocation e < D owns channel g * D + e and runs the T tokens in
// order (the ring is read before it is written, by the same invocation); [KVH, KVH + T * H): one q row
// each. Rows are reduced with a tree in workgroup memory (D <= 256).

struct Params {
    t: u32,
    h: u32,
    kvh: u32,
    d: u32,
    d_rel: u32,
    extent: u32,
    window: u32,
    cap: u32,
    use_tau: u32,
    alpha: f32,
    n_floor: f32,
    slot_rows: u32, // cache rows per sequence slot: slot s's rows start at row s * slot_rows
}

struct FusedParams {
    eps: f32,
    conv_k: u32,
    _p0: u32,
    _p1: u32,
}

const WG: u32 = 256u;
const MAX_CK: u32 = 8u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> pos: vec4<u32>;
@group(0) @binding(2) var<storage, read_write> q: array<f32>;
@group(0) @binding(3) var<storage, read> k_raw: array<f32>;
@group(0) @binding(4) var<storage, read> v_raw: array<f32>;
@group(0) @binding(6) var<storage, read> consts: array<f32>;
@group(0) @binding(7) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(8) var<storage, read_write> v_cache: array<f32>;
@group(0) @binding(10) var<storage, read_write> k_new: array<f32>;
@group(0) @binding(11) var<storage, read_write> v_new: array<f32>;
@group(0) @binding(12) var<uniform> fp: FusedParams;

var<workgroup> red: array<f32, WG>;

// Sum of v over the workgroup (every invocation gets it).
fn wg_sum(tid: u32, v: f32) -> f32 {
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
    return inverseSqrt(ss / f32(p.d) + fp.eps);
}

@compute @workgroup_size(256)
fn attn_prologue(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_id) lid: vec3<u32>) {
    let item = wid.x + wid.y * nwg.x;
    if (item >= p.kvh + p.t * p.h) {
        return;
    }
    let e = lid.x;
    let d = p.d;
    let live = e < d;
    let off_qn = p.d_rel * p.extent;
    let off_kn = off_qn + d;
    if (item >= p.kvh) {
        let b = (item - p.kvh) * d;
        var x = 0.0;
        if (live) {
            x = q[b + e];
        }
        let inv = inv_rms(wg_sum(e, x * x));
        if (live) {
            q[b + e] = consts[off_qn + e] * (x * inv);
        }
        return;
    }
    let row = p.kvh * d;
    let c = item * d + e;
    let ring0 = (pos.y * p.slot_rows + p.cap) * row;
    let kk = fp.conv_k;
    let km1 = kk - 1u;
    let off_kw = off_kn + d;
    let off_vw = off_kw + row * kk;
    let pos0 = pos.x;
    // windows (oldest first) and weights in registers, as conv.wgsl: loops to the constant MAX_CK
    var win_k: array<f32, MAX_CK>;
    var win_v: array<f32, MAX_CK>;
    var wk: array<f32, MAX_CK>;
    var wv: array<f32, MAX_CK>;
    for (var k = 0u; k < MAX_CK; k++) {
        win_k[k] = 0.0;
        win_v[k] = 0.0;
        wk[k] = 0.0;
        wv[k] = 0.0;
        if (live && k < km1) {
            let slot = ring0 + ((pos0 + 1u + k) % kk) * row + c;
            win_k[k] = k_cache[slot];
            win_v[k] = v_cache[slot];
        }
        if (live && k < kk) {
            wk[k] = consts[off_kw + c * kk + k];
            wv[k] = consts[off_vw + c * kk + k];
        }
    }
    for (var t = 0u; t < p.t; t++) {
        var kx = 0.0;
        var vx = 0.0;
        if (live) {
            kx = k_raw[t * row + c];
            vx = v_raw[t * row + c];
        }
        var sk = 0.0;
        var sv = 0.0;
        for (var k = 0u; k < MAX_CK; k++) {
            if (k < km1) {
                sk += wk[k] * win_k[k];
                sv += wv[k] * win_v[k];
            } else if (k == km1) {
                sk += wk[k] * kx;
                sv += wv[k] * vx;
            }
        }
        let ky = kx + sk;
        let vy = vx + sv;
        let inv = inv_rms(wg_sum(e, ky * ky));
        if (live) {
            let slot = ring0 + ((pos0 + t) % kk) * row + c;
            k_cache[slot] = kx;
            v_cache[slot] = vx;
            k_new[t * row + c] = consts[off_kn + e] * (ky * inv);
            v_new[t * row + c] = vy;
        }
        for (var k = 0u; k + 1u < MAX_CK; k++) {
            if (k + 1u < km1) {
                win_k[k] = win_k[k + 1u];
                win_v[k] = win_v[k + 1u];
            } else if (k + 1u == km1) {
                win_k[k] = kx;
                win_v[k] = vx;
            }
        }
    }
}
