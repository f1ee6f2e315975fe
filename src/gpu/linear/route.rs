//! Which kernel runs a linear call and how: the GEMV's per-dispatch [`Plan`] and the GEMM's
//! [`Tile`], chosen by [`route`] under the engine-wide [`LinearOptions`].
//!
//! # Per-call selection ([`plan`])
//! The work split and the x variant are chosen on the host for each dispatch from the format,
//! the pairs, the chunk's rows and x's alignment (rules measured on an H200 with
//! `bench kernels --tune`, BENCHMARKS.md#decision-gemv-tunings and #decision-gemv-direct-x):
//! * **direct x** (`XDIRECT` in the WGSL) for f32 and bf16 whenever [`direct_aligned`] holds (I a
//!   whole number of units: 4 columns for f32, 8 for bf16, so no tail masking; `x_stride` and
//!   `x_offset` multiples of 4, so every x row starts on a vec4): x is bound as
//!   `array<vec4<f32>>` and read in the hot loop straight from global memory (caches), with no
//!   staging loop, no barrier and no x array in workgroup memory. [`direct_candidates`] go from 8
//!   rows per workgroup (32 × 1) to 1 (256 × 1); the first reaching [`DIRECT_MIN_WORKGROUPS`]
//!   workgroups `n_pairs · ceil(rows / ROWS_PER_WORKGROUP)` is taken, else the last.
//! * **staged x** otherwise, always for int4/int3: [`candidates`] go from the format's default
//!   (most rows per workgroup) down; the first reaching its own workgroup minimum
//!   ([`min_workgroups`]) is taken, else the last (staging costs each workgroup a pass over x, so
//!   fewer, larger workgroups win while the GPU stays busy).
//!
//! Both variants compute the same sums in the same order. A forced tuning ([`LinearOptions::tuning`],
//! `bench kernels --tune`, or [`GemvArgs::tuning`]) wins over the selection (direct x then when aligned and ROWS_PER_WORKGROUP ≤
//! [`DIRECT_MAX_RPW`]). Pipelines are cached per (encoding, reduction, tuning, x tile, x variant,
//! weight chunks): everything that changes the WGSL.
//!
//! # GEMM selection ([`select`])
//! The GEMM replaces the GEMV when the call leaves the choice to the engine (automatic reduction,
//! no forced tuning in the call or in [`LinearOptions::tuning`], [`GemmChoice::Auto`], a GEMM in
//! [`LinearOptions::gemm`]), the
//! format has a GEMM kernel, E ≤ [`EMAX`], and the pairs per used expert,
//! `P / min(E, P)`, reach the format's `gemm_min_pairs` (the format table: 9 for f32, bf16 and
//! the int4 family, 14 for int3-g64): below that the GEMV, which reads each weight once per pair
//! at the copy bandwidth, wastes less than the GEMM's partly empty tiles. The tile is
//! [`auto_tile`]'s: the largest of [`TILES`] whose launch fills the GPU, so that a short chunk's
//! few workgroups are smaller ones spread over more SMs.

use crate::formats::{Encoding, Format};
use crate::gpu::linear::args::{strides, GemmChoice, GemvArgs, Reduction, Tile};
use crate::gpu::linear::format::{row, supported, Tuning};
use crate::gpu::linear::slab::{GpuWeights, WeightChunk};

/// Fewest workgroups a direct-x call (f32, bf16) should launch before [`plan`] settles for fewer
/// rows per workgroup (BENCHMARKS.md#decision-gemv-direct-x).
pub const DIRECT_MIN_WORKGROUPS: u64 = 1024;

/// Largest rows per workgroup of the direct-x variant (its candidates, and a forced tuning that
/// may use it).
pub const DIRECT_MAX_RPW: u32 = 8;

/// The default (largest) tuning of `f`'s kernel (BENCHMARKS.md#decision-gemv-tunings).
pub fn tuning(f: Format) -> Tuning {
    candidates(f)[0]
}

/// Rows per workgroup of `enc`'s default tuning ([`tuning`]); a call may use fewer ([`plan`]).
pub fn rows_per_workgroup(enc: Encoding) -> u32 {
    tuning(enc.format).rows_per_workgroup()
}

/// The staged-x tunings of `f`, most rows per workgroup first ([`plan`] takes the first that
/// reaches its [`min_workgroups`]); the first is the format's default.
pub fn candidates(f: Format) -> &'static [Tuning] {
    row(f).tunings
}

