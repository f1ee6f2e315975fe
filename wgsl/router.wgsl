// MoE router, everything f32, one workgroup per token; experts are looped with stride so any count works.
//   choose = topk(sigmoid(L[:E]) + bias, top_k)            (ties -> lower index; NaN below every value)
//   sel    = [L[chosen], L[E:E+S]]
//   ls     = logsigmoid(sel) = min(sel, 0) - log(1 + exp(-|sel|))
//   w      = exp(ls - logsumexp(ls)) * scale                (scale = route_scale * gate.global_scale)
// as transformers 5.24.0 InklingTopkRouter.forward: finite when every sigmoid of the token underflows
// to 0 in f32 (logits below about -88), where sigmoid(sel) / sum(sigmoid(sel)) would be 0/0.
// Writes pairs[t*k + s] = (expert, t, t*k + s, 0), gammas[t*k + s], shared_gammas[t*S + j].
// L is [T, E + S] (routed first, then shared).
// Run-time check: a token whose logits hold a NaN or an Inf sets status[2] = layer + 1 unless an
// earlier layer (of this step or an earlier one) already did, and status[3] = max(0xffffffff - pos)
// over such tokens of that layer, pos = pos0 + t their absolute position (so the first one is
// recorded); the host reads the words with the step's result (model::status).
//
// Top-k by rank, rank(e) = #{o : score[o] > score[e]} + #{o < e : score[o] == score[e]} (a strict total
// order: ranks 0..E-1 without repeats); the experts of rank < k are the choice, in selection order.
// Fast path: every invocation counts ge(e) = #{o : score[o] >= score[e]} with vec4 reads of the scores
// from workgroup memory (one compare-to-1.0 and one add per score, four independent accumulators);
// ge(e) - 1 = rank(e) whenever e ties with no other expert. Experts with ge(e) - 1 < k claim slot
// ge(e) - 1 (atomic count). If every slot 0..k-1 was claimed exactly once, no tie touches the top k
// (tied experts share ge and would claim one slot together) and the claims are the answer. Otherwise
// (exact ties near the top) every expert recounts its exact rank with the index tie-break.
struct Params {
    t: u32,
    n_routed: u32,
    n_shared: u32,
    top_k: u32,
    scale: f32,
    layer: u32,
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
@group(0) @binding(6) var<storage, read_write> status: array<atomic<u32>>;
@group(0) @binding(7) var<uniform> pos0: vec4<u32>;

const MAX_S: u32 = 32u;

var<workgroup> score: array<vec4<f32>, MAX_E / 4u>;
var<workgroup> chosen: array<u32, MAX_K>;
var<workgroup> sig_sh: array<f32, MAX_K>;
var<workgroup> slots: array<atomic<u32>, MAX_K>;
var<workgroup> shared_sig: array<f32, MAX_S>;
// bit e set: expert e's score is NaN (stored as -inf in `score`, ranked below a true -inf)
var<workgroup> nan_bits: array<atomic<u32>, MAX_E / 32u>;
var<workgroup> row_bad: atomic<u32>;

fn sigmoid(v: f32) -> f32 {
    return 1.0 / (1.0 + exp(-v));
}

// log(sigmoid(v)) without underflow (torch's log_sigmoid: min(v, 0) - log1p(exp(-|v|))).
fn log_sigmoid(v: f32) -> f32 {
    return min(v, 0.0) - log(1.0 + exp(-abs(v)));
}

// NaN or +-Inf, tested on the bits (`v != v` may be folded away by compilers that assume no NaN).
fn non_finite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) >= 0x7f800000u;
}

fn is_nan(e: u32) -> bool {
    return (atomicLoad(&nan_bits[e / 32u]) & (1u << (e % 32u))) != 0u;
}

fn score_at(o: u32) -> f32 {
    return score[o / 4u][o % 4u];
}

// a beats b: larger value, or equal value and lower index; NaN (stored as -inf) loses to every value.
fn better(va: f32, ia: u32, vb: f32, ib: u32) -> bool {
    if (va == vb) {
        let na = is_nan(ia);
        let nb = is_nan(ib);
        return (!na && nb) || (na == nb && ia < ib);
    }
    return va > vb;
}

