//! The MoE GEMV kernel (`wgsl/gemv.wgsl`) over a [`GpuWeights`] slab: its instantiations
//! ([`GemvKey`]), their WGSL, and the recorded call ([`GpuWeights::bind_gemv`]).
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
//! # Output segments
//! With [`GemvArgs::segments`] the rows of each expert are cut into up to four consecutive
//! segments, each written to its own buffer as a packed `[pairs, rows_i]` matrix (a layer's q, k,
//! v and r projections as one GEMV over their concatenated rows). The kernel variant
//! (`SEGMENTS` in the WGSL) binds the outputs at 6, 9, 10 and 11 and picks the segment of each
//! row at the final write, after the reduction: the hot loop is the plain one, and a row block
//! may straddle two segments. It exists for one-chunk slabs on devices with 9 storage buffers
//! per stage ([`GpuWeights::segments_fit`]); callers fall back to a packed output otherwise.
//!
//! # silu·up epilogue
//! With [`GemvArgs::silu_mul`] (`SILU` in the WGSL) the rows are a SwiGLU's gate rows `[0, I')`
//! then its up rows `[I', 2I')`, and the call writes `silu(gate_i)·up_i` instead of the rows: row
//! block b of a workgroup is gate rows `[b·R/2, (b+1)·R/2)` in its first R/2 rows and the same up
//! rows in the other half (R = ROWS_PER_WORKGROUP, so a tuning needs two row sets per workgroup,
//! [`silu_tuning`]). After the reduction the row sums go to workgroup memory and each gate/up pair
//! is joined by the expression of `silu_mul` in `wgsl/elementwise.wgsl`: the same sums, the same
//! f32 operations, one dispatch and no `[P, 2I']` intermediate instead of two.
//!
//! # Short-conv epilogue
//! With [`GemvArgs::conv`] (`CONV` in the WGSL; a dense GEMV of one token per sequence slot) the
//! row sums also go to `block_sums`, and each thread then runs the causal depthwise short conv of
//! `wgsl/conv.wgsl` for one row as a channel: the slot's K−1 previous inputs of the channel (its
//! state, bindings 8 and 9 for the slot) and this row's sum, weighted by the conv weights (binding
//! 7), added to `y` (the residual `h += conv(o)`), the state moved on by one: o_proj and the
//! attention's residual conv in one dispatch, with the same f32 operations in the same order.

use crate::formats::{Encoding, Format};
use crate::gpu::call::{dummy, entry, grid_u64, Call, Dispatch, Label};
use crate::gpu::dispatch::DispatchError;
use crate::gpu::kernel::{self, Bind, Kernel, KernelSpec};
use crate::gpu::linear::args::{strides, GemvArgs, MAX_SEGMENTS};
use crate::gpu::linear::format::{encodings_of, kernel_encodings, row, unit_shape, Tuning};
use crate::gpu::linear::route::{
    candidates, direct_candidates, silu_tuning, tuning, LinearOptions, Plan,
};
use crate::gpu::linear::slab::{gpu_row_stride, GpuWeights, WeightChunk};
use crate::gpu::Gpu;

/// Source of the one GEMV skeleton.
pub const GEMV_WGSL: &str = include_str!("../../../wgsl/gemv.wgsl");

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
    conv: [u32; 4],
}

/// Size of the uniform block.
pub const PARAMS_BYTES: u64 = std::mem::size_of::<GemvParams>() as u64;

/// Pad period of the x tile in vec4: one pad vec4 per unit (at least every 8 vec4).
fn pad_period(f: Format) -> u32 {
    (unit_shape(f).0 / 4).max(8)
}

/// Workgroup-memory bytes of an instantiation with tile `xt` (0: x not staged).
fn smem_bytes(f: Format, t: Tuning, xt: u32) -> u64 {
    let v4 = xt / 4;
    16 * (v4 + v4 / pad_period(f)) as u64 + 4 * 256 * t.rpt as u64
}

