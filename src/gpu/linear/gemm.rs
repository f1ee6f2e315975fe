//! The MoE GEMM (`wgsl/gemm.wgsl`): the GEMV problem of [`crate::gpu::gemv`] for calls with many
//! pairs per expert (prefill chunks), with each weight read once per tile of pairs.
//!
//! # Problem
//! Exactly the GEMV's: for P pairs `(expert, token, weight_idx)`,
//! `y[p, 0..O] = gamma[weight_idx(p)] · W_{expert(p)} · x[token(p), 0..I]` (or x row p with
//! `x_per_pair`), f32 in and out, f32 accumulation, over the same [`GpuWeights`] slab (FORMATS.md's
//! GPU layout: rows padded to whole units, int3-g64 in its GPU bit order; f32 scales) and the same
//! decode of each format.
//! [`GpuWeights::bind`] returns the GEMM's [`Call`] (label `"gemm"`, built by [`bind`]) instead
//! of GEMV dispatches when [`select`] says so; callers see one call either way.
//!
//! # Kernel shape
//! A workgroup (256 threads = 64 row sets × 4 lanes) computes a tile of BM = 64·RM rows × BN =
//! 4·NQ pairs of one expert ([`Tile`]). Columns run in steps of 128: the x rows of the tile's
//! pairs for the step are staged in workgroup memory (BN × 128 f32, padded against bank
//! conflicts), then each lane decodes 32 columns of its RM rows straight from global memory, once
//! per weight, and adds each weight times the BN staged x values into its RM × BN accumulators
//! (vec4 over 4 pairs: every x vec4 read from workgroup memory feeds RM FMAs; 32 consecutive
//! threads share a lane, so those reads are broadcasts). The 4 lanes of a row set add their
//! partial sums through the same workgroup memory at the end. The column loop's body is
//! generated unrolled for the tile ([`wgsl_source`]), so the accumulators stay in registers.
//! Workgroup memory: 16·(128·NQ + 4) + 12·BN + 4 bytes: 8.3 KiB at NQ 4 (within WebGPU's
//! default 16 KiB), 16.4 KiB at NQ 8 (benchmarks only; [`bind`] checks the device's limit). RM is
//! 1, 2, 4 or 8 and NQ 2, 4 or 8.
//!
//! # Grouping by expert
//! A one-expert slab (dense linears) tiles the pairs in order: tile s holds pairs s·BN .. s·BN +
//! BN. A slab of several experts first runs a one-workgroup pass (`sort_pairs`) that counts the
//! pairs of each expert, scans the counts and scatters the pair indices in expert order into a
//! scratch buffer owned by the call, with a table of tiles (expert, first index, count); the
//! GEMM then launches ceil(P / BN) + min(E, P) tiles per row block, a bound on Σ_e ceil(count_e /
//! BN), and the tiles past the used ones exit at once. The pairs come from the GPU router, so
//! the host never sees them. At most [`EMAX`] experts (workgroup memory of the pass).

use crate::formats::Encoding;
use crate::gpu::call::{dummy, grid_u64, Call, Dispatch, Label};
use crate::gpu::dispatch::DispatchError;
use crate::gpu::kernel::{self, Bind, Kernel, KernelSpec};
use crate::gpu::linear::args::{GemvArgs, Tile};
use crate::gpu::linear::format::{kernel_encodings, supported};
use crate::gpu::linear::gemv::{wgsl_format_const, wgsl_format_consts};
use crate::gpu::linear::route::{EMAX, TILES};
use crate::gpu::linear::slab::{gpu_row_stride, GpuWeights};
use crate::gpu::Gpu;
use std::fmt;

/// Source of the GEMM skeleton and its grouping pass.
pub const GEMM_WGSL: &str = include_str!("../../../wgsl/gemm.wgsl");

/// The WGSL of one instantiation: the generated prelude (every registry ordinal as a named
/// constant, then the instantiation's: see the header of `wgsl/gemm.wgsl`), then the GEMM (`sort`
/// false, entry `main`) or the grouping pass (`sort` true, entry `sort_pairs`; only the pairs per
/// tile matter to it), its column loop unrolled for `tile` by [`kernel::preprocess_with`].
pub fn wgsl_source(enc: Encoding, tile: Tile, sort: bool) -> String {
    let mut out = format!(
        "// gemm instantiation: {}{}, rm {} bn {}\n",
        enc.spelling(),
        if sort { " (sort pass)" } else { "" },
        tile.rm,
        tile.pairs(),
    );
    out.push_str(&wgsl_format_consts());
    let consts: [(&str, String); 6] = [
        ("FMT", wgsl_format_const(enc.format)),
        ("GROUP_SIZE", format!("{}u", enc.group_size)),
        ("ROWS_PER_THREAD", format!("{}u", tile.rm)),
        ("PAIR_QUADS", format!("{}u", tile.nq)),
        ("PAIRS_PER_TILE", format!("{}u", tile.pairs())),
        ("MAX_EXPERTS", format!("{EMAX}u")),
    ];
    for (name, value) in consts {
        out.push_str(&format!("const {name}: u32 = {value};\n"));
    }
    out.push_str(&kernel::preprocess_with(
        GEMM_WGSL,
        &[("SORT", sort)],
        &[
            ("ROWS_PER_THREAD", tile.rm as i64),
            ("PAIR_QUADS", tile.nq as i64),
            ("PREFETCH_AFTER", PREFETCH_AFTER),
        ],
    ));
    out
}

