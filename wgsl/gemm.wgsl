// The MoE GEMM (prefill): the GEMV's problem for many pairs at once, each weight read once per
// tile of pairs. Instantiated by src/gpu/linear/gemm.rs (`gemm::wgsl_source`):
//   * a generated prelude defines the format ordinals FMT_* from the registry, FMT and
//     GROUP_SIZE (0 = none) of this instantiation, ROWS_PER_THREAD, PAIR_QUADS (quads of pairs
//     per tile: a tile holds PAIRS_PER_TILE = 4 * PAIR_QUADS pairs), PAIRS_PER_TILE and
//     MAX_EXPERTS (most experts the sort pass can group);
//   * `//!IF SORT` selects the grouping pass (entry `sort_pairs`) over the GEMM (entry `main`);
//   * the preprocessor (`kernel::preprocess_with`) writes the column loop's body and the final
//     writes unrolled for the tile (`//!FOR` over rows r < ROWS_PER_THREAD, quads q <
//     PAIR_QUADS, octets o < 4, x items j), so that no per-thread array is indexed by a loop
//     variable: each accumulator, raw word and decoded weight is a named value that the
//     driver's compiler keeps in registers. PREFETCH_AFTER (a preprocessor value) is the octet
//     before which the next step's weights are loaded.
//
// Problem, as the GEMV (wgsl/gemv.wgsl): for pairs p in 0..n_pairs,
//   Y[p * y_stride + y_offset + r] = gamma(p) * sum_i W_{expert(p)}[r, i] * X[xrow(p) * x_stride + x_offset + i]
// with xrow(p) = token(p), or p with `x_per_pair` (bit 8 of `pair_mode`), for the rows r0 <= r < r1
// of the experts e0 <= e < e1 held by the bound weight chunk; pairs of other experts are not
// written. PAIRS holds 4 u32 per pair (expert, token, weight_idx, pad); weight_idx 0xFFFFFFFF = no
// gamma. Weight rows, scales and their decode are the GEMV's (the GPU layout of FORMATS.md:
// rows padded to whole units, int3-g64 in its GPU bit order; f32 scales [E][O][scales_per_row]).
//
// Tiles of pairs. Unsorted (bit 0 of `pair_mode` clear, one-expert slabs): tile s holds pairs
// s * PAIRS_PER_TILE .. (s + 1) * PAIRS_PER_TILE; a pair whose expert is not e0 is skipped.
// Sorted (bit 0 set): the SORT pass first groups the pairs by expert into the scratch buffer SC:
//   SC[4 s .. 4 s + 3]       tile s = (expert, first sorted index, pair count (0 = empty), 0),
//                            s < n_tiles = ceil(n_pairs / PAIRS_PER_TILE) + min(E, n_pairs), a
//                            bound on sum_e ceil(count_e / PAIRS_PER_TILE);
//   SC[4 n_tiles + k]        the k-th pair index in expert order.
// Then every tile holds at most PAIRS_PER_TILE pairs of ONE expert. Pairs with expert >= E are in
// no tile.
//
// GEMM workgroup: 256 threads = 64 row sets x 4 lanes; a row set owns ROWS_PER_THREAD
// consecutive rows, so a workgroup covers ROWS_PER_TILE = 64 * ROWS_PER_THREAD rows of one tile.
// Thread li is lane (li / 32) % 4 of row set li % 32 + 32 (li / 128): 32 consecutive threads
// share a lane, so their x reads are broadcasts. The columns run in steps of 128: the x of the
// tile's pairs for the step is staged in workgroup memory (zeros past `cols` and for empty slots,
// pre-scaled for int4 as in the GEMV), then lane l of a row set reads columns 32 l .. 32 l + 31
// of its rows from global memory, decodes each weight ONCE and multiplies it into the tile's
// pairs' accumulators (ROWS_PER_THREAD x PAIRS_PER_TILE f32 per thread, as vec4 over 4 pairs);
// each x vec4 read from workgroup memory feeds ROWS_PER_THREAD FMAs. The 4 lanes' partial sums
// are added through workgroup memory at the end. Each output is one f32 sum over the row in a
// fixed order (the same for every tile).

