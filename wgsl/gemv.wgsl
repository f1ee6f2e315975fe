// The MoE GEMV skeleton for every kernel format; src/gpu/linear/ (mod.rs, gemv.rs) tells its story
// (problem, GPU layout, work split, x staged or direct, weight chunks). The generated prelude
// (`gemv::wgsl_source_tuned`) defines the format ordinals FMT_* from the registry, FMT and
// GROUP_SIZE of this instantiation, COLS_PER_UNIT / WORDS_PER_UNIT (a unit: the columns decoded
// from WORDS_PER_UNIT vec4<u32> weight words), THREADS_PER_ROW, ROWS_PER_THREAD,
// ROWS_PER_WORKGROUP, X_TILE (x columns staged at a time, 0 when x is direct), X_PAD_PERIOD,
// WEIGHT_CHUNKS (bindings 1/2 always, 7/8 as well when 2) and UNITS_PER_STEP (units per hot-loop
// step). Lines between `//!IF FLAG`, `//!ELSE` and `//!END` keep one branch per flag: SUBGROUP
// (subgroup reduction), XDIRECT (x read from global memory instead of staged), CHUNK1 (a second
// weight chunk bound), SEGMENTS (the rows written to up to four output matrices, bindings 6 and
// 9-11; see `write_y`), SILU (rows = gate rows then up rows; writes silu(gate)·up, see
// `row_of_set`), CONV (the short conv of wgsl/conv.wgsl on each row as a channel, added to Y;
// bindings 7-9), UNIT_ARRAYS (the hot loop loads a step's units into arrays first) and
// PREFETCH (it loads the next step while decoding this one). The preprocessor
// (`kernel::preprocess_with`) also writes the decode functions of each bound weight chunk k
// (`//!FOR k`: `unit_scales_k` and `unit_dot_k` over the chunk's arrays Wk and Sk),
// and the hot loop of chunk k (`//!DEFINE hot_loop(k)`) at each `//!INSERT hot_loop(k)`.

struct Params {
    rows: u32,                // O, rows per expert
    cols: u32,                // I, columns
    n_pairs: u32,             // P
    row_stride_v4: u32,       // padded weight row stride in vec4<u32>
    x_stride: u32,            // f32 elements between tokens in X
    x_offset: u32,            // f32 element offset of token 0
    y_stride: u32,            // f32 elements between pairs in Y
    y_offset: u32,            // f32 element offset of pair 0, row 0
    scales_per_row: u32,      // f32 scales per row (0 when the format has none)
    use_gamma: u32,           // 0: ignore weight_idx (no gamma buffer bound)
    x_row_is_pair: u32,       // 1: pair p reads x row p instead of row token(p)
    pad: u32,
    chunk0: vec4<u32>,        // experts [x, y) and rows [z, w) of each held by weight chunk 0
    chunk1: vec4<u32>,        // the same for chunk 1 (empty ranges when one chunk is bound)
    row_blocks: vec4<u32>,    // x: row blocks of chunk 0, y: of chunk 1 (ceil(rows / ROWS_PER_WORKGROUP))
    seg_end: vec4<u32>,       // SEGMENTS: end row of output segments 0-3 (unused ones end at `rows`)
    conv: vec4<u32>,          // CONV: x = kernel size K, y = 1: token t's slot is CSLOT[t].y (else CSLOT[0].y)
}

@group(0) @binding(0) var<uniform> prm: Params;
@group(0) @binding(1) var<storage, read> W0: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> S0: array<f32>;
//!IF XDIRECT
@group(0) @binding(3) var<storage, read> X: array<vec4<f32>>;
//!ELSE
@group(0) @binding(3) var<storage, read> X: array<f32>;
//!END
@group(0) @binding(4) var<storage, read> PAIRS: array<u32>;
@group(0) @binding(5) var<storage, read> GAMMA: array<f32>;
@group(0) @binding(6) var<storage, read_write> Y: array<f32>;
//!IF CHUNK1
@group(0) @binding(7) var<storage, read> W1: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read> S1: array<f32>;
//!END
//!IF CONV
@group(0) @binding(7) var<storage, read> CW: array<f32>;
@group(0) @binding(8) var<storage, read_write> CSTATE: array<f32>;
@group(0) @binding(9) var<storage, read> CSLOT: array<vec4<u32>>;
//!END
//!IF SEGMENTS
@group(0) @binding(9) var<storage, read_write> Y1: array<f32>;
@group(0) @binding(10) var<storage, read_write> Y2: array<f32>;
@group(0) @binding(11) var<storage, read_write> Y3: array<f32>;
//!END

