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
// Sequence slots: the caches hold one block of `slot_rows` rows per slot; pos.y names the slot of
// this call's tokens (its rows start at row pos.y * slot_rows).
//
// Two variants (`//!IF VEC4` lines, chosen by the host): D % 4 == 0 binds q/k/v/caches/out as vec4 arrays
// (one 16-byte load per 4 elements); otherwise they are f32 arrays read four at a time with the tail
// masked. Either way a row is handled as ceil(D/4) vec4 "columns".
//
// The `//!IF FUSED` variant (one-token decode, T = 1) also runs the attention prologue inside the
// dispatch: every workgroup normalises its raw q row (q_norm), and computes the k and v short convs
// (residual inside) of its KV head from the raw k/v projections and a conv ring, then k_norm, all
// in workgroup memory, so the one new key and value never leave the workgroup. The first query head
// of each KV group (exactly one workgroup per KV head) writes the new k/v into the cache and the raw
// k/v into the ring. Bindings: q = raw q_proj [H, D], k_new / v_new = the raw k/v projections
// [KVH * D], `proj` = the layer's attention constants [rel_proj | q_norm | k_norm | k conv w
// [C, K] | v conv w [C, K]] (C = KVH * D), caches [cap + K, KVH, D] read_write, whose last K rows
// are the conv ring: ring row p % K holds the raw input of position p (zeros before the sequence),
// so the K - 1 rows a step reads are never the row it writes and no workgroup races another.
// `fp` (binding 12) holds eps and the conv kernel size K. No `attn_append` in this variant.
// Its `//!IF BATCH` form runs a decode batch: T tokens of T different slots, token t at position
// seq[t].x of slot seq[t].y (binding 13, `[pos, slot, 0, 0]` per token); each workgroup runs the
// prologue of its own token.
//
// One workgroup of 256 invocations per (token, head); keys in blocks of BK = 64 with an online softmax:
//   scores: LPK = 4 lanes per key, each a strided share of the q.k columns (two accumulators) and of
//           the d_rel bias terms; the 4 partials are summed from workgroup memory,
//   max:    a 6-level tree over the block's 64 scores,
//   values: invocation (slice, column) accumulates p_j * v_j[column] over the keys j = slice (mod
//           256 / ceil(D/4)), two keys in flight; the slices (and their sums of p) are added at the end.

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
    slot_rows: u32, // cache rows per sequence slot: slot s's rows start at row s * slot_rows
}

const WG: u32 = 256u;
const LPK: u32 = 4u;   // lanes per key (score phase)
const BK: u32 = 64u;   // keys per block = WG / LPK
const MAX_D4: u32 = 64u; // head_dim <= 256
const MAX_REL: u32 = 256u;
const NEW: u32 = 0x80000000u; // row-base tag: the row lives in k_new / v_new, not in the cache

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> pos: vec4<u32>;
@group(0) @binding(5) var<storage, read> r: array<f32>;
@group(0) @binding(6) var<storage, read> proj: array<f32>;

//!IF VEC4
@group(0) @binding(2) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> k_new: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> v_new: array<vec4<f32>>;
//!IF FUSED
@group(0) @binding(7) var<storage, read_write> k_cache: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> v_cache: array<vec4<f32>>;
//!ELSE
@group(0) @binding(7) var<storage, read> k_cache: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read> v_cache: array<vec4<f32>>;
@group(0) @binding(10) var<storage, read_write> k_cache_w: array<vec4<f32>>;
@group(0) @binding(11) var<storage, read_write> v_cache_w: array<vec4<f32>>;
//!END
@group(0) @binding(9) var<storage, read_write> out: array<vec4<f32>>;

const UNIT: u32 = 4u; // floats per array element

