// ONE MoE GEMV skeleton for every kernel format (FORMATS.md), instantiated by a tiny preprocessing
// step in src/gpu/gemv.rs (`gemv::wgsl_source`):
//   * a generated prelude defines the constants FMT (format ordinal), GS (group size, 0 = none),
//     CPU (columns per unit), VPU (vec4<u32> per unit), XN (x values held per load, min(CPU, 64)),
//     TPR (threads per row), RPT (rows per thread, sharing one x load), RPW (rows per workgroup
//     = 256 / TPR * RPT), XT (x tile columns in workgroup memory), PP (pad period of the tile);
//   * lines between `//!IF SUBGROUP`, `//!ELSE` and `//!END` select the subgroup reduction
//     (adapters with wgpu::Features::SUBGROUP) or the shared-memory tree reduction.
// Nothing else differs between instantiations: only `unit_dot` (the decode step) switches on FMT,
// and FMT is a constant, so each pipeline keeps only its own decode.
//
// One dispatch (per weight chunk, see GpuWeights) computes, for pairs p in 0..n_pairs:
//   Y[p * y_stride + y_offset + r] = gamma(p) * sum_i W_{expert(p)}[r, i] * X[token(p) * x_stride + x_offset + i]
// for the rows r0 <= r < r1 of the experts e0 <= e < e1 held by the bound chunk. Pairs whose expert
// lies outside the chunk are skipped (another chunk's dispatch writes them).
// PAIRS holds `pair_words` u32 per pair (3, or 4 for the router's 16-byte `Pair`):
// (expert, token, weight_idx[, pad]); weight_idx 0xFFFFFFFF = no gamma. With `x_per_pair`, pair p
// reads x row p instead of x row token(p) (the routed down projection reads the activation of its
// own pair).
//
// Weight layout in the bound chunk: row (e, r) starts at vec4 index
// ((e - e0) * (r1 - r0) + (r - r0)) * row_v; rows are the FORMATS.md bytes padded with zeros to a
// whole number of units (16 bytes; 48 bytes = two 64-column groups for int3-g64), so every unit is
// a 16-byte aligned vec4<u32> load. Columns >= cols inside the last unit are masked through x.

struct Params {
    rows: u32,      // O, rows per expert
    cols: u32,      // I, columns
    n_pairs: u32,   // P
    row_v: u32,     // padded row stride in vec4<u32>
    e0: u32,        // experts [e0, e1) are in this chunk
    e1: u32,
    r0: u32,        // rows [r0, r1) of each of them are in this chunk
    r1: u32,
    x_stride: u32,  // f32 elements between tokens in X
    x_offset: u32,  // f32 element offset of token 0
    y_stride: u32,  // f32 elements between pairs in Y
    y_offset: u32,  // f32 element offset of pair 0, row 0
    spr: u32,       // f32 scales per row (0 when the format has none)
    rb: u32,        // row blocks in this chunk: ceil((r1 - r0) / RPW)
    use_gamma: u32, // 0: ignore weight_idx (no gamma buffer bound)
    pair_mode: u32, // bits 0-7: u32 words per pair (3 or 4); bit 8: x row = pair index
}

@group(0) @binding(0) var<uniform> prm: Params;
@group(0) @binding(1) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> S: array<f32>;
@group(0) @binding(3) var<storage, read> X: array<f32>;
@group(0) @binding(4) var<storage, read> PAIRS: array<u32>;
@group(0) @binding(5) var<storage, read> GAMMA: array<f32>;
@group(0) @binding(6) var<storage, read_write> Y: array<f32>;

const NONE: u32 = 0xffffffffu;

// Small integers to f32 without an int-to-float conversion (quarter rate on several GPUs):
// the f32 with bits 0x4B000000 | k is exactly 2^23 + k, so subtracting 2^23 + 8 (int4) or
// 2^23 + 4 (int3) gives k − 8 or k − 4 exactly.
const MAGIC: u32 = 0x4b000000u;
const MAGIC_INT4: f32 = 8388616.0;
const MAGIC_INT3: f32 = 8388612.0;

// Partial sums for the reductions: RPT rows per thread.
var<workgroup> red: array<f32, 256u * RPT>;

// x of the pair's token, one tile of XT columns at a time, staged in workgroup memory by
// coalesced loads (zeros past `cols`, so tail units need no masking). One pad word every PP words
// (PP = max(CPU, 32)) makes the per-lane unit reads below free of bank conflicts.
var<workgroup> XS: array<f32, XT + XT / PP>;