/// Fewest workgroups a staged-x call must launch to take the [`candidates`] entry of the same
/// index (the last entry is taken when none reaches its minimum). Measured on an H200
/// (BENCHMARKS.md#decision-gemv-tunings: more, smaller workgroups each stage the whole x row
/// again; fewer leave SMs idle). WebGPU reports no SM count, so these are constants sized for the
/// largest GPUs measured; on smaller GPUs they only cost slightly smaller workgroups on small
/// problems.
pub fn min_workgroups(f: Format) -> &'static [u64] {
    row(f).min_workgroups
}

/// The direct-x tunings (f32, bf16 with aligned x), most rows per workgroup first ([`plan`] takes
/// the first that reaches [`DIRECT_MIN_WORKGROUPS`]); all have ≤ [`DIRECT_MAX_RPW`] rows.
pub fn direct_candidates() -> &'static [Tuning] {
    &[
        Tuning { tpr: 32, rpt: 1 },
        Tuning { tpr: 64, rpt: 1 },
        Tuning { tpr: 128, rpt: 1 },
        Tuning { tpr: 256, rpt: 1 },
    ]
}

/// Whether the direct-x variant's alignment assumptions hold: f32 or bf16 (int4-g64 with direct x
/// measured 11–60% slower than staged on the H200, BENCHMARKS.md#decision-gemv-direct-x),
/// `cols` a whole number of units (4 columns for f32, 8 for bf16: no tail masking) and
/// `x_stride` (0 = `cols`) and `x_offset` multiples of 4 (every x row on a vec4).
pub fn direct_aligned(enc: Encoding, cols: u32, x_stride: u32, x_offset: u32) -> bool {
    let x_stride = if x_stride == 0 { cols } else { x_stride };
    let kf = row(enc.format);
    kf.direct_x
        && cols.is_multiple_of(kf.cols_per_unit)
        && x_stride.is_multiple_of(4)
        && x_offset.is_multiple_of(4)
}

/// How one dispatch (one weight chunk) of a [`GpuWeights::bind`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Plan {
    /// The work split.
    pub tuning: Tuning,
    /// x read straight from global memory in the hot loop (the `XDIRECT` variant) instead of
    /// staged in workgroup memory.
    pub direct: bool,
}

/// The plan of one dispatch over `rows` rows of `n_pairs` pairs of `enc`'s weights with `cols`
/// columns, x at `x_stride` f32 between tokens (0 = packed, i.e. `cols`) from f32 element
/// `x_offset`. Host-side rules, matching the kernel's assumptions:
///
/// * when [`direct_aligned`]: [`direct_aligned`]: direct x, the first of [`direct_candidates`] for which
///   `n_pairs · ceil(rows / rows per workgroup)` ≥ [`DIRECT_MIN_WORKGROUPS`], else the last;
/// * else staged x, the first of [`candidates`] reaching its [`min_workgroups`], else the last.
///
/// Panics if `enc` has no GEMV kernel.
pub fn plan(
    enc: Encoding,
    n_pairs: u32,
    rows: u32,
    cols: u32,
    x_stride: u32,
    x_offset: u32,
) -> Plan {
    plan_with(enc, None, false, n_pairs, rows, cols, x_stride, x_offset)
}

/// [`plan`] with `forced` (if any) as the tuning (direct x then when [`direct_aligned`] and its
/// rows per workgroup ≤ [`DIRECT_MAX_RPW`]). With `silu` ([`GemvArgs::silu_mul`]) only tunings
/// whose workgroups hold at least two row sets ([`silu_tuning`]) are candidates; a forced tuning
/// that is not is [`plan`]'s choice instead.
#[allow(clippy::too_many_arguments)]
fn plan_with(
    enc: Encoding,
    forced: Option<Tuning>,
    silu: bool,
    n_pairs: u32,
    rows: u32,
    cols: u32,
    x_stride: u32,
    x_offset: u32,
) -> Plan {
    let aligned = direct_aligned(enc, cols, x_stride, x_offset);
    let pick = |list: &[Tuning], min: &dyn Fn(usize) -> u64| {
        let usable = list.iter().copied().enumerate();
        let mut last = None;
        for (k, t) in usable.filter(|&(_, t)| !silu || silu_tuning(t)) {
            if n_pairs as u64 * rows.div_ceil(t.rows_per_workgroup()) as u64 >= min(k) {
                return t;
            }
            last = Some(t);
        }
        last.expect("every candidate list has a tuning of several row sets")
    };
    let forced = forced.filter(|&t| !silu || silu_tuning(t));
    let (tuning, direct) = match forced {
        Some(t) => (t, aligned && t.rows_per_workgroup() <= DIRECT_MAX_RPW),
        None if aligned => (pick(direct_candidates(), &|_| DIRECT_MIN_WORKGROUPS), true),
        None => {
            let mins = min_workgroups(enc.format);
            (pick(candidates(enc.format), &|k| mins[k]), false)
        }
    };
    Plan { tuning, direct }
}

