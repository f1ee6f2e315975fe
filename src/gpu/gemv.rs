//! The MoE GEMV kernel (`wgsl/gemv.wgsl`): uploaded weight slabs, pipelines and recorded calls.
//!
//! # Problem
//! For a batch of P pairs `(expert, token, weight_idx)` one [`GpuWeights::bind`] computes
//! `y[p, 0..O] = gamma[weight_idx(p)] · W_{expert(p)} · x[token(p), 0..I]` (gamma omitted when
//! `weight_idx == 0xFFFFFFFF` or the call has no gamma buffer). All dtypes are f32 except the
//! weights (any kernel format of FORMATS.md) and the pairs (u32). Accumulation is f32.
//! A dense GEMV is E = 1 with pairs `(0, t, NO_GAMMA)`.
//!
//! # GPU layout and alignment (enforced here on the host)
//! [`GpuWeights`] holds the E experts of one tensor in one slab. Each row is stored with its
//! FORMATS.md bytes followed by zero padding up to a whole number of *units*: 16 bytes for f32,
//! bf16, int4 and int4-grouped, 48 bytes (two 64-column groups) for int3-g64. So every row starts
//! 16-byte aligned whatever I is and the kernel reads whole `vec4<u32>` words; the kernel masks
//! columns ≥ I through x, so padding never contributes. int3-g64 groups are stored with their
//! bits in the GPU order of [`slab_layout`] (same bytes per group). Real Inkling shapes
//! (I = 6144, 3072, 4096, 2048) need no padding in any format. Scales are stored unpadded,
//! `[E][O][scales per row]` f32.
//!
//! # Kernel shape (`wgsl/gemv.wgsl`)
//! 256 threads per workgroup in groups of THREADS_PER_ROW threads per row set; each thread
//! handles ROWS_PER_THREAD rows with one read of x, so one row block is ROWS_PER_WORKGROUP =
//! (256 / THREADS_PER_ROW) · ROWS_PER_THREAD rows of one pair. By default x is staged: the whole
//! x row (up to 16384 columns, as far as the adapter's workgroup memory allows) is copied once
//! per workgroup into workgroup memory as vec4, zero past I, padded against bank conflicts.
//! The hot loop has no barrier: two units per step (their loads issue together), one coalesced
//! 16-byte weight load per row and unit, vec4 accumulators. A quantised kernel whose threads take
//! at least [`PREFETCH_MIN_STEPS`] steps over the x tile software-pipelines the loop ([`prefetch`],
//! `PREFETCH` in the WGSL): the next step's weight words and group scales load while the current
//! step decodes, so a thread's loads stay in flight during its arithmetic. The quantised decode keeps x in f32 and costs one mask-or,
//! one subtract and one FMA per weight: a 4-bit field masked in place inside the mantissa of
//! 2²³ (the "magic number" conversion) gives (q − bias)·16ˡ in lane l after one subtract, so
//! lane l of an accumulator carries 16ˡ, removed once per row (an exact power of two). int3-g64
//! first joins its 2-bit lows and high bits into such fields with one bitwise select per eight
//! values (the GPU bit order above). Scales are applied once per 32-column unit (grouped
//! formats), per group (int3-g64) or per row (int4). Reductions: subgroup shuffles inside blocks
//! of min(subgroup size, THREADS_PER_ROW) lanes then workgroup memory, or a workgroup-memory
//! tree. Workgroups (pairs × row blocks) are spread over x and y (≤ 65,535 each).
//!
//! # Per-call selection ([`plan`])
//! The work split and the x variant are chosen on the host for each dispatch from the format,
//! the pairs, the chunk's rows and x's alignment (rules measured on an H200 with
//! `bench kernels --tune`, BENCHMARKS.md, *MoE GEMV kernels* and *Quantised GEMV decode*):
//! * **direct x** (`XDIRECT` in the WGSL) for f32 and bf16 whenever [`direct_aligned`] holds (I a
//!   whole number of units: 4 columns for f32, 8 for bf16, so no tail masking; `x_stride` and
//!   `x_offset` multiples of 4, so every x row starts on a vec4): x is bound as
//!   `array<vec4<f32>>` and read in the hot loop straight from global memory (caches), with no
//!   staging loop, no barrier and no x array in workgroup memory. [`direct_candidates`] go from 8
//!   rows per workgroup (32 × 1) to 1 (256 × 1); the first reaching [`DIRECT_MIN_WORKGROUPS`]
//!   workgroups `n_pairs · ceil(rows / ROWS_PER_WORKGROUP)` is taken, else the last.
//! * **staged x** otherwise, always for int4/int3: [`candidates`] go from the format's default
//!   down to 256 × 1; the first reaching [`MIN_WORKGROUPS`] is taken, else the last (staging
//!   costs each workgroup a pass over x, so fewer, larger workgroups win here).
//!
//! Both variants compute the same sums in the same order. [`set_tuning_override`] (`bench kernels
//! --tune`) wins over the selection (direct x then when aligned and ROWS_PER_WORKGROUP ≤
//! [`DIRECT_MAX_RPW`]). Pipelines are cached per (encoding, reduction, tuning, x tile, x variant,
//! weight chunks): everything that changes the WGSL.
//!
//! # Weight chunks
//! The slab is split into chunks (one storage binding each) no larger than the adapter's
//! `max_storage_buffer_binding_size`, `max_buffer_size` and 2³¹ − 1 bytes: by whole experts when
//! an expert fits, else by rows within each expert. One dispatch binds two chunks (bindings 1/2
//! and 7/8; eight storage buffers, WebGPU's default limit), so inkling-small's 2.4 GB routed
//! gate_up runs as one dispatch: the row blocks of chunk 0 come first, then those of chunk 1,
//! and each workgroup picks its chunk once, outside the hot loop (the skeleton's hot loop is
//! written once per chunk). A slab of more chunks takes one dispatch per two; the caller never sees chunks.
//!
//! # Output segments
//! With [`GemvArgs::segments`] the rows of each expert are cut into up to four consecutive
//! segments, each written to its own buffer as a packed `[pairs, rows_i]` matrix (a layer's q, k,
//! v and r projections as one GEMV over their concatenated rows). The kernel variant
//! (`SEGMENTS` in the WGSL) binds the outputs at 6, 9, 10 and 11 and picks the segment of each
//! row at the final write, after the reduction: the hot loop is the plain one, and a row block
//! may straddle two segments. It exists for one-chunk slabs on devices with 9 storage buffers
//! per stage ([`GpuWeights::segments_fit`]); callers fall back to a packed output otherwise.
//!
//! # x prologues ([`XPrologue`])
//! The staged variant can stage a function of x instead of x, so the elementwise kernel before a
//! GEMV needs no dispatch of its own: the RMSNorm of the x row (`w ⊙ x · rsqrt(mean(x²) + eps)`,
//! the formula of [`crate::gpu::ops::RmsNorm`]; every workgroup first reduces the row's sum of
//! squares over all its columns, then scales each tile as it stages it), or `silu(gate) · up` of
//! a gate‖up row (the layout of [`crate::gpu::ops::SiluMulLayout::fused`], the formula of
//! [`crate::gpu::ops::SiluMul`]). The choice is a uniform read outside the hot loop, so it adds no
//! pipeline. A call with a prologue always stages x ([`GpuWeights::plans`]) and never runs as a
//! GEMM (`gemm::select`).

use crate::formats::{Encoding, Format, QMatrix};
use crate::gpu::call::{dummy, entry, grid_u64, Call, Dispatch, Label};
use crate::gpu::dispatch::{self, DispatchError};
use crate::gpu::gemm_tile::GemmChoice;
use crate::gpu::kernel::{self, Bind, Kernel, KernelSpec};
use crate::gpu::slab_layout;
use crate::gpu::Gpu;

/// Source of the one GEMV skeleton.
pub const GEMV_WGSL: &str = include_str!("../../wgsl/gemv.wgsl");

/// `weight_idx` meaning "no per-pair weight".
pub const NO_GAMMA: u32 = 0xFFFF_FFFF;

/// Largest x tile (columns staged in workgroup memory at once); the real tile is the row length
/// rounded up to 512 columns when it fits the adapter's workgroup memory, so normally the whole x
/// is staged once per workgroup and the hot loop has no barrier.
const XT_MAX: u32 = 16384;
/// The uniform block, the twin of `Params` in `wgsl/gemv.wgsl` (field meanings there).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct GemvParams {
    rows: u32,
    cols: u32,
    n_pairs: u32,
    row_stride_v4: u32,
    x_stride: u32,
    x_offset: u32,
    y_stride: u32,
    y_offset: u32,
    scales_per_row: u32,
    use_gamma: u32,
    x_row_is_pair: u32,
    pad: u32,
    chunk0: [u32; 4],
    chunk1: [u32; 4],
    row_blocks: [u32; 4],
    seg_end: [u32; 4],
    prologue: u32,
    norm_eps: f32,
    prologue_pad0: u32,
    prologue_pad1: u32,
}

