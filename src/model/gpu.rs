//! The GPU forward: the whole Inkling text model on wgpu, one command encoder and one submission
//! per call (per chunk of at most `max_chunk` tokens).
//!
//! [`GpuModel::new`] uploads every weight once (linears through [`GpuWeights`], everything else as
//! f32 buffers), allocates the activations for a chunk of up to `max_chunk` tokens, the KV caches
//! (`max_seq` slots on full layers, a ring of W on sliding layers) and the short-conv states. The
//! recorded step for a given token count T (bind groups, uniforms, GEMV calls) is built on first use
//! and cached by `(T, head mode)`, so decode (T = 1) allocates nothing per token: a step writes the
//! ids and the position with `queue.write_buffer`, records one compute pass plus one copy of the
//! logits into a persistent readback buffer, and submits once.
//!
//! Per layer the pass holds: input norm; q/k/v/r GEMVs; k/v short convs; per-head q/k norms;
//! attention (τ, relative bias, sliding mask, KV append); o_proj; attn_sconv accumulated into the
//! residual; post-attention norm; then either the dense MLP (one GEMV over gate‖up, silu·up, down,
//! × global_scale) or the MoE (router GEMV → router kernel → pairs/gammas on the GPU; shared experts
//! first as their own slab, then the routed experts: one MoE GEMV over the (expert, token) pairs for
//! gate‖up, silu·up, one for down; combine with the gammas); mlp_sconv accumulated into the
//! residual. Then the final norm, ÷ `logits_mup_width_multiplier`, and the head over the first
//! `logits_width()` rows of `lm_head`. Routing never goes through the CPU.
use super::config::{AttnGeom, TextConfig};
use super::expert_cache::{Assign, ExpertCache};
use super::profile::{DecodeProfile, Phase};
use super::status;
use super::stream::{Placement, StreamStats};
use super::usage::Usage;
use super::weights::{Ffn, Mlp, Weights};
use crate::formats::{Format, QMatrix};
use crate::gpu::gemv::{gpu_row_stride, run_staged, GemvArgs, GpuWeights, StagedCopy, NO_GAMMA};
use crate::gpu::ops::{
    attention_consts, norm::EmbedShard, Argmax, AttentionShape, DivConst, EmbedNorm,
    FusedAttention, FusedAttentionIo, MoeCombine, MulConst, PosBuffer, RmsNorm, RouterShape,
    SconvInput, SconvRmsNorm, ShortConvKernel, SiluMul, SiluMulLayout,
};
use crate::gpu::Gpu;
use crate::gpu::{timing, Call, Label};
use crate::human_bytes;
use anyhow::{bail, ensure, Context, Result};
use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;

/// Default largest chunk of tokens one submission processes.
pub const DEFAULT_MAX_CHUNK: usize = 64;

/// What the head computes in a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Head {
    /// No head (an inner chunk of a long prefill).
    None,
    /// Logits of the last token only (plus its greedy argmax).
    Last,
    /// Logits of every token of the chunk.
    All,
}

/// Key of a recorded step: token count, head mode, and whether the embedding reads its id from
/// the previous step's argmax on the device (the pipelined greedy decode) instead of `ids`.
type StepKey = (u32, Head, bool);

/// Readback buffers of the pipelined greedy decode (a ring: step k copies its id into slot k % 2).
const RING: usize = 2;
/// Bytes of the status words (model::status) read back with every result.
const STATUS_BYTES: u64 = 4 * status::WORDS as u64;

/// One node of a recorded step: a kernel call, or the streaming cut.
enum Rec {
    Call(Call),
    /// Streaming mode: the routed experts of this layer go here (placed by the host between
    /// submissions; see [`super::stream`]). Never recorded into a pass.
    Routed(usize),
}

impl Rec {
    fn record_in_pass(&self, pass: &mut wgpu::ComputePass<'_>) {
        match self {
            Rec::Call(c) => c.record_in_pass(pass),
            Rec::Routed(_) => {}
        }
    }

    /// The kernel's name without its layer (`"q_proj"`, `"rms_norm"`): the per-op profile's key.
    fn op_name(&self) -> &'static str {
        match self {
            Rec::Call(c) => c.label.op,
            Rec::Routed(_) => "routed (streamed)",
        }
    }
}

/// The recorded step for one token count and head mode.
struct Step {
    recs: Vec<Rec>,
    /// Consecutive runs of `recs` by phase (profile mode records each as its own timed pass).
    segs: Vec<(Phase, Range<usize>)>,
}

/// Phase boundaries while a step is built: `(phase, index of its first rec)`.
#[derive(Default)]
struct Marks(Vec<(Phase, usize)>);

impl Marks {
    fn at(&mut self, recs: &[Rec], p: Phase) {
        self.0.push((p, recs.len()));
    }

    /// Non-empty runs, adjacent runs of one phase merged.
    fn segments(self, n: usize) -> Vec<(Phase, Range<usize>)> {
        let mut out: Vec<(Phase, Range<usize>)> = Vec::new();
        for (i, &(p, start)) in self.0.iter().enumerate() {
            let end = self.0.get(i + 1).map_or(n, |m| m.1);
            if end <= start {
                continue;
            }
            match out.last_mut() {
                Some((q, r)) if *q == p && r.end == start => r.end = end,
                _ => out.push((p, start..end)),
            }
        }
        out
    }
}

/// Timestamp queries of profile mode: one query set for one step, resolved into slots of a GPU
/// buffer that is read back when full and at the end.
struct Timestamps {
    qs: wgpu::QuerySet,
    /// Queries the set holds (2 per segment).
    queries: u32,
    resolve: wgpu::Buffer,
    /// Bytes per slot (a multiple of the resolve alignment).
    stride: u64,
    slots: u64,
    /// The step key of each filled slot.
    pending: Vec<StepKey>,
    ticks: [u64; 7],
    span_ticks: u64,
}

/// Profile-mode state (see [`super::profile`]).
struct Profiler {
    steps: usize,
    bytes_sum: f64,
    ts: Option<Timestamps>,
}

/// Per-op profile state (see [`GpuModel::start_op_profile`]): one query set with two timestamps
/// per recorded kernel, resolved and read back after every profiled step.
struct OpProfiler {
    /// Query sets of [`OP_SET_KERNELS`] kernels (two timestamps each), as many as a step needs.
    sets: Vec<wgpu::QuerySet>,
    /// Resolved timestamps: 16 bytes per kernel, set k from byte k · 16 · OP_SET_KERNELS.
    resolve: Option<wgpu::Buffer>,
    times: super::profile::OpTimes,
}

/// Kernels per query set of the per-op profile (two queries each: the set limit is 4096).
const OP_SET_KERNELS: usize = (wgpu::QUERY_SET_MAX_QUERIES / 2) as usize;

/// GPU timestamps at the beginning and end of each normal (single-pass) one-token step: how long
/// the GPU spends on a step and how long it sits idle between steps (see
/// [`GpuModel::start_step_spans`]).
struct StepSpans {
    qs: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    cap: u32,
    n: u32,
}

/// Dense matrices of one linear, uploaded.
struct Lin {
    w: GpuWeights,
    ordinal: u32,
}

impl Lin {
    fn upload(gpu: &Gpu, mats: &[QMatrix<'_>], limit: u64, what: &str) -> Result<Lin> {
        let w = GpuWeights::upload_with_limit(gpu, mats, limit)
            .with_context(|| format!("uploading {what}"))?;
        let ordinal = w.encoding().format.ordinal();
        Ok(Lin { w, ordinal })
    }

    fn call(&self, gpu: &Gpu, args: GemvArgs<'_>, label: Label) -> Result<Rec> {
        let mut call = self
            .w
            .bind(gpu, self.ordinal, args)
            .with_context(|| format!("binding the {label} GEMV"))?;
        call.label = label;
        Ok(Rec::Call(call))
    }
}

/// `gate` rows then `up` rows of one SwiGLU as one `[2I, H]` matrix (any encoding: rows are
/// independent, so row bytes and per-row scales simply concatenate).
fn gate_up(f: &Ffn<'_>) -> QMatrix<'static> {
    let mut data = Vec::with_capacity(f.gate.data.len() + f.up.data.len());
    data.extend_from_slice(&f.gate.data);
    data.extend_from_slice(&f.up.data);
    let mut scales = Vec::with_capacity(f.gate.scales.len() + f.up.scales.len());
    scales.extend_from_slice(&f.gate.scales);
    scales.extend_from_slice(&f.up.scales);
    QMatrix {
        enc: f.gate.enc,
        rows: f.gate.rows + f.up.rows,
        cols: f.gate.cols,
        data: Cow::Owned(data),
        scales: Cow::Owned(scales),
    }
}

struct Experts {
    /// `[2I, H]` per expert (gate rows, then up rows).
    gate_up: Lin,
    /// `[H, I]` per expert.
    down: Lin,
    n: usize,
}

/// The inputs of one expert-FFN recording: x rows `[tokens, H]` and `n_pairs` (expert, token)
/// pairs in a 16-byte `Pair` buffer.
struct FfnIo<'b> {
    x: &'b wgpu::Buffer,
    tokens: u32,
    pairs: &'b wgpu::Buffer,
    n_pairs: u32,
}

impl Experts {
    /// Records `y[p] = down_e(silu(gate_e x_t) · up_e x_t)` for every pair p = (e, t): the gate_up
    /// GEMV into `gu` `[P, 2I]`, silu·up into `act` `[P, I]`, then the down GEMV in which pair p
    /// reads activation row p (`x_per_pair`). Shared and routed experts both go through here.
    #[allow(clippy::too_many_arguments)]
    fn record_ffn(
        &self,
        gpu: &Gpu,
        recs: &mut Vec<Rec>,
        io: FfnIo<'_>,
        inter: u32,
        (gu, act): (&wgpu::Buffer, &wgpu::Buffer),
        y: &wgpu::Buffer,
        (gate_up, down): (Label, Label),
    ) -> Result<()> {
        let np = io.n_pairs;
        recs.push(self.gate_up.call(
            gpu,
            GemvArgs::new(io.x, io.tokens, io.pairs, np, gu),
            gate_up,
        )?);
        recs.push(Rec::Call(
            SiluMul {
                rows: np,
                i: inter,
                layout: SiluMulLayout::fused(inter),
            }
            .bind(gpu, gu, gu, act)?,
        ));
        recs.push(self.down.call(
            gpu,
            GemvArgs::new(act, np, io.pairs, np, y).x_per_pair(true),
            down,
        )?);
        Ok(())
    }

