//! What the GPU model keeps on the device, and its upload from [`Weights`]: every linear as a
//! [`GpuWeights`] slab, norms and conv weights as f32 buffers, the KV caches and conv states of each
//! layer, the embedding table in binding-sized shards, and the activations of one chunk.
use crate::formats::{Format, QMatrix};
use crate::gpu::linear::args::{GemvArgs, NO_GAMMA};
use crate::gpu::linear::gemv_pair;
use crate::gpu::linear::route::LinearOptions;
use crate::gpu::linear::slab::GpuWeights;
use crate::gpu::ops::{attention_consts, AttentionShape, EmbedShard, FusedAttention, PosBuffer};
use crate::gpu::{Call, Gpu};
use crate::model::config::{AttnGeom, TextConfig};
use crate::model::status;
use crate::model::weights::{Ffn, Mlp, Weights};
use anyhow::{ensure, Context, Result};
use std::borrow::Cow;
use std::ops::Range;

/// The dense matrices of one linear (or of a slab of experts), uploaded.
pub(super) struct Linear {
    pub w: GpuWeights,
    pub ordinal: u32,
}

impl Linear {
    pub fn upload(gpu: &Gpu, mats: &[QMatrix<'_>], limit: u64, what: &str) -> Result<Linear> {
        let w = GpuWeights::upload_with_limit(gpu, mats, limit)
            .with_context(|| format!("uploading {what}"))?;
        Ok(Linear::from_weights(w))
    }

    pub fn from_weights(w: GpuWeights) -> Linear {
        let ordinal = w.encoding().format.ordinal();
        Linear { w, ordinal }
    }

    /// The GEMV (or GEMM) `args` over these weights under `opts`, labelled `op`.
    pub fn call(
        &self,
        gpu: &Gpu,
        args: GemvArgs<'_>,
        opts: &LinearOptions,
        op: &'static str,
    ) -> Result<Call> {
        let mut c = self
            .w
            .bind_with(gpu, self.ordinal, args, opts)
            .with_context(|| format!("binding the {op} GEMV"))?;
        c.label.op = op;
        Ok(c)
    }

    /// GEMVs `a` and `b` (each over its linear) under `opts` as one dispatch labelled `op`, or
    /// `None` where they do not pair ([`gemv_pair::bind_pair`]: among other reasons, when one
    /// binds a buffer the other writes; the caller then records each, in order).
    pub fn pair_call(
        gpu: &Gpu,
        a: (&Linear, GemvArgs<'_>),
        b: (&Linear, GemvArgs<'_>),
        opts: &LinearOptions,
        op: &'static str,
    ) -> Result<Option<Call>> {
        let pair = gemv_pair::bind_pair(gpu, a.0.half(a.1, opts), b.0.half(b.1, opts))
            .with_context(|| format!("binding the {op} GEMV pair"))?;
        Ok(pair.map(|mut c| {
            c.label.op = op;
            c
        }))
    }

    /// This linear with `args` under `opts` as one half of a GEMV pair.
    fn half<'b>(&'b self, args: GemvArgs<'b>, opts: &'b LinearOptions) -> gemv_pair::Half<'b> {
        gemv_pair::Half {
            w: &self.w,
            ordinal: self.ordinal,
            args,
            opts,
        }
    }

    /// Weight + scale bytes of every expert of the slab.
    pub fn bytes(&self) -> u64 {
        self.w.expert_bytes() * self.w.experts() as u64
    }
}

/// The rows of `mats` (one encoding and column count, at least one matrix), in order, as one
/// matrix: any encoding, since rows are independent, so row bytes and per-row scales simply
/// concatenate.
fn concat_rows(mats: &[&QMatrix<'_>]) -> QMatrix<'static> {
    let mut data = Vec::with_capacity(mats.iter().map(|m| m.data.len()).sum());
    let mut scales = Vec::with_capacity(mats.iter().map(|m| m.scales.len()).sum());
    for m in mats {
        data.extend_from_slice(&m.data);
        scales.extend_from_slice(&m.scales);
    }
    QMatrix {
        enc: mats[0].enc,
        rows: mats.iter().map(|m| m.rows).sum(),
        cols: mats[0].cols,
        data: Cow::Owned(data),
        scales: Cow::Owned(scales),
    }
}

/// `gate` rows then `up` rows of one SwiGLU as one `[2I, H]` matrix.
fn gate_up(f: &Ffn<'_>) -> QMatrix<'static> {
    concat_rows(&[&f.gate, &f.up])
}

/// A layer's q, k, v and r projections of the normed input (`[Rq, H]`, `[Rk, H]`, `[Rv, H]`,
/// `[Rr, H]`), uploaded.
pub(super) enum Projections {
    /// One slab `[Rq + Rk + Rv + Rr, H]`: q rows, then k, v and r rows (one encoding).
    Joint { w: Linear, rows: [u32; 4] },
    /// Four slabs in the order q, k, v, r (their encodings differ).
    Separate([Linear; 4]),
}

impl Projections {
    /// Upload `[q, k, v, r]` of layer `layer` as one slab when they share their encoding, else as
    /// four.
    fn upload(gpu: &Gpu, m: [&QMatrix<'_>; 4], limit: u64, layer: usize) -> Result<Projections> {
        let what = |p: &str| format!("layer {layer} {p}");
        if m.iter().all(|x| x.enc == m[0].enc && x.cols == m[0].cols) {
            let joint = concat_rows(&m);
            let w = Linear::upload(
                gpu,
                std::slice::from_ref(&joint),
                limit,
                &what("q/k/v/r_proj"),
            )?;
            return Ok(Projections::Joint {
                w,
                rows: m.map(|x| x.rows as u32),
            });
        }
        let mut lin = Vec::with_capacity(4);
        for (x, p) in m.iter().zip(["q_proj", "k_proj", "v_proj", "r_proj"]) {
            lin.push(Linear::upload(
                gpu,
                std::slice::from_ref(*x),
                limit,
                &what(p),
            )?);
        }
        Ok(Projections::Separate(
            lin.try_into().ok().expect("four projections"),
        ))
    }

    /// The uploaded slabs.
    pub fn linears(&self) -> Vec<&Linear> {
        match self {
            Projections::Joint { w, .. } => vec![w],
            Projections::Separate(l) => l.iter().collect(),
        }
    }

    /// Rows of the joint slab (0 for separate slabs).
    fn joint_rows(&self) -> usize {
        match self {
            Projections::Joint { rows, .. } => rows.iter().map(|&r| r as usize).sum(),
            Projections::Separate(_) => 0,
        }
    }
}

/// `n` SwiGLU FFNs as two slabs: a dense MLP (`n = 1`), a layer's shared or routed experts, or the
/// slot pool of expert streaming.
pub(super) struct FfnSlab {
    /// `[2I, H]` per expert (gate rows, then up rows).
    pub gate_up: Linear,
    /// `[H, I]` per expert.
    pub down: Linear,
    pub n: usize,
}

impl FfnSlab {
    pub fn upload(gpu: &Gpu, ffns: &[Ffn<'_>], limit: u64, what: &str) -> Result<Option<FfnSlab>> {
        if ffns.is_empty() {
            return Ok(None);
        }
        let gu: Vec<QMatrix<'static>> = ffns.iter().map(gate_up).collect();
        let gate_up = Linear::upload(gpu, &gu, limit, &format!("{what} gate_up"))?;
        drop(gu);
        let dn: Vec<QMatrix<'_>> = ffns.iter().map(|f| f.down.clone()).collect();
        let down = Linear::upload(gpu, &dn, limit, &format!("{what} down"))?;
        Ok(Some(FfnSlab {
            gate_up,
            down,
            n: ffns.len(),
        }))
    }

    /// Weight + scale bytes of one FFN of the slab.
    pub fn ffn_bytes(&self) -> u64 {
        self.gate_up.w.expert_bytes() + self.down.w.expert_bytes()
    }
}

/// The dense MLP of a dense layer.
pub(super) struct DenseMlp {
    pub ffn: FfnSlab,
    pub inter: u32,
    pub global_scale: f32,
}

/// The MoE of a sparse layer.
pub(super) struct MoeMlp {
    pub router: Linear,
    pub bias: wgpu::Buffer,
    /// `route_scale × gate.global_scale`.
    pub scale: f32,
    pub top_k: u32,
    /// `None` when the routed experts stream through the expert slots.
    pub routed: Option<FfnSlab>,
    /// Weight + scale bytes of one routed expert (gate, up and down).
    pub expert_bytes: u64,
    pub shared: Option<FfnSlab>,
    pub inter: u32,
}

/// The MLP of one layer.
// One per layer, so the size difference between the variants does not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum ResidentMlp {
    Dense(DenseMlp),
    Moe(MoeMlp),
}

/// One decoder layer on the GPU: weights, KV cache and conv states.
pub(super) struct ResidentLayer {
    pub geom: AttnGeom,
    pub input_norm: wgpu::Buffer,
    pub post_norm: wgpu::Buffer,
    /// q, k, v and r projections.
    pub proj: Projections,
    pub o: Linear,
    pub q_norm: wgpu::Buffer,
    pub k_norm: wgpu::Buffer,
    pub rel_proj: wgpu::Buffer,
    /// k_sconv, v_sconv, attn_sconv, mlp_sconv weights `[C, K]`.
    pub conv_w: [wgpu::Buffer; 4],
    /// Their states: `[K−1, C]` for k and v (the unfused attention's, one sequence slot), `[slots,
    /// K−1, C]` for attn and mlp.
    pub conv_state: [wgpu::Buffer; 4],
    /// `[slots, cache_capacity + K, KVH·D]` each: per sequence slot the KV cache, then the k/v
    /// conv ring of [`FusedAttention`] (byte range `conv_ring` of the slot's block).
    pub k_cache: wgpu::Buffer,
    pub v_cache: wgpu::Buffer,
    pub cache_capacity: u32,
    pub conv_ring: Range<u64>,
    /// Bytes of one slot's block of `k_cache` / `v_cache`.
    pub cache_slot_bytes: u64,
    /// Bytes of one slot's block of the attn and mlp conv states.
    pub conv_slot_bytes: u64,
    /// rel_proj, q_norm, k_norm and the k/v conv weights as one buffer ([`attention_consts`]).
    pub attn_consts: wgpu::Buffer,
    pub mlp: ResidentMlp,
}

impl ResidentLayer {
    /// The attention shape of this layer for chunks of `t` tokens.
    pub fn attn_shape(&self, t: u32) -> AttentionShape {
        attn_shape(self.geom, t, self.cache_capacity)
    }
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

/// Index of each short conv in [`ResidentLayer::conv_w`] / `conv_state`.
pub(super) const K_SCONV: usize = 0;
pub(super) const V_SCONV: usize = 1;
pub(super) const ATTN_SCONV: usize = 2;
pub(super) const MLP_SCONV: usize = 3;

/// Activation buffers for a chunk of up to `max_chunk` tokens (sized for the widest layer).
pub(super) struct Activations {
    pub ids: wgpu::Buffer,
    pub h: wgpu::Buffer,
    pub xn: wgpu::Buffer,
    pub q: wgpu::Buffer,
    pub k_raw: wgpu::Buffer,
    pub v_raw: wgpu::Buffer,
    /// Joint q‖k‖v‖r projection outputs `[T, Rq + Rk + Rv + Rr]` before their split.
    pub qkvr: wgpu::Buffer,
    pub k_new: wgpu::Buffer,
    pub v_new: wgpu::Buffer,
    pub r: wgpu::Buffer,
    pub attn: wgpu::Buffer,
    pub o: wgpu::Buffer,
    /// gate‖up outputs `[rows, 2I]` (dense, shared or routed; reused in turn).
    pub gu: wgpu::Buffer,
    /// silu(gate)·up `[rows, I]` (dense or routed).
    pub act: wgpu::Buffer,
    /// The shared experts' silu(gate)·up `[T·S, I]`: apart from `act`, so the shared down can
    /// run beside the routed gate_up ([`crate::gpu::linear::gemv_pair`]).
    pub act_shared: wgpu::Buffer,
    /// Routed down outputs `[T·top_k, H]`.
    pub y_routed: wgpu::Buffer,
    /// Shared down outputs `[T·S, H]`.
    pub y_shared: wgpu::Buffer,
    /// MLP output `[T, H]` (input of mlp_sconv).
    pub m: wgpu::Buffer,
    pub router_logits: wgpu::Buffer,
    pub pairs: wgpu::Buffer,
    pub gammas: wgpu::Buffer,
    pub shared_gammas: wgpu::Buffer,
    /// Dense pairs `(0, t, NO_GAMMA)`, t < max_chunk (16-byte pairs).
    pub dense_pairs: wgpu::Buffer,
    /// Shared-expert pairs `(s, t, NO_GAMMA)` at `p = t·S + s` (16-byte pairs).
    pub shared_pairs: wgpu::Buffer,
    pub hn: wgpu::Buffer,
    /// Logits `[max_chunk, logits_width]`.
    pub logits: wgpu::Buffer,
    /// The greedy id, then the rest of the status words ([`status::WORDS`] u32).
    pub argmax: wgpu::Buffer,
    /// `[p, 0, 0, 0]` for every position p < max_seq: a chained step copies its position from here
    /// into the position uniform on the device (no host write per step).
    pub positions: wgpu::Buffer,
    /// The slot table of a decode batch: `[pos, slot, 0, 0]` u32 per token (max_chunk entries).
    pub seq: wgpu::Buffer,
}

/// One embedding shard on the GPU (see [`EmbedShard`]).
pub(super) struct EmbedBuf {
    pub buffer: wgpu::Buffer,
    pub first_row: u32,
    pub n_rows: u32,
    pub bf16: bool,
}

/// Everything resident on the GPU.
pub(super) struct Resident {
    pub embed: Vec<EmbedBuf>,
    /// Bytes of one embedding row as stored on the GPU.
    pub embed_row_bytes: u64,
    pub embed_norm: wgpu::Buffer,
    pub norm: wgpu::Buffer,
    pub lm_head: Linear,
    pub layers: Vec<ResidentLayer>,
    pub acts: Activations,
    /// The position uniform of the attention kernels.
    pub pos: PosBuffer,
    /// Largest `top_k` of any sparse layer (1 without one).
    pub max_topk: usize,
    /// How every linear's calls are built ([`super::GpuModelOptions::linear`]).
    pub linear: LinearOptions,
    /// Hidden size (floats per row of `h`).
    pub hidden: u32,
}

fn f32_buf(gpu: &Gpu, label: &str, v: &[f32]) -> wgpu::Buffer {
    gpu.storage_init(label, bytemuck::cast_slice(v))
}

/// A storage buffer of `floats` f32 (wgpu zero-initialises new buffers).
pub(super) fn zeroed(gpu: &Gpu, label: &str, floats: usize) -> wgpu::Buffer {
    gpu.storage(label, 4 * floats.max(1) as u64)
}

/// What [`Resident::upload`] sizes the buffers for.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sizes {
    /// Tokens per sequence (the full layers' KV capacity).
    pub max_seq: usize,
    /// Tokens per submission.
    pub max_chunk: usize,
    /// Largest weight buffer in bytes.
    pub limit: u64,
    /// Leave the routed experts on the host.
    pub stream_routed: bool,
    /// Sequence slots: KV caches and conv states hold one block per slot.
    pub seq_slots: usize,
}

impl Resident {
    /// Upload `w` for `sz.seq_slots` sequences of `sz.max_seq` tokens and chunks of
    /// `sz.max_chunk`, with weight buffers of at most `sz.limit` bytes; `sz.stream_routed`
    /// leaves the routed experts on the host.
    pub fn upload(gpu: &Gpu, w: &Weights<'_>, sz: Sizes) -> Result<Resident> {
        let Sizes {
            max_seq,
            max_chunk,
            limit,
            ..
        } = sz;
        let cfg = &w.config;
        let hid = cfg.hidden_size;

        // Embedding table: raw f32/bf16 bytes in binding-sized shards; other encodings are
        // dequantised to f32.
        let vocab = cfg.vocab_size;
        let (bf16, raw): (bool, Option<&[u8]>) = match w.embed.enc.format {
            Format::F32 => (false, Some(&w.embed.data)),
            Format::Bf16 => (true, Some(&w.embed.data)),
            _ => (false, None),
        };
        let row_bytes = if bf16 { 2 * hid } else { 4 * hid };
        let rows_per_shard = ((limit as usize / row_bytes).max(1)).min(vocab);
        let mut embed = Vec::new();
        for r0 in (0..vocab).step_by(rows_per_shard) {
            let r1 = (r0 + rows_per_shard).min(vocab);
            let buffer = match raw {
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
            embed.push(EmbedBuf {
                buffer,
                first_row: r0 as u32,
                n_rows: (r1 - r0) as u32,
                bf16,
            });
        }
        let embed_norm = f32_buf(gpu, "embed_norm", &w.embed_norm);
        let norm = f32_buf(gpu, "norm", &w.norm);
        let width = cfg.logits_width();
        let lm_head = Linear::upload(gpu, &[w.lm_head.rows_view(0, width)], limit, "lm_head")?;

        // Widest activation of any layer.
        let mut widest = Widest::default();
        let mut layers = Vec::with_capacity(w.layers.len());
        for i in 0..w.layers.len() {
            layers.push(upload_layer(gpu, cfg, w, i, sz, &mut widest)?);
        }
        let acts = Activations::new(gpu, cfg, max_seq, max_chunk, &widest);
        Ok(Resident {
            embed,
            embed_row_bytes: row_bytes as u64,
            embed_norm,
            norm,
            lm_head,
            layers,
            acts,
            pos: PosBuffer::new(gpu, 0),
            max_topk: widest.topk,
            hidden: hid as u32,
            linear: LinearOptions::default(),
        })
    }

    /// The embedding shards as the embedding kernel binds them.
    pub fn embed_shards(&self) -> Vec<EmbedShard<'_>> {
        self.embed
            .iter()
            .map(|s| EmbedShard {
                buffer: &s.buffer,
                first_row: s.first_row,
                n_rows: s.n_rows,
                bf16: s.bf16,
            })
            .collect()
    }

    /// Queue the clearing of sequence slot `slot`'s conv states and fused-attention conv rings
    /// (a new sequence in that slot).
    pub fn clear_slot(&self, gpu: &Gpu, slot: usize) {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        let slot = slot as u64;
        for l in &self.layers {
            for s in &l.conv_state[..ATTN_SCONV] {
                enc.clear_buffer(s, 0, None);
            }
            let n = l.conv_slot_bytes;
            if n > 0 {
                for s in &l.conv_state[ATTN_SCONV..] {
                    enc.clear_buffer(s, slot * n, Some(n));
                }
            }
            let ring = &l.conv_ring;
            let at = slot * l.cache_slot_bytes;
            for c in [&l.k_cache, &l.v_cache] {
                enc.clear_buffer(c, at + ring.start, Some(ring.end - ring.start));
            }
        }
        gpu.queue.submit([enc.finish()]);
    }
}

/// The widest per-token activations over the layers (at least 1 each).
struct Widest {
    qd: usize,
    kvd: usize,
    r: usize,
    /// Rows of the widest joint q/k/v/r slab.
    qkvr: usize,
    /// Per token: max(2·inter, top_k·2·moe_I, S·2·moe_I).
    gu: usize,
    topk: usize,
}

impl Default for Widest {
    fn default() -> Widest {
        Widest {
            qd: 1,
            kvd: 1,
            r: 1,
            qkvr: 1,
            gu: 1,
            topk: 1,
        }
    }
}

/// Upload layer `i` of `w` (sizes as in [`Resident::upload`]), widening `widest` to its
/// activations.
fn upload_layer(
    gpu: &Gpu,
    cfg: &TextConfig,
    w: &Weights<'_>,
    i: usize,
    sz: Sizes,
    widest: &mut Widest,
) -> Result<ResidentLayer> {
    let Sizes {
        max_seq,
        limit,
        stream_routed,
        seq_slots,
        ..
    } = sz;
    let lw = &w.layers[i];
    let hid = cfg.hidden_size;
    let kk = cfg.conv_kernel_size;
    let g = lw.attn.geom;
    widest.qd = widest.qd.max(g.q_dim());
    widest.kvd = widest.kvd.max(g.kv_dim());
    widest.r = widest.r.max(g.heads * g.d_rel);
    let aw = &lw.attn;
    let lin = |m: &QMatrix<'_>, what: &str| {
        Linear::upload(
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
    // per sequence slot: the cache rows, then the K rows of the fused attention's conv ring
    let kv_floats = seq_slots * (cache_capacity as usize + kk) * g.kv_dim();
    ensure!(
        (4 * kv_floats as u64) <= gpu.max_binding(),
        "layer {i}: {seq_slots} KV cache(s) of {cache_capacity} tokens (+ {kk} rows of conv \
         history) × {} floats need {} bytes, more than this adapter's largest storage binding ({} \
         bytes); use a shorter context (prompt + --max-tokens) or fewer sequence slots",
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
        zeroed(gpu, "attn_sconv state", seq_slots * (kk - 1) * hid),
        zeroed(gpu, "mlp_sconv state", seq_slots * (kk - 1) * hid),
    ];
    let eps = cfg.rms_norm_eps as f32;
    let fused = FusedAttention::new(attn_shape(g, 1, cache_capacity), kk as u32, eps);
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
    let proj = Projections::upload(gpu, [&aw.q, &aw.k, &aw.v, &aw.r], limit, i)?;
    widest.qkvr = widest.qkvr.max(proj.joint_rows());
    let mlp = match &lw.mlp {
        Mlp::Dense(d) => {
            let inter = d.ffn.gate.rows;
            widest.gu = widest.gu.max(2 * inter);
            ResidentMlp::Dense(DenseMlp {
                ffn: FfnSlab::upload(
                    gpu,
                    std::slice::from_ref(&d.ffn),
                    limit,
                    &format!("layer {i} dense mlp"),
                )?
                .expect("one ffn"),
                inter: inter as u32,
                global_scale: d.global_scale,
            })
        }
        Mlp::Moe(m) => {
            let inter = m.experts[0].gate.rows;
            let s = m.shared.len();
            widest.topk = widest.topk.max(m.top_k);
            let f0 = &m.experts[0];
            let expert_bytes = [&f0.gate, &f0.up, &f0.down]
                .iter()
                .map(|q| (q.data.len() + q.scales.len()) as u64)
                .sum();
            widest.gu = widest.gu.max(m.top_k.max(s) * 2 * inter);
            ResidentMlp::Moe(MoeMlp {
                router: lin(&m.router, "router")?,
                bias: f32_buf(gpu, "router bias", &m.router_bias),
                scale: m.route_scale * m.router_scale,
                top_k: m.top_k as u32,
                routed: if stream_routed {
                    None
                } else {
                    Some(
                        FfnSlab::upload(
                            gpu,
                            &m.experts,
                            limit,
                            &format!("layer {i} routed experts"),
                        )?
                        .context("a sparse layer without routed experts")?,
                    )
                },
                expert_bytes,
                shared: FfnSlab::upload(
                    gpu,
                    &m.shared,
                    limit,
                    &format!("layer {i} shared experts"),
                )?,
                inter: inter as u32,
            })
        }
    };
    Ok(ResidentLayer {
        geom: g,
        input_norm: f32_buf(gpu, "input_norm", &lw.input_norm),
        post_norm: f32_buf(gpu, "post_attn_norm", &lw.post_attn_norm),
        proj,
        o: lin(&aw.o, "o_proj")?,
        q_norm: f32_buf(gpu, "q_norm", &aw.q_norm),
        k_norm: f32_buf(gpu, "k_norm", &aw.k_norm),
        rel_proj: f32_buf(gpu, "rel_proj", &aw.rel_proj),
        conv_w,
        conv_state,
        k_cache: zeroed(gpu, "k cache", kv_floats),
        v_cache: zeroed(gpu, "v cache", kv_floats),
        cache_capacity,
        conv_ring: fused.ring_range(),
        cache_slot_bytes: fused.cache_bytes(),
        conv_slot_bytes: 4 * ((kk - 1) * hid) as u64,
        attn_consts: f32_buf(gpu, "attention constants", &attn_consts),
        mlp,
    })
}

impl Activations {
    fn new(
        gpu: &Gpu,
        cfg: &TextConfig,
        max_seq: usize,
        max_chunk: usize,
        wd: &Widest,
    ) -> Activations {
        let t = max_chunk;
        let hid = cfg.hidden_size;
        let s = cfg.n_shared_experts;
        let n_router = cfg.n_routed_experts + s;
        let dense_pairs: Vec<u32> = (0..t as u32).flat_map(|ti| [0, ti, NO_GAMMA, 0]).collect();
        let shared_pairs: Vec<u32> = (0..t as u32)
            .flat_map(|ti| (0..s as u32).flat_map(move |si| [si, ti, NO_GAMMA, 0]))
            .collect();
        Activations {
            ids: gpu.storage("ids", 4 * t as u64),
            h: zeroed(gpu, "h", t * hid),
            xn: zeroed(gpu, "xn", t * hid),
            q: zeroed(gpu, "q", t * wd.qd),
            k_raw: zeroed(gpu, "k_raw", t * wd.kvd),
            v_raw: zeroed(gpu, "v_raw", t * wd.kvd),
            qkvr: zeroed(gpu, "q/k/v/r", t * wd.qkvr),
            k_new: zeroed(gpu, "k_new", t * wd.kvd),
            v_new: zeroed(gpu, "v_new", t * wd.kvd),
            r: zeroed(gpu, "r", t * wd.r),
            attn: zeroed(gpu, "attn", t * wd.qd),
            o: zeroed(gpu, "o", t * hid),
            gu: zeroed(gpu, "gate_up", t * wd.gu),
            act: zeroed(gpu, "act", t * wd.gu / 2 + 1),
            act_shared: zeroed(gpu, "shared act", t * wd.gu / 2 + 1),
            y_routed: zeroed(gpu, "y_routed", t * wd.topk * hid),
            y_shared: zeroed(gpu, "y_shared", t * s.max(1) * hid),
            m: zeroed(gpu, "m", t * hid),
            router_logits: zeroed(gpu, "router logits", t * n_router.max(1)),
            pairs: gpu.storage("pairs", 16 * (t * wd.topk) as u64),
            gammas: zeroed(gpu, "gammas", t * wd.topk),
            shared_gammas: zeroed(gpu, "shared gammas", t * s.max(1)),
            dense_pairs: gpu.storage_init("dense pairs", bytemuck::cast_slice(&dense_pairs)),
            shared_pairs: gpu.storage_init("shared pairs", bytemuck::cast_slice(&shared_pairs)),
            hn: zeroed(gpu, "hn", t * hid),
            logits: zeroed(gpu, "logits", t * cfg.logits_width()),
            argmax: zeroed(gpu, "argmax and status", status::WORDS),
            positions: {
                let v: Vec<u32> = (0..max_seq as u32).flat_map(|p| [p, 0, 0, 0]).collect();
                gpu.storage_init("positions", bytemuck::cast_slice(&v))
            },
            seq: gpu.storage("decode batch slots", 16 * t as u64),
        }
    }
}