/// Most output segments of one GEMV ([`GemvArgs::segments`]).
pub const MAX_SEGMENTS: usize = 4;

/// Size of the uniform block.
const PARAMS_BYTES: u64 = std::mem::size_of::<GemvParams>() as u64;

/// How a row's partial sums are reduced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// Subgroup shuffles when the device has `SUBGROUP`, else shared memory.
    Auto,
    /// Subgroup shuffles (error when the device lacks `SUBGROUP`).
    Subgroup,
    /// Shared-memory tree (works everywhere).
    Shared,
}

/// Columns per unit and `vec4<u32>` words per unit of a format's row in the GPU slab.
fn unit_shape(f: Format) -> (u32, u32) {
    match f {
        Format::F32 => (4, 1),
        Format::Bf16 => (8, 1),
        Format::Int4 | Format::Int4Grouped => (32, 1),
        Format::Int3G64 => (128, 3),
        _ => unreachable!("no kernel for {f}"),
    }
}

/// Work split of one instantiation: threads per row (`tpr`, THREADS_PER_ROW in the WGSL, a power
/// of two ≤ 256) and rows per thread (`rpt`, ROWS_PER_THREAD: rows sharing every x load).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tuning {
    pub tpr: u32,
    pub rpt: u32,
}

impl Tuning {
    /// Rows per workgroup (ROWS_PER_WORKGROUP): (256 / tpr) thread groups × rpt rows.
    pub fn rows_per_workgroup(self) -> u32 {
        (256 / self.tpr) * self.rpt
    }
}

/// Fewest workgroups a staged-x call should launch before [`plan`] settles for fewer rows per
/// workgroup (about 2 per SM of a 132-SM H200; BENCHMARKS.md, *MoE GEMV kernels*: more, smaller
/// workgroups each stage the whole x row again). WebGPU reports no SM count, so this is a
/// constant sized for the largest GPUs measured; on smaller GPUs it only costs slightly smaller
/// workgroups on small problems.
pub const MIN_WORKGROUPS: u64 = 256;

/// Fewest workgroups a direct-x call (f32, bf16) should launch before [`plan`] settles for fewer
/// rows per workgroup (BENCHMARKS.md, *MoE GEMV kernels*).
pub const DIRECT_MIN_WORKGROUPS: u64 = 1024;

/// Largest rows per workgroup of the direct-x variant (its candidates, and a forced tuning that
/// may use it).
pub const DIRECT_MAX_RPW: u32 = 8;

/// Benchmark-only override of [`Tuning`] for every format (0 = none): `tpr << 16 | rpt`.
static TUNING_OVERRIDE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Override the tuning of calls built from now on (`bench kernels --tune`), winning over the
/// per-call choice of [`plan`]; `None` restores the automatic choice. Numbers only: every tuning
/// computes the same sums.
pub fn set_tuning_override(t: Option<Tuning>) {
    let v = t.map_or(0, |t| {
        assert!(t.tpr.is_power_of_two() && t.tpr <= 256 && (1..=8).contains(&t.rpt));
        (t.tpr << 16) | t.rpt
    });
    TUNING_OVERRIDE.store(v, std::sync::atomic::Ordering::Relaxed);
}

pub(crate) fn tuning_override() -> Option<Tuning> {
    let o = TUNING_OVERRIDE.load(std::sync::atomic::Ordering::Relaxed);
    (o != 0).then_some(Tuning {
        tpr: o >> 16,
        rpt: o & 0xffff,
    })
}

/// The default (largest) tuning of `f`'s kernel (BENCHMARKS.md, *MoE GEMV kernels*), or the
/// override of [`set_tuning_override`].
pub fn tuning(f: Format) -> Tuning {
    tuning_override().unwrap_or(candidates(f)[0])
}

/// Rows per workgroup of `enc`'s default tuning ([`tuning`]); a call may use fewer ([`plan`]).
pub fn rows_per_workgroup(enc: Encoding) -> u32 {
    tuning(enc.format).rows_per_workgroup()
}

/// The staged-x tunings of `f`, most rows per workgroup first ([`plan`] takes the first that
/// reaches [`MIN_WORKGROUPS`]); the first is the format's default.
pub fn candidates(f: Format) -> &'static [Tuning] {
    const fn t(tpr: u32, rpt: u32) -> Tuning {
        Tuning { tpr, rpt }
    }
    // the int4 family's list: 8x4 first, then the generic one
    const INT4: &[Tuning] = &[
        t(8, 4),
        t(16, 4),
        t(32, 4),
        t(32, 2),
        t(32, 1),
        t(64, 1),
        t(128, 1),
        t(256, 1),
    ];
    const GENERIC: &[Tuning] = INT4.split_at(1).1;
    const INT3: &[Tuning] = &[t(32, 1), t(64, 1), t(128, 1), t(256, 1)];
    match f {
        Format::Int4 | Format::Int4Grouped => INT4,
        Format::Int3G64 => INT3,
        _ => GENERIC,
    }
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
/// measured 11–60% slower than staged on the H200, BENCHMARKS.md, *quantised GEMV hot loop*),
/// `cols` a whole number of units (4 columns for f32, 8 for bf16: no tail masking) and
/// `x_stride` (0 = `cols`) and `x_offset` multiples of 4 (every x row on a vec4).
pub fn direct_aligned(enc: Encoding, cols: u32, x_stride: u32, x_offset: u32) -> bool {
    let x_stride = if x_stride == 0 { cols } else { x_stride };
    matches!(enc.format, Format::F32 | Format::Bf16)
        && cols.is_multiple_of(unit_shape(enc.format).0)
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
/// * the [`set_tuning_override`] override if any, direct x when [`direct_aligned`] and rows per workgroup ≤
///   [`DIRECT_MAX_RPW`];
/// * else, when [`direct_aligned`]: direct x, the first of [`direct_candidates`] for which
///   `n_pairs · ceil(rows / rows per workgroup)` ≥ [`DIRECT_MIN_WORKGROUPS`], else the last;
/// * else staged x, the first of [`candidates`] reaching [`MIN_WORKGROUPS`], else the last.
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
    plan_with(
        enc,
        tuning_override(),
        false,
        n_pairs,
        rows,
        cols,
        x_stride,
        x_offset,
    )
}

/// [`plan`] with `forced` (if any) as the tuning, staged x whatever the alignment when `staged`.
#[allow(clippy::too_many_arguments)]
fn plan_with(
    enc: Encoding,
    forced: Option<Tuning>,
    staged: bool,
    n_pairs: u32,
    rows: u32,
    cols: u32,
    x_stride: u32,
    x_offset: u32,
) -> Plan {
    let aligned = !staged && direct_aligned(enc, cols, x_stride, x_offset);
    let pick = |list: &[Tuning], min: u64| {
        list.iter()
            .copied()
            .find(|t| n_pairs as u64 * rows.div_ceil(t.rows_per_workgroup()) as u64 >= min)
            .unwrap_or(list[list.len() - 1])
    };
    let (tuning, direct) = match forced {
        Some(t) => (t, aligned && t.rows_per_workgroup() <= DIRECT_MAX_RPW),
        None if aligned => (pick(direct_candidates(), DIRECT_MIN_WORKGROUPS), true),
        None => (pick(candidates(enc.format), MIN_WORKGROUPS), false),
    };
    Plan { tuning, direct }
}

/// Pad period of the x tile in vec4: one pad vec4 per unit (at least every 8 vec4).
fn pad_period(f: Format) -> u32 {
    (unit_shape(f).0 / 4).max(8)
}

/// Workgroup-memory bytes of an instantiation with tile `xt` (0: x not staged).
fn smem_bytes(f: Format, t: Tuning, xt: u32) -> u64 {
    let v4 = xt / 4;
    16 * (v4 + v4 / pad_period(f)) as u64 + 4 * 256 * t.rpt as u64
}

/// The x tile for `cols` columns: the row rounded up to 512 columns, shrunk by 512 until it fits
/// `smem_limit` bytes of workgroup memory (never below 512).
fn x_tile(f: Format, t: Tuning, cols: usize, smem_limit: u64) -> u32 {
    let mut xt = (cols.next_multiple_of(512) as u64).min(XT_MAX as u64) as u32;
    while xt > 512 && smem_bytes(f, t, xt) > smem_limit {
        xt -= 512;
    }
    xt
}

/// Units each hot-loop step of a thread decodes (UNITS_PER_STEP in the WGSL); their weight
/// loads issue together.
const UNITS_PER_STEP: u32 = 2;

/// Fewest steps of a thread per x tile for which the hot loop prefetches (PREFETCH in the WGSL:
/// the next step's weights load while this step decodes); shorter loops lose more to the longer
/// prologue and the registers of the second step than they win (BENCHMARKS.md, *quantised GEMV
/// hot loop*, H200).
const PREFETCH_MIN_STEPS: u32 = 6;

