// MoE router, everything f32, one workgroup per token; experts are looped with stride so any count works.
// Top-k by rank: each invocation counts, for its experts, how many experts beat them (E shared-memory
// reads, no barriers), and the experts of rank < k are the choice; no k rounds of tree reductions.
//   choose = topk(sigmoid(L[:E]) + bias, top_k)            (ties -> lower index)
//   sel    = [L[chosen], L[E:E+S]]
//   w      = sigmoid(sel) / sum(sigmoid(sel)) * scale       (scale = route_scale * gate.global_scale)
// Writes pairs[t*k + s] = (expert, t, t*k + s, 0), gammas[t*k + s], shared_gammas[t*S + j].
// L is [T, E + S] (routed first, then shared).

struct Params {
    t: u32,
    n_routed: u32,
    n_shared: u32,
    top_k: u32,
    scale: f32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

struct Pair {
    expert: u32,
    token: u32,
    weight_idx: u32,
    _pad: u32,
}

const WG: u32 = 256u;
const MAX_E: u32 = 2048u;
const MAX_K: u32 = 32u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> pairs: array<Pair>;
@group(0) @binding(4) var<storage, read_write> gammas: array<f32>;
@group(0) @binding(5) var<storage, read_write> shared_gammas: array<f32>;

var<workgroup> score: array<f32, MAX_E>;
var<workgroup> chosen: array<u32, MAX_K>;
var<workgroup> sig_sh: array<f32, MAX_K>;

fn sigmoid(v: f32) -> f32 {
    return 1.0 / (1.0 + exp(-v));
}

// a beats b: larger value, or equal value and lower index.
fn better(va: f32, ia: u32, vb: f32, ib: u32) -> bool {
    return va > vb || (va == vb && ia < ib);
}

@compute @workgroup_size(256)
fn route(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_id) lid: vec3<u32>) {
    let t = wid.x + wid.y * nwg.x;
    if (t >= p.t) {
        return;
    }
    let tid = lid.x;
    let ne = p.n_routed + p.n_shared;
    let lb = t * ne;
    for (var e = tid; e < p.n_routed; e += WG) {
        var v = sigmoid(logits[lb + e]) + bias[e];
        if (v != v) {
            v = -3.4e38; // NaN ranks below every number
        }
        score[e] = v;
    }
    workgroupBarrier();
    // rank(e) = number of experts that beat e (a strict total order, so ranks are 0..E-1 without
    // repeats); the top-k are the experts of rank < k, in selection order.
    for (var e = tid; e < p.n_routed; e += WG) {
        let v = score[e];
        var rank = 0u;
        for (var o = 0u; o < p.n_routed; o++) {
            rank += select(0u, 1u, better(score[o], o, v, e));
        }
        if (rank < p.top_k) {
            chosen[rank] = e;
        }
    }
    workgroupBarrier();
    if (tid < p.top_k) {
        sig_sh[tid] = sigmoid(logits[lb + chosen[tid]]);
    }
    workgroupBarrier();
    // every invocation sums (chosen in selection order, then the shared experts)
    var sum = 0.0;
    for (var s = 0u; s < p.top_k; s++) {
        sum += sig_sh[s];
    }
    for (var j = 0u; j < p.n_shared; j++) {
        sum += sigmoid(logits[lb + p.n_routed + j]);
    }
    let f = p.scale / sum;
    if (tid < p.top_k) {
        let wi = t * p.top_k + tid;
        pairs[wi] = Pair(chosen[tid], t, wi, 0u);
        gammas[wi] = sig_sh[tid] * f;
    }
    for (var j = tid; j < p.n_shared; j += WG) {
        shared_gammas[t * p.n_shared + j] = sigmoid(logits[lb + p.n_routed + j]) * f;
    }
}