    fn upload(gpu: &Gpu, ffns: &[Ffn<'_>], limit: u64, what: &str) -> Result<Option<Experts>> {
        if ffns.is_empty() {
            return Ok(None);
        }
        let gu: Vec<QMatrix<'static>> = ffns.iter().map(gate_up).collect();
        let gate_up = Lin::upload(gpu, &gu, limit, &format!("{what} gate_up"))?;
        drop(gu);
        let dn: Vec<QMatrix<'_>> = ffns.iter().map(|f| f.down.clone()).collect();
        let down = Lin::upload(gpu, &dn, limit, &format!("{what} down"))?;
        Ok(Some(Experts {
            gate_up,
            down,
            n: ffns.len(),
        }))
    }
}

// One per layer, so the size difference between the variants does not matter.
#[allow(clippy::large_enum_variant)]
enum MlpGpu {
    Dense {
        ffn: Experts,
        inter: u32,
        global_scale: f32,
    },
    Moe {
        router: Lin,
        bias: wgpu::Buffer,
        /// `route_scale × gate.global_scale`.
        scale: f32,
        top_k: u32,
        /// `None` when the routed experts stream through the expert slots.
        routed: Option<Experts>,
        /// Weight + scale bytes of one routed expert (gate, up and down).
        expert_bytes: u64,
        shared: Option<Experts>,
        inter: u32,
    },
}

struct LayerGpu {
    geom: AttnGeom,
    input_norm: wgpu::Buffer,
    post_norm: wgpu::Buffer,
    q: Lin,
    k: Lin,
    v: Lin,
    r: Lin,
    o: Lin,
    q_norm: wgpu::Buffer,
    k_norm: wgpu::Buffer,
    rel_proj: wgpu::Buffer,
    /// k_sconv, v_sconv, attn_sconv, mlp_sconv weights `[C, K]`.
    conv_w: [wgpu::Buffer; 4],
    /// Their states `[K−1, C]`.
    conv_state: [wgpu::Buffer; 4],
    /// `[cache_capacity + K, KVH·D]`: the KV cache, then the k/v conv ring of
    /// [`FusedAttention`] (byte range `conv_ring`).
    k_cache: wgpu::Buffer,
    v_cache: wgpu::Buffer,
    cache_capacity: u32,
    conv_ring: Range<u64>,
    /// rel_proj, q_norm, k_norm and the k/v conv weights as one buffer ([`attention_consts`]).
    attn_consts: wgpu::Buffer,
    mlp: MlpGpu,
}

/// Activation buffers for a chunk of up to `max_chunk` tokens (sized for the widest layer).
struct Acts {
    ids: wgpu::Buffer,
    h: wgpu::Buffer,
    xn: wgpu::Buffer,
    q: wgpu::Buffer,
    k_raw: wgpu::Buffer,
    v_raw: wgpu::Buffer,
    k_new: wgpu::Buffer,
    v_new: wgpu::Buffer,
    r: wgpu::Buffer,
    attn: wgpu::Buffer,
    o: wgpu::Buffer,
    /// gate‖up outputs `[rows, 2I]` (dense, shared or routed; reused in turn).
    gu: wgpu::Buffer,
    /// silu(gate)·up `[rows, I]`.
    act: wgpu::Buffer,
    /// Routed down outputs `[T·top_k, H]`.
    y_routed: wgpu::Buffer,
    /// Shared down outputs `[T·S, H]`.
    y_shared: wgpu::Buffer,
    /// MLP output `[T, H]` (input of mlp_sconv).
    m: wgpu::Buffer,
    router_logits: wgpu::Buffer,
    pairs: wgpu::Buffer,
    gammas: wgpu::Buffer,
    shared_gammas: wgpu::Buffer,
    /// Dense pairs `(0, t, NO_GAMMA)`, t < max_chunk (16-byte pairs).
    dense_pairs: wgpu::Buffer,
    /// Shared-expert pairs `(s, t, NO_GAMMA)` at `p = t·S + s` (16-byte pairs).
    shared_pairs: wgpu::Buffer,
    hn: wgpu::Buffer,
    logits: wgpu::Buffer,
    argmax: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// The pipelined greedy decode's ring of 8-byte readback buffers for the argmax id.
    ring: [wgpu::Buffer; RING],
    /// `[p, 0, 0, 0]` for every position p < max_seq: a chained step copies its position from here
    /// into the position uniform on the device (no host write per step).
    positions: wgpu::Buffer,
}

/// Settings of a [`GpuModel`].
#[derive(Clone, Copy, Debug)]
pub struct GpuModelOptions {
    /// Longest sequence (prompt + generated tokens): the full layers' KV capacity.
    pub max_seq: usize,
    /// Most tokens one submission processes (longer calls are split).
    pub max_chunk: usize,
    /// Largest weight buffer in bytes (default: the adapter's binding limit, at most 2³¹ − 1).
    /// Smaller values split the embedding table into more shards and weight slabs into more
    /// chunks (tests use it to exercise those paths on tiny models).
    pub binding_limit: Option<u64>,
}

/// Host seconds spent per phase of the one-token steps (see [`GpuModel::host_times`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostTimes {
    /// One-token steps counted.
    pub steps: u64,
    /// Writing ids/position and recording the compute pass(es).
    pub record_s: f64,
    /// `CommandEncoder::finish` (wgpu encodes the recorded pass into a backend command buffer).
    pub finish_s: f64,
    /// `Queue::submit`.
    pub submit_s: f64,
    /// Waiting for the greedy id of a pipelined step (map + poll).
    pub wait_s: f64,
}

impl HostTimes {
    /// Milliseconds per step: (record, finish, submit, wait).
    pub fn per_step_ms(&self) -> [f64; 4] {
        let n = self.steps.max(1) as f64;
        [self.record_s, self.finish_s, self.submit_s, self.wait_s].map(|x| 1e3 * x / n)
    }
}

/// GPU side of expert streaming: the slot pool and the buffers of one routed part.
struct StreamGpu<'w> {
    /// The slot pool: `slots` experts of gate‖up `[2I, H]` and down `[H, I]`.
    pool: Experts,
    inter: u32,
    /// Compacted pairs of one part, `(slot, token, weight_idx, 0)`.
    part_pairs: wgpu::Buffer,
    /// Down outputs of one part `[P, H]`, copied to the pairs' rows of `y_routed`.
    y_part: wgpu::Buffer,
    /// Recorded part FFNs by `(tokens, pairs)`.
    part_calls: HashMap<(u32, u32), Vec<Rec>>,
    /// `MAP_READ` copy of the router's pairs of one layer (read back once per streamed layer).
    pairs_rb: wgpu::Buffer,
    /// Threads copying misses ([`upload_threads`]).
    threads: usize,
    host: super::stream::StreamState<'w>,
}

/// The GPU model: weights, activations, caches and the recorded steps, plus one sequence's state.
///
/// `'w` is the lifetime of the mapped weights a streaming model reads its routed experts from
/// ([`GpuModel::with_placement`]); a fully resident model borrows nothing (`GpuModel<'static>`).
pub struct GpuModel<'w> {
    gpu: Gpu,
    cfg: TextConfig,
    max_seq: usize,
    max_chunk: usize,
    pos: usize,
    /// Conv states may hold a previous sequence's inputs.
    dirty: bool,
    embed_shards: Vec<(wgpu::Buffer, u32, u32, bool)>,
    embed_norm: wgpu::Buffer,
    norm: wgpu::Buffer,
    lm_head: Lin,
    layers: Vec<LayerGpu>,
    acts: Acts,
    pos_buf: PosBuffer,
    steps: HashMap<StepKey, Step>,
    /// Set by a ring buffer's `map_async` callback: 1 = mapped, 2 = failed.
    map_flag: std::sync::Arc<std::sync::atomic::AtomicU8>,
    /// Bytes a one-token step reads apart from the KV caches (see [`GpuModel::decode_bytes`]).
    static_decode_bytes: u64,
    prof: Option<Profiler>,
    stream: Option<StreamGpu<'w>>,
    host: HostTimes,
    /// Record a step as one compute pass per phase run (as profile mode does) instead of one.
    pass_per_phase: bool,
    fuse_residual: bool,
    fuse_attention: bool,
    op_prof: Option<OpProfiler>,
    spans: Option<StepSpans>,
}

/// The attention shape of a layer of geometry `g` for chunks of `t` tokens.
fn attn_shape(g: AttnGeom, t: u32, cache_capacity: u32) -> AttentionShape {
    AttentionShape {
        tokens: t,
        heads: g.heads as u32,
        kv_heads: g.kv_heads as u32,
        head_dim: g.head_dim as u32,
        d_rel: g.d_rel as u32,
        extent: g.rel_extent as u32,
        window: g.window.map(|w| w as u32),
        cache_capacity,
        tau: g
            .log_scaling
            .map(|(n_floor, alpha)| (alpha as f32, n_floor as f32)),
    }
}

fn f32_buf(gpu: &Gpu, label: &str, v: &[f32]) -> wgpu::Buffer {
    gpu.storage_init(label, bytemuck::cast_slice(v))
}

/// A storage buffer of `floats` f32 (wgpu zero-initialises new buffers).
fn zeroed(gpu: &Gpu, label: &str, floats: usize) -> wgpu::Buffer {
    gpu.storage(label, 4 * floats.max(1) as u64)
}

/// Bytes a one-token step reads apart from the KV caches: one embedding row, every norm, conv
/// weight and conv state, rel_proj, every dense linear (q/k/v/r/o, router and its bias, dense MLPs),
/// `top_k` routed experts and every shared expert per sparse layer, and the head's `lm_head` rows.
fn static_decode_bytes(
    embed_row: u64,
    embed_norm: &wgpu::Buffer,
    norm: &wgpu::Buffer,
    lm_head: &Lin,
    layers: &[LayerGpu],
) -> u64 {
    let lin = |l: &Lin| l.w.expert_bytes() * l.w.experts() as u64;
    let ffn = |e: &Experts| e.gate_up.w.expert_bytes() + e.down.w.expert_bytes();
    let mut b = embed_row + embed_norm.size() + norm.size() + lin(lm_head);
    for l in layers {
        b += l.input_norm.size() + l.post_norm.size();
        b += [&l.q, &l.k, &l.v, &l.r, &l.o]
            .into_iter()
            .map(lin)
            .sum::<u64>();
        b += l.q_norm.size() + l.k_norm.size() + l.rel_proj.size();
        b += l.conv_w.iter().map(|x| x.size()).sum::<u64>();
        b += l.conv_state.iter().map(|x| x.size()).sum::<u64>();
        b += match &l.mlp {
            MlpGpu::Dense { ffn: f, .. } => ffn(f),
            MlpGpu::Moe {
                router,
                bias,
                top_k,
                expert_bytes,
                shared,
                ..
            } => {
                lin(router)
                    + bias.size()
                    + *top_k as u64 * expert_bytes
                    + shared.as_ref().map_or(0, |s| s.n as u64 * ffn(s))
            }
        };
    }
    b
}

/// Read back the filled slots of `ts` and add them to its sums.
fn flush_timestamps(gpu: &Gpu, ts: &mut Timestamps, steps: &HashMap<StepKey, Step>) -> Result<()> {
    if ts.pending.is_empty() {
        return Ok(());
    }
    let raw = gpu.read_bytes(&ts.resolve, 0, ts.pending.len() as u64 * ts.stride)?;
    let ticks = timing::ticks(&raw);
    for (slot, key) in ts.pending.iter().enumerate() {
        let segs = &steps[key].segs;
        let base = slot * ts.stride as usize / 8;
        let t = |q: usize| ticks[base + q];
        for (i, (ph, _)) in segs.iter().enumerate() {
            ts.ticks[ph.index()] += t(2 * i + 1).saturating_sub(t(2 * i));
        }
        if !segs.is_empty() {
            ts.span_ticks += t(2 * segs.len() - 1).saturating_sub(t(0));
        }
    }
    ts.pending.clear();
    Ok(())
}

/// What a step copies into the readback buffer.
#[derive(Clone, Copy, Debug)]
enum Readback {
    None,
    /// The first `n` bytes of the logits buffer.
    Logits(u64),
    /// The greedy id (4 bytes).
    Argmax,
    /// The greedy id into ring slot `n` of the pipelined decode.
    Ring(usize),
}