// The x values of the current unit (or 64-column half-unit for int3-g64), read once from XS and
// used for the RPT rows this thread handles.
var<private> XR: array<f32, XN>;

// XR = the XN x values starting at tile-local column `c`.
fn load_x(c: u32) {
    for (var j = 0u; j < XN; j++) {
        XR[j] = XS[c + j + (c + j) / PP];
    }
}

// f32: one u32 word is one value.
fn dot_f32(wd: vec4<u32>) -> f32 {
    return bitcast<f32>(wd.x) * XR[0] + bitcast<f32>(wd.y) * XR[1]
         + bitcast<f32>(wd.z) * XR[2] + bitcast<f32>(wd.w) * XR[3];
}

// bf16: two values per word, low half first; w = f32 with those upper 16 bits.
fn dot_bf16_word(wd: u32, j: u32) -> f32 {
    return bitcast<f32>(wd << 16u) * XR[j] + bitcast<f32>(wd & 0xffff0000u) * XR[j + 1u];
}

// int4: eight nibbles per word; column 2j is the low nibble of byte j; q = nibble - 8 (unscaled).
fn dot_int4_word(wd: u32, j: u32) -> f32 {
    var s = 0.0;
    for (var n = 0u; n < 8u; n++) {
        s += (bitcast<f32>(((wd >> (4u * n)) & 15u) | MAGIC) - MAGIC_INT4) * XR[j + n];
    }
    return s;
}

// int3-g64: one 64-column group = 16 bytes of 2-bit lows + 8 bytes of high bits (unscaled).
fn dot_int3_group(lo: vec4<u32>, hi: vec2<u32>) -> f32 {
    var s = 0.0;
    for (var k = 0u; k < 64u; k++) {
        let l = (lo[k >> 4u] >> (2u * (k & 15u))) & 3u;
        let h = (hi[k >> 5u] >> (k & 31u)) & 1u;
        s += (bitcast<f32>(l | (h << 2u) | MAGIC) - MAGIC_INT3) * XR[k];
    }
    return s;
}

// THE per-format decode step: unit u of a row (at vec4 index wv) dotted with XR.
// `srow` = scale index of the row. For int3-g64 this is the unit's first group only; the second
// group is `unit_dot_int3_b` after XR is reloaded with the next 64 x values.
fn unit_dot(wv: u32, srow: u32, u: u32) -> f32 {
    if (FMT == 0u) {
        return dot_f32(W[wv]);
    } else if (FMT == 9u) {
        let wd = W[wv];
        return dot_bf16_word(wd.x, 0u) + dot_bf16_word(wd.y, 2u) + dot_bf16_word(wd.z, 4u) + dot_bf16_word(wd.w, 6u);
    } else if (FMT == 2u || FMT == 4u) {
        let wd = W[wv];
        let d = dot_int4_word(wd.x, 0u) + dot_int4_word(wd.y, 8u) + dot_int4_word(wd.z, 16u) + dot_int4_word(wd.w, 24u);
        if (FMT == 4u) {
            // a 32-column unit lies inside one group (GS is 32, 64 or 128)
            return d * S[srow + (u * 32u) / max(GS, 1u)];
        }
        return d; // per-row scale applied once per row by the caller
    } else {
        // int3-g64: a unit is two groups in 3 vec4 (48 bytes); group A = a, b.xy
        let a = W[wv];
        let b = W[wv + 1u];
        return dot_int3_group(a, b.xy) * S[srow + 2u * u];
    }
}

// int3-g64, second group of unit u: b.zw, c.xy (lows), c.zw (highs).
fn unit_dot_int3_b(wv: u32, srow: u32, u: u32) -> f32 {
    let b = W[wv + 1u];
    let c = W[wv + 2u];
    return dot_int3_group(vec4<u32>(b.z, b.w, c.x, c.y), c.zw) * S[srow + 2u * u + 1u];
}