/// Whether tuning `t` can run the silu·up epilogue ([`GemvArgs::silu_mul`]): a workgroup holds at
/// least two row sets (threads per row ≤ 128), so its rows split into a gate half and an up half
/// of whole row sets.
pub fn silu_tuning(t: Tuning) -> bool {
    t.tpr <= 128
}

impl GpuWeights {
    /// The [`plan`] of each dispatch of a GEMV over these weights with `args` (what
    /// [`GpuWeights::bind`] records, one per pair of weight chunks, dispatches without pairs
    /// included): planned over the rows one pair can meet in it (both chunks' rows when they
    /// split one expert's rows, else the larger chunk's); n_pairs of 0 launches nothing and is
    /// planned as one pair. The call's forced tuning
    /// ([`GemvArgs::tuning`]) wins over `opts.tuning`, which wins over the per-call choice.
    pub fn plans(&self, args: &GemvArgs, opts: &LinearOptions) -> Vec<Plan> {
        let enc = self.encoding();
        let (x_stride, _) = strides(self, args);
        let rows_of = |c: &WeightChunk| c.r1 - c.r0;
        self.chunks()
            .chunks(2)
            .map(|group| {
                let rows = match group {
                    [a, b] if (a.e0, a.e1) == (b.e0, b.e1) => rows_of(a) + rows_of(b),
                    _ => group.iter().map(rows_of).max().unwrap_or(0),
                };
                plan_with(
                    enc,
                    args.tuning.or(opts.tuning),
                    args.silu_mul,
                    args.n_pairs.max(1),
                    rows,
                    self.cols() as u32,
                    x_stride as u32,
                    args.x_offset,
                )
            })
            .collect()
    }
}

impl GpuWeights {
    /// Whether `args` over these weights under `opts` can take the silu·up epilogue
    /// ([`GemvArgs::silu_mul`]): the call runs as the GEMV anyway (a GEMM keeps the separate
    /// silu_mul kernel), has no segments and no gamma, and [`GpuWeights::silu_mul_shape_fits`].
    pub fn silu_mul_fits(&self, args: &GemvArgs, opts: &LinearOptions) -> bool {
        let plain = GemvArgs {
            silu_mul: false,
            ..*args
        };
        select(self, &plain, opts).is_none() && self.check_silu_mul(args).is_ok()
    }

    /// Whether `args` (with its short-conv epilogue, [`GemvArgs::conv`]) would run as the GEMV
    /// without the epilogue under `opts` and passes [`GpuWeights::check_conv`].
    pub fn conv_shape_fits(&self, args: &GemvArgs, opts: &LinearOptions) -> bool {
        let plain = GemvArgs {
            conv: None,
            ..*args
        };
        select(self, &plain, opts).is_none()
            && args.conv.is_some_and(|c| self.check_conv(args, &c).is_ok())
    }
}

/// The GEMM threshold of f32, bf16 and the int4 family; every format's own is
/// [`KernelFormat::gemm_min_pairs`](crate::gpu::linear::format::KernelFormat::gemm_min_pairs).
pub use crate::gpu::linear::format::MIN_PAIRS_PER_EXPERT;

/// Most experts of a slab the grouping pass handles (two u32 per expert of workgroup memory);
/// larger slabs keep the GEMV.
pub const EMAX: u32 = 1024;