impl GpuModel<'static> {
    /// Upload `w` and build a model for sequences of up to `max_seq` tokens, processing chunks of
    /// up to [`DEFAULT_MAX_CHUNK`] tokens per submission.
    pub fn new(gpu: &Gpu, w: &Weights<'_>, max_seq: usize) -> Result<GpuModel<'static>> {
        Self::with_chunk(gpu, w, max_seq, DEFAULT_MAX_CHUNK)
    }

    /// [`GpuModel::new`] with an explicit chunk size (tokens per submission).
    pub fn with_chunk(
        gpu: &Gpu,
        w: &Weights<'_>,
        max_seq: usize,
        max_chunk: usize,
    ) -> Result<GpuModel<'static>> {
        Self::with_options(
            gpu,
            w,
            GpuModelOptions {
                max_seq,
                max_chunk,
                binding_limit: None,
            },
        )
    }

    /// The general constructor of a fully resident model (see [`GpuModelOptions`]).
    pub fn with_options(
        gpu: &Gpu,
        w: &Weights<'_>,
        opts: GpuModelOptions,
    ) -> Result<GpuModel<'static>> {
        Self::build(gpu, w, opts, None)
    }

    /// Build everything; `slots = Some(n)` leaves the routed experts off the GPU and allocates a
    /// pool of `n` expert slots instead (the caller attaches the host state).
    fn build(
        gpu: &Gpu,
        w: &Weights<'_>,
        opts: GpuModelOptions,
        slots: Option<usize>,
    ) -> Result<GpuModel<'static>> {
        let GpuModelOptions {
            max_seq,
            max_chunk,
            binding_limit,
        } = opts;
        let cfg = w.config.clone();
        crate::gpu::variants::check_device(gpu)?;
        ensure!(max_seq >= 1, "max_seq must be at least 1");
        ensure!(
            u32::try_from(max_seq).is_ok(),
            "a sequence of {max_seq} tokens (prompt + --max-tokens) is more than the GPU model's \
             positions can index (at most {}); use a smaller --max-tokens",
            u32::MAX
        );
        ensure!(max_chunk >= 1, "max_chunk must be at least 1");
        let max_chunk = max_chunk.min(max_seq);
        let hid = cfg.hidden_size;
        let kk = cfg.conv_kernel_size;
        ensure!(
            (1..=8).contains(&kk),
            "conv_kernel_size {kk} not supported by the GPU short conv (1..=8)"
        );

        // Embedding table: raw f32/bf16 bytes in binding-sized shards; other encodings are
        // dequantised to f32.
        let limit = crate::gpu::gemv::default_limit(gpu).min(binding_limit.unwrap_or(u64::MAX));
        let vocab = cfg.vocab_size;
        let (bf16, raw): (bool, Option<&[u8]>) = match w.embed.enc.format {
            Format::F32 => (false, Some(&w.embed.data)),
            Format::Bf16 => (true, Some(&w.embed.data)),
            _ => (false, None),
        };
        let row_bytes = if bf16 { 2 * hid } else { 4 * hid };
        let rows_per_shard = ((limit as usize / row_bytes).max(1)).min(vocab);
        let mut embed_shards = Vec::new();
        for r0 in (0..vocab).step_by(rows_per_shard) {
            let r1 = (r0 + rows_per_shard).min(vocab);
            let buf = match raw {
                Some(bytes) => {
                    gpu.storage_init("embed shard", &bytes[r0 * row_bytes..r1 * row_bytes])
                }
                None => {
                    let mut v = vec![0f32; (r1 - r0) * hid];
                    for (i, row) in v.chunks_exact_mut(hid).enumerate() {
                        w.embed.dequantize_row(r0 + i, row);
                    }
                    f32_buf(gpu, "embed shard", &v)
                }
            };
            embed_shards.push((buf, r0 as u32, (r1 - r0) as u32, bf16));
        }
        let embed_norm = f32_buf(gpu, "embed_norm", &w.embed_norm);
        let norm = f32_buf(gpu, "norm", &w.norm);
        let width = cfg.logits_width();
        let lm_head = Lin::upload(gpu, &[w.lm_head.rows_view(0, width)], limit, "lm_head")?;

        // Widest activation of any layer.
        let mut max_qd = 1;
        let mut max_kvd = 1;
        let mut max_r = 1;
        let mut max_gu_rows_x2i = 1; // per token: max(2·inter, top_k·2·moe_I, S·2·moe_I)
        let mut max_topk = 1;
        let mut layers = Vec::with_capacity(w.layers.len());
        for (i, lw) in w.layers.iter().enumerate() {
            let g = lw.attn.geom;
            max_qd = max_qd.max(g.q_dim());
            max_kvd = max_kvd.max(g.kv_dim());
            max_r = max_r.max(g.heads * g.d_rel);
            let aw = &lw.attn;
            let lin = |m: &QMatrix<'_>, what: &str| {
                Lin::upload(
                    gpu,
                    std::slice::from_ref(m),
                    limit,
                    &format!("layer {i} {what}"),
                )
            };
            let cache_capacity = match g.window {
                Some(win) => win,
                None => max_seq,
            } as u32;
            // the cache rows, then the K rows of the fused attention's conv ring
            let kv_floats = (cache_capacity as usize + kk) * g.kv_dim();
            ensure!(
                (4 * kv_floats as u64) <= gpu.max_binding(),
                "layer {i}: a KV cache of {cache_capacity} tokens (+ {kk} rows of conv history) × {} floats needs {} bytes, more \
                 than this adapter's largest storage binding ({} bytes); use a shorter max_seq (prompt + --max-tokens)",
                g.kv_dim(),
                4 * kv_floats as u64,
                gpu.max_binding()
            );
            let conv_w = [
                f32_buf(gpu, "k_sconv", &aw.k_sconv.w),
                f32_buf(gpu, "v_sconv", &aw.v_sconv.w),
                f32_buf(gpu, "attn_sconv", &lw.attn_sconv.w),
                f32_buf(gpu, "mlp_sconv", &lw.mlp_sconv.w),
            ];
            let conv_state = [
                zeroed(gpu, "k_sconv state", (kk - 1) * g.kv_dim()),
                zeroed(gpu, "v_sconv state", (kk - 1) * g.kv_dim()),
                zeroed(gpu, "attn_sconv state", (kk - 1) * hid),
                zeroed(gpu, "mlp_sconv state", (kk - 1) * hid),
            ];
            let eps = cfg.rms_norm_eps as f32;
            let fused = FusedAttention::new(attn_shape(g, 1, cache_capacity), kk as u32, eps);
            let conv_ring = fused.ring_range();
            let attn_consts = attention_consts(
                &fused.shape,
                kk as u32,
                [
                    &aw.rel_proj,
                    &aw.q_norm,
                    &aw.k_norm,
                    &aw.k_sconv.w,
                    &aw.v_sconv.w,
                ],
            );
            let mlp = match &lw.mlp {
                Mlp::Dense(d) => {
                    let inter = d.ffn.gate.rows;
                    max_gu_rows_x2i = max_gu_rows_x2i.max(2 * inter);
                    MlpGpu::Dense {
                        ffn: Experts::upload(
                            gpu,
                            std::slice::from_ref(&d.ffn),
                            limit,
                            &format!("layer {i} dense mlp"),
                        )?
                        .expect("one ffn"),
                        inter: inter as u32,
                        global_scale: d.global_scale,
                    }
                }
                Mlp::Moe(m) => {
                    let inter = m.experts[0].gate.rows;
                    let s = m.shared.len();
                    max_topk = max_topk.max(m.top_k);
                    let f0 = &m.experts[0];
                    let expert_bytes = [&f0.gate, &f0.up, &f0.down]
                        .iter()
                        .map(|q| (q.data.len() + q.scales.len()) as u64)
                        .sum();
                    max_gu_rows_x2i = max_gu_rows_x2i.max(m.top_k.max(s) * 2 * inter);
                    MlpGpu::Moe {
                        router: lin(&m.router, "router")?,
                        bias: f32_buf(gpu, "router bias", &m.router_bias),
                        scale: m.route_scale * m.router_scale,
                        top_k: m.top_k as u32,
                        routed: match slots {
                            Some(_) => None,
                            None => Some(
                                Experts::upload(
                                    gpu,
                                    &m.experts,
                                    limit,
                                    &format!("layer {i} routed experts"),
                                )?
                                .context("a sparse layer without routed experts")?,
                            ),
                        },
                        expert_bytes,
                        shared: Experts::upload(
                            gpu,
                            &m.shared,
                            limit,
                            &format!("layer {i} shared experts"),
                        )?,
                        inter: inter as u32,
                    }
                }
            };
            layers.push(LayerGpu {
                geom: g,
                input_norm: f32_buf(gpu, "input_norm", &lw.input_norm),
                post_norm: f32_buf(gpu, "post_attn_norm", &lw.post_attn_norm),
                q: lin(&aw.q, "q_proj")?,
                k: lin(&aw.k, "k_proj")?,
                v: lin(&aw.v, "v_proj")?,
                r: lin(&aw.r, "r_proj")?,
                o: lin(&aw.o, "o_proj")?,
                q_norm: f32_buf(gpu, "q_norm", &aw.q_norm),
                k_norm: f32_buf(gpu, "k_norm", &aw.k_norm),
                rel_proj: f32_buf(gpu, "rel_proj", &aw.rel_proj),
                conv_w,
                conv_state,
                k_cache: zeroed(gpu, "k cache", kv_floats),
                v_cache: zeroed(gpu, "v cache", kv_floats),
                cache_capacity,
                conv_ring,
                attn_consts: f32_buf(gpu, "attention constants", &attn_consts),
                mlp,
            });
        }

        let t = max_chunk;
        let s = cfg.n_shared_experts;
        let n_router = cfg.n_routed_experts + s;
        let dense_pairs: Vec<u32> = (0..t as u32).flat_map(|ti| [0, ti, NO_GAMMA, 0]).collect();
        let shared_pairs: Vec<u32> = (0..t as u32)
            .flat_map(|ti| (0..s as u32).flat_map(move |si| [si, ti, NO_GAMMA, 0]))
            .collect();
        let logits_rows = t * width;
        let acts = Acts {
            ids: gpu.storage("ids", 4 * t as u64),
            h: zeroed(gpu, "h", t * hid),
            xn: zeroed(gpu, "xn", t * hid),
            q: zeroed(gpu, "q", t * max_qd),
            k_raw: zeroed(gpu, "k_raw", t * max_kvd),
            v_raw: zeroed(gpu, "v_raw", t * max_kvd),
            k_new: zeroed(gpu, "k_new", t * max_kvd),
            v_new: zeroed(gpu, "v_new", t * max_kvd),
            r: zeroed(gpu, "r", t * max_r),
            attn: zeroed(gpu, "attn", t * max_qd),
            o: zeroed(gpu, "o", t * hid),
            gu: zeroed(gpu, "gate_up", t * max_gu_rows_x2i),
            act: zeroed(gpu, "act", t * max_gu_rows_x2i / 2 + 1),
            y_routed: zeroed(gpu, "y_routed", t * max_topk * hid),
            y_shared: zeroed(gpu, "y_shared", t * s.max(1) * hid),
            m: zeroed(gpu, "m", t * hid),
            router_logits: zeroed(gpu, "router logits", t * n_router.max(1)),
            pairs: gpu.storage("pairs", 16 * (t * max_topk) as u64),
            gammas: zeroed(gpu, "gammas", t * max_topk),
            shared_gammas: zeroed(gpu, "shared gammas", t * s.max(1)),
            dense_pairs: gpu.storage_init("dense pairs", bytemuck::cast_slice(&dense_pairs)),
            shared_pairs: gpu.storage_init("shared pairs", bytemuck::cast_slice(&shared_pairs)),
            hn: zeroed(gpu, "hn", t * hid),
            logits: zeroed(gpu, "logits", logits_rows),
            argmax: zeroed(gpu, "argmax and status", status::WORDS),
            readback: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("logits readback"),
                // the logits, then the status words
                size: 4 * logits_rows as u64 + STATUS_BYTES,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            ring: std::array::from_fn(|_| {
                gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("greedy id ring"),
                    size: STATUS_BYTES,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            }),
            positions: {
                let v: Vec<u32> = (0..max_seq as u32).flat_map(|p| [p, 0, 0, 0]).collect();
                gpu.storage_init("positions", bytemuck::cast_slice(&v))
            },
        };
        let pos_buf = PosBuffer::new(gpu, 0);
        let static_decode_bytes =
            static_decode_bytes(row_bytes as u64, &embed_norm, &norm, &lm_head, &layers);
        let stream = match slots {
            None => None,
            Some(n) => {
                let (f0, inter) = w
                    .layers
                    .iter()
                    .find_map(|l| match &l.mlp {
                        Mlp::Moe(m) => Some((&m.experts[0], m.experts[0].gate.rows)),
                        Mlp::Dense(_) => None,
                    })
                    .context("expert streaming needs a sparse layer")?;
                let (enc, denc) = (f0.gate.enc, f0.down.enc);
                // one pool serves every layer: every routed expert must have its shape and encoding
                for (i, l) in w.layers.iter().enumerate() {
                    let Mlp::Moe(m) = &l.mlp else { continue };
                    for (e, f) in m.experts.iter().enumerate() {
                        let same = |q: &QMatrix<'_>, like: &QMatrix<'_>| {
                            q.enc == like.enc && q.rows == like.rows && q.cols == like.cols
                        };
                        ensure!(
                            same(&f.gate, &f0.gate) && same(&f.up, &f0.gate) && same(&f.down, &f0.down),
                            "expert streaming needs one shape and encoding for every routed expert; \
                             layer {i} expert {e} differs from the first ({} / {} [{}, {}] vs {} / {} [{}, {}])",
                            f.gate.enc.spelling(),
                            f.down.enc.spelling(),
                            f.gate.rows,
                            f.gate.cols,
                            enc.spelling(),
                            denc.spelling(),
                            f0.gate.rows,
                            f0.gate.cols
                        );
                    }
                }
                let gu = GpuWeights::empty_with_limit(gpu, enc, n, 2 * inter, hid, limit)
                    .context("allocating the expert slots (gate_up)")?;
                let dn = GpuWeights::empty_with_limit(gpu, denc, n, hid, inter, limit)
                    .context("allocating the expert slots (down)")?;
                let p = max_chunk * max_topk;
                Some(StreamGpu {
                    pool: Experts {
                        gate_up: Lin {
                            w: gu,
                            ordinal: enc.format.ordinal(),
                        },
                        down: Lin {
                            w: dn,
                            ordinal: denc.format.ordinal(),
                        },
                        n,
                    },
                    inter: inter as u32,
                    part_pairs: gpu.storage("expert part pairs", 16 * p as u64),
                    y_part: zeroed(gpu, "expert part outputs", p * hid),
                    part_calls: HashMap::new(),
                    pairs_rb: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("router pairs readback"),
                        size: 16 * p as u64,
                        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    }),
                    threads: upload_threads(),
                    host: super::stream::StreamState {
                        experts: Vec::new(),
                        cache: ExpertCache::new(cfg.num_hidden_layers, cfg.n_routed_experts, n)
                            .map_err(|e| anyhow::anyhow!("{e}"))?,
                        usage: Usage::new("", cfg.num_hidden_layers, cfg.n_routed_experts),
                        stats: StreamStats::default(),
                        fail_at: None,
                        warned: false,
                    },
                })
            }
        };
        Ok(GpuModel {
            pass_per_phase: false,
            fuse_residual: false,
            fuse_attention: false,
            op_prof: None,
            spans: None,
            host: HostTimes::default(),
            stream,
            static_decode_bytes,
            prof: None,
            gpu: gpu.clone(),
            cfg,
            max_seq,
            max_chunk,
            pos: 0,
            dirty: false,
            embed_shards,
            embed_norm,
            norm,
            lm_head,
            layers,
            acts,
            pos_buf,
            steps: HashMap::new(),
            map_flag: Default::default(),
        })
    }
}

