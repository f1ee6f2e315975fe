// The decoder's residual chain of a one-token step (T = 1) in one dispatch of one workgroup, f32:
//
//   xin[c] = x[c]                                            mode 0 (attn_sconv on o_proj's output)
//          | x[c] * scale                                    mode 1 (the dense MLP's mul_const)
//          | sum_s yr[s, c] * gammas[s] + sum_j ys[j, c] * sg[j]
//                                                            mode 2 (elementwise.wgsl moe_combine with
//                                                            both weightings on; yr bound at x)
//   o[c]   = xin[c] + sum_{k<K-1} w[c, k] * state[k, c] + w[c, K-1] * xin[c]
//                                                            (conv.wgsl short_conv, T = 1, same order)
//   state  <- the window shifted by one, xin[c] newest       (conv.wgsl short_conv)
//   h[c]  += o[c]                                            (short_conv's accumulate)
//   y[c]   = nw[c] * (h[c] * rsqrt(mean(h^2) + eps))         (norm.wgsl rms_norm of the new h)
//   y[c]   = y[c] / div                                      when div != 0 (the head's div_const)
//
// Each invocation owns units u = tid + j * WG (a unit is one channel, or four with the vec4 variant:
// C % 4 == 0, x/h/state/y/nw/yr/ys bound as vec4 arrays; the conv taps and gammas stay f32). The first
// MAX_J units of an invocation keep their new h in registers for the normalisation; any further ones
// re-read the h they wrote. Sum of squares: per-invocation partials, one tree in workgroup memory.

struct Params {
    cu: u32,       // units per row (C, or C / 4 for vec4)
    c: u32,        // channels C
    k: u32,        // conv kernel size K (1..=8)
    mode: u32,     // 0 plain, 1 scaled, 2 moe combine
    top_k: u32,    // mode 2: routed rows
    n_shared: u32, // mode 2: shared rows
    eps: f32,
    scale: f32,    // mode 1
    div: f32,      // 0: none
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

const WG: u32 = 256u;
const MAX_K: u32 = 8u;
const MAX_J: u32 = 8u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> cw: array<f32>;
@group(0) @binding(7) var<storage, read> gammas: array<f32>;
@group(0) @binding(9) var<storage, read> sg: array<f32>;

//!IF VEC4
alias V = vec4<f32>;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> state: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> h: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> nw: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read> ys: array<vec4<f32>>;

fn sq(v: V) -> f32 {
    return dot(v, v);
}

fn zero() -> V {
    return vec4<f32>(0.0);
}

// Tap k of the four channels of unit u (w is [C, K]).
fn tap(u: u32, k: u32) -> V {
    let b = 4u * u * p.k + k;
    return vec4<f32>(cw[b], cw[b + p.k], cw[b + 2u * p.k], cw[b + 3u * p.k]);
}
//!ELSE
alias V = f32;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> state: array<f32>;
@group(0) @binding(4) var<storage, read_write> h: array<f32>;
@group(0) @binding(5) var<storage, read> nw: array<f32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;
@group(0) @binding(8) var<storage, read> ys: array<f32>;

fn sq(v: V) -> f32 {
    return v * v;
}

fn zero() -> V {
    return 0.0;
}

fn tap(u: u32, k: u32) -> V {
    return cw[u * p.k + k];
}
//!END

var<workgroup> red: array<f32, WG>;

// The conv input of unit u.
fn xin(u: u32) -> V {
    if (p.mode == 0u) {
        return x[u];
    }
    if (p.mode == 1u) {
        return x[u] * p.scale;
    }
    var s = zero();
    for (var r = 0u; r < p.top_k; r++) {
        s += x[r * p.cu + u] * gammas[r];
    }
    for (var j = 0u; j < p.n_shared; j++) {
        s += ys[j * p.cu + u] * sg[j];
    }
    return s;
}

// Conv of unit u with its state update and the residual add; returns (and writes) the new h.
fn step_unit(u: u32) -> V {
    let xv = xin(u);
    let km1 = p.k - 1u;
    var win: array<V, MAX_K>;
    var wk: array<V, MAX_K>;
    for (var k = 0u; k < MAX_K; k++) {
        win[k] = zero();
        wk[k] = zero();
        if (k < km1) {
            win[k] = state[k * p.cu + u];
        }
        if (k < p.k) {
            wk[k] = tap(u, k);
        }
    }
    var s = zero();
    for (var k = 0u; k < MAX_K; k++) {
        if (k < km1) {
            s += wk[k] * win[k];
        } else if (k == km1) {
            s += wk[k] * xv;
        }
    }
    let o = xv + s;
    // state[k] = win[k + 1], the newest input last
    for (var k = 0u; k + 1u < MAX_K; k++) {
        if (k + 1u < km1) {
            state[k * p.cu + u] = win[k + 1u];
        } else if (k + 1u == km1) {
            state[k * p.cu + u] = xv;
        }
    }
    let hv = h[u] + o;
    h[u] = hv;
    return hv;
}

fn normed(u: u32, hv: V, inv: f32) -> V {
    let v = nw[u] * (hv * inv);
    if (p.div != 0.0) {
        return v / p.div;
    }
    return v;
}

@compute @workgroup_size(256)
fn sconv_rms_norm(@builtin(local_invocation_id) lid: vec3<u32>) {
    let tid = lid.x;
    var keep: array<V, MAX_J>;
    var a0 = 0.0;
    var a1 = 0.0;
    for (var j = 0u; j < MAX_J; j++) {
        let u = tid + j * WG;
        keep[j] = zero();
        if (u < p.cu) {
            let hv = step_unit(u);
            keep[j] = hv;
            if ((j & 1u) == 0u) {
                a0 += sq(hv);
            } else {
                a1 += sq(hv);
            }
        }
    }
    for (var u = tid + MAX_J * WG; u < p.cu; u += WG) {
        a0 += sq(step_unit(u));
    }
    red[tid] = a0 + a1;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st = st / 2u) {
        if (tid < st) {
            red[tid] += red[tid + st];
        }
        workgroupBarrier();
    }
    let inv = inverseSqrt(red[0] / f32(p.c) + p.eps);
    for (var j = 0u; j < MAX_J; j++) {
        let u = tid + j * WG;
        if (u < p.cu) {
            y[u] = normed(u, keep[j], inv);
        }
    }
    // units past the registers: this invocation wrote their h above (program order makes it visible)
    for (var u = tid + MAX_J * WG; u < p.cu; u += WG) {
        y[u] = normed(u, h[u], inv);
    }
}
