//! What a caller states about one linear call over a slab ([`GemvArgs`]): buffers, strides,
//! pairs, the reduction, an optional forced tuning, whether the call may run as a GEMM
//! ([`GemmChoice`], [`Tile`]) and output segments; and the checks every kernel runs first
//! ([`GpuWeights::check_args`]).

use crate::formats::Encoding;
use crate::gpu::dispatch::{self, DispatchError};
use crate::gpu::linear::format::Tuning;
use crate::gpu::linear::slab::GpuWeights;
use crate::gpu::Gpu;

/// `weight_idx` meaning "no per-pair weight".
pub const NO_GAMMA: u32 = 0xFFFF_FFFF;

/// Most output segments of one GEMV ([`GemvArgs::segments`]).
pub const MAX_SEGMENTS: usize = 4;

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

/// The output tile of one workgroup: RM rows per thread (BM = 64·RM rows) × NQ quads of pairs
/// (BN = 4·NQ pairs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tile {
    pub rm: u32,
    pub nq: u32,
}

impl Tile {
    /// Rows per workgroup, BM.
    pub fn rows(self) -> u32 {
        64 * self.rm
    }
    /// Pairs per workgroup, BN.
    pub fn pairs(self) -> u32 {
        4 * self.nq
    }
    /// Whether the GEMM kernel can be instantiated with this tile: RM in 1, 2, 4, 8 and NQ in
    /// 2, 4, 8 (its x staging needs an even NQ; workgroup memory bounds NQ: NQ 8 needs 16.4 KiB,
    /// past WebGPU's default 16 KiB, so the device's limit is checked when it is bound).
    pub fn buildable(self) -> bool {
        matches!(self.rm, 1 | 2 | 4 | 8) && matches!(self.nq, 2 | 4 | 8)
    }
}

/// Whether a GEMV call (`GemvArgs::gemm`) may run as a GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmChoice {
    /// Always the GEMV.
    Never,
    /// The GEMM when `gemm::select`'s rules pick it (the default).
    Auto,
    /// The GEMM with this tile whenever it can run (a GEMM format, experts ≤ `gemm::EMAX`, ≥ 1
    /// pair); tests and benchmarks.
    Always(Tile),
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
/// With `silu_mul` ([`GemvArgs::silu_mul`]) the O = 2·I' rows are a SwiGLU's gate rows then its
/// up rows, and pair p's output is `act[i] = silu(gate_i)·up_i`, `y[p·y_stride + y_offset + i]`
/// for i < I' (`y_stride` packed: I').
///
/// Strides of 0 mean "packed": `x_stride = I`, `y_stride = O` (O/2 with `silu_mul`).
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
    /// Force this tuning instead of the per-call choice (tests, benchmarks); wins over
    /// `LinearOptions::tuning`. x is read directly or staged by `route::plan`'s rules for that
    /// tuning.
    pub tuning: Option<Tuning>,
    /// Whether [`GpuWeights::bind`] may run the call as a GEMM (`gemm::select`; default
    /// [`GemmChoice::Auto`]).
    pub gemm: GemmChoice,
    /// Output segments `(rows_i, buffer_i)` ([`GemvArgs::segments`]); empty: the whole row to `y`.
    pub segments: &'a [(u32, &'a wgpu::Buffer)],
    /// Write `silu(gate)·up` of the two row halves instead of the rows ([`GemvArgs::silu_mul`]).
    pub silu_mul: bool,
    /// The short-conv epilogue ([`GemvArgs::conv`]).
    pub conv: Option<ConvEpilogue<'a>>,
}

/// The short-conv epilogue of a dense GEMV ([`GemvArgs::conv`]): row r of token t is channel r of
/// the causal depthwise short conv of `wgsl/conv.wgsl` (Inkling's ShortConvolution with the
/// residual inside), `y[t, r] += x_r + Σ_{k<K} w[r, k] · window_k`, the window being the slot's
/// K−1 previous inputs of channel r then `x_r` (this row's sum); the slot's state moves on by one.
#[derive(Clone, Copy, Debug)]
pub struct ConvEpilogue<'a> {
    /// Conv weights `[O, K]` f32.
    pub w: &'a wgpu::Buffer,
    /// Conv states `[slots, K−1, O]` f32 (oldest input first).
    pub state: &'a wgpu::Buffer,
    /// `[pos, slot, 0, 0]` u32 entries: one per token when `per_token` (a decode batch, slots
    /// distinct), else one for every token (the chunk's); bound as storage.
    pub slots: &'a wgpu::Buffer,
    pub per_token: bool,
    /// Kernel size K, 2 to [`MAX_CONV_KERNEL`].
    pub kernel: u32,
}