impl<'w> GpuModel<'w> {
    /// A model whose routed experts are placed by `placement`: resident (as [`GpuModel::with_options`])
    /// or streamed from `w`'s mapped bytes through a pool of expert slots (see [`super::stream`]).
    ///
    /// `usage` is the routing-count table the model records into (and, loaded from a usage file,
    /// ranks the pinned hot set with: up to half the slots when there are at least twice
    /// `top_k` of them). Errors: a budget below the resident part plus one expert slot.
    pub fn with_placement(
        gpu: &Gpu,
        w: &'w Weights<'w>,
        opts: GpuModelOptions,
        placement: Placement,
        usage: Option<Usage>,
    ) -> Result<GpuModel<'w>> {
        let slots = Self::plan_slots(w, opts, placement)?;
        // out of memory while uploading is an error that says what to do, not a panic
        let oom = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let built = GpuModel::build(gpu, w, opts, slots);
        if let Some(e) = pollster::block_on(oom.pop()) {
            bail!(
                "the GPU ran out of memory while uploading the model ({e}); {}",
                match slots {
                    None => "give a budget with --gpu-mem GiB (or --expert-slots N) so the routed \
                             experts stream from the container"
                        .to_string(),
                    Some(n) => format!("{n} expert slots did not fit: use a smaller --gpu-mem"),
                }
            );
        }
        let mut m: GpuModel<'w> = built?;
        if let Some(sg) = m.stream.as_mut() {
            let h = &mut sg.host;
            h.experts = w
                .layers
                .iter()
                .map(|l| match &l.mlp {
                    Mlp::Moe(x) => &x.experts[..],
                    Mlp::Dense(_) => &[][..],
                })
                .collect();
            let max_topk = w
                .layers
                .iter()
                .filter_map(|l| match &l.mlp {
                    Mlp::Moe(x) => Some(x.top_k),
                    Mlp::Dense(_) => None,
                })
                .max()
                .unwrap_or(1);
            if let Some(u) = usage {
                let n = sg.pool.n;
                let max_pinned = if n >= 2 * max_topk { n / 2 } else { 0 };
                let t0 = std::time::Instant::now();
                // only keys the model has (a count on a dense layer cannot be pinned)
                let hot: Vec<(usize, usize)> = u
                    .ranked()
                    .into_iter()
                    .filter(|&(l, e)| h.experts.get(l).is_some_and(|x| e < x.len()))
                    .collect();
                let loads = h.cache.pin(&hot, max_pinned);
                // staged in batches of about 1 GiB (a submission each), inside error scopes
                let gpu = &m.gpu;
                let oom = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
                let invalid = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
                let res = (|| -> Result<u64> {
                    let (mut total, mut batch_bytes, mut batch) = (0, 0, Vec::new());
                    for (layer, a) in &loads {
                        let n = stage_expert(gpu, &sg.pool, h.experts[*layer], *a, &mut batch)?;
                        total += n;
                        batch_bytes += n;
                        if batch_bytes >= 1 << 30 {
                            run_staged(std::mem::take(&mut batch), sg.threads);
                            gpu.queue.submit([]);
                            batch_bytes = 0;
                        }
                    }
                    run_staged(batch, sg.threads);
                    Ok(total)
                })();
                let scoped = [
                    pollster::block_on(invalid.pop()),
                    pollster::block_on(oom.pop()),
                ];
                match (res, scoped) {
                    (Ok(n), [None, None]) => h.stats.startup_bytes = n,
                    (res, [v, o]) => {
                        let why = match (res, v.or(o)) {
                            (Err(e), _) => format!("{e:#}"),
                            (Ok(_), Some(e)) => e.to_string(),
                            (Ok(_), None) => unreachable!("matched above"),
                        };
                        eprintln!(
                            "warning: the hot set from the usage file could not be uploaded ({why}); \
                             going on without it"
                        );
                        for (_, a) in &loads {
                            h.cache.forget(a.slot);
                        }
                    }
                }
                h.stats.startup_s = t0.elapsed().as_secs_f64();
                h.usage = u;
            }
        }
        Ok(m)
    }

    /// How many expert slots `placement` gives this model: `None` = fully resident (every routed
    /// expert fits, or no budget was given). Errors: zero slots asked for, or a budget below the
    /// resident part plus one slot.
    pub fn plan_slots(
        w: &Weights<'_>,
        opts: GpuModelOptions,
        placement: Placement,
    ) -> Result<Option<usize>> {
        let cfg = &w.config;
        let sparse = w
            .layers
            .iter()
            .filter(|l| matches!(l.mlp, Mlp::Moe(_)))
            .count();
        let total = sparse * cfg.n_routed_experts;
        let slot_bytes = Self::slot_bytes(w);
        Ok(match placement {
            Placement::Resident => None,
            Placement::Slots(n) => {
                ensure!(n >= 1, "--expert-slots must be at least 1");
                (n < total).then_some(n)
            }
            Placement::GpuMem(b) => {
                let est = Self::resident_bytes_estimate(w, opts);
                let free = b.saturating_sub(est);
                let n = (free / slot_bytes.max(1)) as usize;
                ensure!(
                    n >= 1,
                    "a GPU memory budget of {} holds no expert slot: the resident part (dense \
                     weights, shared experts, KV cache, activations) needs about {} and one expert \
                     slot {}",
                    human_bytes(b),
                    human_bytes(est),
                    human_bytes(slot_bytes)
                );
                (n < total).then_some(n)
            }
        })
    }

    /// GPU bytes of one expert slot (gate‖up and down, padded rows, scales).
    pub fn slot_bytes(w: &Weights<'_>) -> u64 {
        let Some(f) = w.layers.iter().find_map(|l| match &l.mlp {
            Mlp::Moe(m) => Some(&m.experts[0]),
            Mlp::Dense(_) => None,
        }) else {
            return 0;
        };
        let mat = |rows: usize, q: &QMatrix<'_>| {
            (rows * gpu_row_stride(q.enc, q.cols) + 4 * q.enc.scale_count(rows, q.cols)) as u64
        };
        mat(2 * f.gate.rows, &f.gate) + mat(f.down.rows, &f.down)
    }

    /// Bytes of routed experts in the model, as they sit in the container.
    pub fn routed_bytes(w: &Weights<'_>) -> u64 {
        w.layers
            .iter()
            .map(|l| match &l.mlp {
                Mlp::Moe(m) => m
                    .experts
                    .iter()
                    .flat_map(|f| [&f.gate, &f.up, &f.down])
                    .map(|q| (q.data.len() + q.scales.len()) as u64)
                    .sum(),
                Mlp::Dense(_) => 0,
            })
            .sum()
    }

    /// An estimate of the GPU bytes of everything but the routed experts: dense linears, shared
    /// experts, router, embedding table, head, norms and conv weights as stored, the KV caches
    /// and conv states for `opts.max_seq`, and the activations of a `max_chunk` chunk.
    pub fn resident_bytes_estimate(w: &Weights<'_>, opts: GpuModelOptions) -> u64 {
        let cfg = &w.config;
        let q = |m: &QMatrix<'_>| (m.data.len() + m.scales.len()) as u64;
        let ffn = |f: &Ffn<'_>| q(&f.gate) + q(&f.up) + q(&f.down);
        let v = |x: &[f32]| 4 * x.len() as u64;
        let hid = cfg.hidden_size as u64;
        let embed = match w.embed.enc.format {
            Format::F32 | Format::Bf16 => q(&w.embed),
            _ => 4 * hid * cfg.vocab_size as u64,
        };
        let mut b = embed + q(&w.lm_head) + v(&w.embed_norm) + v(&w.norm);
        for (i, l) in w.layers.iter().enumerate() {
            let a = &l.attn;
            b += q(&a.q) + q(&a.k) + q(&a.v) + q(&a.r) + q(&a.o);
            b += v(&a.q_norm) + v(&a.k_norm) + v(&a.rel_proj) + v(&l.input_norm);
            b += v(&l.post_attn_norm) + v(&a.k_sconv.w) + v(&a.v_sconv.w);
            b += v(&l.attn_sconv.w) + v(&l.mlp_sconv.w);
            let g = cfg.attn(i);
            let cap = g.window.unwrap_or(opts.max_seq) as u64;
            b += 2 * 4 * cap * g.kv_dim() as u64;
            b += 4 * (cfg.conv_kernel_size as u64) * (2 * g.kv_dim() as u64 + 2 * hid);
            b += match &l.mlp {
                Mlp::Dense(d) => ffn(&d.ffn),
                Mlp::Moe(m) => q(&m.router) + m.shared.iter().map(ffn).sum::<u64>(),
            };
        }
        // activations of a chunk: the logits and their readback copy, the expert FFN buffers
        // (gate‖up, activation, outputs, streamed part outputs) and a bound of 64 hidden-size
        // vectors per token for the rest
        let t = opts.max_chunk.min(opts.max_seq) as u64;
        let (k, inter) = w
            .layers
            .iter()
            .find_map(|l| match &l.mlp {
                Mlp::Moe(m) => Some((m.top_k.max(m.shared.len()) as u64, m.experts[0].gate.rows)),
                Mlp::Dense(_) => None,
            })
            .unwrap_or((1, cfg.intermediate_size));
        let ffn_acts = k * (3 * inter as u64 + 3 * hid);
        b + 4 * t * (2 * cfg.logits_width() as u64 + ffn_acts + 64 * hid)
    }

    /// Counters of expert streaming (`None` when the routed experts are resident).
    pub fn stream_stats(&self) -> Option<StreamStats> {
        self.stream.as_ref().map(|s| {
            let c = s.host.cache.counters();
            StreamStats {
                slots: s.host.cache.slots(),
                hits: c.hits,
                misses: c.misses,
                pinned: s.host.cache.pinned_count(),
                ..s.host.stats
            }
        })
    }

    /// The routing counts recorded so far (streaming only), for the usage file.
    pub fn usage(&self) -> Option<&Usage> {
        self.stream.as_ref().map(|s| &s.host.usage)
    }

    /// Test hook: make the GPU part of `layer`'s routed experts fail in the step that feeds
    /// position `pos` (streaming only; the layer is then recomputed on the CPU). Errors when
    /// the model is fully resident.
    #[doc(hidden)]
    pub fn inject_routed_failure(&mut self, pos: usize, layer: usize) -> Result<()> {
        let s = self
            .stream
            .as_mut()
            .context("failure injection needs a streaming model")?;
        s.host.fail_at = Some((pos, layer));
        Ok(())
    }

    /// The device this model runs on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Longest sequence (tokens) the KV caches hold.
    pub fn max_seq(&self) -> usize {
        self.max_seq
    }

    /// Tokens per submission.
    pub fn max_chunk(&self) -> usize {
        self.max_chunk
    }

    /// Tokens consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Number of distinct recorded steps built so far (one per (token count, head mode)).
    pub fn recorded_steps(&self) -> usize {
        self.steps.len()
    }

    /// Compute dispatches of a greedy one-token decode step with the current options (the step is
    /// built, not run; streamed routed experts count as none).
    pub fn decode_step_dispatches(&self) -> Result<usize> {
        let step = self.build_step(1, Head::Last, false)?;
        Ok(step
            .recs
            .iter()
            .map(|r| match r {
                Rec::Call(c) => c.dispatches(),
                Rec::Routed(_) => 0,
            })
            .sum())
    }

    /// Bytes a one-token step at position `pos` must read: [`static_decode_bytes`] plus, per
    /// layer, the K and V cache entries it attends over (`min(pos + 1, capacity)` of each).
    pub fn decode_bytes(&self, pos: usize) -> u64 {
        let kv: u64 = self
            .layers
            .iter()
            .map(|l| {
                let n = (pos as u64 + 1).min(l.cache_capacity as u64);
                2 * n * l.geom.kv_dim() as u64 * 4
            })
            .sum();
        self.static_decode_bytes + kv
    }

    /// Whether profile mode can time phases (the adapter has `TIMESTAMP_QUERY`).
    pub fn has_timestamps(&self) -> bool {
        self.gpu.has_timestamps()
    }

    /// Enter profile mode (dropping anything accumulated so far): from now on every one-token step
    /// is counted, with its bytes, and, with `TIMESTAMP_QUERY`, recorded as one timed compute pass
    /// per phase run. The kernels are the same, so the results are too.
    pub fn start_profile(&mut self) {
        self.prof = Some(Profiler {
            steps: 0,
            bytes_sum: 0.0,
            ts: None,
        });
    }

    /// Enter the per-op profile: every later one-token step records each kernel as its own
    /// compute pass with timestamps at its beginning and end, and waits for its times (slow: a
    /// diagnosis tool, not a speed figure; the kernels and their order are those of the normal
    /// step). Errors: the adapter lacks `TIMESTAMP_QUERY`, or the model streams experts.
    pub fn start_op_profile(&mut self) -> Result<()> {
        ensure!(
            self.has_timestamps(),
            "the per-op profile needs TIMESTAMP_QUERY, which {} lacks",
            self.gpu.describe()
        );
        ensure!(
            self.stream.is_none(),
            "the per-op profile does not time streamed steps"
        );
        self.op_prof = Some(OpProfiler {
            sets: Vec::new(),
            resolve: None,
            times: Default::default(),
        });
        Ok(())
    }

    /// Time the next `cap` normal one-token steps on the GPU (a timestamp at the beginning and
    /// the end of each step's single pass; no change to what runs). Errors without
    /// `TIMESTAMP_QUERY`.
    pub fn start_step_spans(&mut self, cap: u32) -> Result<()> {
        ensure!(
            self.has_timestamps(),
            "step timestamps need TIMESTAMP_QUERY, which {} lacks",
            self.gpu.describe()
        );
        let cap = cap.clamp(1, wgpu::QUERY_SET_MAX_QUERIES / 2);
        self.spans = Some(StepSpans {
            qs: timing::query_set(&self.gpu, "step spans", 2 * cap),
            resolve: timing::resolve_buffer(
                &self.gpu,
                "step span timestamps",
                cap as u64 * wgpu::QUERY_RESOLVE_BUFFER_ALIGNMENT,
            ),
            cap,
            n: 0,
        });
        Ok(())
    }

    /// Stop timing steps; returns `(GPU seconds of each step, GPU seconds idle before each step
    /// after the first)`, in submission order.
    pub fn take_step_spans(&mut self) -> Result<(Vec<f64>, Vec<f64>)> {
        let Some(sp) = self.spans.take() else {
            return Ok(Default::default());
        };
        if sp.n == 0 {
            return Ok(Default::default());
        }
        let period = timing::seconds_per_tick(&self.gpu);
        let stride = wgpu::QUERY_RESOLVE_BUFFER_ALIGNMENT as usize;
        let raw = self
            .gpu
            .read_bytes(&sp.resolve, 0, sp.n as u64 * stride as u64)?;
        let ticks = timing::ticks(&raw);
        let tick = |i: usize, k: usize| ticks[i * stride / 8 + k];
        let n = sp.n as usize;
        let busy = (0..n)
            .map(|i| tick(i, 1).saturating_sub(tick(i, 0)) as f64 * period)
            .collect();
        let idle = (1..n)
            .map(|i| tick(i, 0).saturating_sub(tick(i - 1, 1)) as f64 * period)
            .collect();
        Ok((busy, idle))
    }

    /// Leave the per-op profile and return the GPU seconds per kernel name, summed over the steps.
    pub fn take_op_profile(&mut self) -> super::profile::OpTimes {
        self.op_prof.take().map(|p| p.times).unwrap_or_default()
    }

    /// Leave profile mode and return what it accumulated (reads the timestamps back).
    pub fn take_profile(&mut self) -> Result<DecodeProfile> {
        let Some(mut p) = self.prof.take() else {
            return Ok(DecodeProfile::default());
        };
        let mut out = DecodeProfile {
            steps: p.steps,
            bytes_sum: p.bytes_sum,
            phase_s: None,
            span_s: None,
        };
        // streaming steps are several submissions and carry no timestamps
        if self.has_timestamps() && self.stream.is_none() {
            let period = timing::seconds_per_tick(&self.gpu);
            let mut phase_s = [0f64; 7];
            let mut span_s = 0.0;
            if let Some(ts) = p.ts.as_mut() {
                flush_timestamps(&self.gpu, ts, &self.steps)?;
                for (o, &t) in phase_s.iter_mut().zip(&ts.ticks) {
                    *o = t as f64 * period;
                }
                span_s = ts.span_ticks as f64 * period;
            }
            out.phase_s = Some(phase_s);
            out.span_s = Some(span_s);
        }
        Ok(out)
    }

    /// Forget the sequence: position 0, conv states cleared (KV slots are overwritten before they
    /// are read, so the caches need no clearing).
    pub fn reset(&mut self) {
        self.pos = 0;
        if self.dirty {
            let mut enc = self.gpu.device.create_command_encoder(&Default::default());
            for l in &self.layers {
                for s in &l.conv_state {
                    enc.clear_buffer(s, 0, None);
                }
                for c in [&l.k_cache, &l.v_cache] {
                    enc.clear_buffer(
                        c,
                        l.conv_ring.start,
                        Some(l.conv_ring.end - l.conv_ring.start),
                    );
                }
            }
            self.gpu.queue.submit([enc.finish()]);
            self.dirty = false;
        }
    }

    /// Feed `tokens` and return the logits of the last one (`config.logits_width()` values).
    /// Errors (as every forward of this type): a token past the vocabulary, `max_seq` exceeded,
    /// and a NaN or an Inf in a router's logits or in the logits
    /// ([`super::ModelError::NonFiniteRouter`] / [`super::ModelError::NonFiniteLogits`], naming
    /// the position; the model must be [`GpuModel::reset`] before it is used again).
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let mut out = self.run(tokens, Head::Last)?;
        Ok(out.pop().expect("one row"))
    }

    /// Feed `tokens` and return the logits of every one of them.
    pub fn forward_all(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.run(tokens, Head::All)
    }

    /// Feed `tokens` and return only the greedy choice after the last one (argmax on the GPU,
    /// ties to the lowest id; 4 bytes read back).
    pub fn forward_greedy(&mut self, tokens: &[u32]) -> Result<u32> {
        self.check(tokens)?;
        self.clear_status();
        let chunks: Vec<&[u32]> = tokens.chunks(self.max_chunk).collect();
        let last = chunks.len() - 1;
        for (ci, c) in chunks.into_iter().enumerate() {
            if ci == last {
                self.submit(c, Head::Last, Readback::Argmax)?;
                let w = words(&self.read_back(STATUS_BYTES)?);
                status::check(&w, self.pos - 1)?;
                return Ok(w[status::ID]);
            }
            self.submit(c, Head::None, Readback::None)?;
        }
        unreachable!("at least one chunk")
    }

    fn check(&self, tokens: &[u32]) -> Result<()> {
        ensure!(!tokens.is_empty(), "no tokens to feed");
        if let Some(&id) = tokens
            .iter()
            .find(|&&id| id as usize >= self.cfg.vocab_size)
        {
            bail!(
                "token id {id} is outside the vocabulary (vocab_size {})",
                self.cfg.vocab_size
            );
        }
        ensure!(
            self.pos + tokens.len() <= self.max_seq,
            "sequence of {} tokens exceeds the GPU model's max_seq {}",
            self.pos + tokens.len(),
            self.max_seq
        );
        Ok(())
    }

    /// Zero the status words (all but the greedy id) before a call feeds tokens.
    fn clear_status(&self) {
        let zeros = [0u8; STATUS_BYTES as usize - 4];
        self.gpu.queue.write_buffer(&self.acts.argmax, 4, &zeros);
    }

    fn run(&mut self, tokens: &[u32], head: Head) -> Result<Vec<Vec<f32>>> {
        self.check(tokens)?;
        self.clear_status();
        let width = self.cfg.logits_width();
        let chunks: Vec<&[u32]> = tokens.chunks(self.max_chunk).collect();
        let last = chunks.len() - 1;
        let mut out = Vec::new();
        for (ci, c) in chunks.into_iter().enumerate() {
            let h = match head {
                Head::All => Head::All,
                _ if ci == last => Head::Last,
                _ => Head::None,
            };
            let rows = match h {
                Head::None => 0,
                Head::Last => 1,
                Head::All => c.len(),
            };
            let bytes = (rows * width * 4) as u64;
            let rb = if rows > 0 {
                Readback::Logits(bytes)
            } else {
                Readback::None
            };
            self.submit(c, h, rb)?;
            if rows > 0 {
                let b = self.read_back(bytes + STATUS_BYTES)?;
                status::check(&words(&b[bytes as usize..]), self.pos - 1)?;
                let v: Vec<f32> = b[..bytes as usize]
                    .chunks_exact(4)
                    .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                    .collect();
                status::check_logits(&v, width, self.pos - rows)?;
                out.extend(v.chunks_exact(width).map(|r| r.to_vec()));
            }
        }
        Ok(out)
    }

    /// Record and submit one chunk (≤ max_chunk tokens): ids and position writes, one compute
    /// pass, and the copy of `copy` into the readback buffer, in one submission.
    fn submit(
        &mut self,
        tokens: &[u32],
        head: Head,
        copy: Readback,
    ) -> Result<wgpu::SubmissionIndex> {
        self.submit_keyed(Some(tokens), head, copy)
    }

    /// [`GpuModel::submit`]; `tokens == None` is a chained one-token step: its id is the previous
    /// step's argmax (read on the device) and its position is copied on the device from
    /// `positions`, so nothing is written from the host.
    fn submit_keyed(
        &mut self,
        tokens: Option<&[u32]>,
        head: Head,
        copy: Readback,
    ) -> Result<wgpu::SubmissionIndex> {
        let chained = tokens.is_none();
        let n_tok = tokens.map_or(1, |t| t.len());
        let t = n_tok as u32;
        let key = (t, head, chained);
        if !self.steps.contains_key(&key) {
            let step = self.build_step(t, head, chained)?;
            self.steps.insert(key, step);
        }
        let gpu = &self.gpu.clone();
        let mut enc = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("inkling step"),
            });
        match tokens {
            Some(tokens) => {
                gpu.queue
                    .write_buffer(&self.acts.ids, 0, bytemuck::cast_slice(tokens));
                self.pos_buf.set(&gpu.queue, self.pos as u32);
            }
            None => enc.copy_buffer_to_buffer(
                &self.acts.positions,
                16 * self.pos as u64,
                &self.pos_buf.buffer,
                0,
                16,
            ),
        }
        let t_rec = std::time::Instant::now();
        let step = &self.steps[&key];
        let n_segs = step.segs.len();
        // profile mode: one-token steps are counted and, with timestamps, timed per phase
        let profiled = t == 1 && self.prof.is_some();
        let streaming = self.stream.is_some();
        let mut timed_slot = None;
        if profiled {
            let bytes = self.decode_bytes(self.pos);
            let prof = self.prof.as_mut().expect("profiling");
            prof.steps += 1;
            prof.bytes_sum += bytes as f64;
            if gpu.has_timestamps() && !streaming {
                let need = 2 * step.segs.len() as u32;
                ensure!(
                    need <= wgpu::QUERY_SET_MAX_QUERIES,
                    "profile mode: {} phase passes per step exceed the {} queries of a query set",
                    step.segs.len(),
                    wgpu::QUERY_SET_MAX_QUERIES
                );
                if prof.ts.as_ref().is_none_or(|ts| ts.queries < need) {
                    let mut old = prof.ts.take();
                    let (ticks, span_ticks) = match old.as_mut() {
                        Some(ts) => {
                            flush_timestamps(gpu, ts, &self.steps)?;
                            (ts.ticks, ts.span_ticks)
                        }
                        None => ([0; 7], 0),
                    };
                    let stride =
                        (8 * need as u64).next_multiple_of(wgpu::QUERY_RESOLVE_BUFFER_ALIGNMENT);
                    let slots = ((16u64 << 20) / stride).clamp(1, 4096);
                    prof.ts = Some(Timestamps {
                        qs: timing::query_set(gpu, "decode profile", need),
                        queries: need,
                        resolve: timing::resolve_buffer(
                            gpu,
                            "decode profile timestamps",
                            slots * stride,
                        ),
                        stride,
                        slots,
                        pending: Vec::new(),
                        ticks,
                        span_ticks,
                    });
                }
                let ts = prof.ts.as_mut().expect("created");
                if ts.pending.len() as u64 == ts.slots {
                    flush_timestamps(gpu, ts, &self.steps)?;
                }
                timed_slot = Some(ts.pending.len() as u64);
                for (i, (ph, range)) in step.segs.iter().enumerate() {
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some(ph.key()),
                        timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                            query_set: &ts.qs,
                            beginning_of_pass_write_index: Some(2 * i as u32),
                            end_of_pass_write_index: Some(2 * i as u32 + 1),
                        }),
                    });
                    for r in &step.recs[range.clone()] {
                        r.record_in_pass(&mut pass);
                    }
                }
            }
        }
        let op_timed = t == 1 && !streaming && timed_slot.is_none() && self.op_prof.is_some();
        if op_timed {
            let op = self.op_prof.as_mut().expect("op profile");
            let n = step.recs.len();
            if op.sets.len() * OP_SET_KERNELS < n {
                op.sets = (0..n.div_ceil(OP_SET_KERNELS))
                    .map(|_| timing::query_set(gpu, "per-op profile", 2 * OP_SET_KERNELS as u32))
                    .collect();
                op.resolve = Some(timing::resolve_buffer(
                    gpu,
                    "per-op profile timestamps",
                    (16 * OP_SET_KERNELS * op.sets.len()) as u64,
                ));
            }
            for (i, r) in step.recs.iter().enumerate() {
                let q = 2 * (i % OP_SET_KERNELS) as u32;
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("per-op profile"),
                    timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                        query_set: &op.sets[i / OP_SET_KERNELS],
                        beginning_of_pass_write_index: Some(q),
                        end_of_pass_write_index: Some(q + 1),
                    }),
                });
                r.record_in_pass(&mut pass);
            }
            let resolve = op.resolve.as_ref().expect("created");
            // kernel i's two timestamps land at byte 16 · i of `resolve`
            for (k, qs) in op.sets.iter().enumerate().take(n.div_ceil(OP_SET_KERNELS)) {
                let used = (n - k * OP_SET_KERNELS).min(OP_SET_KERNELS) as u32;
                let at = (16 * OP_SET_KERNELS * k) as u64;
                enc.resolve_query_set(qs, 0..2 * used, resolve, at);
            }
        }
        if streaming {
            enc = self.record_streamed(key, enc)?;
        } else if op_timed || timed_slot.is_some() {
            // recorded above
        } else if self.pass_per_phase {
            for (ph, range) in &step.segs {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some(ph.key()),
                    timestamp_writes: None,
                });
                for r in &step.recs[range.clone()] {
                    r.record_in_pass(&mut pass);
                }
            }
        } else {
            let span = self
                .spans
                .as_ref()
                .filter(|sp| t == 1 && sp.n < sp.cap)
                .map(|sp| (sp, sp.n));
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("inkling forward"),
                timestamp_writes: span.map(|(sp, n)| wgpu::ComputePassTimestampWrites {
                    query_set: &sp.qs,
                    beginning_of_pass_write_index: Some(2 * n),
                    end_of_pass_write_index: Some(2 * n + 1),
                }),
            });
            for r in &step.recs {
                r.record_in_pass(&mut pass);
            }
            drop(pass);
            if let Some((sp, n)) = span {
                enc.resolve_query_set(
                    &sp.qs,
                    2 * n..2 * n + 2,
                    &sp.resolve,
                    n as u64 * wgpu::QUERY_RESOLVE_BUFFER_ALIGNMENT,
                );
                self.spans.as_mut().expect("spans").n += 1;
            }
        }
        if let (Some(slot), Some(ts)) = (timed_slot, self.prof.as_mut().and_then(|p| p.ts.as_mut()))
        {
            let n = 2 * n_segs as u32;
            enc.resolve_query_set(&ts.qs, 0..n, &ts.resolve, slot * ts.stride);
            ts.pending.push(key);
        }
        let a = &self.acts;
        match copy {
            Readback::None => {}
            Readback::Logits(n) => {
                enc.copy_buffer_to_buffer(&a.logits, 0, &a.readback, 0, n);
                enc.copy_buffer_to_buffer(&a.argmax, 0, &a.readback, n, STATUS_BYTES);
            }
            Readback::Argmax => {
                enc.copy_buffer_to_buffer(&a.argmax, 0, &a.readback, 0, STATUS_BYTES)
            }
            Readback::Ring(slot) => {
                enc.copy_buffer_to_buffer(&a.argmax, 0, &a.ring[slot], 0, STATUS_BYTES)
            }
        }
        let t_fin = std::time::Instant::now();
        let cb = enc.finish();
        let t_sub = std::time::Instant::now();
        let idx = gpu.queue.submit([cb]);
        if t == 1 {
            let h = &mut self.host;
            h.steps += 1;
            h.record_s += (t_fin - t_rec).as_secs_f64();
            h.finish_s += (t_sub - t_fin).as_secs_f64();
            h.submit_s += t_sub.elapsed().as_secs_f64();
        }
        self.pos += n_tok;
        self.dirty = true;
        if op_timed {
            self.read_op_times(key)?;
        }
        Ok(idx)
    }

    /// Per-op profile: wait for the step just submitted and add its kernels' times.
    fn read_op_times(&mut self, key: StepKey) -> Result<()> {
        let period = timing::seconds_per_tick(&self.gpu);
        let recs = &self.steps[&key].recs;
        let op = self.op_prof.as_mut().expect("op profile");
        let raw = self.gpu.read_bytes(
            op.resolve.as_ref().expect("created"),
            0,
            16 * recs.len() as u64,
        )?;
        let ticks = timing::ticks(&raw);
        let tick = |q: usize| ticks[q];
        let first = tick(0);
        let mut last = first;
        for (i, r) in recs.iter().enumerate() {
            let (b, e) = (tick(2 * i), tick(2 * i + 1));
            op.times
                .add(r.op_name(), e.saturating_sub(b) as f64 * period);
            last = last.max(e);
        }
        op.times.steps += 1;
        op.times.span_s += last.saturating_sub(first) as f64 * period;
        Ok(())
    }

    /// Host time per phase of the one-token steps since the model was built or
    /// [`GpuModel::reset_host_times`] (the record/finish/submit split tells whether a decode step is
    /// bound by the host or by the GPU).
    pub fn host_times(&self) -> HostTimes {
        self.host
    }

    /// Record each step as one compute pass per phase run (the passes profile mode times) instead
    /// of one pass (the default). Same kernels, same order, same tokens; an experiment knob for
    /// `bench decode --pass-per-phase`, since one long pass measured slower on the GPU than the
    /// same kernels in per-phase passes on an H200 (BENCHMARKS.md).
    pub fn set_pass_per_phase(&mut self, on: bool) {
        self.pass_per_phase = on;
    }

    /// Fuse each residual chain of one-token steps into one single-workgroup dispatch
    /// ([`crate::gpu::ops::SconvRmsNorm`]: conv input → short conv → `h +=` → the next RMSNorm)
    /// instead of two or three dispatches. Same results (tested); off by default because on an
    /// H200 the single workgroup was slower than the separate kernels it replaces (22.2 µs vs
    /// 6.9 + 8.6 µs per attention chain, 27.3 µs vs 7.1 + 6.9 + 8.6 µs per MoE chain, `bench
    /// decode --per-op`); an experiment knob (`bench decode --fuse-residual`) for GPUs where
    /// dispatches cost more than latency.
    pub fn set_fuse_residual(&mut self, on: bool) {
        if on != self.fuse_residual {
            self.fuse_residual = on;
            self.steps.clear();
        }
    }

    /// Run the attention block after the projections through [`FusedAttention`]: one dispatch per
    /// layer for one-token steps (k/v short convs, q/k RMSNorms, attention and the KV-cache write)
    /// instead of five (conv pair, two norms, attention, KV append), and a prologue plus the
    /// attention for longer chunks. Same results as the separate kernels within float rounding
    /// (tested). The fused kernels keep the k/v conv history in their own ring, so the switch is
    /// refused in the middle of a sequence: call it at position 0 (after [`GpuModel::reset`]).
    pub fn set_fuse_attention(&mut self, on: bool) -> Result<()> {
        if on != self.fuse_attention {
            ensure!(
                self.pos == 0,
                "the fused attention can only be switched at the start of a sequence (position \
                 {}); reset first",
                self.pos
            );
            self.fuse_attention = on;
            self.steps.clear();
        }
        Ok(())
    }

    /// Start counting [`GpuModel::host_times`] afresh.
    pub fn reset_host_times(&mut self) {
        self.host = HostTimes::default();
    }

    /// Wait for submission `idx` only (later ones keep running), then read the id in ring `slot`
    /// (its step's last token at position `last`; an error when its status words report a
    /// non-finite value).
    fn read_ring(&mut self, slot: usize, idx: wgpu::SubmissionIndex, last: usize) -> Result<u32> {
        let t0 = std::time::Instant::now();
        let r = self.read_ring_inner(slot, idx);
        self.host.wait_s += t0.elapsed().as_secs_f64();
        let w = r?;
        status::check(&w, last)?;
        Ok(w[status::ID])
    }

    fn read_ring_inner(&self, slot: usize, idx: wgpu::SubmissionIndex) -> Result<Vec<u32>> {
        use std::sync::atomic::Ordering;
        let buf = &self.acts.ring[slot];
        let slice = buf.slice(0..STATUS_BYTES);
        self.map_flag.store(0, Ordering::Release);
        let flag = self.map_flag.clone();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            flag.store(if r.is_ok() { 1 } else { 2 }, Ordering::Release);
        });
        self.gpu
            .device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(idx),
                timeout: None,
            })
            .map_err(|e| anyhow::anyhow!("GPU poll failed: {e}"))?;
        // the callback fires during the poll that sees the submission done; poll again if not
        while self.map_flag.load(Ordering::Acquire) == 0 {
            self.gpu
                .device
                .poll(wgpu::PollType::Poll)
                .map_err(|e| anyhow::anyhow!("GPU poll failed: {e}"))?;
            std::thread::yield_now();
        }
        ensure!(
            self.map_flag.load(Ordering::Acquire) == 1,
            "GPU readback of the greedy id failed"
        );
        let w = {
            let m = slice
                .get_mapped_range()
                .map_err(|e| anyhow::anyhow!("GPU readback failed: {e:?}"))?;
            words(&m)
        };
        buf.unmap();
        Ok(w)
    }

    /// Greedy decode with one step in flight: feed `prompt`, then hand each greedy id to `on_id`
    /// in order while it returns `true`, at most `max_new` ids. Each decode step after the prompt
    /// is *chained*: recorded once, its embedding reads the previous step's argmax on the device
    /// and its position is copied on the device, so step k + 1 is submitted before step k's id is
    /// mapped (a ring of two 8-byte readback buffers), and the GPU does not wait for the host.
    ///
    /// Returns `Ok(false)` without doing anything in profile mode (profiling times one step per
    /// submission; callers fall back to [`GpuModel::forward_greedy`]), else `Ok(true)`.
    ///
    /// When `on_id` stops the run (e.g. on an EOS), the step speculatively submitted behind that
    /// id has already fed it: the cache is left one step ahead, holding the prompt and *every*
    /// id handed out, and [`GpuModel::position`] counts it (prompt + ids handed out). That step's
    /// own argmax is discarded. At `max_new` no step is speculated, so position is then
    /// prompt + ids − 1, as with the unpipelined loop. Either way the state is a consistent
    /// prefix of the sequence, and [`GpuModel::reset`] (which every new prompt goes through)
    /// clears the conv states; KV slots are overwritten before they are read.
    pub fn greedy_stream(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        on_id: &mut dyn FnMut(u32) -> Result<bool>,
    ) -> Result<bool> {
        if self.prof.is_some() || self.stream.is_some() {
            return Ok(false);
        }
        self.check(prompt)?;
        if max_new == 0 {
            return Ok(true);
        }
        self.clear_status();
        let prompt_last = self.pos + prompt.len() - 1;
        let chunks = prompt.len().div_ceil(self.max_chunk);
        let mut cur = None;
        for (ci, c) in prompt.chunks(self.max_chunk).enumerate() {
            if ci + 1 == chunks {
                cur = Some((0, self.submit(c, Head::Last, Readback::Ring(0))?));
            } else {
                self.submit(c, Head::None, Readback::None)?;
            }
        }
        let (mut slot, mut idx) = cur.expect("at least one chunk");
        let mut n = 0;
        loop {
            // the step that feeds id n (not known to the host yet), if it may be needed
            let spec = if n + 1 < max_new && self.pos < self.max_seq {
                let s = (slot + 1) % RING;
                Some((s, self.submit_keyed(None, Head::Last, Readback::Ring(s))?))
            } else {
                None
            };
            let id = self.read_ring(slot, idx, prompt_last + n)?;
            n += 1;
            if !on_id(id)? || n >= max_new {
                return Ok(true);
            }
            match spec {
                Some(s) => (slot, idx) = s,
                // past max_seq: the same error as the unpipelined path
                None => {
                    self.check(&[id])?;
                    unreachable!("a step was not speculated only past max_seq");
                }
            }
        }
    }

    /// Map the first `bytes` of the readback buffer (after the last submission) and copy them out.
    fn read_back(&self, bytes: u64) -> Result<Vec<u8>> {
        Ok(self.gpu.map_read(&self.acts.readback, bytes)?)
    }

    /// Build every call object of a step of `t` tokens.
    fn build_step(&self, t: u32, head: Head, chained: bool) -> Result<Step> {
        let gpu = &self.gpu;
        let a = &self.acts;
        let cfg = &self.cfg;
        let hid = cfg.hidden_size as u32;
        let eps = cfg.rms_norm_eps as f32;
        let kk = cfg.conv_kernel_size as u32;
        let mut recs = Vec::new();
        let mut marks = Marks::default();
        marks.at(&recs, Phase::Other);

        let shards: Vec<EmbedShard<'_>> = self
            .embed_shards
            .iter()
            .map(|(b, r0, n, bf)| EmbedShard {
                buffer: b,
                first_row: *r0,
                n_rows: *n,
                bf16: *bf,
            })
            .collect();
        recs.push(Rec::Call(
            EmbedNorm {
                tokens: t,
                hidden: hid,
                eps,
                ids_off: 0,
            }
            .bind(
                gpu,
                if chained { &a.argmax } else { &a.ids },
                &shards,
                &self.embed_norm,
                &a.h,
            )?,
        ));

        fn dense_args<'b>(
            x: &'b wgpu::Buffer,
            t: u32,
            pairs: &'b wgpu::Buffer,
            y: &'b wgpu::Buffer,
        ) -> GemvArgs<'b> {
            GemvArgs::new(x, t, pairs, t, y)
        }
        let dense = |x, y| dense_args(x, t, &a.dense_pairs, y);
        // With `set_fuse_residual`, one-token steps fuse each residual chain (conv input → short
        // conv → `h +=` → the next RMSNorm) into one dispatch (`SconvRmsNorm`); longer chunks, and
        // every step by default, keep the separate kernels.
        let fuse = t == 1 && self.fuse_residual;
        let n_layers = self.layers.len();
        // The norm that follows layer li's MLP residual when fused: (weight, output, div), or None
        // (an inner prefill chunk has no head after the last layer).
        let next_norm = |li: usize| -> Option<(&wgpu::Buffer, &wgpu::Buffer, Option<f32>)> {
            let mup = cfg.logits_mup_width_multiplier as f32;
            match self.layers.get(li + 1) {
                Some(nl) => Some((&nl.input_norm, &a.xn, None)),
                None => match head {
                    Head::None => None,
                    Head::Last | Head::All => Some((&self.norm, &a.hn, Some(mup))),
                },
            }
        };
        let fused = |li: usize, input: SconvInput<'_>, wi: usize, nw, y, div| -> Result<Rec> {
            let l = &self.layers[li];
            Ok(Rec::Call(
                SconvRmsNorm {
                    channels: hid,
                    kernel: kk,
                    eps,
                    div,
                }
                .bind(gpu, input, &l.conv_w[wi], &l.conv_state[wi], &a.h, nw, y)?,
            ))
        };
        // whether the last layer's MLP residual already produced the head's normed (and divided) row
        let head_fused = fuse && n_layers > 0 && next_norm(n_layers - 1).is_some();
        for (li, l) in self.layers.iter().enumerate() {
            let g = l.geom;
            let (h, kvh, d) = (g.heads as u32, g.kv_heads as u32, g.head_dim as u32);
            let kvd = kvh * d;
            let conv = |ch: u32,
                        acc: bool,
                        x: &wgpu::Buffer,
                        wi: usize,
                        y: &wgpu::Buffer|
             -> Result<Rec> {
                Ok(Rec::Call(
                    ShortConvKernel {
                        tokens: t,
                        channels: ch,
                        kernel: kk,
                        accumulate: acc,
                    }
                    .bind(gpu, x, &l.conv_w[wi], &l.conv_state[wi], y)?,
                ))
            };
            let what = |op: &'static str| Label {
                layer: Some(li as u16),
                op,
            };
            // attention block
            marks.at(&recs, Phase::Attention);
            if !(fuse && li > 0) {
                recs.push(Rec::Call(RmsNorm::rows(t, hid, eps).bind(
                    gpu,
                    &a.h,
                    &l.input_norm,
                    &a.xn,
                )?));
            }
            recs.push(l.q.call(gpu, dense(&a.xn, &a.q), what("q_proj"))?);
            recs.push(l.k.call(gpu, dense(&a.xn, &a.k_raw), what("k_proj"))?);
            recs.push(l.v.call(gpu, dense(&a.xn, &a.v_raw), what("v_proj"))?);
            recs.push(l.r.call(gpu, dense(&a.xn, &a.r), what("r_proj"))?);
            let shape = attn_shape(g, t, l.cache_capacity);
            if self.fuse_attention {
                // k/v convs, q/k norms, attention and the cache write: one dispatch for one token
                let io = FusedAttentionIo {
                    q: &a.q,
                    k_raw: &a.k_raw,
                    v_raw: &a.v_raw,
                    r: &a.r,
                    consts: &l.attn_consts,
                    k_cache: &l.k_cache,
                    v_cache: &l.v_cache,
                    out: &a.attn,
                    k_new: &a.k_new,
                    v_new: &a.v_new,
                };
                recs.push(Rec::Call(FusedAttention::new(shape, kk, eps).bind(
                    gpu,
                    &self.pos_buf,
                    &io,
                )?));
            } else {
                // k and v convs in one dispatch
                recs.push(Rec::Call(
                    ShortConvKernel {
                        tokens: t,
                        channels: kvd,
                        kernel: kk,
                        accumulate: false,
                    }
                    .bind_pair(
                        gpu,
                        [&a.k_raw, &l.conv_w[0], &l.conv_state[0], &a.k_new],
                        [&a.v_raw, &l.conv_w[1], &l.conv_state[1], &a.v_new],
                    )?,
                ));
                recs.push(Rec::Call(
                    RmsNorm::rows(t * h, d, eps).bind_inplace(gpu, &a.q, &l.q_norm)?,
                ));
                recs.push(Rec::Call(
                    RmsNorm::rows(t * kvh, d, eps).bind_inplace(gpu, &a.k_new, &l.k_norm)?,
                ));
                recs.push(Rec::Call(shape.bind(
                    gpu,
                    &self.pos_buf,
                    &a.q,
                    &a.k_new,
                    &a.v_new,
                    &a.r,
                    &l.rel_proj,
                    &l.k_cache,
                    &l.v_cache,
                    &a.attn,
                )?));
            }
            recs.push(l.o.call(gpu, dense(&a.attn, &a.o), what("o_proj"))?);
            // MLP block
            if fuse {
                marks.at(&recs, Phase::Other);
                recs.push(fused(
                    li,
                    SconvInput::Plain(&a.o),
                    2,
                    &l.post_norm,
                    &a.xn,
                    None,
                )?);
            } else {
                recs.push(conv(hid, true, &a.o, 2, &a.h)?);
                marks.at(&recs, Phase::Other);
                recs.push(Rec::Call(RmsNorm::rows(t, hid, eps).bind(
                    gpu,
                    &a.h,
                    &l.post_norm,
                    &a.xn,
                )?));
            }
            let tail = if fuse { next_norm(li) } else { None };
            match &l.mlp {
                MlpGpu::Dense {
                    ffn,
                    inter,
                    global_scale,
                } => {
                    marks.at(&recs, Phase::Dense);
                    recs.push(
                        ffn.gate_up
                            .call(gpu, dense(&a.xn, &a.gu), what("dense gate_up"))?,
                    );
                    recs.push(Rec::Call(
                        SiluMul {
                            rows: t,
                            i: *inter,
                            layout: SiluMulLayout::fused(*inter),
                        }
                        .bind(gpu, &a.gu, &a.gu, &a.act)?,
                    ));
                    recs.push(
                        ffn.down
                            .call(gpu, dense(&a.act, &a.m), what("dense down"))?,
                    );
                    match tail {
                        Some((nw, y, div)) => {
                            marks.at(&recs, Phase::Other);
                            recs.push(fused(
                                li,
                                SconvInput::Scaled(&a.m, *global_scale),
                                3,
                                nw,
                                y,
                                div,
                            )?)
                        }
                        None => {
                            recs.push(Rec::Call(
                                MulConst {
                                    n: t * hid,
                                    c: *global_scale,
                                }
                                .bind(gpu, &a.m)?,
                            ));
                            marks.at(&recs, Phase::Other);
                            recs.push(conv(hid, true, &a.m, 3, &a.h)?);
                        }
                    }
                }
                MlpGpu::Moe {
                    router,
                    bias,
                    scale,
                    top_k,
                    routed,
                    shared,
                    inter,
                    ..
                } => {
                    let ns = shared.as_ref().map_or(0, |s| s.n as u32);
                    let ne = cfg.n_routed_experts as u32;
                    marks.at(&recs, Phase::Router);
                    recs.push(router.call(gpu, dense(&a.xn, &a.router_logits), what("router"))?);
                    recs.push(Rec::Call(
                        RouterShape {
                            tokens: t,
                            n_routed: ne,
                            n_shared: ns,
                            top_k: *top_k,
                            scale: *scale,
                        }
                        .bind_checked(
                            gpu,
                            &a.router_logits,
                            bias,
                            &a.pairs,
                            &a.gammas,
                            &a.shared_gammas,
                            (&a.argmax, &self.pos_buf.buffer),
                            li as u32,
                        )?,
                    ));
                    // shared experts first (static pairs), so they do not wait on routing
                    if let Some(sh) = shared {
                        marks.at(&recs, Phase::Shared);
                        let np = t * ns;
                        let io = FfnIo {
                            x: &a.xn,
                            tokens: t,
                            pairs: &a.shared_pairs,
                            n_pairs: np,
                        };
                        sh.record_ffn(
                            gpu,
                            &mut recs,
                            io,
                            *inter,
                            (&a.gu, &a.act),
                            &a.y_shared,
                            (what("shared gate_up"), what("shared down")),
                        )?;
                    }
                    let np = t * top_k;
                    marks.at(&recs, Phase::Routed);
                    match routed {
                        Some(routed) => {
                            let io = FfnIo {
                                x: &a.xn,
                                tokens: t,
                                pairs: &a.pairs,
                                n_pairs: np,
                            };
                            routed.record_ffn(
                                gpu,
                                &mut recs,
                                io,
                                *inter,
                                (&a.gu, &a.act),
                                &a.y_routed,
                                (what("routed gate_up"), what("routed down")),
                            )?;
                        }
                        None => recs.push(Rec::Routed(li)),
                    }
                    marks.at(&recs, Phase::Other);
                    let sh = shared.as_ref().map(|_| (&a.y_shared, &a.shared_gammas, ns));
                    match tail {
                        Some((nw, y, div)) => recs.push(fused(
                            li,
                            SconvInput::MoeCombine {
                                routed: &a.y_routed,
                                gammas: &a.gammas,
                                top_k: *top_k,
                                shared: sh,
                            },
                            3,
                            nw,
                            y,
                            div,
                        )?),
                        None => {
                            recs.push(Rec::Call(
                                MoeCombine {
                                    tokens: t,
                                    hidden: hid,
                                    top_k: *top_k,
                                    weight_routed: true,
                                    weight_shared: true,
                                    accumulate: false,
                                }
                                .bind(
                                    gpu,
                                    &a.y_routed,
                                    &a.gammas,
                                    sh,
                                    &a.m,
                                )?,
                            ));
                            recs.push(conv(hid, true, &a.m, 3, &a.h)?);
                        }
                    }
                }
            }
        }

        // head
        let mup = cfg.logits_mup_width_multiplier as f32;
        marks.at(&recs, Phase::Head);
        match head {
            Head::None => {}
            Head::Last => {
                if !head_fused {
                    let mut n = RmsNorm::rows(1, hid, eps);
                    n.x_off = (t - 1) * hid;
                    recs.push(Rec::Call(n.bind(gpu, &a.h, &self.norm, &a.hn)?));
                    recs.push(Rec::Call(DivConst { n: hid, c: mup }.bind(gpu, &a.hn)?));
                }
                recs.push(self.lm_head.call(
                    gpu,
                    GemvArgs::new(&a.hn, 1, &a.dense_pairs, 1, &a.logits),
                    Label::op("lm_head"),
                )?);
                recs.push(Rec::Call(
                    Argmax {
                        vocab: cfg.logits_width() as u32,
                        out_idx: 0,
                    }
                    .bind_flagged(
                        gpu,
                        &a.logits,
                        &a.argmax,
                        Some(status::LOGITS_BAD as u32),
                    )?,
                ));
            }
            Head::All => {
                if !head_fused {
                    recs.push(Rec::Call(
                        RmsNorm::rows(t, hid, eps).bind(gpu, &a.h, &self.norm, &a.hn)?,
                    ));
                    recs.push(Rec::Call(DivConst { n: t * hid, c: mup }.bind(gpu, &a.hn)?));
                }
                recs.push(
                    self.lm_head
                        .call(gpu, dense(&a.hn, &a.logits), Label::op("lm_head"))?,
                );
            }
        }
        let segs = marks.segments(recs.len());
        Ok(Step { recs, segs })
    }
}