/// The tiles [`select`] picks from, most rows per workgroup first: 256, 128 and 64 rows × 16
/// pairs (one x tile, so the same workgroup memory). [`auto_tile`] takes the first whose launch
/// reaches its entry of [`GEMM_MIN_WORKGROUPS`], else the last (BENCHMARKS.md#decision-gemm-tile).
/// [`GemmChoice::Always`] builds any [`Tile::buildable`] tile.
pub const TILES: [Tile; 3] = [
    Tile { rm: 4, nq: 4 },
    Tile { rm: 2, nq: 4 },
    Tile { rm: 1, nq: 4 },
];

/// Fewest workgroups a GEMM launch must have to take the [`TILES`] entry of the same index. A
/// GEMM workgroup holds one SM of the H100 and H200 (132 SMs) at a time: a launch of fewer
/// workgroups than a wave leaves SMs idle while each workgroup runs its whole share of the
/// columns, and a smaller tile then spreads the same work over more of them
/// (BENCHMARKS.md#prefill-gemm-short). WebGPU reports no SM count, so these are sized for the
/// largest GPUs measured, as the GEMV's [`min_workgroups`].
pub const GEMM_MIN_WORKGROUPS: [u64; 3] = [128, 128, 0];

/// The tile of the engine's own choice for a GEMM over `pairs` pairs of a slab of `experts`
/// experts of `rows` rows: the first of [`TILES`] whose launch, the used experts ×
/// ceil(pairs per used expert / BN) tiles × ceil(rows / BM) row blocks, reaches its
/// [`GEMM_MIN_WORKGROUPS`], else the last. The pairs per used expert are `pairs / min(experts,
/// pairs)`, as in [`select`]: the host never sees how the router spread them.
pub fn auto_tile(rows: u32, experts: u32, pairs: u32) -> Tile {
    let used = experts.min(pairs).max(1);
    let per_expert = (pairs / used).max(1);
    for (t, &min) in TILES.iter().zip(GEMM_MIN_WORKGROUPS.iter()) {
        let wg = used as u64
            * per_expert.div_ceil(t.pairs()) as u64
            * rows.div_ceil(t.rows()).max(1) as u64;
        if wg >= min {
            return *t;
        }
    }
    TILES[TILES.len() - 1]
}

/// Which GEMM tile the calls that leave the choice to the engine take once the rules send them
/// to the GEMM ([`LinearOptions::gemm`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmTiles {
    /// No GEMM: those calls keep the GEMV (`bench prefill --compare`).
    Off,
    /// The engine's choice by the launch's size ([`auto_tile`]).
    Auto,
    /// This tile for every such call (`bench prefill --tiles`).
    Fixed(Tile),
}

/// Engine-wide choices of the linear layer, given when a model (or a benchmark) builds its calls:
/// every call built with them follows them. The default is the engine's own choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearOptions {
    /// Run every GEMV with this tuning (`bench kernels --tune`) unless the call forces its own
    /// ([`GemvArgs::tuning`]); such calls never run as a GEMM. Numbers only: every tuning computes
    /// the same sums. `None`: the per-call choice of [`plan`].
    pub tuning: Option<Tuning>,
    /// The GEMM tile of calls that leave the choice to the engine ([`GemmChoice::Auto`]) when the
    /// rules pick the GEMM. Default [`GemmTiles::Auto`].
    pub gemm: GemmTiles,
}

impl Default for LinearOptions {
    fn default() -> Self {
        LinearOptions {
            tuning: None,
            gemm: GemmTiles::Auto,
        }
    }
}

/// Which kernel runs a call ([`route`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// The GEMV, with the plan of each of its dispatches ([`GpuWeights::plans`]).
    Gemv(Vec<Plan>),
    /// The GEMM with this tile.
    Gemm(Tile),
}

impl Route {
    /// The GEMM's tile, or `None` for the GEMV.
    pub fn gemm_tile(&self) -> Option<Tile> {
        match self {
            Route::Gemm(t) => Some(*t),
            Route::Gemv(_) => None,
        }
    }
}

/// The one choice of kernel for `args` over `weights` under `opts`: the GEMM when [`select`]
/// picks a tile, else the GEMV with its plans.
pub fn route(weights: &GpuWeights, args: &GemvArgs<'_>, opts: &LinearOptions) -> Route {
    match select(weights, args, opts) {
        Some(t) => Route::Gemm(t),
        None => Route::Gemv(weights.plans(args, opts)),
    }
}