// Start of row `row` (of D floats) in array elements.
fn row_base(row: u32) -> u32 {
    return row * (p.d / 4u);
}
// Column c (elements 4c .. 4c+3) of the row at b, one loader per array.
//!EACH ld_q=q ld_kn=k_new ld_kc=k_cache ld_vn=v_new ld_vc=v_cache
fn $NAME(b: u32, c: u32) -> vec4<f32> {
    return $ARRAY[b + c];
}
//!END EACH
// Element i of a flat f32 view, one loader (and, in the fused variant, one store) per array.
//!EACH ld_q1=q ld_kn1=k_new ld_vn1=v_new ld_kc1=k_cache ld_vc1=v_cache
fn $NAME(i: u32) -> f32 {
    return $ARRAY[i / 4u][i % 4u];
}
//!END EACH
//!IF FUSED
//!EACH st_kc1=k_cache st_vc1=v_cache
fn $NAME(i: u32, v: f32) {
    $ARRAY[i / 4u][i % 4u] = v;
}
//!END EACH
//!END
fn st_out(b: u32, c: u32, v: vec4<f32>) {
    out[b + c] = v;
}
//!ELSE
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> k_new: array<f32>;
@group(0) @binding(4) var<storage, read> v_new: array<f32>;
//!IF FUSED
@group(0) @binding(7) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(8) var<storage, read_write> v_cache: array<f32>;
//!ELSE
@group(0) @binding(7) var<storage, read> k_cache: array<f32>;
@group(0) @binding(8) var<storage, read> v_cache: array<f32>;
@group(0) @binding(10) var<storage, read_write> k_cache_w: array<f32>;
@group(0) @binding(11) var<storage, read_write> v_cache_w: array<f32>;
//!END
@group(0) @binding(9) var<storage, read_write> out: array<f32>;

const UNIT: u32 = 1u;

fn row_base(row: u32) -> u32 {
    return row * p.d;
}
// Elements 4c .. 4c+3 of the row at b; those >= D read as 0 (never loaded). One loader per array.
//!EACH ld_q=q ld_kn=k_new ld_kc=k_cache ld_vn=v_new ld_vc=v_cache
fn $NAME(b: u32, c: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var u = 0u; u < 4u; u++) {
        if (4u * c + u < p.d) {
            v[u] = $ARRAY[b + 4u * c + u];
        }
    }
    return v;
}
//!END EACH
// Element i of a flat f32 view, one loader (and, in the fused variant, one store) per array.
//!EACH ld_q1=q ld_kn1=k_new ld_vn1=v_new ld_kc1=k_cache ld_vc1=v_cache
fn $NAME(i: u32) -> f32 {
    return $ARRAY[i];
}
//!END EACH
//!IF FUSED
//!EACH st_kc1=k_cache st_vc1=v_cache
fn $NAME(i: u32, v: f32) {
    $ARRAY[i] = v;
}
//!END EACH
//!END
fn st_out(b: u32, c: u32, v: vec4<f32>) {
    for (var u = 0u; u < 4u; u++) {
        if (4u * c + u < p.d) {
            out[b + 4u * c + u] = v[u];
        }
    }
}
//!END

var<workgroup> q_sh: array<vec4<f32>, MAX_D4>;
var<workgroup> r_sh: array<f32, MAX_REL>;
var<workgroup> part: array<f32, WG>;      // score partials (LPK per key)
var<workgroup> s_sh: array<f32, BK>;      // block scores
var<workgroup> mx: array<f32, BK>;        // max tree
var<workgroup> p_sh: array<f32, BK>;      // exp(score - running max)
var<workgroup> kb_sh: array<u32, BK>;     // row base of each key (| NEW when in k_new / v_new)
var<workgroup> acc_sh: array<vec4<f32>, WG>;
var<workgroup> l_sh: array<f32, WG>;

//!IF FUSED
struct FusedParams {
    eps: f32,
    conv_k: u32,   // short-conv kernel size K (1..=MAX_CK)
    _p0: u32,
    _p1: u32,
}
@group(0) @binding(12) var<uniform> fp: FusedParams;
//!IF BATCH
@group(0) @binding(13) var<storage, read> seq: array<vec4<u32>>;
//!END

const MAX_CK: u32 = 8u;

// The new key and value (after conv, k after k_norm), tail past D zero.
var<workgroup> k_sh: array<vec4<f32>, MAX_D4>;
var<workgroup> v_sh: array<vec4<f32>, MAX_D4>;

// The key / value of this call's token j - pos0 at row base b: the one new token's, from
// workgroup memory.
fn ld_knew(b: u32, c: u32) -> vec4<f32> {
    return k_sh[c];
}
fn ld_vnew(b: u32, c: u32) -> vec4<f32> {
    return v_sh[c];
}

// Sums of a and b over the workgroup (in `part` and `l_sh`; every invocation gets both).
fn wg_sum2(tid: u32, a: f32, b: f32) -> vec2<f32> {
    part[tid] = a;
    l_sh[tid] = b;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st = st / 2u) {
        if (tid < st) {
            part[tid] += part[tid + st];
            l_sh[tid] += l_sh[tid + st];
        }
        workgroupBarrier();
    }
    let s = vec2<f32>(part[0], l_sh[0]);
    workgroupBarrier();
    return s;
}