/// Stage routed expert `a.expert` for slot `a.slot` (the copies are pushed onto `copies`, run
/// by the caller); returns the bytes it reads from the mapped weights.
fn stage_expert<'s>(
    gpu: &Gpu,
    pool: &Experts,
    experts: &'s [Ffn<'s>],
    a: Assign,
    copies: &mut Vec<StagedCopy<'s>>,
) -> Result<u64> {
    let f = experts
        .get(a.expert as usize)
        .with_context(|| format!("routed expert {} does not exist", a.expert))?;
    let (gu, gus, dn, dns) = super::stream::expert_pieces(f);
    let s = a.slot as usize;
    let mut n = pool
        .gate_up
        .w
        .stage_expert(&gpu.queue, s, &gu, &gus, UPLOAD_PIECE, copies)
        .context("staging an expert's gate_up for its slot")?;
    n += pool
        .down
        .w
        .stage_expert(&gpu.queue, s, &[dn], &[dns], UPLOAD_PIECE, copies)
        .context("staging an expert's down for its slot")?;
    Ok(n)
}

/// Largest single staged copy of an expert upload (pieces split so that one or two misses still
/// spread over the upload threads).
const UPLOAD_PIECE: usize = 4 << 20;

/// Threads copying misses from the mapped weights: the cores, at most 8.
fn upload_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
}