const NONE: u32 = 0xffffffffu;

// Small integers to f32 without an int-to-float conversion: the f32 with bits 0x4B000000 | m
// (m < 2^23) is exactly 2^23 + m. A 4-bit field at bits 4l (l < 4) is masked IN PLACE, so lane l
// holds 2^23 + q * 16^l, and one subtract of 2^23 + bias * 16^l leaves (q - bias) * 16^l exactly.
// Lane l of every accumulator therefore carries the factor 16^l, removed (a power of two: exact)
// once per row by LANE_UNSCALE. One mask-or, one subtract and one FMA per weight; x stays f32.
const MAGIC: u32 = 0x4b000000u;
const NIBBLE_MASKS: vec4<u32> = vec4<u32>(0xfu, 0xf0u, 0xf00u, 0xf000u);
const INT3_MASKS: vec4<u32> = vec4<u32>(0x7u, 0x70u, 0x700u, 0x7000u);
const INT4_BIAS: vec4<f32> = vec4<f32>(8388616.0, 8388736.0, 8390656.0, 8421376.0);  // 2^23 + 8 * 16^l
const INT3_BIAS: vec4<f32> = vec4<f32>(8388612.0, 8388672.0, 8389632.0, 8404992.0);  // 2^23 + 4 * 16^l
const LANE_UNSCALE: vec4<f32> = vec4<f32>(1.0, 0.0625, 0.00390625, 0.000244140625);

// Partial sums for the reductions: ROWS_PER_THREAD rows per thread.
var<workgroup> red: array<f32, 256u * ROWS_PER_THREAD>;

//!IF SILU || CONV
// The row sums of the workgroup's row block (SILU: gate half, then up half) for the epilogue.
var<workgroup> block_sums: array<f32, ROWS_PER_WORKGROUP>;
//!END
//!IF CONV
// Largest short-conv kernel (wgsl/conv.wgsl's MAX_K).
const MAX_K: u32 = 8u;
//!END

//!IF XDIRECT
// x of the pair's token read straight from global memory: vec4 index of its column 0 (set once
// per thread in `main`; x_offset and x_stride are multiples of 4, checked on the host).
var<private> x_v0: u32;

// The index of x vec4 i of the tile in X (see `xs`).
fn x_at(i: u32) -> u32 {
    return x_v0 + i;
}

// The x vec4 at index p of `x_at`.
fn xs(p: u32) -> vec4<f32> {
    return X[p];
}
//!ELSE
// x of the pair's token, X_TILE columns at a time (normally the whole row), staged in workgroup
// memory as vec4 by coalesced loads, zeros past `cols` (so tail units need no masking). One pad
// vec4 every X_PAD_PERIOD vec4 makes the per-lane vec4 reads of the hot loop free of bank
// conflicts.
var<workgroup> XS: array<vec4<f32>, X_TILE / 4u + X_TILE / 4u / X_PAD_PERIOD>;

// The index in XS of tile vec4 i. A unit's vec4s (from a multiple of COLS_PER_UNIT / 4) never
// straddle a pad (X_PAD_PERIOD is a multiple of COLS_PER_UNIT / 4, or 8 for the 1- and 2-vec4
// units), so `x_at(xi) + k` is tile vec4 xi + k for every vec4 k of the unit at xi: the padded
// index is computed once per unit.
fn x_at(i: u32) -> u32 {
    return i + i / X_PAD_PERIOD;
}