/// Whether the hot loop of an instantiation prefetches: the quantised formats (x staged) when a
/// thread takes at least [`PREFETCH_MIN_STEPS`] steps over a tile of `xt` columns.
pub fn prefetch(f: Format, t: Tuning, xt: u32) -> bool {
    let steps = (xt / unit_shape(f).0) / (t.tpr * UNITS_PER_STEP);
    !matches!(f, Format::F32 | Format::Bf16) && steps >= PREFETCH_MIN_STEPS
}

/// Padded GPU row stride in bytes for `enc` and `cols` (see the module docs).
pub fn gpu_row_stride(enc: Encoding, cols: usize) -> usize {
    let (_, vpu) = unit_shape(enc.format);
    enc.bytes_per_row(cols).next_multiple_of(16 * vpu as usize)
}

/// The WGSL of one instantiation with the default tuning, staged x, a 2048-column x tile (fits
/// WebGPU's default 16 KiB of workgroup memory) and one weight chunk; see [`wgsl_source_tuned`].
pub fn wgsl_source(enc: Encoding, subgroups: bool) -> String {
    wgsl_source_tuned(enc, subgroups, tuning(enc.format), 2048, false)
}

/// The WGSL name of a registry format's ordinal constant: `FMT_` and the registry name in
/// capitals with `-` as `_` (`FMT_BF16`, `FMT_INT4_GROUPED`, `FMT_INT3_G64`).
pub fn wgsl_format_const(f: Format) -> String {
    format!("FMT_{}", f.name().to_uppercase().replace('-', "_"))
}

/// Every registry format's ordinal as a WGSL constant named by [`wgsl_format_const`], one line
/// each (`const FMT_INT4: u32 = 2u;`): the head of every GEMV and GEMM prelude.
pub fn wgsl_format_consts() -> String {
    crate::formats::REGISTRY
        .iter()
        .map(|spec| {
            format!(
                "const {}: u32 = {}u;\n",
                wgsl_format_const(spec.format),
                spec.ordinal
            )
        })
        .collect()
}

/// The generated prelude of one instantiation: every registry ordinal as a named constant, then
/// the instantiation's constants (see the header of `wgsl/gemv.wgsl`).
fn prelude(enc: Encoding, t: Tuning, xt: u32, chunks: u32, header: &str) -> String {
    let (cols_per_unit, words_per_unit) = unit_shape(enc.format);
    let mut out = format!("// gemv instantiation: {header}\n");
    out.push_str(&wgsl_format_consts());
    let consts: [(&str, String); 11] = [
        ("FMT", wgsl_format_const(enc.format)),
        ("GROUP_SIZE", format!("{}u", enc.group_size)),
        ("COLS_PER_UNIT", format!("{cols_per_unit}u")),
        ("WORDS_PER_UNIT", format!("{words_per_unit}u")),
        ("THREADS_PER_ROW", format!("{}u", t.tpr)),
        ("ROWS_PER_THREAD", format!("{}u", t.rpt)),
        ("ROWS_PER_WORKGROUP", format!("{}u", t.rows_per_workgroup())),
        ("X_TILE", format!("{xt}u")),
        ("X_PAD_PERIOD", format!("{}u", pad_period(enc.format))),
        ("WEIGHT_CHUNKS", format!("{chunks}u")),
        ("UNITS_PER_STEP", format!("{UNITS_PER_STEP}u")),
    ];
    for (name, value) in consts {
        out.push_str(&format!("const {name}: u32 = {value};\n"));
    }
    out
}

/// The WGSL of one instantiation with one weight chunk bound ([`wgsl_source_chunks`]).
pub fn wgsl_source_tuned(
    enc: Encoding,
    subgroups: bool,
    t: Tuning,
    xt: u32,
    direct: bool,
) -> String {
    wgsl_source_chunks(enc, subgroups, t, xt, direct, 1)
}

/// The WGSL of one instantiation without output segments ([`wgsl_source_key`]).
pub fn wgsl_source_chunks(
    enc: Encoding,
    subgroups: bool,
    t: Tuning,
    xt: u32,
    direct: bool,
    chunks: u32,
) -> String {
    wgsl_source_key(&GemvKey::new(enc, subgroups, t, xt, direct).with_chunks(chunks))
}

/// The WGSL of one instantiation: the generated [`prelude`] plus the skeleton with the branches
/// of its named flags selected (`//!IF FLAG` / `//!ELSE` / `//!END` lines): `SUBGROUP` (the
/// reduction), `XDIRECT` (x read from global memory; `xt` is then unused and written as 0),
/// `CHUNK1` (`chunks` = 2: a second weight chunk bound at bindings 7 and 8) and `SEGMENTS` (output
/// segments at bindings 6 and 9-11), and with `WEIGHT_CHUNKS` = `chunks` (the decode functions
/// and the hot loop written once per bound chunk; see [`kernel::preprocess_with`]). Panics on a
/// format without a kernel or `chunks` other than 1 and 2.
pub fn wgsl_source_key(key: &GemvKey) -> String {
    let GemvKey {
        enc,
        subgroups,
        tuning: t,
        xt,
        direct,
        chunks,
        segments,
    } = *key;
    assert!(
        chunks == 1 || chunks == 2,
        "1 or 2 weight chunks per dispatch"
    );
    let xt = if direct { 0 } else { xt };
    let header = format!(
        "{} ({}, {}, {chunks} weight chunk(s){}), threads per row {} rows per thread {} x tile {xt}",
        enc.spelling(),
        if subgroups {
            "subgroup reduction"
        } else {
            "shared-memory reduction"
        },
        if direct { "direct x" } else { "staged x" },
        if segments { ", output segments" } else { "" },
        t.tpr,
        t.rpt,
    );
    let mut out = prelude(enc, t, xt, chunks, &header);
    out.push_str(&kernel::preprocess_with(
        GEMV_WGSL,
        &[
            ("SUBGROUP", subgroups),
            ("XDIRECT", direct),
            ("CHUNK1", chunks == 2),
            ("SEGMENTS", segments),
            (
                "UNIT_ARRAYS",
                !matches!(enc.format, Format::F32 | Format::Bf16),
            ),
            ("PREFETCH", prefetch(enc.format, t, xt)),
        ],
        &[("WEIGHT_CHUNKS", chunks as i64)],
    ));
    out
}

/// Every encoding with a GEMV kernel (all allowed group sizes), for validation and smoke runs.
pub fn kernel_encodings() -> Vec<Encoding> {
    let mut v = Vec::new();
    for s in crate::formats::REGISTRY.iter().filter(|s| s.gpu_kernel) {
        if s.format == Format::Int4Grouped {
            for &g in s.group_sizes {
                v.push(Encoding {
                    format: s.format,
                    group_size: g as usize,
                });
            }
        } else {
            let gs = if s.format == Format::Int3G64 { 64 } else { 0 };
            v.push(Encoding {
                format: s.format,
                group_size: gs,
            });
        }
    }
    v
}

/// One binding-sized piece of a slab: experts `e0..e1`, rows `r0..r1` of each.
#[derive(Debug)]
pub struct WeightChunk {
    pub weights: wgpu::Buffer,
    pub scales: wgpu::Buffer,
    pub e0: u32,
    pub e1: u32,
    pub r0: u32,
    pub r1: u32,
}

/// The E experts `[O, I]` of one tensor in one encoding, uploaded to the GPU (see module docs).
/// The encoding travels with the bytes: a [`GpuWeights::bind`] refuses an ordinal other than this one.
#[derive(Debug)]
pub struct GpuWeights {
    enc: Encoding,
    experts: usize,
    rows: usize,
    cols: usize,
    chunks: Vec<WeightChunk>,
}

impl GpuWeights {
    /// Upload E matrices of identical shape and encoding as one slab (E = 1 for a dense matrix).
    pub fn upload(gpu: &Gpu, mats: &[QMatrix]) -> Result<GpuWeights, DispatchError> {
        Self::upload_with_limit(gpu, mats, default_limit(gpu))
    }

    /// [`GpuWeights::upload`] with chunks of at most `limit` bytes (tests use a small limit).
    pub fn upload_with_limit(
        gpu: &Gpu,
        mats: &[QMatrix],
        limit: u64,
    ) -> Result<GpuWeights, DispatchError> {
        let first = mats
            .first()
            .ok_or_else(|| DispatchError::Shape("no matrices to upload".into()))?;
        for (i, m) in mats.iter().enumerate() {
            if m.enc != first.enc || m.rows != first.rows || m.cols != first.cols {
                return Err(DispatchError::Shape(format!(
                    "expert {i} is {} [{}, {}], expert 0 is {} [{}, {}]",
                    m.enc.spelling(),
                    m.rows,
                    m.cols,
                    first.enc.spelling(),
                    first.rows,
                    first.cols
                )));
            }
        }
        let data: Vec<&[u8]> = mats.iter().map(|m| &m.data[..]).collect();
        let scales: Vec<&[u8]> = mats.iter().map(|m| &m.scales[..]).collect();
        Self::build(
            gpu,
            first.enc,
            mats.len(),
            first.rows,
            first.cols,
            &data,
            &scales,
            limit,
        )
    }