// The prologue of token t (see the header): q_sh, k_sh and v_sh for head hh of KV group g;
// the group's first head writes the cache slot and the conv ring (of the slot whose rows start at
// float `cb`).
fn prologue(tid: u32, t: u32, hh: u32, g: u32, pos0: u32, cb: u32) {
    let d = p.d;
    let row = p.kvh * d;              // C: floats per cache row
    let ring0 = cb + p.cap * row;     // first float of the conv ring
    let kk = fp.conv_k;
    let km1 = kk - 1u;
    let off_qn = p.d_rel * p.extent;  // q_norm in the constants
    let off_kn = off_qn + d;
    let off_kw = off_kn + d;
    let off_vw = off_kw + row * kk;
    let c = g * d + tid;
    let live = tid < d;
    var qv = 0.0;
    var kx = 0.0;
    var vx = 0.0;
    var sk = 0.0;
    var sv = 0.0;
    if (live) {
        qv = ld_q1((t * p.h + hh) * d + tid);
        kx = ld_kn1(t * row + c);
        vx = ld_vn1(t * row + c);
        // as conv.wgsl: s = sum_k w[c, k] * xin[k], window oldest first, then out = x + s
        for (var k = 0u; k < MAX_CK; k++) {
            if (k < km1) {
                let slot = ring0 + ((pos0 + 1u + k) % kk) * row + c;
                sk += proj[off_kw + c * kk + k] * ld_kc1(slot);
                sv += proj[off_vw + c * kk + k] * ld_vc1(slot);
            } else if (k == km1) {
                sk += proj[off_kw + c * kk + k] * kx;
                sv += proj[off_vw + c * kk + k] * vx;
            }
        }
    }
    let kv = kx + sk;
    let vv = vx + sv;
    let ss = wg_sum2(tid, qv * qv, kv * kv);
    let inv_q = inverseSqrt(ss.x / f32(d) + fp.eps);
    let inv_k = inverseSqrt(ss.y / f32(d) + fp.eps);
    var qn = 0.0;
    var kn = 0.0;
    if (live) {
        qn = proj[off_qn + tid] * (qv * inv_q);
        kn = proj[off_kn + tid] * (kv * inv_k);
    }
    if (tid < 4u * ((d + 3u) / 4u)) {
        q_sh[tid / 4u][tid % 4u] = qn;
        k_sh[tid / 4u][tid % 4u] = kn;
        v_sh[tid / 4u][tid % 4u] = select(0.0, vv, live);
    }
    if (live && hh % (p.h / p.kvh) == 0u) {
        var slot = pos0;
        var keep = true;
        if (p.window != 0u) {
            slot = pos0 % p.cap;
        } else {
            keep = pos0 < p.cap;
        }
        if (keep) {
            st_kc1(cb + slot * row + c, kn);
            st_vc1(cb + slot * row + c, vv);
        }
        st_kc1(ring0 + (pos0 % kk) * row + c, kx);
        st_vc1(ring0 + (pos0 % kk) * row + c, vx);
    }
}
//!ELSE
fn ld_knew(b: u32, c: u32) -> vec4<f32> {
    return ld_kn(b, c);
}
fn ld_vnew(b: u32, c: u32) -> vec4<f32> {
    return ld_vn(b, c);
}
//!END

// Cache slot of absolute position j < pos0: ring slot on sliding layers; on full layers the linear slot,
// clamped so a host that overruns the capacity cannot read out of bounds.
fn cache_slot(j: u32) -> u32 {
    if (p.window != 0u) {
        return j % p.cap;
    }
    return min(j, p.cap - 1u);
}

fn ld_v(kb: u32, c: u32) -> vec4<f32> {
    if ((kb & NEW) != 0u) {
        return ld_vnew(kb & ~NEW, c);
    }
    return ld_vc(kb, c);
}

@compute @workgroup_size(256)
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
    var pos0 = pos.x;
    var slot = pos.y;
    var i = pos0 + t;
//!IF BATCH
    pos0 = seq[t].x;
    slot = seq[t].y;
    i = pos0;
//!END
    // first float of the slot's cache rows, and the same in array elements
    let cb = slot * p.slot_rows * p.kvh * p.d;
    let cbu = cb / UNIT;
    let d4 = (p.d + 3u) / 4u;

    // q row (normalised by the prologue in the fused variant) and r row into workgroup memory.
    let qb = row_base(t * p.h + hh);
//!IF FUSED
    prologue(tid, t, hh, g, pos0, cb);
//!ELSE
    if (tid < d4) {
        q_sh[tid] = ld_q(qb, tid);
    }