@compute @workgroup_size(256)
fn main(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
//!IF SUBGROUP
    @builtin(subgroup_id) sg_id: u32,
    @builtin(subgroup_invocation_id) sg_inv: u32,
    @builtin(subgroup_size) sg_size: u32,
//!END
) {
    let lin = wid.x + wid.y * nwg.x;
    if (lin >= prm.n_pairs * prm.rb) {
        return; // whole workgroup: lin is workgroup-uniform
    }
    let p = lin / prm.rb;
    let blk = lin % prm.rb;
//!IF SUBGROUP
    // Work is assigned by subgroup lane, so no layout of subgroups over local_invocation_index is
    // assumed; any power-of-two subgroup size (8 lavapipe, 32 NVIDIA/Apple, 64 AMD) works.
    let v = sg_id * sg_size + sg_inv;
//!ELSE
    let v = li;
//!END
    let lane = v % TPR;
    // this thread's group of TPR threads handles rows r_first .. r_first + RPT
    let r_first = prm.r0 + blk * RPW + (v / TPR) * RPT;
    let pw = prm.pair_mode & 255u;
    let e = PAIRS[pw * p];
    let t = select(PAIRS[pw * p + 1u], p, (prm.pair_mode & 256u) != 0u);
    let wi = PAIRS[pw * p + 2u];
    let in_chunk = e >= prm.e0 && e < prm.e1;

    var acc: array<f32, RPT>;
    var rowv: array<u32, RPT>;
    var srow: array<u32, RPT>;
    var n_live = 0u;
    if (in_chunk && r_first < prm.r1) {
        n_live = min(RPT, prm.r1 - r_first);
        for (var rr = 0u; rr < RPT; rr++) {
            let local_row = (e - prm.e0) * (prm.r1 - prm.r0) + (min(r_first + rr, prm.r1 - 1u) - prm.r0);
            rowv[rr] = local_row * prm.row_v;
            srow[rr] = local_row * prm.spr;
        }
    }
    let xb = t * prm.x_stride + prm.x_offset;
    let nu = (prm.cols + CPU - 1u) / CPU;
    for (var t0 = 0u; t0 < prm.cols; t0 += XT) {
        workgroupBarrier(); // the previous tile is no longer read
        if (in_chunk) {
            // whole units only: zeros from `cols` up to the end of the last unit
            let fill = min(XT, ((prm.cols - t0 + CPU - 1u) / CPU) * CPU);
            for (var j = li; j < fill; j += 256u) {
                let c = t0 + j;
                XS[j + j / PP] = select(0.0, X[xb + min(c, prm.cols - 1u)], c < prm.cols);
            }
        }
        workgroupBarrier();
        let u_end = min(nu, (t0 + XT) / CPU);
        for (var u = t0 / CPU + lane; u < u_end && n_live > 0u; u += TPR) {
            let cl = u * CPU - t0;
            load_x(cl);
            for (var rr = 0u; rr < RPT; rr++) {
                if (rr < n_live) {
                    acc[rr] += unit_dot(rowv[rr] + u * VPU, srow[rr], u);
                }
            }
            if (FMT == 5u && u * CPU + 64u < prm.cols) {
                load_x(cl + 64u);
                for (var rr = 0u; rr < RPT; rr++) {
                    if (rr < n_live) {
                        acc[rr] += unit_dot_int3_b(rowv[rr] + u * VPU, srow[rr], u);
                    }
                }
            }
        }
    }
    if (n_live > 0u) {
        if (FMT == 2u) {
            for (var rr = 0u; rr < RPT; rr++) {
                acc[rr] *= S[srow[rr]];
            }
        }
    }

//!IF SUBGROUP
    // butterfly inside aligned blocks of m = min(subgroup size, TPR) lanes, then across blocks
    let m = min(sg_size, TPR);
    for (var rr = 0u; rr < RPT; rr++) {
        var a = acc[rr];
        for (var off = 1u; off < m; off <<= 1u) {
            a += subgroupShuffleXor(a, off);
        }
        if (v % m == 0u) {
            red[(v / m) * RPT + rr] = a;
        }
    }
    workgroupBarrier();
    if (lane == 0u) {
        for (var rr = 0u; rr < n_live; rr++) {
            var sum = 0.0;
            for (var k = 0u; k < TPR / m; k++) {
                sum += red[(v / m + k) * RPT + rr];
            }
            if (wi != NONE && prm.use_gamma != 0u) {
                sum *= GAMMA[wi];
            }
            Y[p * prm.y_stride + prm.y_offset + r_first + rr] = sum;
        }
    }
//!ELSE
    for (var rr = 0u; rr < RPT; rr++) {
        red[v * RPT + rr] = acc[rr];
    }
    workgroupBarrier();
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            for (var rr = 0u; rr < RPT; rr++) {
                red[v * RPT + rr] += red[(v + s) * RPT + rr];
            }
        }
        workgroupBarrier();
    }
    if (lane == 0u) {
        for (var rr = 0u; rr < n_live; rr++) {
            var o = red[v * RPT + rr];
            if (wi != NONE && prm.use_gamma != 0u) {
                o *= GAMMA[wi];
            }
            Y[p * prm.y_stride + prm.y_offset + r_first + rr] = o;
        }
    }
//!END
}