// The x vec4 at index p of `x_at`.
fn xs(p: u32) -> vec4<f32> {
    return XS[p];
}

// Column c of the x row that starts at f32 index xb, as staged: 0 from `cols` on (indices clamped,
// so nothing past the row is read), else x.
fn x_in(xb: u32, c: u32) -> f32 {
    return select(0.0, X[xb + min(c, prm.cols - 1u)], c < prm.cols);
}
//!END

// Eight 4-bit fields of `wd` (field n at bits 4n, column n: x vec4s at `x_at` index xp and
// xp + 1), each masked with `masks` and decoded as (field - bias), added to `acc` by two FMA chains.
fn nibble_word(acc: vec4<f32>, wd: u32, masks: vec4<u32>, bias: vec4<f32>, xp: u32) -> vec4<f32> {
    let lo = bitcast<vec4<f32>>((vec4<u32>(wd) & masks) | vec4<u32>(MAGIC)) - bias;
    let hi = bitcast<vec4<f32>>((vec4<u32>(wd >> 16u) & masks) | vec4<u32>(MAGIC)) - bias;
    return fma(lo, xs(xp), fma(hi, xs(xp + 1u), acc));
}

// int3-g64 in its GPU bit order (FORMATS.md, GPU layout): the 2-bit lows of a lo word sit at
// bits 0-1 (word unshifted: columns 0-7) or 2-3 (word >> 2: columns 8-15) of each nibble, and the
// hi word holds the high bit of four 8-column sets at bits 2, 1, 3 and 0 of each nibble. One
// bitwise select joins them into eight 3-bit fields at nibble positions (bit 3 is masked off).
fn int3_eight(acc: vec4<f32>, lo: u32, hi: u32, xp: u32) -> vec4<f32> {
    return nibble_word(acc, (lo & 0x33333333u) | (hi & 0xccccccccu), INT3_MASKS, INT3_BIAS, xp);
}

// int3-g64: one 64-column group = four lo words and two hi words, x from `x_at` index xi.
fn int3_group(lo: vec4<u32>, hi: vec2<u32>, xi: u32) -> vec4<f32> {
    var d = int3_eight(vec4<f32>(0.0), lo.x, hi.x, xi);
    d = int3_eight(d, lo.x >> 2u, hi.x << 1u, xi + 2u);
    d = int3_eight(d, lo.y, hi.x >> 1u, xi + 4u);
    d = int3_eight(d, lo.y >> 2u, hi.x << 2u, xi + 6u);
    d = int3_eight(d, lo.z, hi.y, xi + 8u);
    d = int3_eight(d, lo.z >> 2u, hi.y << 1u, xi + 10u);
    d = int3_eight(d, lo.w, hi.y >> 1u, xi + 12u);
    return int3_eight(d, lo.w >> 2u, hi.y << 2u, xi + 14u);
}

// The final write of pair p's output row r (after the reduction, never in the hot loop): at
// Y[p * y_stride + y_offset + r], or with SEGMENTS into the packed [pairs, rows_i] matrix of r's
// segment i (rows seg_end[i-1] .. seg_end[i]; segment 0 in Y, 1-3 in Y1-Y3).
fn write_y(p: u32, r: u32, v: f32) {
//!IF SEGMENTS
    let e = prm.seg_end;
    if (r < e.x) {
        Y[p * e.x + r] = v;
    } else if (r < e.y) {
        Y1[p * (e.y - e.x) + (r - e.x)] = v;
    } else if (r < e.z) {
        Y2[p * (e.z - e.y) + (r - e.y)] = v;
    } else {
        Y3[p * (e.w - e.z) + (r - e.z)] = v;
    }
//!ELSE
    Y[p * prm.y_stride + prm.y_offset + r] = v;
//!END
}