/// Largest short-conv kernel of the epilogue (`MAX_K` of `wgsl/gemv.wgsl` and `wgsl/conv.wgsl`).
pub const MAX_CONV_KERNEL: u32 = 8;

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
            silu_mul: false,
            conv: None,
        }
    }
    /// Run the short conv of `c` on every output row as a channel and add it to `y` instead of
    /// writing the rows ([`ConvEpilogue`]): a dense GEMV (one expert, pairs `(0, t)` with p = t)
    /// of one token per slot (one token, or a decode batch with `per_token`), always the GEMV,
    /// one weight chunk, no segments, no gamma, no silu·up ([`GpuWeights::conv_fits`]).
    pub fn conv(mut self, c: ConvEpilogue<'a>) -> Self {
        self.conv = Some(c);
        self
    }
    /// The rows are gate rows `[0, O/2)` then up rows `[O/2, O)` of a SwiGLU; write
    /// `silu(gate_i)·up_i` (the `silu_mul` of `wgsl/elementwise.wgsl`, same f32 expression) as
    /// pair p's O/2 outputs instead of its O rows. Always the GEMV, whose epilogue pairs the two
    /// halves in one workgroup; [`GpuWeights::silu_mul_fits`] says when a call can take it (no
    /// segments, no gamma, every weight chunk holding whole experts, O even).
    pub fn silu_mul(mut self, on: bool) -> Self {
        self.silu_mul = on;
        self
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
        let (o, i) = (self.rows() as u64, self.cols() as u64);
        let (x_stride, y_stride) = strides(self, args);
        if args.tokens == 0 {
            return Err(DispatchError::Shape("tokens must be ≥ 1".into()));
        }
        let row = i;
        let need_x = 4 * ((args.tokens as u64 - 1) * x_stride + args.x_offset as u64 + row);
        if args.x.size() < need_x {
            return Err(DispatchError::Shape(format!(
                "x buffer has {} bytes, needs {need_x}",
                args.x.size()
            )));
        }
        if args.silu_mul {
            self.check_silu_mul(args)?;
        }
        if let Some(c) = &args.conv {
            self.check_conv(args, c)?;
        }
        let o_written = if args.silu_mul { o / 2 } else { o };
        if !args.segments.is_empty() {
            check_segments(args, o)?;
        } else if args.n_pairs > 0 {
            let need_y =
                4 * ((args.n_pairs as u64 - 1) * y_stride + args.y_offset as u64 + o_written);
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
        Ok((enc, subgroups))
    }
}

impl GpuWeights {
    /// Whether a call over these weights can take [`GemvArgs::silu_mul`]: O even and every
    /// weight chunk holding all rows of its experts (the epilogue pairs gate row i with up row
    /// O/2 + i inside one workgroup).
    pub fn silu_mul_shape_fits(&self) -> bool {
        let o = self.rows() as u32;
        o.is_multiple_of(2) && self.chunks().iter().all(|c| c.r0 == 0 && c.r1 == o)
    }

    /// [`DispatchError::Shape`] unless `args` can take `silu_mul` here (see
    /// [`GpuWeights::silu_mul_shape_fits`]; no segments and no gamma).
    pub(crate) fn check_silu_mul(&self, args: &GemvArgs) -> Result<(), DispatchError> {
        let bad = |m: &str| Err(DispatchError::Shape(format!("silu_mul epilogue: {m}")));
        if !args.segments.is_empty() {
            return bad("no output segments");
        }
        if args.gamma.is_some() {
            return bad("no per-pair gamma (silu(γ·g)·γ·u is not γ·silu(g)·u)");
        }
        if !self.silu_mul_shape_fits() {
            return bad(&format!(
                "needs an even row count ({}) and weight chunks of whole experts",
                self.rows()
            ));
        }
        Ok(())
    }
}

impl GpuWeights {
    /// [`DispatchError::Shape`] unless `args` can take the epilogue `c` here (see
    /// [`GemvArgs::conv`]) with buffers large enough for it.
    pub(crate) fn check_conv(
        &self,
        args: &GemvArgs,
        c: &ConvEpilogue,
    ) -> Result<(), DispatchError> {
        let bad = |m: String| Err(DispatchError::Shape(format!("short-conv epilogue: {m}")));
        let o = self.rows() as u64;
        if !args.segments.is_empty() || args.silu_mul || args.gamma.is_some() {
            return bad("no output segments, silu·up or gamma with it".into());
        }
        if self.experts() != 1 || self.chunks().len() != 1 || args.x_per_pair {
            return bad(format!(
                "a dense GEMV of one weight chunk ({} experts in {} chunks)",
                self.experts(),
                self.chunks().len()
            ));
        }
        if args.n_pairs != args.tokens || (args.tokens > 1 && !c.per_token) {
            return bad(format!(
                "one token per slot: {} pairs of {} tokens, per-token slots {}",
                args.n_pairs, args.tokens, c.per_token
            ));
        }
        if !(2..=MAX_CONV_KERNEL).contains(&c.kernel) {
            return bad(format!("kernel size {} (2 to {MAX_CONV_KERNEL})", c.kernel));
        }
        let k = c.kernel as u64;
        let slots = if c.per_token { args.tokens as u64 } else { 1 };
        for (name, buf, need) in [
            ("weights", c.w, 4 * o * k),
            ("state", c.state, 4 * o * (k - 1)),
            ("slots", c.slots, 16 * slots),
        ] {
            if buf.size() < need {
                return bad(format!(
                    "{name} buffer has {} bytes, needs {need}",
                    buf.size()
                ));
            }
        }
        Ok(())
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
pub(crate) fn strides(w: &GpuWeights, args: &GemvArgs) -> (u64, u64) {
    let x = if args.x_stride == 0 {
        w.cols() as u64
    } else {
        args.x_stride as u64
    };
    let y = if args.y_stride != 0 {
        args.y_stride as u64
    } else if args.silu_mul {
        w.rows() as u64 / 2
    } else {
        w.rows() as u64
    };
    (x, y)
}