/// Workgroup-memory bytes of a staged instantiation with x tile `xt`, with the silu·up
/// epilogue's `block_sums` (one f32 per row of the workgroup) when `silu`.
fn staged_bytes(f: Format, t: Tuning, xt: u32, silu: bool) -> u64 {
    smem_bytes(f, t, xt) + silu as u64 * 4 * t.rows_per_workgroup() as u64
}

/// The x tile for `cols` columns: the row rounded up to 512 columns, shrunk by 512 until it fits
/// `smem_limit` bytes of workgroup memory (never below 512), the silu·up epilogue's bytes
/// included when `silu`.
fn x_tile(f: Format, t: Tuning, cols: usize, smem_limit: u64, silu: bool) -> u32 {
    let mut xt = (cols.next_multiple_of(512) as u64).min(XT_MAX as u64) as u32;
    while xt > 512 && staged_bytes(f, t, xt, silu) > smem_limit {
        xt -= 512;
    }
    xt
}

/// Units each hot-loop step of a thread decodes (UNITS_PER_STEP in the WGSL); their weight
/// loads issue together.
const UNITS_PER_STEP: u32 = 2;

/// Fewest steps of a thread per x tile for which the hot loop prefetches (PREFETCH in the WGSL:
/// the next step's weights load while this step decodes); shorter loops lose more to the longer
/// prologue and the registers of the second step than they win on an H200
/// (BENCHMARKS.md#decision-gemv-units-per-step).
const PREFETCH_MIN_STEPS: u32 = 6;

/// Whether the hot loop of an instantiation prefetches: the quantised formats (x staged) when a
/// thread takes at least [`PREFETCH_MIN_STEPS`] steps over a tile of `xt` columns.
pub fn prefetch(f: Format, t: Tuning, xt: u32) -> bool {
    let steps = (xt / unit_shape(f).0) / (t.tpr * UNITS_PER_STEP);
    row(f).quantised && steps >= PREFETCH_MIN_STEPS
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
/// and the hot loop written once per bound chunk; see [`crate::gpu::kernel::preprocess_with`]).
/// Panics on a format without a kernel or `chunks` other than 1 and 2.
pub fn wgsl_source_key(key: &GemvKey) -> String {
    wgsl_instantiation(key, true)
}

/// [`wgsl_source_key`] without its entry point when not `entry` (`ENTRY` in the WGSL): the
/// module-scope declarations and `gemv_body`, which a pair of GEMVs (`gemv_pair`) calls.
pub fn wgsl_instantiation(key: &GemvKey, entry: bool) -> String {
    let GemvKey {
        enc,
        subgroups,
        tuning: t,
        xt,
        direct,
        chunks,
        segments,
        silu,
        conv,
    } = *key;
    assert!(
        chunks == 1 || chunks == 2,
        "1 or 2 weight chunks per dispatch"
    );
    let xt = if direct { 0 } else { xt };
    let header = format!(
        "{} ({}, {}, {chunks} weight chunk(s){}{}{}), threads per row {} rows per thread {} x tile {xt}",
        enc.spelling(),
        if subgroups {
            "subgroup reduction"
        } else {
            "shared-memory reduction"
        },
        if direct { "direct x" } else { "staged x" },
        if segments { ", output segments" } else { "" },
        if silu { ", silu·up epilogue" } else { "" },
        if conv { ", short-conv epilogue" } else { "" },
        t.tpr,
        t.rpt,
    );
    let mut out = prelude(enc, t, xt, chunks, &header);
    out.push_str(&crate::gpu::kernel::preprocess_with(
        GEMV_WGSL,
        &[
            ("SUBGROUP", subgroups),
            ("XDIRECT", direct),
            ("CHUNK1", chunks == 2),
            ("SEGMENTS", segments),
            ("SILU", silu),
            ("CONV", conv),
            ("UNIT_ARRAYS", row(enc.format).quantised),
            ("PREFETCH", prefetch(enc.format, t, xt)),
            ("ENTRY", entry),
        ],
        &[("WEIGHT_CHUNKS", chunks as i64)],
    ));
    out
}

/// `gemv:{encoding}:{sg|smem}:{tpr}x{rpt}:{xdirect|xstaged}:{x tile}:c{chunks}`, with `:seg`
/// appended for the output-segment variant and `:silu` for the silu·up epilogue.
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
    /// The silu·up epilogue (`SILU`, [`GemvArgs::silu_mul`]).
    pub silu: bool,
    /// The short-conv epilogue (`CONV`, [`GemvArgs::conv`]: bindings 7-9; one chunk, no
    /// segments).
    pub conv: bool,
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
            silu: false,
            conv: false,
        }
    }

    /// The same instantiation with or without the short-conv epilogue.
    pub fn with_conv(self, conv: bool) -> GemvKey {
        GemvKey { conv, ..self }
    }

    /// The same instantiation with or without the silu·up epilogue.
    pub fn with_silu(self, silu: bool) -> GemvKey {
        GemvKey { silu, ..self }
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
    /// for output segments, plus 3 for the short-conv epilogue.
    pub fn storage_buffers(&self) -> u32 {
        6 + if self.chunks == 2 { 2 } else { 0 }
            + if self.segments { 3 } else { 0 }
            + if self.conv { 3 } else { 0 }
    }

    /// Workgroup-memory bytes of this instantiation.
    pub fn workgroup_bytes(&self) -> u64 {
        workgroup_bytes(
            self.enc.format,
            self.tuning,
            self.xt,
            self.direct,
            self.silu || self.conv,
        )
    }
}