    /// Upload straight from raw bytes (e.g. a mapped container): `data` is E·O·row_bytes bytes,
    /// experts then rows, FORMATS.md layout, any alignment; `scales` is E·(scales of one expert)
    /// little-endian f32 as bytes (empty for f32/bf16).
    pub fn from_slab_bytes(
        gpu: &Gpu,
        enc: Encoding,
        experts: usize,
        rows: usize,
        cols: usize,
        data: &[u8],
        scales: &[u8],
    ) -> Result<GpuWeights, DispatchError> {
        Self::from_slab_bytes_with_limit(
            gpu,
            enc,
            experts,
            rows,
            cols,
            data,
            scales,
            default_limit(gpu),
        )
    }

    /// [`GpuWeights::from_slab_bytes`] with chunks of at most `limit` bytes.
    #[allow(clippy::too_many_arguments)]
    pub fn from_slab_bytes_with_limit(
        gpu: &Gpu,
        enc: Encoding,
        experts: usize,
        rows: usize,
        cols: usize,
        data: &[u8],
        scales: &[u8],
        limit: u64,
    ) -> Result<GpuWeights, DispatchError> {
        dispatch::resolve(enc.format.ordinal())?;
        enc.format
            .check_group_size(enc.group_size)
            .map_err(|e| DispatchError::Shape(e.to_string()))?;
        let wb = rows * enc.bytes_per_row(cols);
        let sb = 4 * enc.scale_count(rows, cols);
        if data.len() != experts * wb || scales.len() != experts * sb {
            return Err(DispatchError::Shape(format!(
                "{} slab of {experts}×[{rows}, {cols}] needs {} weight and {} scale bytes, got {} and {}",
                enc.spelling(),
                experts * wb,
                experts * sb,
                data.len(),
                scales.len()
            )));
        }
        let d: Vec<&[u8]> = (0..experts).map(|e| &data[e * wb..(e + 1) * wb]).collect();
        let s: Vec<&[u8]> = (0..experts)
            .map(|e| &scales[e * sb..(e + 1) * sb])
            .collect();
        Self::build(gpu, enc, experts, rows, cols, &d, &s, limit)
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        gpu: &Gpu,
        enc: Encoding,
        experts: usize,
        rows: usize,
        cols: usize,
        data: &[&[u8]],
        scales: &[&[u8]],
        limit: u64,
    ) -> Result<GpuWeights, DispatchError> {
        let (stride, spr, limit) = slab_geometry(gpu, enc, experts, rows, cols, limit)?;
        let rb = enc.bytes_per_row(cols);
        let plan = chunk_plan(experts, rows, stride, limit);
        let mut chunks = Vec::with_capacity(plan.len());
        for (ci, &(e0, e1, r0, r1)) in plan.iter().enumerate() {
            let n_rows = (e1 - e0) * (r1 - r0);
            let wbuf = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(&format!("gemv weights {} chunk {ci}", enc.spelling())),
                size: (n_rows * stride).max(16) as u64,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: true,
            });
            {
                let mut view = wbuf
                    .get_mapped_range_mut(..)
                    .map_err(|e| DispatchError::Shape(format!("mapping a weight chunk: {e:?}")))?;
                let per_expert = (r1 - r0) * stride;
                for (k, src) in data[e0..e1].iter().enumerate() {
                    let rows = &src[r0 * rb..r1 * rb];
                    let mut dst = view.slice(k * per_expert..(k + 1) * per_expert);
                    if rb == stride && !slab_layout::reorders_bits(enc) {
                        dst.copy_from_slice(rows);
                    } else {
                        dst.copy_from_slice(&slab_layout::gpu_rows(enc, rows, rb, stride));
                    }
                }
            }
            wbuf.unmap();
            let mut sbytes = Vec::with_capacity(n_rows * spr * 4);
            for src in &scales[e0..e1] {
                sbytes.extend_from_slice(&src[r0 * spr * 4..r1 * spr * 4]);
            }
            let sbuf = gpu.storage_init(
                &format!("gemv scales {} chunk {ci}", enc.spelling()),
                &sbytes,
            );
            chunks.push(WeightChunk {
                weights: wbuf,
                scales: sbuf,
                e0: e0 as u32,
                e1: e1 as u32,
                r0: r0 as u32,
                r1: r1 as u32,
            });
        }
        Ok(GpuWeights {
            enc,
            experts,
            rows,
            cols,
            chunks,
        })
    }

    /// A slab of `experts` zeroed expert slots `[rows, cols]` in `enc`, to be filled later one
    /// expert at a time with [`GpuWeights::write_expert`] (the expert-cache slot pool). Chunks of
    /// at most `limit` bytes, laid out exactly as an uploaded slab, so a [`GpuWeights::bind`] over it is
    /// a GEMV over whatever experts the slots hold.
    pub fn empty_with_limit(
        gpu: &Gpu,
        enc: Encoding,
        experts: usize,
        rows: usize,
        cols: usize,
        limit: u64,
    ) -> Result<GpuWeights, DispatchError> {
        enc.format
            .check_group_size(enc.group_size)
            .map_err(|e| DispatchError::Shape(e.to_string()))?;
        let (stride, spr, limit) = slab_geometry(gpu, enc, experts, rows, cols, limit)?;
        let chunks = chunk_plan(experts, rows, stride, limit)
            .into_iter()
            .enumerate()
            .map(|(ci, (e0, e1, r0, r1))| {
                let n_rows = (e1 - e0) * (r1 - r0);
                let usage = wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC;
                WeightChunk {
                    weights: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some(&format!("expert slots {} chunk {ci}", enc.spelling())),
                        size: (n_rows * stride).max(16) as u64,
                        usage,
                        mapped_at_creation: false,
                    }),
                    scales: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some(&format!("expert slot scales {} chunk {ci}", enc.spelling())),
                        size: (n_rows * spr * 4).max(16) as u64,
                        usage,
                        mapped_at_creation: false,
                    }),
                    e0: e0 as u32,
                    e1: e1 as u32,
                    r0: r0 as u32,
                    r1: r1 as u32,
                }
            })
            .collect();
        Ok(GpuWeights {
            enc,
            experts,
            rows,
            cols,
            chunks,
        })
    }

    /// Overwrite expert slot `e` with one expert's FORMATS.md bytes through `queue.write_buffer`
    /// (so the write lands before the next submission's commands and after every earlier
    /// submission's). `data` is the expert's `rows` rows as consecutive pieces of whole rows
    /// (e.g. gate rows then up rows); `scales` likewise (little-endian f32 bytes, empty for
    /// f32/bf16). Returns the bytes read from `data` and `scales`.
    ///
    /// Errors: `e` out of range, or pieces that do not add up to `rows` whole rows.
    pub fn write_expert(
        &self,
        queue: &wgpu::Queue,
        e: usize,
        data: &[&[u8]],
        scales: &[&[u8]],
    ) -> Result<u64, DispatchError> {
        let (rb, stride) = (self.enc.bytes_per_row(self.cols), self.row_stride());
        let n = self.expert_segments(e, data, scales, |seg| {
            if seg.weights && (rb != stride || slab_layout::reorders_bits(self.enc)) {
                let rows = slab_layout::gpu_rows(self.enc, seg.src, rb, stride);
                queue.write_buffer(seg.buf, seg.offset, &rows);
            } else {
                queue.write_buffer(seg.buf, seg.offset, seg.src);
            }
            Ok(())
        })?;
        Ok(n)
    }

    /// [`GpuWeights::write_expert`] through staging views the caller fills (in parallel with
    /// [`run_staged`]): one [`StagedCopy`] per piece of at most `max_copy` bytes is pushed onto
    /// `out`. Rows that need padding (a row length that is not a whole number of units) are
    /// written at once instead. The data reach the GPU at the next submission after the copies
    /// ran and were dropped. Returns the bytes read from `data` and `scales`.
    pub fn stage_expert<'s>(
        &self,
        queue: &wgpu::Queue,
        e: usize,
        data: &[&'s [u8]],
        scales: &[&'s [u8]],
        max_copy: usize,
        out: &mut Vec<StagedCopy<'s>>,
    ) -> Result<u64, DispatchError> {
        if self.enc.bytes_per_row(self.cols) != self.row_stride()
            || slab_layout::reorders_bits(self.enc)
        {
            return self.write_expert(queue, e, data, scales);
        }
        let max_copy = max_copy.max(4) & !3;
        self.expert_segments(e, data, scales, |seg| {
            for (k, part) in seg.src.chunks(max_copy).enumerate() {
                let size = wgpu::BufferSize::new(part.len() as u64)
                    .ok_or_else(|| DispatchError::Shape("empty expert piece".into()))?;
                let view = queue
                    .write_buffer_with(seg.buf, seg.offset + (k * max_copy) as u64, size)
                    .ok_or_else(|| {
                        DispatchError::Shape("the queue refused a staging buffer".into())
                    })?;
                out.push(StagedCopy { view, src: part });
            }
            Ok(())
        })
    }

    /// Padded GPU row stride in bytes.
    fn row_stride(&self) -> usize {
        gpu_row_stride(self.enc, self.cols)
    }

    /// Check one expert's pieces (whole rows adding up to `rows`, slot in range), then hand `f`
    /// every (chunk buffer, byte offset, source bytes) segment they map to: weight rows at the
    /// padded stride, scale rows packed. Returns the bytes of `data` and `scales`.
    fn expert_segments<'s>(
        &self,
        e: usize,
        data: &[&'s [u8]],
        scales: &[&'s [u8]],
        mut f: impl FnMut(Segment<'_, 's>) -> Result<(), DispatchError>,
    ) -> Result<u64, DispatchError> {
        let enc = self.enc;
        let rb = enc.bytes_per_row(self.cols);
        let sb = 4 * enc.scales_per_row(self.cols);
        let stride = self.row_stride();
        if e >= self.experts {
            return Err(DispatchError::Shape(format!(
                "expert slot {e} out of range (the slab has {})",
                self.experts
            )));
        }
        let total: usize = data.iter().map(|d| d.len()).sum();
        let total_s: usize = scales.iter().map(|d| d.len()).sum();
        if total != self.rows * rb
            || total_s != self.rows * sb
            || data.iter().any(|d| d.len() % rb != 0)
            || (sb > 0 && scales.iter().any(|d| d.len() % sb != 0))
        {
            return Err(DispatchError::Shape(format!(
                "{} expert [{}, {}] needs {} weight and {} scale bytes in whole rows, got {total} and {total_s}",
                enc.spelling(),
                self.rows,
                self.cols,
                self.rows * rb,
                self.rows * sb
            )));
        }
        for c in self
            .chunks
            .iter()
            .filter(|c| (c.e0..c.e1).contains(&(e as u32)))
        {
            let (r0, r1) = (c.r0 as usize, c.r1 as usize);
            let base_row = (e - c.e0 as usize) * (r1 - r0);
            for (ps, per, dst_per, buf, weights) in [
                (data, rb, stride, &c.weights, true),
                (scales, sb, sb, &c.scales, false),
            ] {
                if per == 0 {
                    continue;
                }
                let mut pr0 = 0;
                for p in ps {
                    let pr1 = pr0 + p.len() / per;
                    let (a, b) = (pr0.max(r0), pr1.min(r1));
                    if a < b {
                        f(Segment {
                            buf,
                            offset: ((base_row + a - r0) * dst_per) as u64,
                            src: &p[(a - pr0) * per..(b - pr0) * per],
                            weights,
                        })?;
                    }
                    pr0 = pr1;
                }
            }
        }
        Ok((total + total_s) as u64)
    }

    /// The encoding of the uploaded bytes.
    pub fn encoding(&self) -> Encoding {
        self.enc
    }
    /// Number of experts E.
    pub fn experts(&self) -> usize {
        self.experts
    }
    /// Rows O per expert.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Columns I.
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// The binding-sized chunks (normally one).
    pub fn chunks(&self) -> &[WeightChunk] {
        &self.chunks
    }
    /// FORMATS.md bytes (weights + scales) of ONE expert: what a GEMV over it must read.
    pub fn expert_bytes(&self) -> u64 {
        (self.rows * self.enc.bytes_per_row(self.cols)
            + 4 * self.enc.scale_count(self.rows, self.cols)) as u64
    }
}

/// Where a run of one expert's rows goes: a chunk buffer, a byte offset in it, and the source
/// rows (weight rows unpadded; the destination stride is the padded one).
struct Segment<'b, 's> {
    buf: &'b wgpu::Buffer,
    offset: u64,
    src: &'s [u8],
    weights: bool,
}

/// One pending copy of [`GpuWeights::stage_expert`]: a staging view of the queue and the bytes
/// it must receive. `Send`, so the copies of several experts can run on several threads.
pub struct StagedCopy<'s> {
    view: wgpu::QueueWriteBufferView,
    src: &'s [u8],
}