// Where the row sum of row r (block-local row w) goes after the reduction: `write_y`, or with
// SILU the workgroup's `block_sums` for the epilogue of `main`.
fn out_row(p: u32, w: u32, r: u32, v: f32) {
//!IF SILU || CONV
    block_sums[w] = v;
//!ELSE
    write_y(p, r, v);
//!END
}

//!FOR k IN 0..WEIGHT_CHUNKS
// The group scales unit u of a row needs (`srow` = index in S$k of the row's first scale): x =
// the unit's group scale (int4-gN, a 32-column unit lies inside one group: GROUP_SIZE is 32, 64
// or 128), x and y = its two group scales (int3-g64; a lone last group has no scale B), zeros
// for the other formats.
fn unit_scales_$k(srow: u32, u: u32) -> vec2<f32> {
    if (FMT == FMT_INT4_GROUPED) {
        return vec2<f32>(S$k[srow + (u * 32u) / max(GROUP_SIZE, 1u)], 0.0);
    } else if (FMT == FMT_INT3_G64) {
        return vec2<f32>(S$k[srow + 2u * u], S$k[srow + min(2u * u + 1u, prm.scales_per_row - 1u)]);
    }
    return vec2<f32>(0.0);
}

// `unit_dot` of unit u of a row read in place (first word at vec4 index wv of W$k).
fn unit_dot_$k(acc: vec4<f32>, wv: u32, srow: u32, u: u32, xi: u32) -> vec4<f32> {
    let w1 = W$k[wv + min(1u, WORDS_PER_UNIT - 1u)];
    let w2 = W$k[wv + min(2u, WORDS_PER_UNIT - 1u)];
    return unit_dot(acc, W$k[wv], w1, w2, unit_scales_$k(srow, u), xi);
}

//!END FOR

// THE per-format decode step: one unit of a row (weight words w0, and w1 and w2 for int3-g64;
// group scales `s` of `unit_scales_0`) dotted with x from tile-local vec4 index xt, added to
// `acc` (scale of the unit's group applied).
fn unit_dot(acc: vec4<f32>, w0: vec4<u32>, w1: vec4<u32>, w2: vec4<u32>, s: vec2<f32>, xt: u32) -> vec4<f32> {
    let xi = x_at(xt);
    if (FMT == FMT_F32) {
        return fma(bitcast<vec4<f32>>(w0), xs(xi), acc);
    } else if (FMT == FMT_BF16) {
        // two values per word, low half first; w = f32 with those upper 16 bits
        let wd = w0;
        let x0 = xs(xi);
        let x1 = xs(xi + 1u);
        let ev = bitcast<vec4<f32>>(wd << vec4<u32>(16u));
        let od = bitcast<vec4<f32>>(wd & vec4<u32>(0xffff0000u));
        return fma(ev, vec4<f32>(x0.x, x0.z, x1.x, x1.z), fma(od, vec4<f32>(x0.y, x0.w, x1.y, x1.w), acc));
    } else if (FMT == FMT_INT4 || FMT == FMT_INT4_GROUPED) {
        let wd = w0;
        if (FMT == FMT_INT4_GROUPED) {
            var d = nibble_word(vec4<f32>(0.0), wd.x, NIBBLE_MASKS, INT4_BIAS, xi);
            d = nibble_word(d, wd.y, NIBBLE_MASKS, INT4_BIAS, xi + 2u);
            d = nibble_word(d, wd.z, NIBBLE_MASKS, INT4_BIAS, xi + 4u);
            d = nibble_word(d, wd.w, NIBBLE_MASKS, INT4_BIAS, xi + 6u);
            return fma(d, vec4<f32>(s.x), acc);
        }
        // the row scale is applied once per row after the loop
        var a = nibble_word(acc, wd.x, NIBBLE_MASKS, INT4_BIAS, xi);
        a = nibble_word(a, wd.y, NIBBLE_MASKS, INT4_BIAS, xi + 2u);
        a = nibble_word(a, wd.z, NIBBLE_MASKS, INT4_BIAS, xi + 4u);
        return nibble_word(a, wd.w, NIBBLE_MASKS, INT4_BIAS, xi + 6u);
    } else {
        // int3-g64: a unit is two groups in 3 vec4: group A = a, b.xy; group B = b.zw c.xy, c.zw
        let ga = int3_group(w0, w1.xy, xi);
        let gb = int3_group(vec4<u32>(w1.z, w1.w, w2.x, w2.y), w2.zw, xi + 16u);
        return fma(ga, vec4<f32>(s.x), fma(gb, vec4<f32>(s.y), acc));
    }
}

