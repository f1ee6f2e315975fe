// ONE MoE GEMV skeleton for every kernel format (FORMATS.md), instantiated by a tiny preprocessing
// step in src/gpu/gemv.rs (`gemv::wgsl_source`):
//   * a generated prelude defines the constants FMT (format ordinal), GS (group size, 0 = none),
//     CPU (columns per unit), VPU (vec4<u32> per unit), TPR (threads per row), RPW (rows per
//     workgroup; TPR * RPW = 256);
//   * lines between `//!IF SUBGROUP`, `//!ELSE` and `//!END` select the subgroup reduction
//     (adapters with wgpu::Features::SUBGROUP) or the shared-memory tree reduction.
// Nothing else differs between instantiations: only `unit_dot` (the decode step) switches on FMT,
// and FMT is a constant, so each pipeline keeps only its own decode.
//
// One dispatch (per weight chunk, see GpuWeights) computes, for pairs p in 0..n_pairs:
//   Y[p * y_stride + y_offset + r] = gamma(p) * sum_i W_{expert(p)}[r, i] * X[token(p) * x_stride + x_offset + i]
// for the rows r0 <= r < r1 of the experts e0 <= e < e1 held by the bound chunk. Pairs whose expert
// lies outside the chunk are skipped (another chunk's dispatch writes them).
// PAIRS holds 3 u32 per pair: (expert, token, weight_idx); weight_idx 0xFFFFFFFF = no gamma.
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
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> prm: Params;
@group(0) @binding(1) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> S: array<f32>;
@group(0) @binding(3) var<storage, read> X: array<f32>;
@group(0) @binding(4) var<storage, read> PAIRS: array<u32>;
@group(0) @binding(5) var<storage, read> GAMMA: array<f32>;
@group(0) @binding(6) var<storage, read_write> Y: array<f32>;

const NONE: u32 = 0xffffffffu;

var<workgroup> red: array<f32, 256>;

// x value j of the unit whose x index is xo; 0 past the `lim` valid columns (tail unit).
fn xv(xo: u32, j: u32, lim: u32) -> f32 {
    return select(0.0, X[xo + min(j, lim - 1u)], j < lim);
}

// f32: one u32 word is one value.
fn dot_f32(wd: vec4<u32>, xo: u32, lim: u32) -> f32 {
    return bitcast<f32>(wd.x) * xv(xo, 0u, lim) + bitcast<f32>(wd.y) * xv(xo, 1u, lim)
         + bitcast<f32>(wd.z) * xv(xo, 2u, lim) + bitcast<f32>(wd.w) * xv(xo, 3u, lim);
}

// bf16: two values per word, low half first; w = f32 with those upper 16 bits.
fn dot_bf16_word(wd: u32, xo: u32, j: u32, lim: u32) -> f32 {
    return bitcast<f32>(wd << 16u) * xv(xo, j, lim) + bitcast<f32>(wd & 0xffff0000u) * xv(xo, j + 1u, lim);
}

// int4: eight nibbles per word; column 2j is the low nibble of byte j; q = nibble - 8 (unscaled).
fn dot_int4_word(wd: u32, xo: u32, j: u32, lim: u32) -> f32 {
    var s = 0.0;
    for (var n = 0u; n < 8u; n++) {
        s += (f32((wd >> (4u * n)) & 15u) - 8.0) * xv(xo, j + n, lim);
    }
    return s;
}

// int3-g64: one 64-column group = 16 bytes of 2-bit lows + 8 bytes of high bits (unscaled).
fn dot_int3_group(lo: vec4<u32>, hi: vec2<u32>, xo: u32, lim: u32) -> f32 {
    var s = 0.0;
    for (var k = 0u; k < 64u; k++) {
        let l = (lo[k >> 4u] >> (2u * (k & 15u))) & 3u;
        let h = (hi[k >> 5u] >> (k & 31u)) & 1u;
        s += (f32(l | (h << 2u)) - 4.0) * xv(xo, k, lim);
    }
    return s;
}

