// One token of Inkling's short convolution with the residual inside (wgsl/conv.wgsl at T = 1, same
// order of summation), then the RMSNorm of the row it leaves in y (wgsl/norm.wgsl's rms_norm), in one
// dispatch of one workgroup of 256 invocations over vec4 units (C % 4 == 0), f32:
//   out[c]  = xin[c] + sum_{k<K-1} w[c, k] * state[k, c] + w[c, K-1] * xin[c]
//   y[c]    = y[c] + out[c] (accumulate != 0) or out[c];   state <- (state[1..K-1], xin)
//   xn[c]   = gnorm[c] * (y[c] * inverseSqrt(mean_c(y[c]^2) + eps))
// xin = x, or (`//!IF COMBINE`) the MoE combine of conv.wgsl: sum_s gammas[s] * yr[s, c] +
// sum_j sgammas[j] * ys[j, c], with yr at binding 1 (in place of x).
// Bindings as conv.wgsl's single/combine kernels, plus gnorm at 8 and xn at 9.

struct Params {
    t: u32,         // 1
    c: u32,
    k: u32,
    accumulate: u32,
    top_k: u32,     // COMBINE only
    n_shared: u32,  // COMBINE only
    eps: f32,
    _p1: u32,
}

const MAX_K: u32 = 8u;
const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> state: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<vec4<f32>>;
//!IF COMBINE
@group(0) @binding(5) var<storage, read> gammas: array<f32>;
@group(0) @binding(6) var<storage, read> ys: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> sgammas: array<f32>;
//!END
@group(0) @binding(8) var<storage, read> gnorm: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read_write> xn: array<vec4<f32>>;

var<workgroup> red: array<f32, WG>;

// The input of unit u (channels 4u..4u+3): x, or the MoE combine (COMBINE).
fn ld_in(u: u32, c4: u32) -> vec4<f32> {
//!IF COMBINE
    var s = vec4<f32>(0.0);
    for (var k = 0u; k < p.top_k; k++) {
        s += x[k * c4 + u] * gammas[k];
    }
    for (var j = 0u; j < p.n_shared; j++) {
        s += ys[j * c4 + u] * sgammas[j];
    }
    return s;
//!ELSE
    return x[u];
//!END
}

// Tap k of the four channels of unit u (w is [C, K]).
fn ld_w(u: u32, k: u32) -> vec4<f32> {
    let b = 4u * u * p.k + k;
    return vec4<f32>(w[b], w[b + p.k], w[b + 2u * p.k], w[b + 3u * p.k]);
}

@compute @workgroup_size(256)
fn short_conv_norm(@builtin(local_invocation_id) lid: vec3<u32>) {
    let tid = lid.x;
    let c4 = p.c / 4u;
    let km1 = p.k - 1u;
    var ss = 0.0;
    for (var u = tid; u < c4; u += WG) {
        // every load of the unit first (the window, the taps, the input, y), then the stores
        var win: array<vec4<f32>, MAX_K>;
        var wk: array<vec4<f32>, MAX_K>;
        for (var k = 0u; k < MAX_K; k++) {
            win[k] = vec4<f32>(0.0);
            wk[k] = vec4<f32>(0.0);
            if (k < km1) {
                win[k] = state[k * c4 + u];
            }
            if (k < p.k) {
                wk[k] = ld_w(u, k);
            }
        }
        let xv = ld_in(u, c4);
        var s = vec4<f32>(0.0);
        for (var k = 0u; k < MAX_K; k++) {
            if (k < km1) {
                s += wk[k] * win[k];
            } else if (k == km1) {
                s += wk[k] * xv;
            }
        }
        var o = xv + s;
        if (p.accumulate != 0u) {
            o += y[u];
        }
        y[u] = o;
        for (var k = 0u; k + 1u < MAX_K; k++) {
            if (k + 1u < km1) {
                state[k * c4 + u] = win[k + 1u];
            } else if (k + 1u == km1) {
                state[k * c4 + u] = xv;
            }
        }
        ss += dot(o, o);
    }
    red[tid] = ss;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st = st / 2u) {
        if (tid < st) {
            red[tid] += red[tid + st];
        }
        workgroupBarrier();
    }
    let inv = inverseSqrt(red[0] / f32(p.c) + p.eps);
    for (var u = tid; u < c4; u += WG) {
        xn[u] = gnorm[u] * (y[u] * inv);
    }
}