/// The tile to run `args` over `weights` as a GEMM under `opts`, or `None` to keep the GEMV
/// (rules in the module docs).
fn select(weights: &GpuWeights, args: &GemvArgs<'_>, opts: &LinearOptions) -> Option<Tile> {
    let e = weights.experts() as u32;
    let p = args.n_pairs;
    // output segments and the silu·up and short-conv epilogues are GEMV writes
    if !supported(weights.encoding())
        || e > EMAX
        || p == 0
        || !args.segments.is_empty()
        || args.silu_mul
        || args.conv.is_some()
    {
        return None;
    }
    match args.gemm {
        GemmChoice::Never => return None,
        GemmChoice::Always(t) => return Some(t),
        GemmChoice::Auto => {}
    }
    if args.tuning.is_some() || args.reduction != Reduction::Auto || opts.tuning.is_some() {
        return None;
    }
    let per_expert = p / e.min(p);
    if per_expert < row(weights.encoding().format).gemm_min_pairs {
        return None;
    }
    match opts.gemm {
        GemmTiles::Off => None,
        GemmTiles::Fixed(t) => Some(t),
        GemmTiles::Auto => Some(auto_tile(weights.rows() as u32, e, p)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine's GEMM tile by launch size (BENCHMARKS.md#prefill-gemm-short): a dense
    /// [4096 x 4096] chunk of 16 or 32 tokens takes 64-row tiles, 64 tokens 128-row tiles, 128
    /// tokens and more the 256-row tile; the routed slabs of a 512-token chunk keep it.
    #[test]
    fn auto_tile_by_launch_size() {
        let t = |rm| Tile { rm, nq: 4 };
        assert_eq!(auto_tile(4096, 1, 16), t(1));
        assert_eq!(auto_tile(4096, 1, 32), t(1));
        assert_eq!(auto_tile(4096, 1, 64), t(2));
        assert_eq!(auto_tile(4096, 1, 128), t(4));
        assert_eq!(auto_tile(4096, 1, 512), t(4));
        // the two shared experts of a 64-token chunk: twice the tiles of one dense matrix
        assert_eq!(auto_tile(4096, 2, 128), t(4));
        // 256 routed experts, 3072 pairs (12 per used expert); the probe's 6 experts of 512 each
        assert_eq!(auto_tile(4096, 256, 3072), t(4));
        assert_eq!(auto_tile(2048, 6, 3072), t(4));
        // a few rows: the smallest tile
        assert_eq!(auto_tile(8, 1, 64), t(1));
    }

    /// The selection rule, then a forced tuning winning over it.
    #[test]
    fn plan_rule_and_forced_tuning() {
        let bf16 = Encoding::BF16;
        // bf16 q_proj [4096 x 4096], one pair: 1024 workgroups of 4 rows, x direct
        let p = plan(bf16, 1, 4096, 4096, 0, 0);
        assert_eq!(p.tuning, Tuning { tpr: 64, rpt: 1 });
        assert!(p.direct);
        // an 8-expert layer: 8 rows per workgroup, direct
        let p = plan(bf16, 8, 6144, 6144, 0, 0);
        assert_eq!(p.tuning, Tuning { tpr: 32, rpt: 1 });
        assert!(p.direct);
        // unaligned x (I = 4095) stages it, from the default down
        let p = plan(bf16, 8, 6144, 4095, 0, 0);
        assert_eq!(p.tuning, Tuning { tpr: 16, rpt: 4 });
        assert!(!p.direct);
        // a router [256 x 4096] cannot reach 256 workgroups: the fewest rows per workgroup
        assert_eq!(
            plan(bf16, 1, 256, 4096, 0, 0).tuning.rows_per_workgroup(),
            1
        );
        // int3-g64 never goes above its own default
        let i3 = Encoding::parse("int3-g64").unwrap();
        assert_eq!(
            plan(i3, 64, 6144, 6144, 0, 0).tuning,
            Tuning { tpr: 4, rpt: 1 }
        );
        assert!(!plan(i3, 1, 256, 4096, 0, 0).direct);
        let forced = Some(Tuning { tpr: 16, rpt: 4 });
        let p = plan_with(bf16, forced, false, 1, 256, 4096, 0, 0);
        assert_eq!(p.tuning, Tuning { tpr: 16, rpt: 4 });
        assert!(!p.direct, "64 rows per workgroup stage x");
        assert_eq!(
            plan(bf16, 1, 256, 4096, 0, 0).tuning.rows_per_workgroup(),
            1
        );
    }
}