// THE per-format decode step: dot product of unit u of a row (at vec4 index wv) with x.
// `lim` = valid columns in this unit (CPU except in the tail); `srow` = scale index of the row.
fn unit_dot(wv: u32, xo: u32, lim: u32, srow: u32, u: u32) -> f32 {
    if (FMT == 0u) {
        return dot_f32(W[wv], xo, lim);
    } else if (FMT == 9u) {
        let wd = W[wv];
        return dot_bf16_word(wd.x, xo, 0u, lim) + dot_bf16_word(wd.y, xo, 2u, lim)
             + dot_bf16_word(wd.z, xo, 4u, lim) + dot_bf16_word(wd.w, xo, 6u, lim);
    } else if (FMT == 2u || FMT == 4u) {
        let wd = W[wv];
        let d = dot_int4_word(wd.x, xo, 0u, lim) + dot_int4_word(wd.y, xo, 8u, lim)
              + dot_int4_word(wd.z, xo, 16u, lim) + dot_int4_word(wd.w, xo, 24u, lim);
        if (FMT == 4u) {
            // a 32-column unit lies inside one group (GS is 32, 64 or 128)
            return d * S[srow + (u * 32u) / max(GS, 1u)];
        }
        return d; // per-row scale applied once per row by the caller
    } else {
        // int3-g64: a unit is two groups in 3 vec4 (48 bytes)
        let a = W[wv];
        let b = W[wv + 1u];
        let c = W[wv + 2u];
        var d = dot_int3_group(a, b.xy, xo, lim) * S[srow + 2u * u];
        if (lim > 64u) {
            d += dot_int3_group(vec4<u32>(b.z, b.w, c.x, c.y), c.zw, xo + 64u, lim - 64u) * S[srow + 2u * u + 1u];
        }
        return d;
    }
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
    let r = prm.r0 + blk * RPW + v / TPR;
    let e = PAIRS[3u * p];
    let t = PAIRS[3u * p + 1u];
    let wi = PAIRS[3u * p + 2u];
    let live = e >= prm.e0 && e < prm.e1 && r < prm.r1;

    var acc = 0.0;
    if (live) {
        let local_row = (e - prm.e0) * (prm.r1 - prm.r0) + (r - prm.r0);
        let rowv = local_row * prm.row_v;
        let srow = local_row * prm.spr;
        let xb = t * prm.x_stride + prm.x_offset;
        let nu = (prm.cols + CPU - 1u) / CPU;
        for (var u = lane; u < nu; u += TPR) {
            let c0 = u * CPU;
            let lim = min(CPU, prm.cols - c0);
            if (lim == CPU) {
                acc += unit_dot(rowv + u * VPU, xb + c0, CPU, srow, u);
            } else {
                acc += unit_dot(rowv + u * VPU, xb + c0, lim, srow, u);
            }
        }
        if (FMT == 2u) {
            acc *= S[srow];
        }
    }

//!IF SUBGROUP
    // butterfly inside aligned blocks of m = min(subgroup size, TPR) lanes, then across blocks
    let m = min(sg_size, TPR);
    for (var off = 1u; off < m; off <<= 1u) {
        acc += subgroupShuffleXor(acc, off);
    }
    if (v % m == 0u) {
        red[v / m] = acc;
    }
    workgroupBarrier();
    if (lane == 0u && live) {
        var sum = 0.0;
        let n = TPR / m;
        for (var k = 0u; k < n; k++) {
            sum += red[v / m + k];
        }
        var o = sum;
        if (wi != NONE) {
            o *= GAMMA[wi];
        }
        Y[p * prm.y_stride + prm.y_offset + r] = o;
    }
//!ELSE
    red[v] = acc;
    workgroupBarrier();
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            red[v] += red[v + s];
        }
        workgroupBarrier();
    }
    if (lane == 0u && live) {
        var o = red[v];
        if (wi != NONE) {
            o *= GAMMA[wi];
        }
        Y[p * prm.y_stride + prm.y_offset + r] = o;
    }
//!END
}