/// One streamed layer's routed experts: which layer, its token count `t`, the hidden size, the
/// router's `(expert, token, weight_idx, pad)` pairs, and whether to inject a failure.
struct LayerJob<'p> {
    layer: usize,
    t: u32,
    hid: u32,
    pairs: &'p [[u32; 4]],
    fail: bool,
}

/// One layer's routed experts on the GPU through the slot pool (see [`super::stream`]): rounds
/// from the cache, each round's hits then loads as their own submissions. On an error the caller
/// forgets the layer's slots ([`ExpertCache::forget_layer`]): what this plan installed may not
/// have reached the GPU.
fn routed_streamed(gpu: &Gpu, a: &Acts, sg: &mut StreamGpu<'_>, job: &LayerJob<'_>) -> Result<()> {
    let LayerJob {
        layer,
        t,
        hid,
        pairs,
        fail,
    } = *job;
    if fail {
        // the test hook: the layer's GPU work fails before any of it ran
        bail!("injected GPU failure (layer {layer})");
    }
    let experts: Vec<u32> = pairs.iter().map(|p| p[0]).collect();
    let rounds = sg
        .host
        .cache
        .plan_layer(layer, &experts)
        .map_err(|e| anyhow::anyhow!("layer {layer}: {e}"))?;
    for round in &rounds {
        for part in super::stream::round_parts(&round.assign) {
            if part[0].load {
                let t0 = std::time::Instant::now();
                let mut copies = Vec::new();
                for &x in &part {
                    sg.host.stats.bytes_read +=
                        stage_expert(gpu, &sg.pool, sg.host.experts[layer], x, &mut copies)?;
                    sg.host.stats.uploads += 1;
                }
                run_staged(copies, sg.threads);
                let dt = t0.elapsed().as_secs_f64();
                sg.host.stats.upload_s += dt;
                if t == 1 {
                    sg.host.stats.decode_upload_s += dt;
                }
            }
            let slot_of: HashMap<u32, u32> = part.iter().map(|x| (x.expert, x.slot)).collect();
            let mut compact: Vec<[u32; 4]> = Vec::new();
            let mut rows: Vec<usize> = Vec::new();
            for (p, pr) in pairs.iter().enumerate() {
                if let Some(&slot) = slot_of.get(&pr[0]) {
                    compact.push([slot, pr[1], pr[2], 0]);
                    rows.push(p);
                }
            }
            let n = compact.len() as u32;
            gpu.queue
                .write_buffer(&sg.part_pairs, 0, bytemuck::cast_slice(&compact));
            if !sg.part_calls.contains_key(&(t, n)) {
                let mut recs = Vec::new();
                sg.pool.record_ffn(
                    gpu,
                    &mut recs,
                    FfnIo {
                        x: &a.xn,
                        tokens: t,
                        pairs: &sg.part_pairs,
                        n_pairs: n,
                    },
                    sg.inter,
                    (&a.gu, &a.act),
                    &sg.y_part,
                    (
                        Label::op("streamed routed gate_up"),
                        Label::op("streamed routed down"),
                    ),
                )?;
                sg.part_calls.insert((t, n), recs);
            }
            let mut enc = gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("streamed experts"),
                });
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("streamed experts"),
                    timestamp_writes: None,
                });
                for r in &sg.part_calls[&(t, n)] {
                    r.record_in_pass(&mut pass);
                }
            }
            let row = 4 * hid as u64;
            for (j, &p) in rows.iter().enumerate() {
                enc.copy_buffer_to_buffer(
                    &sg.y_part,
                    j as u64 * row,
                    &a.y_routed,
                    p as u64 * row,
                    row,
                );
            }
            gpu.queue.submit([enc.finish()]);
        }
    }
    Ok(())
}