impl StagedCopy<'_> {
    /// Bytes to copy.
    pub fn len(&self) -> usize {
        self.src.len()
    }

    /// Whether there is nothing to copy.
    pub fn is_empty(&self) -> bool {
        self.src.is_empty()
    }

    /// Copy the bytes into the staging view (reading a mapped file here is where the page
    /// cache or the disk is read). Returns the view: dropping it queues the GPU-side copy.
    pub fn run(mut self) -> wgpu::QueueWriteBufferView {
        self.view.copy_from_slice(self.src);
        self.view
    }
}

/// Run staged copies on up to `threads` threads (inline when there is little to copy), so the
/// reads of several experts (page cache or NVMe) and their copies proceed in parallel. The views
/// are dropped (their GPU copies queued) on the calling thread, inside whatever error scope it
/// has pushed.
pub fn run_staged(copies: Vec<StagedCopy<'_>>, threads: usize) {
    let total: usize = copies.iter().map(|c| c.len()).sum();
    let threads = threads.clamp(1, copies.len().max(1));
    if threads == 1 || total < (4 << 20) {
        copies.into_iter().for_each(|c| drop(c.run()));
        return;
    }
    // largest first onto the least loaded thread
    let mut copies = copies;
    copies.sort_by_key(|c| std::cmp::Reverse(c.len()));
    let mut bins: Vec<(usize, Vec<StagedCopy<'_>>)> =
        (0..threads).map(|_| (0, Vec::new())).collect();
    for c in copies {
        let b = bins.iter_mut().min_by_key(|b| b.0).expect("threads ≥ 1");
        b.0 += c.len();
        b.1.push(c);
    }
    let views: Vec<Vec<wgpu::QueueWriteBufferView>> = std::thread::scope(|s| {
        let handles: Vec<_> = bins
            .into_iter()
            .map(|(_, bin)| s.spawn(move || bin.into_iter().map(StagedCopy::run).collect()))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("an upload copy thread panicked"))
            .collect()
    });
    drop(views);
}

/// Check a slab's shape against the registry and the adapter; returns the padded GPU row stride,
/// the scales per row and the chunk limit (`limit` capped by [`default_limit`]).
fn slab_geometry(
    gpu: &Gpu,
    enc: Encoding,
    experts: usize,
    rows: usize,
    cols: usize,
    limit: u64,
) -> Result<(usize, usize, u64), DispatchError> {
    dispatch::resolve(enc.format.ordinal())?;
    if experts == 0 || rows == 0 || cols == 0 {
        return Err(DispatchError::Shape(format!(
            "empty weight tensor {experts}×[{rows}, {cols}]"
        )));
    }
    if experts > u32::MAX as usize || rows > u32::MAX as usize || cols > u32::MAX as usize {
        return Err(DispatchError::Shape("dimensions must fit in u32".into()));
    }
    let stride = gpu_row_stride(enc, cols);
    let limit = limit.min(default_limit(gpu));
    if (stride as u64) > limit {
        return Err(DispatchError::Shape(format!(
            "one row of {} [{rows}, {cols}] takes {stride} bytes, more than a binding ({limit} bytes)",
            enc.spelling()
        )));
    }
    Ok((stride, enc.scales_per_row(cols), limit))
}

/// `(e0, e1, r0, r1)` of every binding-sized chunk of a slab: whole experts per chunk when one
/// expert fits `limit`, else each expert split by rows.
fn chunk_plan(
    experts: usize,
    rows: usize,
    stride: usize,
    limit: u64,
) -> Vec<(usize, usize, usize, usize)> {
    let expert_bytes = (rows * stride) as u64;
    let mut plan = Vec::new();
    if expert_bytes <= limit {
        let per = (limit / expert_bytes).max(1) as usize;
        for e0 in (0..experts).step_by(per) {
            plan.push((e0, (e0 + per).min(experts), 0, rows));
        }
    } else {
        let per = (limit / stride as u64) as usize;
        for e in 0..experts {
            for r0 in (0..rows).step_by(per) {
                plan.push((e, e + 1, r0, (r0 + per).min(rows)));
            }
        }
    }
    plan
}

/// Largest chunk: the binding limit, the buffer limit and 2³¹ − 1 bytes (offsets past 2³¹ break
/// on several backends), rounded down to 256 bytes.
pub fn default_limit(gpu: &Gpu) -> u64 {
    let l = gpu
        .max_binding()
        .min(gpu.limits.max_buffer_size)
        .min((1u64 << 31) - 1);
    l & !255
}

