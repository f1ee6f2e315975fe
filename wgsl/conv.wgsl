// Causal depthwise short convolution with the residual inside (Inkling ShortConvolution), f32:
//   out[t, c] = x[t, c] + sum_{k<K} w[c, k] * xin[t - (K-1) + k, c]
// xin before this chunk comes from `state` [K-1, C] (oldest -> newest; zeros at sequence start, i.e. after
// the host clears it). Afterwards the state holds the last K-1 inputs. One invocation per channel, looping
// over the T tokens in order, so the state update never races. accumulate != 0: y += out (fuses the
// decoder's residual add `h = h + sconv(a)`), else y = out.
// The `//!IF COMBINE` variant reads its input as the MoE combine of the layer (the moe_combine of
// wgsl/elementwise.wgsl, same order of summation) instead of x:
//   xin[t, c] = sum_{s<top_k} gammas[t*top_k + s] * yr[t*top_k + s, c]
//             + sum_{j<n_shared} sgammas[t*n_shared + j] * ys[t*n_shared + j, c]
// with yr at binding 1 (in place of x), gammas at 5, ys at 6 and sgammas at 7.
//
// Sequence slots: `state` holds one [K-1, C] block per slot; pos.y (binding 9) names the slot of
// the chunk. The `//!IF BATCH` variant runs T tokens of T different slots (a decode batch): token
// t's slot is seq[t].y (binding 10), and its window comes from and goes back to that slot's block
// (T = 1 per slot, so no two tokens share a block).

struct Params {
    t: u32,
    c: u32,
    k: u32,
    accumulate: u32,
    top_k: u32,     // COMBINE only
    n_shared: u32,  // COMBINE only
    _p0: u32,
    _p1: u32,
}

const MAX_K: u32 = 8u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> state: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
//!IF BATCH
@group(0) @binding(10) var<storage, read> seq: array<vec4<u32>>;
const BATCHED: bool = true;
fn slot_of(t: u32) -> u32 {
    return seq[t].y;
}
//!ELSE
@group(0) @binding(9) var<uniform> pos: vec4<u32>;
const BATCHED: bool = false;
fn slot_of(t: u32) -> u32 {
    return pos.y;
}
//!END

// The `//!IF PAIR` variant runs two independent convolutions of the same shape (the attention's k
// and v convs) in one dispatch: workgroups [0, G) run (x, w, state, y), workgroups [G, 2G) run
// (x2, w2, state2, y2), G = ceil(C / 64). Otherwise workgroups [0, G) run the one convolution.
//!IF PAIR
@group(0) @binding(5) var<storage, read> x2: array<f32>;
@group(0) @binding(6) var<storage, read> w2: array<f32>;
@group(0) @binding(7) var<storage, read_write> state2: array<f32>;
@group(0) @binding(8) var<storage, read_write> y2: array<f32>;
const PAIRED: bool = true;
//!ELSE
const PAIRED: bool = false;
//!END
//!IF COMBINE
@group(0) @binding(5) var<storage, read> gammas: array<f32>;
@group(0) @binding(6) var<storage, read> ys: array<f32>;
@group(0) @binding(7) var<storage, read> sgammas: array<f32>;
//!END

// Loads and stores of convolution `second` (always the first without PAIR).
fn ld_x(second: bool, i: u32) -> f32 {
//!IF PAIR
    if (second) {
        return x2[i];
    }
//!END
    return x[i];
}

// The input of token t, channel c: x, or the MoE combine (COMBINE).
fn ld_in(second: bool, t: u32, c: u32) -> f32 {
//!IF COMBINE
    var s = 0.0;
    for (var k = 0u; k < p.top_k; k++) {
        let row = t * p.top_k + k;
        s += x[row * p.c + c] * gammas[row];
    }
    for (var j = 0u; j < p.n_shared; j++) {
        let row = t * p.n_shared + j;
        s += ys[row * p.c + c] * sgammas[row];
    }
    return s;
//!ELSE
    return ld_x(second, t * p.c + c);
//!END
}

fn ld_w(second: bool, i: u32) -> f32 {
//!IF PAIR
    if (second) {
        return w2[i];
    }
//!END
    return w[i];
}

fn ld_state(second: bool, i: u32) -> f32 {
//!IF PAIR
    if (second) {
        return state2[i];
    }
//!END
    return state[i];
}

fn st_state(second: bool, i: u32, v: f32) {
//!IF PAIR
    if (second) {
        state2[i] = v;
        return;
    }
//!END
    state[i] = v;
}

fn st_y(second: bool, i: u32, v: f32) {
//!IF PAIR
    if (second) {
        if (p.accumulate != 0u) {
            y2[i] += v;
        } else {
            y2[i] = v;
        }
        return;
    }
//!END
    if (p.accumulate != 0u) {
        y[i] += v;
    } else {
        y[i] = v;
    }
}

@compute @workgroup_size(64)
fn short_conv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_id) lid: vec3<u32>) {
    let g = wid.x + wid.y * nwg.x;
    let per = (p.c + 63u) / 64u;
    let second = PAIRED && g >= per;
    let c = (g - select(0u, per, second)) * 64u + lid.x;
    if (g >= select(1u, 2u, PAIRED) * per || c >= p.c) {
        return;
    }
    let km1 = p.k - 1u;
    let blk = km1 * p.c;              // floats of one slot's state
    // Loops run to the constant MAX_K with the runtime size as a guard, so they unroll and the window
    // and weights stay in registers (no dynamically indexed private arrays); all loads are independent.
    // win[0..km1) = previous K-1 inputs, oldest first.
    var win: array<f32, MAX_K>;
    var wk: array<f32, MAX_K>;
    for (var k = 0u; k < MAX_K; k++) {
        win[k] = 0.0;
        wk[k] = 0.0;
        if (k < p.k) {
            wk[k] = ld_w(second, c * p.k + k);
        }
    }
    for (var t = 0u; t < p.t; t++) {
        let sb = slot_of(t) * blk;
        if (BATCHED || t == 0u) {
            for (var k = 0u; k < MAX_K; k++) {
                if (k < km1) {
                    win[k] = ld_state(second, sb + k * p.c + c);
                }
            }
        }
        let xv = ld_in(second, t, c);
        var s = 0.0;
        for (var k = 0u; k < MAX_K; k++) {
            if (k < km1) {
                s += wk[k] * win[k];
            } else if (k == km1) {
                s += wk[k] * xv;
            }
        }
        st_y(second, t * p.c + c, xv + s);
        for (var k = 0u; k + 1u < MAX_K; k++) {
            if (k + 1u < km1) {
                win[k] = win[k + 1u];
            } else if (k + 1u == km1) {
                win[k] = xv;
            }
        }
        if (BATCHED || t + 1u == p.t) {
            for (var k = 0u; k < MAX_K; k++) {
                if (k < km1) {
                    st_state(second, sb + k * p.c + c, win[k]);
                }
            }
        }
    }
}