/// Octets (8 columns of a lane) of a column step computed before the next step's weights are
/// loaded (`PREFETCH_AFTER` in `wgsl/gemm.wgsl`).
const PREFETCH_AFTER: i64 = 2;

/// The uniform block of the GEMM and its grouping pass, the twin of `Params` in
/// `wgsl/gemm.wgsl` (field meanings there).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct GemmParams {
    rows: u32,
    cols: u32,
    n_pairs: u32,
    row_stride_v4: u32,
    e0: u32,
    e1: u32,
    r0: u32,
    r1: u32,
    x_stride: u32,
    x_offset: u32,
    y_stride: u32,
    y_offset: u32,
    scales_per_row: u32,
    row_blocks: u32,
    use_gamma: u32,
    pair_mode: u32,
    n_tiles: u32,
    experts: u32,
    pad0: u32,
    pad1: u32,
}

/// One GEMM pipeline: the format and the tile. Label `gemm:{encoding}:{BM}x{BN}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmKey {
    pub enc: Encoding,
    pub tile: Tile,
}

impl GemmKey {
    pub fn new(enc: Encoding, tile: Tile) -> GemmKey {
        GemmKey { enc, tile }
    }
}

impl fmt::Display for GemmKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.tile;
        write!(f, "gemm:{}:{}x{}", self.enc.spelling(), t.rows(), t.pairs())
    }
}

impl Kernel for GemmKey {
    type Params = GemmParams;
    fn entry(&self) -> &'static str {
        "main"
    }
    /// Uniform params, then weights, scales, x, pairs, gamma and the grouping scratch read-only,
    /// y read-write.
    fn bindings(&self) -> Vec<(u32, Bind)> {
        let mut v = vec![(0, Bind::Uniform)];
        v.extend((1..=6).map(|b| (b, Bind::Read)));
        v.push((7, Bind::Write));
        v
    }
    fn source(&self) -> String {
        wgsl_source(self.enc, self.tile, false)
    }
}

/// The grouping pass for tiles of the key's BN pairs. Label `gemm/sort:{BN}`. Built by
/// [`SortKey::of`], so that the tiles of one BN share one pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SortKey(pub Tile);

impl SortKey {
    /// The grouping pass of `tile`'s BN (the pass does not depend on its rows).
    pub fn of(tile: Tile) -> SortKey {
        SortKey(Tile { rm: 1, nq: tile.nq })
    }
}

impl fmt::Display for SortKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gemm/sort:{}", self.0.pairs())
    }
}

impl Kernel for SortKey {
    type Params = GemmParams;
    fn entry(&self) -> &'static str {
        "sort_pairs"
    }
    /// Uniform params, pairs read-only, scratch read-write.
    fn bindings(&self) -> Vec<(u32, Bind)> {
        vec![(0, Bind::Uniform), (1, Bind::Read), (2, Bind::Write)]
    }
    fn source(&self) -> String {
        wgsl_source(Encoding::F32, self.0, true)
    }
}

/// Every GEMM kernel the engine can build: each GEMM encoding ([`supported`]) × [`TILES`], then
/// the grouping pass of each BN.
pub fn kernels() -> Vec<KernelSpec> {
    kernels_for(&kernel_encodings())
}

/// The GEMM variants of `encs` (those with a GEMM) and the grouping passes, as [`kernels`].
pub fn kernels_for(encs: &[Encoding]) -> Vec<KernelSpec> {
    let mut v = Vec::new();
    for &enc in encs.iter().filter(|&&e| supported(e)) {
        for t in TILES {
            v.push(KernelSpec::of(&GemmKey::new(enc, t)));
        }
    }
    let mut sorts: Vec<SortKey> = TILES.iter().map(|&t| SortKey::of(t)).collect();
    sorts.dedup();
    v.extend(sorts.iter().map(KernelSpec::of));
    v
}

