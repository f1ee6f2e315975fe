// ONE MoE GEMV skeleton for every kernel format (FORMATS.md), instantiated by a tiny preprocessing
// step in src/gpu/gemv.rs (`gemv::wgsl_source_tuned`):
//   * a generated prelude defines the constants FMT (format ordinal), GS (group size, 0 = none),
//     CPU (columns per unit), VPU (vec4<u32> weight words per unit), TPR (threads per row),
//     RPT (rows per thread, sharing every x load), RPW (rows per workgroup = 256 / TPR * RPT),
//     XT (x columns staged in workgroup memory at a time; normally all of them; 0 and unused in
//     the XDIRECT variant) and PPV (pad period of the x tile, in vec4). TPR and RPT are chosen per
//     call on the host (`gemv::plan`): the largest RPW that still launches enough workgroups;
//   * lines between `//!IF FLAG`, `//!ELSE` and `//!END` keep one branch per named flag:
//     SUBGROUP selects the subgroup reduction (adapters with wgpu::Features::SUBGROUP) over the
//     shared-memory tree reduction; XDIRECT selects the direct-x variant (below) over the staged x.
// Nothing else differs between instantiations: only `unit_dot` (the decode step) and `stage_scale`
// switch on FMT, and FMT is a constant, so each pipeline keeps only its own decode.
//
// x staged or direct. The default (staged) variant copies the pair's x row into workgroup memory
// once per workgroup, then runs the hot loop. XDIRECT (f32 and bf16 only, chosen on the host when
// a workgroup covers few rows, <= 8, so that staging the whole x per workgroup would move more
// bytes than the weights) binds X as array<vec4<f32>> and reads it straight from global memory in
// the hot loop: no staging loop, no barrier, no XS array. The host picks XDIRECT only when its
// alignment assumptions hold: cols % CPU == 0 (whole units, no tail masking), x_stride % 4 == 0
// and x_offset % 4 == 0 (every x row starts at a whole vec4); any other shape runs staged.
//
// One dispatch (per weight chunk, see GpuWeights) computes, for pairs p in 0..n_pairs:
//   Y[p * y_stride + y_offset + r] = gamma(p) * sum_i W_{expert(p)}[r, i] * X[token(p) * x_stride + x_offset + i]
// for the rows r0 <= r < r1 of the experts e0 <= e < e1 held by the bound chunk. Pairs whose expert
// lies outside the chunk are skipped (another chunk's dispatch writes them).
// PAIRS holds 4 u32 per pair (16 bytes, the GPU router's `Pair`): (expert, token, weight_idx, pad);
// weight_idx 0xFFFFFFFF = no gamma. With `x_per_pair` (bit 8 of `pair_mode`), pair p reads x row p
// instead of x row token(p) (the routed down projection reads the activation of its own pair).
//
// Weight layout in the bound chunk: row (e, r) starts at vec4 index
// ((e - e0) * (r1 - r0) + (r - r0)) * row_v; rows are the FORMATS.md bytes padded with zeros to a
// whole number of units (16 bytes; 48 bytes = two 64-column groups for int3-g64), so every unit is
// a 16-byte aligned vec4<u32> load. Columns >= cols inside the last unit are masked through x.
//
// Speed (the kernel is memory-bound on real GPUs): per thread, the hot loop is straight-line code
// with no barrier and no dynamically indexed private array: one coalesced vec4<u32> weight load
// per row and unit (RPT rows share each x load, from workgroup memory or, XDIRECT, from the
// caches), a decode made of shifts, masks and the f32 "magic number" trick, and vec4 f32
// accumulators (four independent FMA chains per row). Group scales are applied once per unit, the int4 row scale once per row.

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
    pair_mode: u32, // bit 8: x row = pair index (x_per_pair)
}

@group(0) @binding(0) var<uniform> prm: Params;
@group(0) @binding(1) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> S: array<f32>;
//!IF XDIRECT
@group(0) @binding(3) var<storage, read> X: array<vec4<f32>>;
//!ELSE
@group(0) @binding(3) var<storage, read> X: array<f32>;
//!END
@group(0) @binding(4) var<storage, read> PAIRS: array<u32>;
@group(0) @binding(5) var<storage, read> GAMMA: array<f32>;
@group(0) @binding(6) var<storage, read_write> Y: array<f32>;

const NONE: u32 = 0xffffffffu;