impl std::fmt::Display for GemvKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "gemv:{}:{}:{}x{}:{}:{}:c{}{}{}{}",
            self.enc.spelling(),
            if self.subgroups { "sg" } else { "smem" },
            self.tuning.tpr,
            self.tuning.rpt,
            if self.direct { "xdirect" } else { "xstaged" },
            self.xt,
            self.chunks,
            if self.segments { ":seg" } else { "" },
            if self.silu { ":silu" } else { "" },
            if self.conv { ":conv" } else { "" }
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
        if self.conv {
            v.extend([(7, Bind::Read), (8, Bind::Write), (9, Bind::Read)]);
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
    /// Whether a GEMV over these weights can write output segments on `gpu`
    /// ([`GemvArgs::segments`]): the slab is one weight chunk and the device allows the variant's
    /// 9 storage buffers per shader stage.
    pub fn segments_fit(&self, gpu: &Gpu) -> bool {
        let key = GemvKey::new(
            self.encoding(),
            false,
            tuning(self.encoding().format),
            0,
            false,
        );
        self.chunks().len() == 1
            && key.with_segments(true).storage_buffers()
                <= gpu.limits.max_storage_buffers_per_shader_stage
    }

    /// Whether `args` over these weights under `opts` can take its short-conv epilogue on `gpu`
    /// ([`GemvArgs::conv`]): [`GpuWeights::conv_shape_fits`], and the device allows the
    /// variant's storage buffers per shader stage (9: more than WebGPU's default 8, where o_proj
    /// and the conv stay apart).
    pub fn conv_fits(&self, gpu: &Gpu, args: &GemvArgs, opts: &LinearOptions) -> bool {
        self.conv_shape_fits(args, opts) && conv_storage_fits(gpu, self.encoding())
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
        let plans = self.plans(&args, &LinearOptions::default());
        bind(gpu, self, ordinal, args, &plans)
    }
}

/// A short-conv epilogue instantiation of `enc` (for its bind-group layout's size).
fn conv_key(enc: Encoding) -> GemvKey {
    GemvKey::new(enc, false, tuning(enc.format), 0, false).with_conv(true)
}

/// Whether `gpu` allows the storage buffers of `enc`'s short-conv epilogue variant.
fn conv_storage_fits(gpu: &Gpu, enc: Encoding) -> bool {
    conv_key(enc).storage_buffers() <= gpu.limits.max_storage_buffers_per_shader_stage
}