// The hot loop of one thread over its units from `u_begin` to `u_end` (stride THREADS_PER_ROW)
// of its rows in weight chunk k (Wk, Sk), written into `main` once per bound chunk
// (`//!INSERT hot_loop(k)`): straight-line code, UNITS_PER_STEP (2) units per step, their weight loads issued
// together, one x read per unit shared by the ROWS_PER_THREAD rows; `t0` = first column of the
// x tile. UNIT_ARRAYS (the quantised formats) loads a step's words and group scales into arrays
// before decoding them; without it (f32, bf16) the two units are read in place. With PREFETCH the
// next step's words and scales load before this step decodes (a software pipeline: a thread's
// weight loads stay in flight while it computes); a prefetch past the last unit re-reads the
// last unit (clamped, never decoded).
//!DEFINE hot_loop(k)
//!IF UNIT_ARRAYS
            // words and scales of one step: unit k of row rr at k * ROWS_PER_THREAD + rr
            var cw: array<vec4<u32>, ROWS_PER_THREAD * UNITS_PER_STEP * WORDS_PER_UNIT>;
            var cs: array<vec2<f32>, ROWS_PER_THREAD * UNITS_PER_STEP>;
            let last = u_end - 1u;
//!IF PREFETCH
            for (var k = 0u; k < UNITS_PER_STEP; k++) {
                let uk = min(u_begin + k * THREADS_PER_ROW, last);
                for (var rr = 0u; rr < ROWS_PER_THREAD; rr++) {
                    let i = k * ROWS_PER_THREAD + rr;
                    for (var j = 0u; j < WORDS_PER_UNIT; j++) {
                        cw[i * WORDS_PER_UNIT + j] = W$k[rowv[rr] + uk * WORDS_PER_UNIT + j];
                    }
                    cs[i] = unit_scales_$k(srow[rr], uk);
                }
            }
//!END
            for (var u = u_begin; u < u_end; u += UNITS_PER_STEP * THREADS_PER_ROW) {
//!IF PREFETCH
                // the next step's units (clamped to the last: never decoded past it)
                var nw: array<vec4<u32>, ROWS_PER_THREAD * UNITS_PER_STEP * WORDS_PER_UNIT>;
                var ns: array<vec2<f32>, ROWS_PER_THREAD * UNITS_PER_STEP>;
                let un = u + UNITS_PER_STEP * THREADS_PER_ROW;
//!ELSE
                let un = u;
//!END
                for (var k = 0u; k < UNITS_PER_STEP; k++) {
                    let uk = min(un + k * THREADS_PER_ROW, last);
                    for (var rr = 0u; rr < ROWS_PER_THREAD; rr++) {
                        let i = k * ROWS_PER_THREAD + rr;
                        for (var j = 0u; j < WORDS_PER_UNIT; j++) {
//!IF PREFETCH
                            nw[i * WORDS_PER_UNIT + j] = W$k[rowv[rr] + uk * WORDS_PER_UNIT + j];
//!ELSE
                            cw[i * WORDS_PER_UNIT + j] = W$k[rowv[rr] + uk * WORDS_PER_UNIT + j];
//!END
                        }
//!IF PREFETCH
                        ns[i] = unit_scales_$k(srow[rr], uk);
//!ELSE
                        cs[i] = unit_scales_$k(srow[rr], uk);
//!END
                    }
                }
                for (var k = 0u; k < UNITS_PER_STEP; k++) {
                    let uk = u + k * THREADS_PER_ROW;
                    if (uk < u_end) {
                        let xi = (uk * COLS_PER_UNIT - t0) / 4u;
                        for (var rr = 0u; rr < ROWS_PER_THREAD; rr++) {
                            let i = k * ROWS_PER_THREAD + rr;
                            let b = i * WORDS_PER_UNIT;
                            acc[rr] = unit_dot(acc[rr], cw[b], cw[b + min(1u, WORDS_PER_UNIT - 1u)],
                                cw[b + min(2u, WORDS_PER_UNIT - 1u)], cs[i], xi);
                        }
                    }
                }
//!IF PREFETCH
                cw = nw;
                cs = ns;
//!END
            }