/// What the staged x holds (see the module docs, *x prologues*).
#[derive(Clone, Copy, Debug, Default)]
pub enum XPrologue<'a> {
    /// x itself.
    #[default]
    None,
    /// The RMSNorm of each x row: `x_c → weight_c · (x_c · rsqrt(Σ_c x_c² / I + eps))`, weight
    /// f32 `[I]` (bound where the gamma buffer goes, so a call cannot have both).
    RmsNorm { weight: &'a wgpu::Buffer, eps: f32 },
    /// SiLU·mul of a gate‖up row of 2·I values: `x_c → silu(row_c) · row_{I + c}` with
    /// `silu(g) = g / (1 + e^−g)`.
    SiluMul,
}

impl XPrologue<'_> {
    /// The WGSL `PROLOGUE_*` ordinal.
    fn ordinal(self) -> u32 {
        match self {
            XPrologue::None => 0,
            XPrologue::RmsNorm { .. } => 1,
            XPrologue::SiluMul => 2,
        }
    }

    /// Whether x is staged as something other than x.
    pub fn is_some(self) -> bool {
        !matches!(self, XPrologue::None)
    }
}

/// Buffers and strides of one GEMV problem (see the module docs for the formula).
///
/// * `x`: f32; token t's input is `x[t·x_stride + x_offset ..][..I]`; `tokens` = T.
/// * `pairs`: u32, 4 per pair (16 bytes, the GPU router's [`crate::gpu::ops::Pair`]):
///   `(expert, token, weight_idx, pad)`; `n_pairs` = P (host-known). With `x_per_pair`, pair p
///   reads x row p instead of row `token(p)` (needs `tokens ≥ P`).
/// * `gamma`: optional f32 per-pair weights indexed by `weight_idx`; without it every pair is
///   unweighted whatever its `weight_idx`.
/// * `y`: f32; pair p's output is `y[p·y_stride + y_offset ..][..O]`, or with `segments`
///   ([`GemvArgs::segments`]) rows `s_i .. s_i + rows_i` of it are `segments[i].1[p·rows_i ..]
///   [..rows_i]` (s_i = rows of the segments before i).
///
/// Strides of 0 mean "packed": `x_stride = I` (2·I under [`XPrologue::SiluMul`]), `y_stride = O`.
/// `prologue` stages a function of x instead of x ([`XPrologue`]).
#[derive(Clone, Copy, Debug)]
pub struct GemvArgs<'a> {
    pub x: &'a wgpu::Buffer,
    pub tokens: u32,
    pub x_stride: u32,
    pub x_offset: u32,
    pub pairs: &'a wgpu::Buffer,
    pub n_pairs: u32,
    pub gamma: Option<&'a wgpu::Buffer>,
    pub y: &'a wgpu::Buffer,
    pub y_stride: u32,
    pub y_offset: u32,
    pub reduction: Reduction,
    /// Pair p reads x row p (not row `token(p)`).
    pub x_per_pair: bool,
    /// Force this tuning instead of [`plan`]'s choice (tests, benchmarks); wins over
    /// [`set_tuning_override`]. x is read directly or staged by [`plan`]'s rules for that tuning.
    pub tuning: Option<Tuning>,
    /// Whether [`GpuWeights::bind`] may run the call as a GEMM (`gemm::select`; default
    /// [`GemmChoice::Auto`]; never with a prologue).
    pub gemm: GemmChoice,
    /// Output segments `(rows_i, buffer_i)` ([`GemvArgs::segments`]); empty: the whole row to `y`.
    pub segments: &'a [(u32, &'a wgpu::Buffer)],
    /// What x is staged as (default [`XPrologue::None`]).
    pub prologue: XPrologue<'a>,
}

impl<'a> GemvArgs<'a> {
    /// Packed x and y, no gamma, automatic reduction.
    pub fn new(
        x: &'a wgpu::Buffer,
        tokens: u32,
        pairs: &'a wgpu::Buffer,
        n_pairs: u32,
        y: &'a wgpu::Buffer,
    ) -> Self {
        GemvArgs {
            x,
            tokens,
            x_stride: 0,
            x_offset: 0,
            pairs,
            n_pairs,
            gamma: None,
            y,
            y_stride: 0,
            y_offset: 0,
            reduction: Reduction::Auto,
            x_per_pair: false,
            tuning: None,
            gemm: GemmChoice::Auto,
            segments: &[],
            prologue: XPrologue::None,
        }
    }
    /// Write the O rows of each pair in up to [`MAX_SEGMENTS`] consecutive segments instead of
    /// one `y` row: segment i (`rows_i` rows, in order, Σ rows_i = O) goes to its buffer as a
    /// packed f32 matrix `[n_pairs, rows_i]`; `y` becomes the first segment's buffer. Always the
    /// GEMV ([`GpuWeights::segments_fit`] says where it binds); y strides and offsets must be 0.
    /// The buffers must not alias x or each other.
    pub fn segments(mut self, segments: &'a [(u32, &'a wgpu::Buffer)]) -> Self {
        if let Some(&(_, y)) = segments.first() {
            self.y = y;
        }
        self.segments = segments;
        self
    }
    /// Stage each x row as its RMSNorm with `weight` (f32 `[I]`) and `eps`
    /// ([`XPrologue::RmsNorm`]).
    pub fn rms_norm(mut self, weight: &'a wgpu::Buffer, eps: f32) -> Self {
        self.prologue = XPrologue::RmsNorm { weight, eps };
        self
    }
    /// Read x rows of 2·I values, gate then up, and stage `silu(gate) · up`
    /// ([`XPrologue::SiluMul`]).
    pub fn silu_mul(mut self) -> Self {
        self.prologue = XPrologue::SiluMul;
        self
    }
    /// Whether the call may run as a GEMM ([`GemvArgs::gemm`]).
    pub fn gemm(mut self, choice: GemmChoice) -> Self {
        self.gemm = choice;
        self
    }
    /// With a forced tuning (see [`GemvArgs::tuning`]); panics unless `tpr` is a power of two
    /// ≤ 256 and `rpt` is 1..=8.
    pub fn tuning(mut self, t: Tuning) -> Self {
        assert!(t.tpr.is_power_of_two() && t.tpr <= 256 && (1..=8).contains(&t.rpt));
        self.tuning = Some(t);
        self
    }
    /// Pair p reads x row p instead of x row `token(p)`.
    pub fn x_per_pair(mut self, on: bool) -> Self {
        self.x_per_pair = on;
        self
    }
    /// With per-pair weights.
    pub fn gamma(mut self, gamma: &'a wgpu::Buffer) -> Self {
        self.gamma = Some(gamma);
        self
    }
    /// With a reduction variant.
    pub fn reduction(mut self, r: Reduction) -> Self {
        self.reduction = r;
        self
    }
}

impl Reduction {
    /// Whether this reduction runs with subgroup shuffles on `gpu` (`Auto`: when the device has
    /// `SUBGROUP`); [`DispatchError::Shape`] for `Subgroup` on a device without them.
    pub fn subgroups(self, gpu: &Gpu) -> Result<bool, DispatchError> {
        match self {
            Reduction::Auto => Ok(gpu.has_subgroups()),
            Reduction::Shared => Ok(false),
            Reduction::Subgroup if gpu.has_subgroups() => Ok(true),
            Reduction::Subgroup => Err(DispatchError::Shape(
                "subgroup reduction asked for, but the device lacks SUBGROUP".into(),
            )),
        }
    }
}

/// One GEMV pipeline: everything that changes the WGSL of [`wgsl_source_key`]. Label
/// `gemv:{encoding}:{sg|smem}:{tpr}x{rpt}:{xdirect|xstaged}:{x tile}:c{chunks}`, with `:seg`
/// appended for the output-segment variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemvKey {
    pub enc: Encoding,
    /// Subgroup reduction (else the workgroup-memory tree).
    pub subgroups: bool,
    pub tuning: Tuning,
    /// Columns of x staged per tile; 0 when `direct`.
    pub xt: u32,
    /// x read straight from global memory (`XDIRECT`).
    pub direct: bool,
    /// Weight chunks bound per dispatch: 1, or 2 (the second at bindings 7 and 8).
    pub chunks: u32,
    /// Output segments (`SEGMENTS`: outputs 1-3 at bindings 9-11).
    pub segments: bool,
}

impl GemvKey {
    /// The key of one instantiation (`xt` ignored when `direct`).
    pub fn new(enc: Encoding, subgroups: bool, tuning: Tuning, xt: u32, direct: bool) -> GemvKey {
        GemvKey {
            enc,
            subgroups,
            tuning,
            xt: if direct { 0 } else { xt },
            direct,
            chunks: 1,
            segments: false,
        }
    }

    /// The same instantiation with `chunks` weight chunks bound (1 or 2).
    pub fn with_chunks(self, chunks: u32) -> GemvKey {
        GemvKey { chunks, ..self }
    }

    /// The same instantiation with or without output segments.
    pub fn with_segments(self, segments: bool) -> GemvKey {
        GemvKey { segments, ..self }
    }

    /// Storage buffers of its bind-group layout: 6, plus 2 for a second weight chunk, plus 3
    /// for output segments.
    pub fn storage_buffers(&self) -> u32 {
        6 + if self.chunks == 2 { 2 } else { 0 } + if self.segments { 3 } else { 0 }
    }
}