/// One dispatch of a GEMV call before its uniform and bind group exist: its instantiation, its
/// uniform, the buffers at bindings 1 and up (clones of the handles) and its workgroup count.
#[derive(Clone, Debug)]
pub struct Planned {
    pub key: GemvKey,
    pub params: GemvParams,
    pub buffers: Vec<(u32, wgpu::Buffer)>,
    pub workgroups: u64,
}

/// The dispatches of the GEMV of `args` over `w` with one [`Plan`] per dispatch (`plans`, from
/// [`GpuWeights::plans`]), none for a pair of chunks without workgroups; what [`bind`] records.
/// The dummy buffers they bind are in the buffers' handles. Errors: those of [`bind`].
pub fn planned(
    gpu: &Gpu,
    w: &GpuWeights,
    ordinal: u32,
    args: GemvArgs,
    plans: &[Plan],
) -> Result<Vec<Planned>, DispatchError> {
    let (enc, subgroups) = w.check_args(gpu, ordinal, &args)?;
    let segmented = !args.segments.is_empty();
    if segmented && !w.segments_fit(gpu) {
        return Err(DispatchError::Shape(format!(
            "output segments need a one-chunk slab (this one has {} chunks) and 9 storage \
             buffers per shader stage (the device allows {})",
            w.chunks().len(),
            gpu.limits.max_storage_buffers_per_shader_stage
        )));
    }
    if args.conv.is_some() && !conv_storage_fits(gpu, enc) {
        return Err(DispatchError::Shape(format!(
            "short-conv epilogue: needs {} storage buffers per shader stage, the device allows {}",
            conv_key(enc).storage_buffers(),
            gpu.limits.max_storage_buffers_per_shader_stage
        )));
    }
    // segment i ends at row seg_end[i]; absent segments end at O (never reached)
    let mut seg_end = [w.rows() as u32; MAX_SEGMENTS];
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
    let (o, i) = (w.rows() as u64, w.cols() as u64);
    let (x_stride, y_stride) = strides(w, &args);
    let smem = gpu.limits.max_compute_workgroup_storage_size as u64;
    let no_gamma = args.gamma.is_none().then(|| dummy(gpu));
    let gamma = args.gamma.or(no_gamma.as_ref()).expect("one of them");
    let mut out = Vec::new();
    // one dispatch per pair of weight chunks (the last one alone when their count is odd)
    for (group, plan) in w.chunks().chunks(2).zip(plans) {
        let rows_of = |c: &WeightChunk| c.r1 - c.r0;
        let epilogue = args.silu_mul || args.conv.is_some();
        let xt = x_tile(enc.format, plan.tuning, w.cols(), smem, epilogue);
        let key = GemvKey::new(enc, subgroups, plan.tuning, xt, plan.direct)
            .with_chunks(group.len() as u32)
            .with_segments(segmented)
            .with_silu(args.silu_mul)
            .with_conv(args.conv.is_some());
        let rpw = plan.tuning.rows_per_workgroup();
        let range = |c: Option<&WeightChunk>| c.map_or([0; 4], |c| [c.e0, c.e1, c.r0, c.r1]);
        let blocks = |c: Option<&WeightChunk>| c.map_or(0, |c| rows_of(c).div_ceil(rpw));
        let (c0, c1) = (group.first(), group.get(1));
        let n_blocks = blocks(c0) + blocks(c1);
        let params = GemvParams {
            rows: o as u32,
            cols: i as u32,
            n_pairs: args.n_pairs,
            row_stride_v4: (gpu_row_stride(enc, w.cols()) / 16) as u32,
            x_stride: x_stride as u32,
            x_offset: args.x_offset,
            y_stride: y_stride as u32,
            y_offset: args.y_offset,
            scales_per_row: enc.scales_per_row(w.cols()) as u32,
            use_gamma: args.gamma.is_some() as u32,
            x_row_is_pair: args.x_per_pair as u32,
            pad: 0,
            chunk0: range(c0),
            chunk1: range(c1),
            row_blocks: [blocks(c0), blocks(c1), 0, 0],
            seg_end,
            conv: args
                .conv
                .map_or([0; 4], |c| [c.kernel, c.per_token as u32, 0, 0]),
        };
        let mut buffers = vec![
            (1, group[0].weights.clone()),
            (2, group[0].scales.clone()),
            (3, args.x.clone()),
            (4, args.pairs.clone()),
            (5, gamma.clone()),
            (6, args.y.clone()),
        ];
        if let Some(c) = c1 {
            buffers.extend([(7, c.weights.clone()), (8, c.scales.clone())]);
        }
        buffers.extend((9..).zip(extra_outputs.iter().map(|&y| y.clone())));
        if let Some(c) = &args.conv {
            buffers.extend([(7, c.w.clone()), (8, c.state.clone()), (9, c.slots.clone())]);
        }
        let workgroups = args.n_pairs as u64 * n_blocks as u64;
        if workgroups > 0 {
            out.push(Planned {
                key,
                params,
                buffers,
                workgroups,
            });
        }
    }
    Ok(out)
}