//!ELSE
            var u = u_begin;
            for (; u + THREADS_PER_ROW < u_end; u += 2u * THREADS_PER_ROW) {
                let xi = (u * COLS_PER_UNIT - t0) / 4u;
                let xj = xi + THREADS_PER_ROW * (COLS_PER_UNIT / 4u);
                for (var rr = 0u; rr < ROWS_PER_THREAD; rr++) {
                    let a = unit_dot_$k(acc[rr], rowv[rr] + u * WORDS_PER_UNIT, srow[rr], u, xi);
                    acc[rr] = unit_dot_$k(a, rowv[rr] + (u + THREADS_PER_ROW) * WORDS_PER_UNIT, srow[rr], u + THREADS_PER_ROW, xj);
                }
            }
            if (u < u_end) {
                let xi = (u * COLS_PER_UNIT - t0) / 4u;
                for (var rr = 0u; rr < ROWS_PER_THREAD; rr++) {
                    acc[rr] = unit_dot_$k(acc[rr], rowv[rr] + u * WORDS_PER_UNIT, srow[rr], u, xi);
                }
            }
//!END
//!END DEFINE

//!IF ENTRY
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
//!IF SUBGROUP
    // Work is assigned by subgroup lane, so no layout of subgroups over local_invocation_index is
    // assumed; any power-of-two subgroup size (8 lavapipe, 32 NVIDIA/Apple, 64 AMD) works.
    gemv_body(wid.x + wid.y * nwg.x, li, sg_id * sg_size + sg_inv, sg_size);
//!ELSE
    gemv_body(wid.x + wid.y * nwg.x, li, li, 0u);
//!END
}
//!END