/// Workgroup-memory bytes of the GEMM with `tile` (x tile, reduction buffer, slot table).
pub fn workgroup_bytes(tile: Tile) -> u64 {
    16 * (128 * tile.nq as u64 + 4) + 12 * tile.pairs() as u64 + 4
}

/// The GEMM of `args` over `weights` with `tile`, as one [`Call`] labelled `"gemm"`: for a slab
/// of several experts the grouping pass first, then one dispatch per weight chunk; the grouping
/// scratch and the absent-gamma placeholder are owned by the call. The caller
/// ([`GpuWeights::bind`]) has checked `args` ([`GpuWeights::check_args`]).
/// [`DispatchError::Shape`] for 0 pairs, more than [`EMAX`] experts, a format without a GEMM
/// kernel, a tile the kernel cannot build
/// ([`Tile::buildable`]) or more than 65535² workgroups.
pub fn bind(
    gpu: &Gpu,
    weights: &GpuWeights,
    args: &GemvArgs<'_>,
    tile: Tile,
) -> Result<Call, DispatchError> {
    let enc = weights.encoding();
    let (o, i) = (weights.rows() as u32, weights.cols() as u32);
    let experts = weights.experts() as u32;
    let np = args.n_pairs;
    if np == 0 || experts > EMAX || !supported(enc) || !tile.buildable() {
        return Err(DispatchError::Shape(format!(
            "GEMM over {np} pairs and {experts} experts of {} with tile {tile:?} (needs ≥ 1 pair, \
             ≤ {EMAX} experts, a GEMM format, RM in 1, 2, 4, 8 and NQ in 2, 4, 8)",
            enc.spelling()
        )));
    }
    let smem = gpu.limits.max_compute_workgroup_storage_size as u64;
    if workgroup_bytes(tile) > smem {
        return Err(DispatchError::Shape(format!(
            "the GEMM tile {}x{} needs {} bytes of workgroup memory, but this device allows {smem}",
            tile.rm,
            tile.pairs(),
            workgroup_bytes(tile)
        )));
    }
    let x_stride = if args.x_stride == 0 { i } else { args.x_stride };
    let y_stride = if args.y_stride == 0 { o } else { args.y_stride };
    let bn = tile.pairs();
    let sorted = experts > 1;
    let n_tiles = np.div_ceil(bn) + if sorted { experts.min(np) } else { 0 };
    let scratch_words = if sorted {
        4 * n_tiles as u64 + np as u64
    } else {
        4
    };
    let scratch = gpu.storage("gemm pair groups", 4 * scratch_words);
    let no_gamma = args.gamma.is_none().then(|| dummy(gpu));
    let gamma = args.gamma.or(no_gamma.as_ref()).expect("one of them");
    let key = GemmKey::new(enc, tile);
    let base = GemmParams {
        rows: o,
        cols: i,
        n_pairs: np,
        row_stride_v4: (gpu_row_stride(enc, weights.cols()) / 16) as u32,
        x_stride,
        x_offset: args.x_offset,
        y_stride,
        y_offset: args.y_offset,
        scales_per_row: enc.scales_per_row(weights.cols()) as u32,
        use_gamma: args.gamma.is_some() as u32,
        pair_mode: (sorted as u32) | ((args.x_per_pair as u32) << 8),
        n_tiles,
        experts,
        ..GemmParams::default()
    };
    let mut dispatches = Vec::new();
    if sorted {
        dispatches.push(Dispatch::new(
            gpu,
            &SortKey::of(tile),
            &base,
            &[(1, args.pairs), (2, &scratch)],
            [1, 1, 1],
        ));
    }
    for c in weights.chunks() {
        let row_blocks = (c.r1 - c.r0).div_ceil(tile.rows());
        let p = GemmParams {
            e0: c.e0,
            e1: c.e1,
            r0: c.r0,
            r1: c.r1,
            row_blocks,
            ..base
        };
        let total = n_tiles as u64 * row_blocks as u64;
        let groups = grid_u64(total).ok_or_else(|| {
            DispatchError::Shape(format!("{total} GEMM workgroups exceed 65535²"))
        })?;
        dispatches.push(Dispatch::new(
            gpu,
            &key,
            &p,
            &[
                (1, &c.weights),
                (2, &c.scales),
                (3, args.x),
                (4, args.pairs),
                (5, gamma),
                (6, &scratch),
                (7, args.y),
            ],
            groups,
        ));
    }
    Ok(Call::new(Label::op("gemm"), dispatches).owning([scratch].into_iter().chain(no_gamma)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workgroup_memory_within_webgpu_defaults() {
        for t in TILES {
            assert!(workgroup_bytes(t) <= 16384, "{t:?}");
        }
    }
}