// Small integers to f32 without an int-to-float conversion (quarter rate on several GPUs):
// the f32 with bits 0x4B000000 | m (m < 2^23) is exactly 2^23 + m. For int4 the nibble is masked
// IN PLACE (m = k * 16^n for the nibble at bits 4n, n < 5; the top three nibbles are first shifted
// down by 12 bits), and subtracting 2^23 + 8 * 16^n gives (k - 8) * 16^n exactly; the staged x of
// that column is pre-multiplied by 16^-n (a power of two, exact), so the product is (k - 8) * x.
// One mask-or, one subtract and one FMA per value.
const MAGIC: u32 = 0x4b000000u;
const MAGIC_INT3: f32 = 8388612.0; // 2^23 + 4
const I4_MASK_A: vec4<u32> = vec4<u32>(0xfu, 0xf0u, 0xf00u, 0xf000u);
const I4_MASK_B: vec4<u32> = vec4<u32>(0xf0000u, 0xf00u, 0xf000u, 0xf0000u);
const I4_SUB_A: vec4<f32> = vec4<f32>(8388616.0, 8388736.0, 8390656.0, 8421376.0);
const I4_SUB_B: vec4<f32> = vec4<f32>(8912896.0, 8390656.0, 8421376.0, 8912896.0);
// x pre-scaling of columns 8j..8j+3 (even vec4) and 8j+4..8j+7 (odd vec4) for int4
const I4_XS_A: vec4<f32> = vec4<f32>(1.0, 0.0625, 0.00390625, 0.000244140625);
const I4_XS_B: vec4<f32> = vec4<f32>(0.0000152587890625, 0.00390625, 0.000244140625, 0.0000152587890625);

// Partial sums for the reductions: RPT rows per thread.
var<workgroup> red: array<f32, 256u * RPT>;

//!IF XDIRECT
// x of the pair's token read straight from global memory: vec4 index of its column 0 (set once
// per thread in `main`; x_offset and x_stride are multiples of 4, checked on the host).
var<private> x_v0: u32;

fn xs(i: u32) -> vec4<f32> {
    return X[x_v0 + i];
}
//!ELSE
// x of the pair's token, XT columns at a time (normally the whole row), staged in workgroup memory
// as vec4 by coalesced loads: zeros past `cols` (so tail units need no masking), pre-scaled for
// int4. One pad vec4 every PPV vec4 (PPV = max(a unit's vec4, 8)) makes the per-lane vec4 reads of
// the hot loop free of bank conflicts.
var<workgroup> XS: array<vec4<f32>, XT / 4u + XT / 4u / PPV>;

fn xs(i: u32) -> vec4<f32> {
    return XS[i + i / PPV];
}
//!END

// Per-column factor applied when staging x (vec4 index j of the tile).
fn stage_scale(j: u32) -> vec4<f32> {
    if (FMT == 2u || FMT == 4u) {
        return select(I4_XS_A, I4_XS_B, (j & 1u) == 1u);
    }
    return vec4<f32>(1.0);
}

// int4: one word = eight columns, x vec4 at tile-local vec4 index xi and xi + 1 (pre-scaled),
// added to `acc` by two FMA chains (no separate product or sum: one shift for the word, then one
// mask-or, one subtract and one FMA per value).
fn int4_word(acc: vec4<f32>, wd: u32, xi: u32) -> vec4<f32> {
    let wh = wd >> 12u;
    let a = bitcast<vec4<f32>>((vec4<u32>(wd) & I4_MASK_A) | vec4<u32>(MAGIC)) - I4_SUB_A;
    let b = bitcast<vec4<f32>>((vec4<u32>(wd, wh, wh, wh) & I4_MASK_B) | vec4<u32>(MAGIC)) - I4_SUB_B;
    return fma(a, xs(xi), fma(b, xs(xi + 1u), acc));
}

// int3-g64: four values = one byte of 2-bit lows (`lb`, shifted down) and four high bits (`hb`,
// shifted down), dotted with one x vec4; returns the four products.
fn int3_four(lb: u32, hb: u32, x: vec4<f32>) -> vec4<f32> {
    let l = (vec4<u32>(lb) >> vec4<u32>(0u, 2u, 4u, 6u)) & vec4<u32>(3u);
    let h = (vec4<u32>(hb << 2u, hb << 1u, hb, hb >> 1u)) & vec4<u32>(4u);
    return (bitcast<vec4<f32>>(l | h | vec4<u32>(MAGIC)) - vec4<f32>(MAGIC_INT3)) * x;
}