/// The GEMV of `args` over `w` with one [`Plan`] per dispatch (`plans`, from
/// [`GpuWeights::plans`]); what [`GpuWeights::bind_gemv`] documents.
pub fn bind(
    gpu: &Gpu,
    w: &GpuWeights,
    ordinal: u32,
    args: GemvArgs,
    plans: &[Plan],
) -> Result<Call, DispatchError> {
    let planned = planned(gpu, w, ordinal, args, plans)?;
    // each dispatch's params at a multiple of the offset alignment (a power of two)
    let align =
        PARAMS_BYTES.next_multiple_of(gpu.limits.min_uniform_buffer_offset_alignment as u64);
    let params = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("gemv params"),
        size: align * planned.len().max(1) as u64,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut dispatches = Vec::new();
    for (k, d) in planned.iter().enumerate() {
        let pipeline = kernel::pipeline(gpu, &d.key);
        gpu.queue
            .write_buffer(&params, k as u64 * align, bytemuck::bytes_of(&d.params));
        let mut entries = vec![params_entry(0, &params, k as u64 * align)];
        entries.extend(d.buffers.iter().map(|(b, buf)| entry(*b, buf)));
        let bg = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("gemv"),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let groups = workgroup_grid(d.workgroups)?;
        dispatches.push(Dispatch::from_parts(pipeline, bg, groups));
    }
    Ok(Call::new(Label::op("gemv"), dispatches).owning([params]))
}

/// The bind-group entry of one dispatch's [`GemvParams`] at byte `offset` of `params`.
pub fn params_entry(binding: u32, params: &wgpu::Buffer, offset: u64) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: params,
            offset,
            size: wgpu::BufferSize::new(PARAMS_BYTES),
        }),
    }
}

/// The grid of `n` workgroups ([`grid_u64`]); an error past 65535².
pub fn workgroup_grid(n: u64) -> Result<[u32; 3], DispatchError> {
    grid_u64(n).ok_or_else(|| DispatchError::Shape(format!("{n} workgroups exceed 65535²")))
}

/// Every x tile [`GpuWeights::bind`] can pick for tuning `t` of `f` on a device with
/// `smem_limit` bytes of workgroup memory, with the silu·up epilogue when `silu`: 512 columns
/// (taken even when it does not fit), then every multiple of 512 up to 16384 that fits.
pub fn x_tiles(f: Format, t: Tuning, smem_limit: u64, silu: bool) -> Vec<u32> {
    (1..=XT_MAX / 512)
        .map(|k| 512 * k)
        .filter(|&xt| xt == 512 || staged_bytes(f, t, xt, silu) <= smem_limit)
        .collect()
}