impl std::fmt::Display for GemvKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "gemv:{}:{}:{}x{}:{}:{}:c{}{}",
            self.enc.spelling(),
            if self.subgroups { "sg" } else { "smem" },
            self.tuning.tpr,
            self.tuning.rpt,
            if self.direct { "xdirect" } else { "xstaged" },
            self.xt,
            self.chunks,
            if self.segments { ":seg" } else { "" }
        )
    }
}

impl Kernel for GemvKey {
    type Params = GemvParams;
    fn entry(&self) -> &'static str {
        "main"
    }
    /// Uniform params, then weights, scales, x, pairs and gamma read-only, y read-write, with
    /// two chunks the second chunk's weights and scales read-only at 7 and 8, and with output
    /// segments the outputs of segments 1-3 read-write at 9, 10 and 11.
    fn bindings(&self) -> Vec<(u32, Bind)> {
        let mut v = vec![(0, Bind::Uniform)];
        v.extend((1..=5).map(|b| (b, Bind::Read)));
        v.push((6, Bind::Write));
        if self.chunks == 2 {
            v.extend([(7, Bind::Read), (8, Bind::Read)]);
        }
        if self.segments {
            v.extend((9..=11).map(|b| (b, Bind::Write)));
        }
        v
    }
    fn source(&self) -> String {
        wgsl_source_key(self)
    }
    fn subgroups(&self) -> bool {
        self.subgroups
    }
}

impl GpuWeights {
    /// Check a call over these weights (what [`GpuWeights::bind`] checks first, whichever kernel
    /// runs it): `ordinal` must be in the registry ([`DispatchError::UnknownOrdinal`]), have a
    /// kernel here ([`DispatchError::NoKernel`]) and be the ordinal of the weights' encoding
    /// ([`DispatchError::EncodingMismatch`]); the reduction must be available; buffers too small
    /// for `args` and output segments that are not 1 to [`MAX_SEGMENTS`] non-empty row counts
    /// adding up to O (or come with y strides or offsets) are [`DispatchError::Shape`]. Returns
    /// the encoding and whether the GEMV reduces with subgroups.
    pub fn check_args(
        &self,
        gpu: &Gpu,
        ordinal: u32,
        args: &GemvArgs,
    ) -> Result<(Encoding, bool), DispatchError> {
        let enc = dispatch::check(ordinal, self.encoding())?;
        let subgroups = args.reduction.subgroups(gpu)?;
        let (o, i) = (self.rows as u64, self.cols as u64);
        let (x_stride, y_stride) = strides(self, args);
        if args.tokens == 0 {
            return Err(DispatchError::Shape("tokens must be ≥ 1".into()));
        }
        let row = x_row_len(self, args);
        let need_x = 4 * ((args.tokens as u64 - 1) * x_stride + args.x_offset as u64 + row);
        if args.x.size() < need_x {
            return Err(DispatchError::Shape(format!(
                "x buffer has {} bytes, needs {need_x}",
                args.x.size()
            )));
        }
        if !args.segments.is_empty() {
            check_segments(args, o)?;
        } else if args.n_pairs > 0 {
            let need_y = 4 * ((args.n_pairs as u64 - 1) * y_stride + args.y_offset as u64 + o);
            if args.y.size() < need_y {
                return Err(DispatchError::Shape(format!(
                    "y buffer has {} bytes, needs {need_y}",
                    args.y.size()
                )));
            }
        }
        if args.n_pairs > 0 {
            if args.pairs.size() < 16 * args.n_pairs as u64 {
                return Err(DispatchError::Shape(format!(
                    "pairs buffer has {} bytes, {} pairs need {} (16 bytes per pair)",
                    args.pairs.size(),
                    args.n_pairs,
                    16 * args.n_pairs as u64
                )));
            }
            if args.x_per_pair && args.tokens < args.n_pairs {
                return Err(DispatchError::Shape(format!(
                    "x_per_pair needs an x row per pair: {} rows for {} pairs",
                    args.tokens, args.n_pairs
                )));
            }
        }
        if let XPrologue::RmsNorm { weight, eps } = args.prologue {
            if args.gamma.is_some() {
                return Err(DispatchError::Shape(
                    "the RMSNorm prologue's weight takes the gamma binding: no per-pair gamma with it"
                        .into(),
                ));
            }
            if weight.size() < 4 * i {
                return Err(DispatchError::Shape(format!(
                    "RMSNorm prologue weight has {} bytes, needs {} ({i} f32)",
                    weight.size(),
                    4 * i
                )));
            }
            if !(eps.is_finite() && eps >= 0.0) {
                return Err(DispatchError::Shape(format!(
                    "RMSNorm prologue eps must be finite and ≥ 0, got {eps}"
                )));
            }
        }
        Ok((enc, subgroups))
    }

    /// Whether a GEMV over these weights can write output segments on `gpu`
    /// ([`GemvArgs::segments`]): the slab is one weight chunk and the device allows the variant's
    /// 9 storage buffers per shader stage.
    pub fn segments_fit(&self, gpu: &Gpu) -> bool {
        let key = GemvKey::new(self.enc, false, tuning(self.enc.format), 0, false);
        self.chunks.len() == 1
            && key.with_segments(true).storage_buffers()
                <= gpu.limits.max_storage_buffers_per_shader_stage
    }

    /// Bind the GEMV over these weights (never the GEMM, whatever [`GemvArgs::gemm`] says; errors
    /// of [`GpuWeights::check_args`], and [`DispatchError::Shape`] for output segments where
    /// they do not fit, [`GpuWeights::segments_fit`]). One dispatch per pair of weight chunks
    /// with pairs (none when `n_pairs` is 0); label `"gemv"`.
    pub fn bind_gemv(
        &self,
        gpu: &Gpu,
        ordinal: u32,
        args: GemvArgs,
    ) -> Result<Call, DispatchError> {
        let (enc, subgroups) = self.check_args(gpu, ordinal, &args)?;
        let segmented = !args.segments.is_empty();
        if segmented && !self.segments_fit(gpu) {
            return Err(DispatchError::Shape(format!(
                "output segments need a one-chunk slab (this one has {} chunks) and 9 storage \
                 buffers per shader stage (the device allows {})",
                self.chunks.len(),
                gpu.limits.max_storage_buffers_per_shader_stage
            )));
        }
        // segment i ends at row seg_end[i]; absent segments end at O (never reached)
        let mut seg_end = [self.rows as u32; MAX_SEGMENTS];
        let mut end = 0;
        for (k, &(rows, _)) in args.segments.iter().enumerate() {
            end += rows;
            seg_end[k] = end;
        }
        let absent: Vec<wgpu::Buffer> = (args.segments.len().max(1)..MAX_SEGMENTS)
            .filter(|_| segmented)
            .map(|_| dummy(gpu))
            .collect();
        let extra_outputs: Vec<&wgpu::Buffer> = args
            .segments
            .iter()
            .skip(1)
            .map(|s| s.1)
            .chain(&absent)
            .collect();
        let (o, i) = (self.rows as u64, self.cols as u64);
        let (x_stride, y_stride) = strides(self, &args);
        let smem = gpu.limits.max_compute_workgroup_storage_size as u64;
        // each dispatch's params at a multiple of the offset alignment (a power of two)
        let align =
            PARAMS_BYTES.next_multiple_of(gpu.limits.min_uniform_buffer_offset_alignment as u64);
        // one dispatch per pair of weight chunks (the last one alone when their count is odd)
        let groups: Vec<&[WeightChunk]> = self.chunks.chunks(2).collect();
        let params = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("gemv params"),
            size: align * groups.len() as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        // binding 5: the per-pair gamma, or the RMSNorm prologue's weight
        let (bound5, norm_eps) = match args.prologue {
            XPrologue::RmsNorm { weight, eps } => (Some(weight), eps),
            _ => (args.gamma, 0.0),
        };
        let no_gamma = bound5.is_none().then(|| dummy(gpu));
        let gamma = bound5.or(no_gamma.as_ref()).expect("one of them");
        let mut dispatches = Vec::new();
        for (k, (group, plan)) in groups.iter().zip(self.plans(&args)).enumerate() {
            let rows_of = |c: &WeightChunk| c.r1 - c.r0;
            let xt = x_tile(enc.format, plan.tuning, self.cols, smem);
            let n_chunks = group.len() as u32;
            let key = GemvKey::new(enc, subgroups, plan.tuning, xt, plan.direct)
                .with_chunks(n_chunks)
                .with_segments(segmented);
            let pipeline = kernel::pipeline(gpu, &key);
            let layout = pipeline.get_bind_group_layout(0);
            let rpw = plan.tuning.rows_per_workgroup();
            let range = |c: Option<&WeightChunk>| c.map_or([0; 4], |c| [c.e0, c.e1, c.r0, c.r1]);
            let blocks = |c: Option<&WeightChunk>| c.map_or(0, |c| rows_of(c).div_ceil(rpw));
            let (c0, c1) = (group.first(), group.get(1));
            let n_blocks = blocks(c0) + blocks(c1);
            let p = GemvParams {
                rows: o as u32,
                cols: i as u32,
                n_pairs: args.n_pairs,
                row_stride_v4: (gpu_row_stride(enc, self.cols) / 16) as u32,
                x_stride: x_stride as u32,
                x_offset: args.x_offset,
                y_stride: y_stride as u32,
                y_offset: args.y_offset,
                scales_per_row: enc.scales_per_row(self.cols) as u32,
                use_gamma: args.gamma.is_some() as u32,
                x_row_is_pair: args.x_per_pair as u32,
                pad: 0,
                chunk0: range(c0),
                chunk1: range(c1),
                row_blocks: [blocks(c0), blocks(c1), 0, 0],
                seg_end,
                prologue: args.prologue.ordinal(),
                norm_eps,
                prologue_pad0: 0,
                prologue_pad1: 0,
            };
            gpu.queue
                .write_buffer(&params, k as u64 * align, bytemuck::bytes_of(&p));
            let mut entries = vec![
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &params,
                        offset: k as u64 * align,
                        size: wgpu::BufferSize::new(PARAMS_BYTES),
                    }),
                },
                entry(1, &group[0].weights),
                entry(2, &group[0].scales),
                entry(3, args.x),
                entry(4, args.pairs),
                entry(5, gamma),
                entry(6, args.y),
            ];
            if let Some(c) = c1 {
                entries.extend([entry(7, &c.weights), entry(8, &c.scales)]);
            }
            for (b, y) in (9..).zip(&extra_outputs) {
                entries.push(entry(b, y));
            }
            let bg = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("gemv"),
                layout: &layout,
                entries: &entries,
            });
            let total = args.n_pairs as u64 * n_blocks as u64;
            if total == 0 {
                continue;
            }
            let groups = grid_u64(total)
                .ok_or_else(|| DispatchError::Shape(format!("{total} workgroups exceed 65535²")))?;
            dispatches.push(Dispatch::from_parts(pipeline, bg, groups));
        }
        let owned = [params].into_iter().chain(no_gamma).chain(absent);
        Ok(Call::new(Label::op("gemv"), dispatches).owning(owned))
    }

    /// The [`plan`] of each dispatch of a GEMV over these weights with `args` (what
    /// [`GpuWeights::bind`] records, one per pair of weight chunks, dispatches without pairs
    /// included): planned over the rows one pair can meet in it (both chunks' rows when they
    /// split one expert's rows, else the larger chunk's); n_pairs of 0 launches nothing and is
    /// planned as one pair. A call with an x prologue always stages x.
    pub fn plans(&self, args: &GemvArgs) -> Vec<Plan> {
        let enc = self.encoding();
        let (x_stride, _) = strides(self, args);
        let rows_of = |c: &WeightChunk| c.r1 - c.r0;
        self.chunks
            .chunks(2)
            .map(|group| {
                let rows = match group {
                    [a, b] if (a.e0, a.e1) == (b.e0, b.e1) => rows_of(a) + rows_of(b),
                    _ => group.iter().map(rows_of).max().unwrap_or(0),
                };
                plan_with(
                    enc,
                    args.tuning.or_else(tuning_override),
                    args.prologue.is_some(),
                    args.n_pairs.max(1),
                    rows,
                    self.cols as u32,
                    x_stride as u32,
                    args.x_offset,
                )
            })
            .collect()
    }
}