impl GpuModel<'_> {
    /// Streaming mode: record the step's recs into `enc`, cutting it at every routed-expert marker
    /// (submit, read the router's pairs back, place and run the routed experts, go on); returns
    /// the encoder holding the rest of the step.
    fn record_streamed(
        &mut self,
        key: StepKey,
        mut enc: wgpu::CommandEncoder,
    ) -> Result<wgpu::CommandEncoder> {
        let t = key.0;
        let pos = self.pos;
        let hid = self.cfg.hidden_size as u32;
        let GpuModel {
            gpu,
            acts: a,
            steps,
            stream,
            layers,
            ..
        } = self;
        let sg = stream.as_mut().expect("streaming");
        let recs = &steps[&key].recs;
        let mut i = 0;
        loop {
            let j = recs[i..]
                .iter()
                .position(|r| matches!(r, Rec::Routed(_)))
                .map_or(recs.len(), |k| i + k);
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("inkling forward (streamed)"),
                    timestamp_writes: None,
                });
                for r in &recs[i..j] {
                    r.record_in_pass(&mut pass);
                }
            }
            if j == recs.len() {
                return Ok(enc);
            }
            let Rec::Routed(li) = recs[j] else {
                unreachable!("a routed marker")
            };
            let MlpGpu::Moe { top_k, .. } = &layers[li].mlp else {
                unreachable!("a routed marker sits in a sparse layer")
            };
            // the router's pairs travel in the same submission into a persistent readback buffer
            let bytes = 16 * (t * top_k) as u64;
            enc.copy_buffer_to_buffer(&a.pairs, 0, &sg.pairs_rb, 0, bytes);
            gpu.queue.submit([enc.finish()]);
            let t0 = std::time::Instant::now();
            let raw = gpu
                .map_read(&sg.pairs_rb, bytes)
                .with_context(|| format!("reading back the router's choices of layer {li}"))?;
            sg.host.stats.routing_wait_s += t0.elapsed().as_secs_f64();
            let pairs: Vec<[u32; 4]> = bytemuck::pod_collect_to_vec(&raw);
            for p in &pairs {
                sg.host.usage.record(li, p[0]);
            }
            let fail = match sg.host.fail_at {
                Some((p, l)) if l == li && (pos..pos + t as usize).contains(&p) => {
                    sg.host.fail_at = None;
                    true
                }
                _ => false,
            };
            // GPU errors of the layer (out of memory, validation) come back here instead of
            // reaching wgpu's uncaptured-error handler, which panics
            let oom = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
            let invalid = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
            let job = LayerJob {
                layer: li,
                t,
                hid,
                pairs: &pairs,
                fail,
            };
            let res = routed_streamed(gpu, a, sg, &job);
            let scoped = [
                pollster::block_on(invalid.pop()),
                pollster::block_on(oom.pop()),
            ];
            let res = match (res, scoped) {
                (Err(e), _) => Err(e),
                (Ok(()), [Some(e), _] | [None, Some(e)]) => {
                    Err(anyhow::anyhow!("the GPU reported an error: {e}"))
                }
                (Ok(()), [None, None]) => Ok(()),
            };
            if let Err(e) = res {
                // what this layer's plan installed may not be on the GPU
                sg.host.cache.forget_layer(li);
                routed_on_cpu(gpu, a, sg, &job, &e)?;
            }
            enc = gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("inkling step (continued)"),
                });
            i = j + 1;
        }
    }
}