// int3-g64: sixteen values = one lo word and 16 high bits; x from vec4 index xi.
fn int3_sixteen(lw: u32, hw: u32, xi: u32) -> vec4<f32> {
    return int3_four(lw, hw, xs(xi)) + int3_four(lw >> 8u, hw >> 4u, xs(xi + 1u))
         + int3_four(lw >> 16u, hw >> 8u, xs(xi + 2u)) + int3_four(lw >> 24u, hw >> 12u, xs(xi + 3u));
}

// int3-g64: one 64-column group = 16 bytes of 2-bit lows + 8 bytes of high bits (unscaled).
fn int3_group(lo: vec4<u32>, hi: vec2<u32>, xi: u32) -> vec4<f32> {
    return int3_sixteen(lo.x, hi.x, xi) + int3_sixteen(lo.y, hi.x >> 16u, xi + 4u)
         + int3_sixteen(lo.z, hi.y, xi + 8u) + int3_sixteen(lo.w, hi.y >> 16u, xi + 12u);
}

// THE per-format decode step: unit u of a row (first weight word at vec4 index wv) dotted with the
// staged x from tile-local vec4 index xi, added to `acc` (scale of the unit's group applied).
// `srow` = scale index of the row.
fn unit_dot(acc: vec4<f32>, wv: u32, srow: u32, u: u32, xi: u32) -> vec4<f32> {
    if (FMT == 0u) {
        return fma(bitcast<vec4<f32>>(W[wv]), xs(xi), acc);
    } else if (FMT == 9u) {
        // bf16: two values per word, low half first; w = f32 with those upper 16 bits
        let wd = W[wv];
        let x0 = xs(xi);
        let x1 = xs(xi + 1u);
        let ev = bitcast<vec4<f32>>(wd << vec4<u32>(16u));
        let od = bitcast<vec4<f32>>(wd & vec4<u32>(0xffff0000u));
        return fma(ev, vec4<f32>(x0.x, x0.z, x1.x, x1.z), fma(od, vec4<f32>(x0.y, x0.w, x1.y, x1.w), acc));
    } else if (FMT == 2u || FMT == 4u) {
        let wd = W[wv];
        if (FMT == 4u) {
            // a 32-column unit lies inside one group (GS is 32, 64 or 128)
            let d = int4_word(int4_word(int4_word(int4_word(vec4<f32>(0.0), wd.x, xi), wd.y, xi + 2u), wd.z, xi + 4u), wd.w, xi + 6u);
            return fma(d, vec4<f32>(S[srow + (u * 32u) / max(GS, 1u)]), acc);
        }
        // per-row scale applied once per row by the caller
        return int4_word(int4_word(int4_word(int4_word(acc, wd.x, xi), wd.y, xi + 2u), wd.z, xi + 4u), wd.w, xi + 6u);
    } else {
        // int3-g64: a unit is two groups in 3 vec4: group A = a, b.xy; group B = b.zw c.xy, c.zw
        let a = W[wv];
        let b = W[wv + 1u];
        let c = W[wv + 2u];
        let sa = S[srow + 2u * u];
        let sb = S[srow + min(2u * u + 1u, prm.spr - 1u)]; // a lone last group has no scale B
        let ga = int3_group(a, b.xy, xi);
        let gb = int3_group(vec4<u32>(b.z, b.w, c.x, c.y), c.zw, xi + 16u);
        return fma(ga, vec4<f32>(sa), fma(gb, vec4<f32>(sb), acc));
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
    // this thread's group of TPR threads handles rows r_first .. r_first + RPT
    let r_first = prm.r0 + blk * RPW + (v / TPR) * RPT;
    let e = PAIRS[4u * p];
    let t = select(PAIRS[4u * p + 1u], p, (prm.pair_mode & 256u) != 0u);
    let wi = PAIRS[4u * p + 2u];
    let in_chunk = e >= prm.e0 && e < prm.e1;
    let live = in_chunk && r_first < prm.r1;
    let n_live = select(0u, min(RPT, prm.r1 - r_first), live);

    // rows past r1 repeat the last row (read, never written): no branch in the hot loop
    var acc: array<vec4<f32>, RPT>;
    var rowv: array<u32, RPT>;
    var srow: array<u32, RPT>;
    let ebase = (min(e, prm.e1 - 1u) - min(e, prm.e0)) * (prm.r1 - prm.r0);
    for (var rr = 0u; rr < RPT; rr++) {
        let local_row = ebase + (min(r_first + rr, prm.r1 - 1u) - prm.r0);
        rowv[rr] = local_row * prm.row_v;
        srow[rr] = local_row * prm.spr;
        acc[rr] = vec4<f32>(0.0);
    }
    let xb = t * prm.x_stride + prm.x_offset;
    let nu = (prm.cols + CPU - 1u) / CPU;
//!IF XDIRECT
    // one pass over the whole row, x from global memory (cols is a whole number of units)
    x_v0 = xb / 4u;
    {
        let t0 = 0u;
        let u_end = nu;
//!ELSE
    for (var t0 = 0u; t0 < prm.cols; t0 += XT) {
        if (t0 > 0u) {
            workgroupBarrier(); // the previous tile is no longer read
        }
        if (in_chunk) {
            // whole units only: zeros from `cols` up to the end of the last unit
            let fill = min(XT, ((prm.cols - t0 + CPU - 1u) / CPU) * CPU) / 4u;
            for (var j = li; j < fill; j += 256u) {
                let c = t0 + 4u * j;
                let last = prm.cols - 1u;
                let xv = vec4<f32>(
                    select(0.0, X[xb + min(c, last)], c < prm.cols),
                    select(0.0, X[xb + min(c + 1u, last)], c + 1u < prm.cols),
                    select(0.0, X[xb + min(c + 2u, last)], c + 2u < prm.cols),
                    select(0.0, X[xb + min(c + 3u, last)], c + 3u < prm.cols));
                XS[j + j / PPV] = xv * stage_scale(j);
            }
        }
        workgroupBarrier();
        let u_end = min(nu, (t0 + XT) / CPU);
//!END
        if (live) {
            var u = t0 / CPU + lane;
            // two units per iteration: their weight loads are independent and issue together
            for (; u + TPR < u_end; u += 2u * TPR) {
                let xi = (u * CPU - t0) / 4u;
                let xj = xi + TPR * (CPU / 4u);
                for (var rr = 0u; rr < RPT; rr++) {
                    let a = unit_dot(acc[rr], rowv[rr] + u * VPU, srow[rr], u, xi);
                    acc[rr] = unit_dot(a, rowv[rr] + (u + TPR) * VPU, srow[rr], u + TPR, xj);
                }
            }
            if (u < u_end) {
                let xi = (u * CPU - t0) / 4u;
                for (var rr = 0u; rr < RPT; rr++) {
                    acc[rr] = unit_dot(acc[rr], rowv[rr] + u * VPU, srow[rr], u, xi);
                }
            }
        }
    }
    var sums: array<f32, RPT>;
    for (var rr = 0u; rr < RPT; rr++) {
        let a = acc[rr];
        sums[rr] = (a.x + a.y) + (a.z + a.w);
        if (FMT == 2u && live) {
            sums[rr] *= S[srow[rr]];
        }
    }

//!IF SUBGROUP
    // butterfly inside aligned blocks of m = min(subgroup size, TPR) lanes, then across blocks
    let m = min(sg_size, TPR);
    for (var rr = 0u; rr < RPT; rr++) {
        var a = sums[rr];
        for (var off = 1u; off < m; off <<= 1u) {
            a += subgroupShuffleXor(a, off);
        }
        if (m < TPR && v % m == 0u) {
            red[(v / m) * RPT + rr] = a;
        }
        sums[rr] = a;
    }
    workgroupBarrier();
    if (lane == 0u) {
        for (var rr = 0u; rr < n_live; rr++) {
            var sum = sums[rr];
            if (m < TPR) {
                sum = 0.0;
                for (var k = 0u; k < TPR / m; k++) {
                    sum += red[(v / m + k) * RPT + rr];
                }
            }
            if (wi != NONE && prm.use_gamma != 0u) {
                sum *= GAMMA[wi];
            }
            Y[p * prm.y_stride + prm.y_offset + r_first + rr] = sum;
        }
    }
//!ELSE
    for (var rr = 0u; rr < RPT; rr++) {
        red[v * RPT + rr] = sums[rr];
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