/// Workgroup-memory bytes of the instantiation of [`GemvKey::new`] (`xt` ignored when `direct`),
/// with the silu·up epilogue's when `silu` ([`GemvKey::with_silu`]).
pub fn workgroup_bytes(f: Format, t: Tuning, xt: u32, direct: bool, silu: bool) -> u64 {
    staged_bytes(f, t, if direct { 0 } else { xt }, silu)
}

/// Every GEMV kernel the engine builds without a forced tuning on a device with `smem_limit`
/// bytes of workgroup memory (`u64::MAX`: any device), with the subgroup reduction too when
/// `subgroups`: each kernel encoding × reduction × ([`candidates`] × [`x_tiles`] staged, and
/// [`direct_candidates`] direct for f32 and bf16) × (one or two weight chunks, or one chunk with
/// output segments).
pub fn kernels(smem_limit: u64, subgroups: bool) -> Vec<KernelSpec> {
    let encs = kernel_encodings();
    kernels_where(&encs, subgroups, |enc, t, silu| {
        x_tiles(enc.format, t, smem_limit, silu)
    })
}

/// The subset of [`kernels`] that matrices of these (encoding, columns) `shapes` reach: the staged
/// variants only at the x tile each column count is given ([`x_tile`]), and only the shapes'
/// encodings. A superset of what a model over them builds whatever its calls' pairs and tokens.
pub fn kernels_for(
    shapes: &[(Encoding, usize)],
    smem_limit: u64,
    subgroups: bool,
) -> Vec<KernelSpec> {
    kernels_where(&encodings_of(shapes), subgroups, |enc, t, silu| {
        let mut xts: Vec<u32> = Vec::new();
        for &(e, cols) in shapes.iter().filter(|(e, _)| *e == enc) {
            let xt = x_tile(e.format, t, cols, smem_limit, silu);
            if !xts.contains(&xt) {
                xts.push(xt);
            }
        }
        xts.sort_unstable();
        xts
    })
}

/// The GEMV variants of `encs` with the staged x tiles `xts(encoding, tuning, silu)` gives.
fn kernels_where(
    encs: &[Encoding],
    subgroups: bool,
    xts: impl Fn(Encoding, Tuning, bool) -> Vec<u32>,
) -> Vec<KernelSpec> {
    let mut v = Vec::new();
    for &enc in encs {
        for sg in [false, true].into_iter().filter(|&sg| !sg || subgroups) {
            // (weight chunks, output segments, silu·up, short conv)
            let variants = [
                (1, false, false, false),
                (2, false, false, false),
                (1, true, false, false),
                (1, false, true, false),
                (2, false, true, false),
                (1, false, false, true),
            ];
            for (chunks, segs, silu, conv) in variants {
                let key = |t, xt, direct| {
                    GemvKey::new(enc, sg, t, xt, direct)
                        .with_chunks(chunks)
                        .with_segments(segs)
                        .with_silu(silu)
                        .with_conv(conv)
                };
                let usable = |t: &&Tuning| !silu || silu_tuning(**t);
                for &t in candidates(enc.format).iter().filter(usable) {
                    for xt in xts(enc, t, silu || conv) {
                        v.push(KernelSpec::of(&key(t, xt, false)));
                    }
                }
                if row(enc.format).direct_x {
                    for &t in direct_candidates().iter().filter(usable) {
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
    use crate::gpu::linear::format::KERNEL_FORMATS;

    /// `x_at` in wgsl/gemv.wgsl computes a unit's padded x index once: that holds when every
    /// unit's vec4s lie inside one pad period (the period a multiple of the unit's vec4s, or the
    /// unit a divisor of it) and every x tile (a multiple of 512 columns) starts on a period.
    #[test]
    fn a_unit_never_straddles_an_x_pad() {
        for r in KERNEL_FORMATS {
            let unit = r.cols_per_unit / 4;
            let period = pad_period(r.format);
            assert!(
                period.is_multiple_of(unit) && (512 / 4u32).is_multiple_of(period),
                "{}: unit of {unit} vec4s, pad period {period}",
                r.format
            );
        }
    }
}
