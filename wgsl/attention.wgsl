// Inkling attention with a KV cache: prefill (T >= 1 new tokens, causal among themselves) and decode (T = 1).
//
// score(i, j) = tau(i) * (q_i . k_j / D + bias(i, i - j)),  bias(i, d) = sum_r r[i,h,r] * proj[r, d] for
// 0 <= d < extent, else 0.  Keys j: full layers 0 <= j <= i; sliding layers i - W < j <= i.
// Keys at positions >= pos0 (this call's tokens) are read from k_new / v_new, older ones from the cache,
// so a prefill longer than a sliding ring is exact. `attn_append` (a second dispatch) then writes the new
// tokens into the cache: linear slot p (full) or ring slot p % W (sliding, only the last W tokens).
//
// Layouts (f32): q [T, H, D], k_new/v_new [T, KVH, D], r [T, H, d_rel], proj [d_rel, extent],
// caches [cap, KVH, D], out [T, H * D]. pos.x = pos0 = absolute position of the first new token.

struct Params {
    t: u32,
    h: u32,
    kvh: u32,
    d: u32,
    d_rel: u32,
    extent: u32,
    window: u32,   // 0 = full attention, else sliding window W (= cache capacity)
    cap: u32,      // cache capacity in tokens
    use_tau: u32,
    alpha: f32,
    n_floor: f32,
    _pad: u32,
}

const WG: u32 = 64u;
const MAX_D: u32 = 256u;
const ACC: u32 = 4u; // MAX_D / WG
const MAX_REL: u32 = 256u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> pos: vec4<u32>;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> k_new: array<f32>;
@group(0) @binding(4) var<storage, read> v_new: array<f32>;
@group(0) @binding(5) var<storage, read> r: array<f32>;
@group(0) @binding(6) var<storage, read> proj: array<f32>;
@group(0) @binding(7) var<storage, read> k_cache: array<f32>;
@group(0) @binding(8) var<storage, read> v_cache: array<f32>;
@group(0) @binding(9) var<storage, read_write> out: array<f32>;

@group(0) @binding(10) var<storage, read_write> k_cache_w: array<f32>;
@group(0) @binding(11) var<storage, read_write> v_cache_w: array<f32>;

var<workgroup> q_sh: array<f32, MAX_D>;
var<workgroup> r_sh: array<f32, MAX_REL>;
var<workgroup> red: array<f32, WG>;
var<workgroup> p_sh: array<f32, WG>;

// Start (in floats) of the key/value row of absolute position j for kv head g (in k_new/v_new when
// j >= pos0, else in the cache).
fn kv_base(j: u32, pos0: u32, g: u32) -> u32 {
    if (j >= pos0) {
        return ((j - pos0) * p.kvh + g) * p.d;
    }
    // Full layers: linear slot, clamped so a host that overruns the capacity cannot read out of bounds.
    var slot = min(j, p.cap - 1u);
    if (p.window != 0u) {
        slot = j % p.cap;
    }
    return (slot * p.kvh + g) * p.d;
}

@compute @workgroup_size(64)
fn attn(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let item = wid.x + wid.y * nwg.x;
    if (item >= p.t * p.h) {
        return;
    }
    let tid = lid.x;
    let t = item / p.h;
    let hh = item % p.h;
    let g = hh / (p.h / p.kvh);
    let pos0 = pos.x;
    let i = pos0 + t;

    // q row and r row into workgroup memory.
    for (var e = tid; e < p.d; e += WG) {
        q_sh[e] = q[(t * p.h + hh) * p.d + e];
    }
    for (var e = tid; e < p.d_rel; e += WG) {
        r_sh[e] = r[(t * p.h + hh) * p.d_rel + e];
    }
    workgroupBarrier();

    var tau = 1.0;
    if (p.use_tau != 0u) {
        tau = 1.0 + p.alpha * log(max(f32(i + 1u) / p.n_floor, 1.0));
    }
    let inv_d = 1.0 / f32(p.d);

    var j_lo = 0u;
    if (p.window != 0u && i + 1u > p.window) {
        j_lo = i + 1u - p.window;
    }
    let n_keys = i + 1u - j_lo;
    let n_blocks = (n_keys + WG - 1u) / WG;

    var m = -3.0e38;
    var l = 0.0;
    var acc: array<f32, ACC>;
    for (var u = 0u; u < ACC; u++) {
        acc[u] = 0.0;
    }

    for (var b = 0u; b < n_blocks; b++) {
        let j0 = j_lo + b * WG;
        let j = j0 + tid;
        var s = -3.0e38;
        let valid = j <= i;
        if (valid) {
            let base = kv_base(j, pos0, g);
            var dot = 0.0;
            if (j >= pos0) {
                for (var e = 0u; e < p.d; e++) {
                    dot += q_sh[e] * k_new[base + e];
                }
            } else {
                for (var e = 0u; e < p.d; e++) {
                    dot += q_sh[e] * k_cache[base + e];
                }
            }
            let dist = i - j;
            var bias = 0.0;
            if (dist < p.extent) {
                for (var rr = 0u; rr < p.d_rel; rr++) {
                    bias += r_sh[rr] * proj[rr * p.extent + dist];
                }
            }
            s = tau * (dot * inv_d + bias);
        }
        red[tid] = s;
        workgroupBarrier();
        for (var st = WG / 2u; st > 0u; st = st / 2u) {
            if (tid < st) {
                red[tid] = max(red[tid], red[tid + st]);
            }
            workgroupBarrier();
        }
        let m_new = max(m, red[0]);
        var pe = 0.0;
        if (valid) {
            pe = exp(s - m_new);
        }
        p_sh[tid] = pe;
        workgroupBarrier();
        let corr = exp(m - m_new);
        m = m_new;
        let nb = min(WG, i + 1u - j0);
        var lsum = 0.0;
        for (var bb = 0u; bb < nb; bb++) {
            lsum += p_sh[bb];
        }
        l = l * corr + lsum;
        for (var u = 0u; u < ACC; u++) {
            let e = tid + u * WG;
            if (e < p.d) {
                var a = acc[u] * corr;
                for (var bb = 0u; bb < nb; bb++) {
                    let jj = j0 + bb;
                    let base = kv_base(jj, pos0, g);
                    var vv: f32;
                    if (jj >= pos0) {
                        vv = v_new[base + e];
                    } else {
                        vv = v_cache[base + e];
                    }
                    a += p_sh[bb] * vv;
                }
                acc[u] = a;
            }
        }
        workgroupBarrier();
    }

    for (var u = 0u; u < ACC; u++) {
        let e = tid + u * WG;
        if (e < p.d) {
            out[(t * p.h + hh) * p.d + e] = acc[u] / l;
        }
    }
}

// Append this call's k/v rows to the cache. One invocation per float of [T, KVH, D].
@compute @workgroup_size(256)
fn attn_append(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 256u;
    let row = p.kvh * p.d;
    if (idx >= p.t * row) {
        return;
    }
    let t = idx / row;
    let rest = idx % row;
    let ppos = pos.x + t;
    var slot = ppos;
    if (p.window != 0u) {
        // Only the last W tokens survive in the ring; writing earlier ones would race with them.
        if (t + p.cap < p.t) {
            return;
        }
        slot = ppos % p.cap;
    } else if (ppos >= p.cap) {
        return;
    }
    k_cache_w[slot * row + rest] = k_new[idx];
    v_cache_w[slot * row + rest] = v_new[idx];
}