struct Params {
    rows: u32,      // O, rows per expert
    cols: u32,      // I, columns
    n_pairs: u32,   // P
    row_stride_v4: u32, // padded weight row stride in vec4<u32>
    e0: u32,        // experts [e0, e1) are in this chunk
    e1: u32,
    r0: u32,        // rows [r0, r1) of each of them are in this chunk
    r1: u32,
    x_stride: u32,  // f32 elements between x rows
    x_offset: u32,  // f32 element offset of x row 0
    y_stride: u32,  // f32 elements between pairs in Y
    y_offset: u32,  // f32 element offset of pair 0, row 0
    scales_per_row: u32, // f32 scales per row (0 when the format has none)
    row_blocks: u32, // row blocks in this chunk: ceil((r1 - r0) / ROWS_PER_TILE)
    use_gamma: u32, // 0: ignore weight_idx (no gamma buffer bound)
    pair_mode: u32, // bit 0: sorted tiles in SC; bit 8: x row = pair index (x_per_pair)
    n_tiles: u32,   // tiles launched per row block
    experts: u32,   // E of the slab (sort pass)
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> prm: Params;
//!IF SORT
@group(0) @binding(1) var<storage, read> PAIRS: array<u32>;
@group(0) @binding(2) var<storage, read_write> SC: array<u32>;

// per-expert pair counts, then write cursors
var<workgroup> cnt: array<atomic<u32>, MAX_EXPERTS>;
var<workgroup> cur: array<atomic<u32>, MAX_EXPERTS>;
// per-thread sums of the scans (pairs, tiles)
var<workgroup> scan_p: array<u32, 256>;
var<workgroup> scan_t: array<u32, 256>;

// One workgroup: count the pairs of each expert, exclusive scans of the counts and of the tiles
// per expert (each thread owns MAX_EXPERTS / 256 consecutive experts), scatter the pair indices in
// expert order (order inside an expert is free: each pair's sum does not depend on it), then
// write every tile (empty ones with count 0).
@compute @workgroup_size(256)
fn sort_pairs(@builtin(local_invocation_index) li: u32) {
    let ne = prm.experts;
    let np = prm.n_pairs;
    let nt = prm.n_tiles;
    const PER: u32 = MAX_EXPERTS / 256u;
    for (var e = li; e < MAX_EXPERTS; e += 256u) {
        atomicStore(&cnt[e], 0u);
    }
    workgroupBarrier();
    for (var p = li; p < np; p += 256u) {
        let e = PAIRS[4u * p];
        if (e < ne) {
            atomicAdd(&cnt[e], 1u);
        }
    }
    workgroupBarrier();
    var sp = 0u;
    var st = 0u;
    for (var k = 0u; k < PER; k++) {
        let c = atomicLoad(&cnt[li * PER + k]);
        sp += c;
        st += (c + PAIRS_PER_TILE - 1u) / PAIRS_PER_TILE;
    }
    scan_p[li] = sp;
    scan_t[li] = st;
    workgroupBarrier();
    // Hillis-Steele inclusive scan over the 256 thread sums
    for (var off = 1u; off < 256u; off <<= 1u) {
        var ap = 0u;
        var at = 0u;
        if (li >= off) {
            ap = scan_p[li - off];
            at = scan_t[li - off];
        }
        workgroupBarrier();
        scan_p[li] += ap;
        scan_t[li] += at;
        workgroupBarrier();
    }
    var bp = scan_p[li] - sp;
    var bt = scan_t[li] - st;
    for (var k = 0u; k < PER; k++) {
        let e = li * PER + k;
        let c = atomicLoad(&cnt[e]);
        atomicStore(&cur[e], bp);
        for (var j = 0u; j * PAIRS_PER_TILE < c; j++) {
            let s = bt + j;
            SC[4u * s] = e;
            SC[4u * s + 1u] = bp + j * PAIRS_PER_TILE;
            SC[4u * s + 2u] = min(PAIRS_PER_TILE, c - j * PAIRS_PER_TILE);
            SC[4u * s + 3u] = 0u;
        }
        bp += c;
        bt += (c + PAIRS_PER_TILE - 1u) / PAIRS_PER_TILE;
    }
    let used = scan_t[255];
    for (var s = used + li; s < nt; s += 256u) {
        SC[4u * s] = 0u;
        SC[4u * s + 1u] = 0u;
        SC[4u * s + 2u] = 0u;
        SC[4u * s + 3u] = 0u;
    }
    workgroupBarrier();
    let base = 4u * nt;
    for (var p = li; p < np; p += 256u) {
        let e = PAIRS[4u * p];
        if (e < ne) {
            SC[base + atomicAdd(&cur[e], 1u)] = p;
        }
    }
}
//!ELSE
@group(0) @binding(1) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> S: array<f32>;
@group(0) @binding(3) var<storage, read> X: array<f32>;
@group(0) @binding(4) var<storage, read> PAIRS: array<u32>;
@group(0) @binding(5) var<storage, read> GAMMA: array<f32>;
@group(0) @binding(6) var<storage, read> SC: array<u32>;
@group(0) @binding(7) var<storage, read_write> Y: array<f32>;

const NONE: u32 = 0xffffffffu;
const ROWS_PER_TILE: u32 = 64u * ROWS_PER_THREAD;
// the x tile: 128 columns x PAIR_QUADS vec4 (4 pairs each), one pad vec4 per 32 columns so that the
// 4 lanes of a row set (32 columns apart) read 4 different bank groups; after the column loop
// it holds the 256 threads' partial sums (emit; 128 PAIR_QUADS + 4 >= 256 for PAIR_QUADS >= 2)
const XS_LEN: u32 = 128u * PAIR_QUADS + 4u;
var<workgroup> XS: array<vec4<f32>, XS_LEN>;
// the tile's slots: x row base (NONE = empty slot), pair index, gamma
var<workgroup> slot_x: array<u32, PAIRS_PER_TILE>;
var<workgroup> slot_p: array<u32, PAIRS_PER_TILE>;
var<workgroup> slot_g: array<f32, PAIRS_PER_TILE>;
var<workgroup> tile_e: u32;

// int4 magic-number decode, as the GEMV: nibbles masked in place, x pre-scaled by 16^-n
const MAGIC: u32 = 0x4b000000u;
const INT3_BIAS: f32 = 8388612.0; // 2^23 + 4
const INT4_MASKS_COLS_0_3: vec4<u32> = vec4<u32>(0xfu, 0xf0u, 0xf00u, 0xf000u);
const INT4_MASKS_COLS_4_7: vec4<u32> = vec4<u32>(0xf0000u, 0xf00u, 0xf000u, 0xf0000u);
const INT4_BIAS_COLS_0_3: vec4<f32> = vec4<f32>(8388616.0, 8388736.0, 8390656.0, 8421376.0);
const INT4_BIAS_COLS_4_7: vec4<f32> = vec4<f32>(8912896.0, 8390656.0, 8421376.0, 8912896.0);
const INT4_X_SCALE_COLS_0_3: vec4<f32> = vec4<f32>(1.0, 0.0625, 0.00390625, 0.000244140625);
const INT4_X_SCALE_COLS_4_7: vec4<f32> = vec4<f32>(0.0000152587890625, 0.00390625, 0.000244140625, 0.0000152587890625);

fn xs_index(lc: u32) -> u32 {
    return lc * PAIR_QUADS + lc / 32u;
}

// Factor of column c applied while staging x (int4: 16^-n of its nibble's in-place position).
fn stage_scale(c: u32) -> f32 {
    if (FMT == FMT_INT4 || FMT == FMT_INT4_GROUPED) {
        let v = select(INT4_X_SCALE_COLS_0_3, INT4_X_SCALE_COLS_4_7, (c & 4u) != 0u);
        return v[c & 3u];
    }
    return 1.0;
}

// int3-g64: the values u - 4 of the low four 3-bit nibbles of `j` (nibble n at bits 4n .. 4n + 2)
fn int3_four(j: u32) -> vec4<f32> {
    let u = (vec4<u32>(j) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(7u);
    return bitcast<vec4<f32>>(u | vec4<u32>(MAGIC)) - vec4<f32>(INT3_BIAS);
}

// Words of one lane's 32 columns of one row per 128-column step: 8 vec4 (f32), 4 (bf16), one
// (int4: 4 words of 8 columns; int3-g64: 2 words of lows and 1 of highs in .xyz).
const WORDS_PER_LANE: u32 = select(select(1u, 4u, FMT == FMT_BF16), 8u, FMT == FMT_F32);

// The raw words of lane `lane`'s columns k0 + 32 lane .. + 31 of the row at vec4 `rowv` (last
// vec4 of the row: `last`; loads never leave the row).
fn load_w(rowv: u32, last: u32, k0: u32, lane: u32) -> array<vec4<u32>, WORDS_PER_LANE> {
    var raw: array<vec4<u32>, WORDS_PER_LANE>;
    let c = k0 + 32u * lane;
    if (FMT == FMT_INT3_G64) {
        // int3-g64: a 128-column unit is 12 words: group A lows 0-3, highs 4-5; group B lows
        // 6-9, highs 10-11; lane l takes half l % 2 of group l / 2
        let wb = 4u * rowv + 12u * (k0 / 128u) + 6u * (lane / 2u);
        let h = lane & 1u;
        let lw = 4u * last + 3u;
        let a = min(wb + 2u * h, lw);
        let b = min(wb + 2u * h + 1u, lw);
        let hi = min(wb + 4u + h, lw);
        raw[0] = vec4<u32>(W[a / 4u][a & 3u], W[b / 4u][b & 3u], W[hi / 4u][hi & 3u], 0u);
    } else {
        let cpv = select(select(32u, 8u, FMT == FMT_BF16), 4u, FMT == FMT_F32); // columns per vec4
        for (var m = 0u; m < WORDS_PER_LANE; m++) {
            raw[m] = W[min(rowv + c / cpv + m, last)];
        }
    }
    return raw;
}

// The 8 weights of octet o (columns c8 = k0 + 32 lane + 8 o .. c8 + 7) from the raw words:
// columns 0-3 in [0], 4-7 in [1] (int4: in-place values for the pre-scaled x; the int4 row scale
// is applied after the sum). `s` = the scale of the lane's columns (grouped formats). Zero past
// `cols`.
fn w8(raw: array<vec4<u32>, WORDS_PER_LANE>, o: u32, c8: u32, s: f32) -> array<vec4<f32>, 2> {
    var out: array<vec4<f32>, 2>;
    let ok = c8 < prm.cols;
    if (FMT == FMT_F32) {
        out[0] = select(vec4<f32>(0.0), bitcast<vec4<f32>>(raw[2u * o]), ok);
        out[1] = select(vec4<f32>(0.0), bitcast<vec4<f32>>(raw[2u * o + 1u]), c8 + 4u < prm.cols);
    } else if (FMT == FMT_BF16) {
        let wd = raw[o];
        let ev = bitcast<vec4<f32>>(wd << vec4<u32>(16u));
        let od = bitcast<vec4<f32>>(wd & vec4<u32>(0xffff0000u));
        out[0] = select(vec4<f32>(0.0), vec4<f32>(ev.x, od.x, ev.y, od.y), ok);
        out[1] = select(vec4<f32>(0.0), vec4<f32>(ev.z, od.z, ev.w, od.w), ok);
    } else if (FMT == FMT_INT4 || FMT == FMT_INT4_GROUPED) {
        let wd = raw[0][o];
        let wh = wd >> 12u;
        var a = bitcast<vec4<f32>>((vec4<u32>(wd) & INT4_MASKS_COLS_0_3) | vec4<u32>(MAGIC)) - INT4_BIAS_COLS_0_3;
        var b = bitcast<vec4<f32>>((vec4<u32>(wd, wh, wh, wh) & INT4_MASKS_COLS_4_7) | vec4<u32>(MAGIC)) - INT4_BIAS_COLS_4_7;
        if (FMT == FMT_INT4_GROUPED) {
            a *= s;
            b *= s;
        }
        out[0] = select(vec4<f32>(0.0), a, ok);
        out[1] = select(vec4<f32>(0.0), b, ok);
    } else {
        // int3-g64 in its GPU bit order (FORMATS.md, GPU layout; the GEMV's int3_group): the
        // lane's half h of its group has lo words 2h, 2h + 1 (raw .x, .y) and hi word h (.z);
        // value n of octet o has its 2-bit low part in lo word 2h + o / 2 at bits
        // 4n + 2·(o % 2) .. +1 and its high bit in the hi word at bit 4n + 2 (o = 0), 4n + 1 (1),
        // 4n + 3 (2), 4n (3); one select joins them into eight 3-bit nibbles
        let r = raw[0];
        let lo = r[o / 2u] >> (2u * (o & 1u));
        let h = r.z;
        let hi = select(select(h, h << 1u, o == 1u), select(h >> 1u, h << 2u, o == 3u), o >= 2u);
        let j = (lo & 0x33333333u) | (hi & 0x44444444u);
        out[0] = select(vec4<f32>(0.0), int3_four(j) * s, ok);
        out[1] = select(vec4<f32>(0.0), int3_four(j >> 16u) * s, ok);
    }
    return out;
}

// The scale of lane `lane`'s 32 columns of step k0 (grouped int4, int3-g64; 1 otherwise).
fn lane_scale(srow: u32, k0: u32, lane: u32) -> f32 {
    if (FMT == FMT_INT4_GROUPED) {
        return S[srow + min((k0 + 32u * lane) / max(GROUP_SIZE, 1u), prm.scales_per_row - 1u)];
    }
    if (FMT == FMT_INT3_G64) {
        return S[srow + min(2u * (k0 / 128u) + lane / 2u, prm.scales_per_row - 1u)];
    }
    return 1.0;
}

// The raw words raw{r} and scales sc{r} of every row of the thread at step k (a WGSL expression).
//!DEFINE load_weights(k)
//!FOR r IN 0..ROWS_PER_THREAD
    raw$r = load_w(rowv$r, rowv$r + prm.row_stride_v4 - 1u, $k, lane);
    sc$r = lane_scale(srow$r, $k, lane);
//!END FOR
//!END DEFINE

@compute @workgroup_size(256)
fn main(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let lin = wid.x + wid.y * nwg.x;
    if (lin >= prm.n_tiles * prm.row_blocks) {
        return; // whole workgroup: lin is workgroup-uniform
    }
    let tile = lin / prm.row_blocks;
    let blk = lin % prm.row_blocks;
    let sorted = (prm.pair_mode & 1u) != 0u;
    if (li < PAIRS_PER_TILE) {
        var e = prm.e0;
        var p = tile * PAIRS_PER_TILE + li;
        var live = p < prm.n_pairs;
        if (sorted) {
            e = SC[4u * tile];
            live = li < SC[4u * tile + 2u];
            p = SC[4u * prm.n_tiles + min(SC[4u * tile + 1u] + li, prm.n_pairs - 1u)];
        }
        p = min(p, prm.n_pairs - 1u);
        live = live && PAIRS[4u * p] == e && e >= prm.e0 && e < prm.e1;
        let xr = select(PAIRS[4u * p + 1u], p, (prm.pair_mode & 256u) != 0u);
        let wi = PAIRS[4u * p + 2u];
        slot_x[li] = select(NONE, xr * prm.x_stride + prm.x_offset, live);
        slot_p[li] = p;
        slot_g[li] = select(1.0, GAMMA[min(wi, arrayLength(&GAMMA) - 1u)], wi != NONE && prm.use_gamma != 0u);
        if (li == 0u) {
            tile_e = select(NONE, e, e >= prm.e0 && e < prm.e1);
        }
    }
    let e = workgroupUniformLoad(&tile_e);
    if (e == NONE) {
        return;
    }
    // the 32 threads of a subgroup-sized run share a lane (the same x addresses: broadcast
    // reads of XS) and own 32 row sets
    let lane = (li >> 5u) & 3u;
    let rset = (li & 31u) | ((li >> 7u) << 5u);
    let r_first = prm.r0 + blk * ROWS_PER_TILE + rset * ROWS_PER_THREAD;
    let ebase = (e - prm.e0) * (prm.r1 - prm.r0);
    // this thread's x items: column lc of token quads q0 + 2 j, read from the 4 slots' rows
    let lc = li & 127u;
    let q0 = li / 128u;
    let xscale = stage_scale(lc);
    // the start of this lane's 32 columns in XS (xs_index(32 lane))
    let xl = lane * (32u * PAIR_QUADS + 1u);
    // rows rowv{r} / srow{r} (rows past r1 repeat the last row: read, never written)
//!FOR r IN 0..ROWS_PER_THREAD
    let lrow$r = ebase + (min(r_first + ${r}u, prm.r1 - 1u) - prm.r0);
    let rowv$r = lrow$r * prm.row_stride_v4;
    let srow$r = lrow$r * prm.scales_per_row;
//!END FOR
    // slot rows xb{j} of quad q0 + 2 j and their x items xr{j}
//!FOR j IN 0..PAIR_QUADS / 2
    let xb$j = vec4<u32>(slot_x[4u * (q0 + ${2 * j}u)], slot_x[4u * (q0 + ${2 * j}u) + 1u], slot_x[4u * (q0 + ${2 * j}u) + 2u], slot_x[4u * (q0 + ${2 * j}u) + 3u]);
    var xr$j = load_x(xb$j, lc);
//!END FOR
    // accumulators a{r}_{q}: rows r_first + r, pairs 4 q .. 4 q + 3
//!FOR r IN 0..ROWS_PER_THREAD
//!FOR q IN 0..PAIR_QUADS
    var a${r}_$q = vec4<f32>(0.0);
//!END FOR
//!END FOR
    // the raw words raw{r} and scales sc{r} of step 0
//!FOR r IN 0..ROWS_PER_THREAD
    var raw$r: array<vec4<u32>, WORDS_PER_LANE>;
    var sc$r = 1.0;
//!END FOR
//!INSERT load_weights("0u")
    for (var k0 = 0u; k0 < prm.cols; k0 += 128u) {
        // this step's raw words and scales
//!FOR r IN 0..ROWS_PER_THREAD
        let cur$r = raw$r;
        let csc$r = sc$r;
//!END FOR
//!FOR j IN 0..PAIR_QUADS / 2
        XS[xs_index(lc) + q0 + ${2 * j}u] = xr$j * xscale;
//!END FOR
        workgroupBarrier();
        // the next step's x loads, in flight during the FMAs
        if (k0 + 128u < prm.cols) {
//!FOR j IN 0..PAIR_QUADS / 2
            xr$j = load_x(xb$j, k0 + 128u + lc);
//!END FOR
        }
        // octet o of the lane's columns: the 8 weights w{r}_{o} of each row, each times the x of
        // the tile's pairs; the next step's raw words and scales load before octet
        // PREFETCH_AFTER (the words of the octets before it are dead by then; clamped inside the
        // row past the last step), so their latency hides behind FMAs
//!FOR o IN 0..4
//!IF o == PREFETCH_AFTER
//!INSERT load_weights("k0 + 128u")
//!END
//!FOR r IN 0..ROWS_PER_THREAD
        let w${r}_$o = w8(cur$r, ${o}u, k0 + 32u * lane + ${8 * o}u, csc$r);
//!END FOR
//!FOR j IN 0..8
//!FOR q IN 0..PAIR_QUADS
        {
            let xv = XS[xl + ${(8 * o + j) * PAIR_QUADS + q}u];
//!FOR r IN 0..ROWS_PER_THREAD
            a${r}_$q = fma(vec4<f32>(w${r}_$o[${j / 4}][${j % 4}]), xv, a${r}_$q);
//!END FOR
        }
//!END FOR
//!END FOR
//!END FOR
        workgroupBarrier();
    }
    // the 4 lanes' sums of every accumulator, written
//!FOR r IN 0..ROWS_PER_THREAD
    var rs$r = 1.0;
    if (FMT == FMT_INT4) {
        rs$r = S[srow$r];
    }
//!FOR q IN 0..PAIR_QUADS
    emit(a${r}_$q, r_first + ${r}u, ${q}u, rs$r, li);
//!END FOR
//!END FOR
}

// Add the 4 lanes' partial sums of accumulator (row r, quad q) through XS and write them:
// lane q % 4 of each row set writes its row r (scaled by the int4 row scale `rs`) for the
// quad's live slots. Called by every thread in uniform control flow.
fn emit(acc: vec4<f32>, r: u32, q: u32, rs: f32, li: u32) {
    XS[li] = acc;
    workgroupBarrier();
    let lane = (li >> 5u) & 3u;
    if (lane == (q & 3u) && r < prm.r1) {
        let b = li & ~96u;
        let sum = ((XS[b] + XS[b + 32u]) + (XS[b + 64u] + XS[b + 96u])) * rs;
        for (var n = 0u; n < 4u; n++) {
            let slot = 4u * q + n;
            if (slot_x[slot] != NONE) {
                Y[slot_p[slot] * prm.y_stride + prm.y_offset + r] = sum[n] * slot_g[slot];
            }
        }
    }
    workgroupBarrier();
}

// x at column c of the rows starting at `b` (4 slots; NONE = empty slot), zero past `cols`.
fn load_x(b: vec4<u32>, c: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (c < prm.cols) {
        for (var n = 0u; n < 4u; n++) {
            if (b[n] != NONE) {
                v[n] = X[b[n] + c];
            }
        }
    }
    return v;
}
//!END