/// Check the output segments of `args` over weights of `o` rows (see [`GpuWeights::check_args`]).
fn check_segments(args: &GemvArgs, o: u64) -> Result<(), DispatchError> {
    let segs = args.segments;
    let bad = |m: String| Err(DispatchError::Shape(format!("output segments: {m}")));
    if segs.len() > MAX_SEGMENTS {
        return bad(format!("{} given, at most {MAX_SEGMENTS}", segs.len()));
    }
    if args.y_stride != 0 || args.y_offset != 0 {
        return bad("y stride and offset must be 0 (each segment is packed)".into());
    }
    let total: u64 = segs.iter().map(|s| s.0 as u64).sum();
    if segs.iter().any(|s| s.0 == 0) || total != o {
        let rows: Vec<u32> = segs.iter().map(|s| s.0).collect();
        return bad(format!(
            "rows {rows:?} must be non-empty and add up to the {o} rows"
        ));
    }
    for (i, &(rows, y)) in segs.iter().enumerate() {
        let need = 4 * args.n_pairs as u64 * rows as u64;
        if y.size() < need {
            return bad(format!(
                "buffer {i} has {} bytes, {} pairs × {rows} rows need {need}",
                y.size(),
                args.n_pairs
            ));
        }
    }
    Ok(())
}

/// `(x_stride, y_stride)` of `args` over `w`, packed strides (0) resolved.
fn strides(w: &GpuWeights, args: &GemvArgs) -> (u64, u64) {
    let x = if args.x_stride == 0 {
        x_row_len(w, args)
    } else {
        args.x_stride as u64
    };
    let y = if args.y_stride == 0 {
        w.rows as u64
    } else {
        args.y_stride as u64
    };
    (x, y)
}

/// f32 values of one x row that a GEMV over `w` reads: I, or 2·I (gate‖up) under
/// [`XPrologue::SiluMul`].
fn x_row_len(w: &GpuWeights, args: &GemvArgs) -> u64 {
    match args.prologue {
        XPrologue::SiluMul => 2 * w.cols as u64,
        _ => w.cols as u64,
    }
}

/// Every x tile [`GpuWeights::bind`] can pick for tuning `t` of `f` on a device with
/// `smem_limit` bytes of workgroup memory: 512 columns (taken even when it does not fit), then
/// every multiple of 512 up to 16384 that fits.
pub fn x_tiles(f: Format, t: Tuning, smem_limit: u64) -> Vec<u32> {
    (1..=XT_MAX / 512)
        .map(|k| 512 * k)
        .filter(|&xt| xt == 512 || smem_bytes(f, t, xt) <= smem_limit)
        .collect()
}

/// Workgroup-memory bytes of the instantiation of [`GemvKey::new`] (`xt` ignored when `direct`).
pub fn workgroup_bytes(f: Format, t: Tuning, xt: u32, direct: bool) -> u64 {
    smem_bytes(f, t, if direct { 0 } else { xt })
}

/// Every GEMV kernel the engine builds without a forced tuning on a device with `smem_limit`
/// bytes of workgroup memory (`u64::MAX`: any device), with the subgroup reduction too when
/// `subgroups`: each kernel encoding × reduction × ([`candidates`] × [`x_tiles`] staged, and
/// [`direct_candidates`] direct for f32 and bf16) × (one or two weight chunks, or one chunk with
/// output segments). Forced tunings (`bench kernels --tune`, [`GemvArgs::tuning`]) may build
/// others.
pub fn kernels(smem_limit: u64, subgroups: bool) -> Vec<KernelSpec> {
    let mut v = Vec::new();
    for enc in kernel_encodings() {
        for sg in [false, true].into_iter().filter(|&sg| !sg || subgroups) {
            for (chunks, segs) in [(1, false), (2, false), (1, true)] {
                let key = |t, xt, direct| {
                    GemvKey::new(enc, sg, t, xt, direct)
                        .with_chunks(chunks)
                        .with_segments(segs)
                };
                for &t in candidates(enc.format) {
                    for xt in x_tiles(enc.format, t, smem_limit) {
                        v.push(KernelSpec::of(&key(t, xt, false)));
                    }
                }
                if matches!(enc.format, Format::F32 | Format::Bf16) {
                    for &t in direct_candidates() {
                        v.push(KernelSpec::of(&key(t, 0, true)));
                    }
                }
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The selection rule, then the override winning over it (one test: the override is global).
    #[test]
    fn plan_rule_and_override() {
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
        // a router [256 x 4096] cannot reach MIN_WORKGROUPS: the fewest rows per workgroup
        assert_eq!(
            plan(bf16, 1, 256, 4096, 0, 0).tuning.rows_per_workgroup(),
            1
        );
        // int3-g64 never goes above its own default
        let i3 = Encoding::parse("int3-g64").unwrap();
        assert_eq!(
            plan(i3, 64, 6144, 6144, 0, 0).tuning,
            Tuning { tpr: 32, rpt: 1 }
        );
        assert!(!plan(i3, 1, 256, 4096, 0, 0).direct);
        set_tuning_override(Some(Tuning { tpr: 16, rpt: 4 }));
        let p = plan(bf16, 1, 256, 4096, 0, 0);
        set_tuning_override(None);
        assert_eq!(p.tuning, Tuning { tpr: 16, rpt: 4 });
        assert!(!p.direct, "64 rows per workgroup stage x");
        assert_eq!(
            plan(bf16, 1, 256, 4096, 0, 0).tuning.rows_per_workgroup(),
            1
        );
    }
}