// The workgroup of linear index `lin` (workgroup-uniform): thread `li`, working as thread `v`
// (its subgroup lane order under SUBGROUP, else `li`) of subgroups of `sg_size` lanes (unused
// without SUBGROUP). The entry point `main`, or a pair's (`gemv_pair.rs`), calls it.
fn gemv_body(lin: u32, li: u32, v: u32, sg_size: u32) {
    let n_blocks = prm.row_blocks.x + prm.row_blocks.y;
    if (lin >= prm.n_pairs * n_blocks) {
        return; // whole workgroup: lin is workgroup-uniform
    }
    let p = lin / n_blocks;
    let blk = lin % n_blocks;
    // the block's chunk: the row blocks of chunk 0 come first, then those of chunk 1
    let in1 = blk >= prm.row_blocks.x;
    let ch = select(prm.chunk0, prm.chunk1, in1);
    let cblk = select(blk, blk - prm.row_blocks.x, in1);
    let lane = v % THREADS_PER_ROW;
    // this thread's group of THREADS_PER_ROW threads handles rows r_first .. r_first + ROWS_PER_THREAD
    // (block-local rows w_first ..)
    let w_first = (v / THREADS_PER_ROW) * ROWS_PER_THREAD;
    let e = PAIRS[4u * p];
    let t = select(PAIRS[4u * p + 1u], p, prm.x_row_is_pair != 0u);
    let wi = PAIRS[4u * p + 2u];
    let in_chunk = e >= ch.x && e < ch.y;
//!IF SILU
    // the chunk holds whole experts (z = 0, w = 2I'): gate rows [b·R/2, (b+1)·R/2) in the first
    // half of the block, the up rows I' + the same in the second
    let half = ROWS_PER_WORKGROUP / 2u;
    let n_gate = (ch.w - ch.z) / 2u;
    let g_first = cblk * half + w_first % half;
    let r_first = ch.z + select(g_first, n_gate + g_first, w_first >= half);
    let live = in_chunk && g_first < n_gate;
    let n_live = select(0u, min(ROWS_PER_THREAD, n_gate - g_first), live);
//!ELSE
    let r_first = ch.z + cblk * ROWS_PER_WORKGROUP + w_first;
    let live = in_chunk && r_first < ch.w;
    let n_live = select(0u, min(ROWS_PER_THREAD, ch.w - r_first), live);
//!END

    // rows past the chunk's end repeat its last row (read, never written): no branch in the hot loop
    var acc: array<vec4<f32>, ROWS_PER_THREAD>;
    var rowv: array<u32, ROWS_PER_THREAD>;
    var srow: array<u32, ROWS_PER_THREAD>;
    let ebase = (min(e, ch.y - 1u) - min(e, ch.x)) * (ch.w - ch.z);
    for (var rr = 0u; rr < ROWS_PER_THREAD; rr++) {
        let local_row = ebase + (min(r_first + rr, ch.w - 1u) - ch.z);
        rowv[rr] = local_row * prm.row_stride_v4;
        srow[rr] = local_row * prm.scales_per_row;
        acc[rr] = vec4<f32>(0.0);
    }
    let xb = t * prm.x_stride + prm.x_offset;
    let n_units = (prm.cols + COLS_PER_UNIT - 1u) / COLS_PER_UNIT;
//!IF XDIRECT
    // one pass over the whole row, x from global memory (cols is a whole number of units)
    x_v0 = xb / 4u;
    {
        let t0 = 0u;
        let u_end = n_units;
//!ELSE
    for (var t0 = 0u; t0 < prm.cols; t0 += X_TILE) {
        if (t0 > 0u) {
            workgroupBarrier(); // the previous tile is no longer read
        }
        if (in_chunk) {
            // whole units only: zeros from `cols` up to the end of the last unit
            let fill = min(X_TILE, ((prm.cols - t0 + COLS_PER_UNIT - 1u) / COLS_PER_UNIT) * COLS_PER_UNIT) / 4u;
            for (var j = li; j < fill; j += 256u) {
                let c = t0 + 4u * j;
                XS[j + j / X_PAD_PERIOD] = vec4<f32>(
                    x_in(xb, c), x_in(xb, c + 1u), x_in(xb, c + 2u), x_in(xb, c + 3u));
            }
        }
        workgroupBarrier();
        let u_end = min(n_units, (t0 + X_TILE) / COLS_PER_UNIT);
//!END
        if (live) {
            let u_begin = t0 / COLS_PER_UNIT + lane;
//!IF CHUNK1
            if (in1) {
//!INSERT hot_loop(1)
            } else {
//!INSERT hot_loop(0)
            }
//!ELSE
//!INSERT hot_loop(0)
//!END
        }
    }
    var sums: array<f32, ROWS_PER_THREAD>;
    for (var rr = 0u; rr < ROWS_PER_THREAD; rr++) {
        var a = acc[rr];
        if (FMT == FMT_INT4 || FMT == FMT_INT4_GROUPED || FMT == FMT_INT3_G64) {
            a *= LANE_UNSCALE;
        }
        sums[rr] = (a.x + a.y) + (a.z + a.w);
        if (FMT == FMT_INT4 && live) {
            // the row scale, once per row
//!IF CHUNK1
            if (in1) {
                sums[rr] *= S1[srow[rr]];
            } else {
                sums[rr] *= S0[srow[rr]];
            }
//!ELSE
            sums[rr] *= S0[srow[rr]];
//!END
        }
    }

//!IF SUBGROUP
    // butterfly inside aligned blocks of m = min(subgroup size, THREADS_PER_ROW) lanes, then across blocks
    let m = min(sg_size, THREADS_PER_ROW);
    for (var rr = 0u; rr < ROWS_PER_THREAD; rr++) {
        var a = sums[rr];
        for (var off = 1u; off < m; off <<= 1u) {
            a += subgroupShuffleXor(a, off);
        }
        if (m < THREADS_PER_ROW && v % m == 0u) {
            red[(v / m) * ROWS_PER_THREAD + rr] = a;
        }
        sums[rr] = a;
    }
    workgroupBarrier();
    if (lane == 0u) {
        for (var rr = 0u; rr < n_live; rr++) {
            var sum = sums[rr];
            if (m < THREADS_PER_ROW) {
                sum = 0.0;
                for (var k = 0u; k < THREADS_PER_ROW / m; k++) {
                    sum += red[(v / m + k) * ROWS_PER_THREAD + rr];
                }
            }
            if (wi != NONE && prm.use_gamma != 0u) {
                sum *= GAMMA[wi];
            }
            out_row(p, w_first + rr, r_first + rr, sum);
        }
    }
//!ELSE
    for (var rr = 0u; rr < ROWS_PER_THREAD; rr++) {
        red[v * ROWS_PER_THREAD + rr] = sums[rr];
    }
    workgroupBarrier();
    for (var s = THREADS_PER_ROW / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            for (var rr = 0u; rr < ROWS_PER_THREAD; rr++) {
                red[v * ROWS_PER_THREAD + rr] += red[(v + s) * ROWS_PER_THREAD + rr];
            }
        }
        workgroupBarrier();
    }
    if (lane == 0u) {
        for (var rr = 0u; rr < n_live; rr++) {
            var o = red[v * ROWS_PER_THREAD + rr];
            if (wi != NONE && prm.use_gamma != 0u) {
                o *= GAMMA[wi];
            }
            out_row(p, w_first + rr, r_first + rr, o);
        }
    }
//!END
//!IF SILU
    // the epilogue: gate i and up i of the block joined as silu_mul in wgsl/elementwise.wgsl does
    workgroupBarrier();
    for (var j = li; j < half; j += 256u) {
        let gi = cblk * half + j;
        if (in_chunk && gi < n_gate) {
            let gv = block_sums[j];
            let uv = block_sums[half + j];
            Y[p * prm.y_stride + prm.y_offset + gi] = gv / (1.0 + exp(-gv)) * uv;
        }
    }
//!END
//!IF CONV
    // the epilogue: row r is channel r of token t; the causal depthwise short conv of
    // wgsl/conv.wgsl over the channel's window (the slot's K-1 previous inputs, then this row's
    // sum), the same f32 operations in the same order, added to Y (the residual h += conv); the
    // window moves on by one
    workgroupBarrier();
    let conv_k = prm.conv.x;
    let km1 = conv_k - 1u;
    let slot = CSLOT[select(0u, t, prm.conv.y != 0u)].y;
    let sb = slot * km1 * prm.rows;
    for (var j = li; j < ROWS_PER_WORKGROUP; j += 256u) {
        let c = ch.z + cblk * ROWS_PER_WORKGROUP + j;
        if (in_chunk && c < ch.w) {
            let xv = block_sums[j];
            var win: array<f32, MAX_K>;
            var s = 0.0;
            for (var q = 0u; q < MAX_K; q++) {
                if (q < km1) {
                    win[q] = CSTATE[sb + q * prm.rows + c];
                    s += CW[c * conv_k + q] * win[q];
                } else if (q == km1) {
                    s += CW[c * conv_k + q] * xv;
                }
            }
            let yi = p * prm.y_stride + prm.y_offset + c;
            Y[yi] += xv + s;
            for (var q = 0u; q + 1u < MAX_K; q++) {
                if (q + 1u < km1) {
                    CSTATE[sb + q * prm.rows + c] = win[q + 1u];
                } else if (q + 1u == km1) {
                    CSTATE[sb + q * prm.rows + c] = xv;
                }
            }
        }
    }
//!END
}