//!END
    if (tid < p.d_rel) {
        r_sh[tid] = r[(t * p.h + hh) * p.d_rel + tid];
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

    // score-phase role: key `key` of the block, lane `lane` of its LPK
    let key = tid / LPK;
    let lane = tid % LPK;
    // value-phase role: column vc of slice vs (slices = WG / d4; invocations past them idle)
    let slices = WG / d4;
    let vc = tid % d4;
    let vs = tid / d4;

    var m = -3.0e38;
    var l = 0.0;
    var acc = vec4<f32>(0.0);

    for (var j0 = j_lo; j0 <= i; j0 += BK) {
        let nb = min(BK, i + 1u - j0);
        var s_part = 0.0;
        if (key < nb) {
            let j = j0 + key;
            var a0 = 0.0;
            var a1 = 0.0;
            var c = lane;
            if (j >= pos0) {
                let b = row_base((j - pos0) * p.kvh + g);
                for (; c + LPK < d4; c += 2u * LPK) {
                    a0 += dot(q_sh[c], ld_knew(b, c));
                    a1 += dot(q_sh[c + LPK], ld_knew(b, c + LPK));
                }
                if (c < d4) {
                    a0 += dot(q_sh[c], ld_knew(b, c));
                }
                if (lane == 0u) {
                    kb_sh[key] = b | NEW;
                }
            } else {
                let b = cbu + row_base(cache_slot(j) * p.kvh + g);
                for (; c + LPK < d4; c += 2u * LPK) {
                    a0 += dot(q_sh[c], ld_kc(b, c));
                    a1 += dot(q_sh[c + LPK], ld_kc(b, c + LPK));
                }
                if (c < d4) {
                    a0 += dot(q_sh[c], ld_kc(b, c));
                }
                if (lane == 0u) {
                    kb_sh[key] = b;
                }
            }
            let dist = i - j;
            var bias = 0.0;
            if (dist < p.extent) {
                for (var rr = lane; rr < p.d_rel; rr += LPK) {
                    bias += r_sh[rr] * proj[rr * p.extent + dist];
                }
            }
            s_part = (a0 + a1) * inv_d + bias;
        }
        part[tid] = s_part;
        workgroupBarrier();
        if (tid < BK) {
            var s = -3.0e38;
            if (tid < nb) {
                let pb = tid * LPK;
                s = tau * ((part[pb] + part[pb + 1u]) + (part[pb + 2u] + part[pb + 3u]));
            }
            s_sh[tid] = s;
            mx[tid] = s;
        }
        workgroupBarrier();
        for (var st = BK / 2u; st > 0u; st = st / 2u) {
            if (tid < st) {
                mx[tid] = max(mx[tid], mx[tid + st]);
            }
            workgroupBarrier();
        }
        let m_new = max(m, mx[0]);
        if (tid < BK) {
            var pe = 0.0;
            if (tid < nb) {
                pe = exp(s_sh[tid] - m_new);
            }
            p_sh[tid] = pe;
        }
        workgroupBarrier();
        let corr = exp(m - m_new);
        m = m_new;
        acc *= corr;
        l *= corr;
        if (vs < slices) {
            var a0 = vec4<f32>(0.0);
            var a1 = vec4<f32>(0.0);
            var l0 = 0.0;
            var kk = vs;
            for (; kk + slices < nb; kk += 2u * slices) {
                let pa = p_sh[kk];
                let pb = p_sh[kk + slices];
                a0 += pa * ld_v(kb_sh[kk], vc);
                a1 += pb * ld_v(kb_sh[kk + slices], vc);
                l0 += pa + pb;
            }
            if (kk < nb) {
                let pa = p_sh[kk];
                a0 += pa * ld_v(kb_sh[kk], vc);
                l0 += pa;
            }
            acc += a0 + a1;
            l += l0;
        }
        // the next block overwrites part / s_sh / p_sh / kb_sh
        workgroupBarrier();
    }

    acc_sh[tid] = acc;
    l_sh[tid] = l;
    workgroupBarrier();
    if (tid < d4) {
        var a = vec4<f32>(0.0);
        var ls = 0.0;
        for (var sl = 0u; sl < slices; sl++) {
            a += acc_sh[sl * d4 + tid];
            ls += l_sh[sl * d4];
        }
        st_out(qb, tid, a / ls);
    }
}

//!IF FUSED
//!ELSE
// Append this call's k/v rows to the cache. One invocation per array element (vec4 or f32) of [T, KVH, D].
@compute @workgroup_size(256)
fn attn_append(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 256u;
    let row = p.kvh * p.d / UNIT;
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
    let base = pos.y * p.slot_rows * row;
    k_cache_w[base + slot * row + rest] = k_new[idx];
    v_cache_w[base + slot * row + rest] = v_new[idx];
}
//!END