// #{o : score[o] >= v} (exact in f32 for E <= 2048).
fn count_ge(v: f32) -> f32 {
    let vv = vec4<f32>(v);
    let nf = p.n_routed / 4u;
    var c0 = vec4<f32>(0.0);
    var c1 = vec4<f32>(0.0);
    var c2 = vec4<f32>(0.0);
    var c3 = vec4<f32>(0.0);
    var j = 0u;
    for (; j + 4u <= nf; j += 4u) {
        c0 += step(vv, score[j]);
        c1 += step(vv, score[j + 1u]);
        c2 += step(vv, score[j + 2u]);
        c3 += step(vv, score[j + 3u]);
    }
    for (; j < nf; j++) {
        c0 += step(vv, score[j]);
    }
    var n = dot((c0 + c1) + (c2 + c3), vec4<f32>(1.0));
    for (var o = 4u * nf; o < p.n_routed; o++) {
        n += step(v, score_at(o));
    }
    return n;
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
    if (tid < MAX_K) {
        atomicStore(&slots[tid], 0u);
    }
    for (var i = tid; i < MAX_E / 32u; i += WG) {
        atomicStore(&nan_bits[i], 0u);
    }
    if (tid == 0u) {
        atomicStore(&row_bad, 0u);
    }
    workgroupBarrier();
    for (var e = tid; e < p.n_routed; e += WG) {
        let l = logits[lb + e];
        var v = sigmoid(l) + bias[e];
        if (non_finite(l)) {
            atomicOr(&row_bad, 1u);
        }
        // NaN: -inf in `score`, and its bit set, so it ranks below every value (a true -inf included)
        if ((bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u) {
            v = bitcast<f32>(0xff800000u);
            atomicOr(&nan_bits[e / 32u], 1u << (e % 32u));
        }
        score[e / 4u][e % 4u] = v;
    }
    for (var j = tid; j < p.n_shared; j += WG) {
        let l = logits[lb + p.n_routed + j];
        if (non_finite(l)) {
            atomicOr(&row_bad, 1u);
        }
        if (j < MAX_S) {
            shared_sig[j] = log_sigmoid(l);
        }
    }
    workgroupBarrier();
    if (tid == 0u && atomicLoad(&row_bad) != 0u) {
        let first = atomicLoad(&status[2]);
        if (first == 0u || first == p.layer + 1u) {
            atomicStore(&status[2], p.layer + 1u);
            atomicMax(&status[3], 0xffffffffu - (pos0.x + t));
        }
    }
    for (var e = tid; e < p.n_routed; e += WG) {
        let sg = log_sigmoid(logits[lb + e]); // issued early: its latency hides behind the count
        let r = u32(count_ge(score_at(e))) - 1u;
        if (r < p.top_k) {
            atomicAdd(&slots[r], 1u);
            chosen[r] = e;
            sig_sh[r] = sg;
        }
    }
    workgroupBarrier();
    var exact = true;
    for (var s = 0u; s < p.top_k; s++) {
        exact = exact && atomicLoad(&slots[s]) == 1u;
    }
    if (!exact) {
        // ties near the top: exact ranks with the index tie-break (rewrites every slot < k)
        for (var e = tid; e < p.n_routed; e += WG) {
            let v = score_at(e);
            var rank = 0u;
            for (var o = 0u; o < p.n_routed; o++) {
                rank += select(0u, 1u, better(score_at(o), o, v, e));
            }
            if (rank < p.top_k) {
                chosen[rank] = e;
                sig_sh[rank] = log_sigmoid(logits[lb + e]);
            }
        }
    }
    workgroupBarrier();
    // every invocation reduces (chosen in selection order, then the shared experts):
    // logsumexp(ls) = m + log(sum exp(ls - m)), m = max(ls)
    var m = bitcast<f32>(0xff800000u);
    for (var s = 0u; s < p.top_k; s++) {
        m = max(m, sig_sh[s]);
    }
    for (var j = 0u; j < p.n_shared; j++) {
        m = max(m, shared_ls(lb, j));
    }
    var sum = 0.0;
    for (var s = 0u; s < p.top_k; s++) {
        sum += exp(sig_sh[s] - m);
    }
    for (var j = 0u; j < p.n_shared; j++) {
        sum += exp(shared_ls(lb, j) - m);
    }
    let lse = m + log(sum);
    if (tid < p.top_k) {
        let wi = t * p.top_k + tid;
        pairs[wi] = Pair(chosen[tid], t, wi, 0u);
        gammas[wi] = exp(sig_sh[tid] - lse) * p.scale;
    }
    for (var j = tid; j < p.n_shared; j += WG) {
        shared_gammas[t * p.n_shared + j] = exp(shared_ls(lb, j) - lse) * p.scale;
    }
}

// logsigmoid of shared logit j of the token whose row starts at lb (from workgroup memory for j < MAX_S).
fn shared_ls(lb: u32, j: u32) -> f32 {
    if (j < MAX_S) {
        return shared_sig[j];
    }
    return log_sigmoid(logits[lb + p.n_routed + j]);
}