/// The CPU fallback of one layer's routed experts after a GPU failure: read the layer's MoE
/// input back, compute every pair's expert FFN on the CPU from the mapped bytes
/// ([`super::cpu::expert_ffn`]), and write the rows of `y_routed`. Warns once per model.
fn routed_on_cpu(
    gpu: &Gpu,
    a: &Acts,
    sg: &mut StreamGpu<'_>,
    job: &LayerJob<'_>,
    why: &anyhow::Error,
) -> Result<()> {
    let LayerJob {
        layer,
        t,
        hid,
        pairs,
        ..
    } = *job;
    if !sg.host.warned {
        eprintln!(
            "warning: the GPU step of layer {layer}'s routed experts failed ({why:#}); \
             recomputing it on the CPU from the mapped weights (further fallbacks are counted in the stats)"
        );
        sg.host.warned = true;
    }
    sg.host.stats.cpu_fallbacks += 1;
    let h = hid as usize;
    let x = gpu
        .read_f32(&a.xn, t as usize * h)
        .with_context(|| format!("CPU fallback of layer {layer}: the GPU is unreachable"))?;
    let experts = sg.host.experts[layer];
    let mut y = Vec::with_capacity(pairs.len() * h);
    for pr in pairs {
        let (e, tok) = (pr[0] as usize, pr[1] as usize);
        let f = experts.get(e).with_context(|| {
            format!("layer {layer}: the router chose expert {e}, which does not exist")
        })?;
        ensure!(
            tok < t as usize,
            "layer {layer}: a pair names token {tok} of {t}"
        );
        y.extend(super::cpu::expert_ffn(f, &x[tok * h..(tok + 1) * h]));
    }
    gpu.queue
        .write_buffer(&a.y_routed, 0, bytemuck::cast_slice(&y));
    Ok(())
}

impl super::Forward for GpuModel<'_> {
    fn forward(&mut self, tokens: &[u32]) -> anyhow::Result<Vec<f32>> {
        GpuModel::forward(self, tokens)
    }
    fn forward_all(&mut self, tokens: &[u32]) -> anyhow::Result<Vec<Vec<f32>>> {
        GpuModel::forward_all(self, tokens)
    }
    fn forward_greedy(&mut self, tokens: &[u32]) -> anyhow::Result<u32> {
        GpuModel::forward_greedy(self, tokens)
    }
    fn reset(&mut self) {
        GpuModel::reset(self)
    }
    fn position(&self) -> usize {
        GpuModel::position(self)
    }
    fn greedy_stream(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        on_id: &mut dyn FnMut(u32) -> anyhow::Result<bool>,
    ) -> anyhow::Result<bool> {
        GpuModel::greedy_stream(self, prompt, max_new, on_id)
    }
    fn backend(&self) -> &'static str {
        "gpu"
    }
    fn adapter(&self) -> String {
        self.gpu.describe()
    }
}

/// Little-endian u32 words of `b`.
fn words(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
        .collect()
}
