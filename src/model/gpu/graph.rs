//! The Inkling recipe: the kernels one step runs, block by block, as a value ([`Step`]).
//!
//! A step of T tokens is the embedding, then per layer the attention block and the MLP block
//! (dense or MoE), then the head; each function below returns the calls of one block in the order
//! they run, with the phase marks the profiler times them by. Routing never goes through the CPU:
//! the router kernel writes the (expert, token) pairs the MoE GEMVs read. With expert streaming,
//! a layer's routed experts are a [`Node::Routed`] cut that the host fills between submissions.
//!
//! The attention block after the projections (k/v convs, q/k norms, attention, KV write) is one
//! [`FusedAttention`] call: one dispatch for a one-token step, a prologue plus the attention for
//! longer chunks. The separate kernels of that block ([`Fusions::attention`] off) are the fused
//! kernel's test oracle.
use super::resident::{
    DenseMlp, FfnSlab, Linear, MoeMlp, Projections, Resident, ResidentLayer, ResidentMlp,
    ATTN_SCONV, K_SCONV, MLP_SCONV, V_SCONV,
};
use crate::gpu::linear::args::{ConvEpilogue, GemvArgs};
use crate::gpu::linear::format::{self, RoutedGemv};
use crate::gpu::linear::route::{self, LinearOptions};
use crate::gpu::ops::{
    Argmax, DivConst, EmbedNorm, FusedAttention, FusedAttentionIo, MulConst, RmsNorm, RouterShape,
    ShortConvKernel, SiluMul, SiluMulLayout, SlotOf, SplitColumns,
};
use crate::gpu::{Call, Gpu};
use crate::model::config::TextConfig;
use crate::model::profile::Phase;
use crate::model::status;
use anyhow::Result;
use std::ops::Range;

/// What the head computes in a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Head {
    /// No head (an inner chunk of a long prefill).
    None,
    /// Logits of the last token only (plus its greedy argmax).
    Last,
    /// Logits of every token of the chunk.
    All,
}

/// What a recorded step is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct StepKey {
    pub tokens: u32,
    pub head: Head,
    /// The embedding reads its id from the previous step's argmax on the device (the pipelined
    /// greedy decode) instead of `ids`.
    pub chained: bool,
    /// A decode batch: token t is one token of sequence slot `seq[t].y` at its position
    /// `seq[t].x` (the activations' slot table), every slot different.
    pub batch: bool,
}

/// One entry of a step.
pub(super) enum Node {
    Call(Call),
    /// Expert streaming: the routed experts of `layer` go here, placed and run by the host
    /// between submissions. Never recorded into a pass.
    Routed {
        layer: usize,
    },
}

/// The calls of one step in order, and their phases.
pub(super) struct Step {
    pub nodes: Vec<Node>,
    /// Consecutive non-empty runs of `nodes` by phase (adjacent runs of one phase merged).
    pub phases: Vec<(Phase, Range<usize>)>,
}

impl Step {
    /// The calls of `blocks` in order.
    fn from_blocks(blocks: Vec<Block>) -> Step {
        let mut nodes = Vec::new();
        let mut marks = Vec::new();
        for b in blocks {
            let at = nodes.len();
            marks.extend(b.marks.into_iter().map(|(p, i)| (p, at + i)));
            nodes.extend(b.nodes);
        }
        let mut phases: Vec<(Phase, Range<usize>)> = Vec::new();
        for (i, &(p, start)) in marks.iter().enumerate() {
            let end = marks.get(i + 1).map_or(nodes.len(), |m| m.1);
            if end <= start {
                continue;
            }
            match phases.last_mut() {
                Some((q, r)) if *q == p && r.end == start => r.end = end,
                _ => phases.push((p, start..end)),
            }
        }
        Step { nodes, phases }
    }

    /// The passes of `layout`: (label, nodes), in order.
    pub fn passes(&self, layout: PassLayout) -> Vec<(&'static str, Range<usize>)> {
        match layout {
            PassLayout::Single => vec![("inkling forward", 0..self.nodes.len())],
            PassLayout::PerPhase => self
                .phases
                .iter()
                .map(|(p, r)| (p.key(), r.clone()))
                .collect(),
            PassLayout::PerCall => (0..self.nodes.len())
                .map(|i| ("per-op profile", i..i + 1))
                .collect(),
        }
    }

    /// The calls (streaming cuts left out).
    pub fn calls(&self) -> impl Iterator<Item = &Call> {
        self.nodes.iter().filter_map(|n| match n {
            Node::Call(c) => Some(c),
            Node::Routed { .. } => None,
        })
    }
}

/// How a step is cut into compute passes (same calls, same order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PassLayout {
    /// One pass (the default).
    Single,
    /// One pass per phase run.
    PerPhase,
    /// One pass per call.
    PerCall,
}

/// The calls of one block, with phase marks `(phase, index of its first node)`; every call of a
/// layer's block is labelled with the layer.
struct Block {
    layer: Option<usize>,
    nodes: Vec<Node>,
    marks: Vec<(Phase, usize)>,
}

impl Block {
    fn new(p: Phase, layer: Option<usize>) -> Block {
        Block {
            layer,
            nodes: Vec::new(),
            marks: vec![(p, 0)],
        }
    }

    /// The nodes pushed from now on belong to `p`.
    fn phase(&mut self, p: Phase) {
        self.marks.push((p, self.nodes.len()));
    }

    fn push(&mut self, c: Call) {
        self.nodes.push(Node::Call(match self.layer {
            Some(l) => at_layer(c, l),
            None => c,
        }));
    }
}

/// `c` labelled as part of decoder layer `layer`.
pub(super) fn at_layer(mut c: Call, layer: usize) -> Call {
    c.label.layer = Some(u16::try_from(layer).expect("layer index fits u16"));
    c
}

/// Which fused kernels the steps of a [`super::GpuModel`] run, a construction option
/// ([`super::GpuModelOptions::fusions`]). The default is the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fusions {
    /// The attention after the projections as [`FusedAttention`] (every chunk size; the
    /// default). Off: the separate kernels (conv pair, q and k norms, attention with KV append),
    /// kept only as the fused kernel's test oracle.
    pub attention: bool,
}

impl Default for Fusions {
    fn default() -> Self {
        Fusions { attention: true }
    }
}

/// Build the step of `key` over `res`.
pub(super) fn build_step(
    gpu: &Gpu,
    cfg: &TextConfig,
    res: &Resident,
    key: StepKey,
    fusions: Fusions,
) -> Result<Step> {
    let r = Recipe {
        gpu,
        cfg,
        res,
        t: key.tokens,
        hid: cfg.hidden_size as u32,
        eps: cfg.rms_norm_eps as f32,
        kernel: cfg.conv_kernel_size as u32,
        head: key.head,
        fuse_attention: fusions.attention,
        batch: key.batch,
    };
    anyhow::ensure!(
        !key.batch || fusions.attention,
        "a decode batch needs the fused attention"
    );
    let mut blocks = vec![r.embedding(key.chained)?];
    for li in 0..res.layers.len() {
        blocks.push(r.attention_block(li)?);
        blocks.push(match &res.layers[li].mlp {
            ResidentMlp::Dense(mlp) => r.dense_mlp(li, mlp)?,
            ResidentMlp::Moe(moe) => r.moe_block(li, moe)?,
        });
    }
    blocks.push(r.head()?);
    let step = Step::from_blocks(blocks);
    if cfg!(debug_assertions) {
        assert_checked(&step, fusions);
    }
    Ok(step)
}

/// Debug builds (the tests): every op kernel of `step` is one that the device check counted for
/// its op ([`crate::gpu::ops::decoder_kernels`]), so no op kernel escapes
/// [`crate::gpu::variants::check_device`]. The linear layer's kernels (`gemv`, `gemm`) are checked
/// by their layout.
fn assert_checked(step: &Step, fusions: Fusions) {
    let listed = crate::gpu::ops::decoder_kernels(fusions.attention);
    for c in step.calls() {
        for k in c
            .kernels()
            // the decode batch's kernels are checked by `GpuModel::new` (BATCH_STORAGE_BUFFERS)
            .filter(|k| !k.starts_with("gemv") && !k.starts_with("gemm") && !k.contains("+batch"))
        {
            assert!(
                listed.iter().any(|(op, s)| *op == c.label.op && s.key == k),
                "{}: kernel {k} is not listed for op {:?} by gpu::ops::decoder_kernels({}); \
                 list it there so that the device check counts it",
                c.label,
                c.label.op,
                fusions.attention
            );
        }
    }
}

/// Where an expert FFN reads and writes: x rows `[tokens, H]`, `n_pairs` (expert, token) pairs in a 16-byte `Pair` buffer,
/// the gate‖up and activation scratch, and the outputs `[n_pairs, H]`.
#[derive(Clone, Copy)]
pub(super) struct FfnIo<'b> {
    pub x: &'b wgpu::Buffer,
    pub tokens: u32,
    pub pairs: &'b wgpu::Buffer,
    pub n_pairs: u32,
    pub gu: &'b wgpu::Buffer,
    pub act: &'b wgpu::Buffer,
    pub y: &'b wgpu::Buffer,
    /// How the two GEMVs are built.
    pub linear: &'b LinearOptions,
}

impl<'b> FfnIo<'b> {
    /// The gate_up GEMV with its silu·up epilogue into `act` `[P, I]`.
    fn silu_args(&self) -> GemvArgs<'b> {
        GemvArgs::new(self.x, self.tokens, self.pairs, self.n_pairs, self.act).silu_mul(true)
    }

    /// The down GEMV: pair p reads activation row p of `act`, writes row p of `y`.
    fn down_args(&self) -> GemvArgs<'b> {
        let np = self.n_pairs;
        GemvArgs::new(self.act, np, self.pairs, np, self.y).x_per_pair(true)
    }
}

/// `y[p] = down_e(silu(gate_e x_t) · up_e x_t)` for every pair p = (e, t): the gate_up GEMV with
/// its silu·up epilogue straight into `act` `[P, I]` when the call runs as the GEMV (the decode),
/// else (a GEMM) into `gu` `[P, 2I]` then silu·up into `act`; then the down GEMV in which pair p
/// reads activation row p (`x_per_pair`). Dense, shared, routed and streamed experts all run this; `ops`
/// names the two GEMVs.
pub(super) fn ffn_calls(
    gpu: &Gpu,
    slab: &FfnSlab,
    inter: u32,
    io: FfnIo<'_>,
    ops: [&'static str; 2],
) -> Result<Vec<Call>> {
    let np = io.n_pairs;
    let down = |gpu| slab.down.call(gpu, io.down_args(), io.linear, ops[1]);
    let args = GemvArgs::new(io.x, io.tokens, io.pairs, np, io.gu);
    if slab.gate_up.w.silu_mul_fits(&args, io.linear) {
        // the GEMV's silu·up epilogue writes `act` (BENCHMARKS.md#decision-silu-epilogue)
        let args = io.silu_args();
        let gate_up = slab.gate_up.call(gpu, args, io.linear, ops[0])?;
        return Ok(vec![gate_up, down(gpu)?]);
    }
    let gate_up = slab.gate_up.call(gpu, args, io.linear, ops[0])?;
    Ok(vec![
        gate_up,
        SiluMul {
            rows: np,
            i: inter,
            layout: SiluMulLayout::fused(inter),
        }
        .bind(gpu, io.gu, io.gu, io.act)?,
        down(gpu)?,
    ])
}

/// The shared inputs of every block function.
struct Recipe<'a> {
    gpu: &'a Gpu,
    cfg: &'a TextConfig,
    res: &'a Resident,
    /// Tokens of the step.
    t: u32,
    hid: u32,
    eps: f32,
    /// Short-conv kernel size.
    kernel: u32,
    head: Head,
    /// Run the attention after the projections as [`FusedAttention`].
    fuse_attention: bool,
    /// A decode batch ([`StepKey::batch`]).
    batch: bool,
}

impl Recipe<'_> {
    /// `h = embed_norm ⊙ rmsnorm(embed[id])` per token; the ids come from `ids`, or from the
    /// previous step's argmax when `chained`.
    fn embedding(&self, chained: bool) -> Result<Block> {
        let a = &self.res.acts;
        let mut b = Block::new(Phase::Other, None);
        b.push(
            EmbedNorm {
                tokens: self.t,
                hidden: self.hid,
                eps: self.eps,
                ids_off: 0,
            }
            .bind(
                self.gpu,
                if chained { &a.argmax } else { &a.ids },
                &self.res.embed_shards(),
                &self.res.embed_norm,
                &a.h,
            )?,
        );
        Ok(b)
    }

    /// Layer `li`'s attention block and its residual: input norm; q/k/v/r projections ([`Recipe::projections`]); the attention after the
    /// projections ([`Recipe::attention`] or [`Recipe::fused_attention`]); o_proj;
    /// `h += attn_sconv(o)`; the post-attention norm into `xn`.
    fn attention_block(&self, li: usize) -> Result<Block> {
        let (gpu, a, t, hid, eps) = (self.gpu, &self.res.acts, self.t, self.hid, self.eps);
        let l: &ResidentLayer = &self.res.layers[li];
        let mut b = Block::new(Phase::Attention, Some(li));
        let xn = self.normed(&mut b, &l.input_norm)?;
        for c in self.projections(li, xn)? {
            b.push(c);
        }
        if self.fuse_attention {
            b.push(self.fused_attention(li)?);
        } else {
            for c in self.attention(li)? {
                b.push(c);
            }
        }
        // o_proj with the residual short conv as its epilogue where one token per slot runs
        // it as one GEMV dispatch (the decode), else o_proj then the conv
        let (slots, per_token) = match self.slot_of() {
            SlotOf::Pos(p) => (&p.buffer, false),
            SlotOf::Batch(seq) => (seq, true),
        };
        let conv = ConvEpilogue {
            w: &l.conv_w[ATTN_SCONV],
            state: &l.conv_state[ATTN_SCONV],
            slots,
            per_token,
            kernel: self.kernel,
        };
        let fused = self.dense(&a.attn, &a.h).conv(conv);
        if (t == 1 || self.batch) && l.o.w.conv_fits(gpu, &fused, &self.res.linear) {
            b.push(l.o.call(gpu, fused, &self.res.linear, "o_proj+short_conv")?);
        } else {
            b.push(l.o.call(gpu, self.dense(&a.attn, &a.o), &self.res.linear, "o_proj")?);
            b.push(self.conv(li, ATTN_SCONV, hid, true, &a.o, &a.h)?);
        }
        b.phase(Phase::Other);
        b.push(RmsNorm::rows(t, hid, eps).bind(gpu, &a.h, &l.post_norm, &a.xn)?);
        Ok(b)
    }

    /// Layer `li`'s dense MLP and its residual: one GEMV over gate‖up, silu·up, down,
    /// × global_scale, `h += mlp_sconv(m)`.
    fn dense_mlp(&self, li: usize, mlp: &DenseMlp) -> Result<Block> {
        let (gpu, a, t, hid) = (self.gpu, &self.res.acts, self.t, self.hid);
        let DenseMlp {
            ffn,
            inter,
            global_scale,
        } = mlp;
        let mut b = Block::new(Phase::Dense, Some(li));
        let io = FfnIo {
            x: &a.xn,
            tokens: t,
            pairs: &a.dense_pairs,
            n_pairs: t,
            gu: &a.gu,
            act: &a.act,
            y: &a.m,
            linear: &self.res.linear,
        };
        for c in ffn_calls(gpu, ffn, *inter, io, ["dense gate_up", "dense down"])? {
            b.push(c);
        }
        b.push(
            MulConst {
                n: t * hid,
                c: *global_scale,
            }
            .bind(gpu, &a.m)?,
        );
        b.phase(Phase::Other);
        b.push(self.conv(li, MLP_SCONV, hid, true, &a.m, &a.h)?);
        Ok(b)
    }

    /// Layer `li`'s MoE block and its residual: router GEMV → router kernel (pairs and gammas on
    /// the GPU); the shared experts (static pairs, so they do not wait on routing) and the routed
    /// experts (one MoE GEMV over the (expert, token) pairs for gate‖up with silu·up, one for
    /// down; or the streaming cut); `h += mlp_sconv(combine)`, the combine with the gammas as the
    /// conv's input (one dispatch). Where each runs as one GEMV dispatch (the decode), the router
    /// runs beside the shared gate_up and the shared down beside the routed gate_up, each pair as
    /// one dispatch ([`crate::gpu::linear::gemv_pair`]).
    fn moe_block(&self, li: usize, moe: &MoeMlp) -> Result<Block> {
        let (gpu, a, t, hid) = (self.gpu, &self.res.acts, self.t, self.hid);
        let MoeMlp {
            router,
            bias,
            scale,
            top_k,
            routed,
            shared,
            inter,
            ..
        } = moe;
        let opts = &self.res.linear;
        let ns = shared.as_ref().map_or(0, |s| s.n as u32);
        let xn = &a.xn;
        let mut b = Block::new(Phase::Router, Some(li));
        let router_args = self.dense(xn, &a.router_logits);
        let top_k_call = RouterShape {
            tokens: t,
            n_routed: self.cfg.n_routed_experts as u32,
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
            (&a.argmax, &self.res.pos.buffer),
            li as u32,
        )?;
        let shared_io = FfnIo {
            x: xn,
            tokens: t,
            pairs: &a.shared_pairs,
            n_pairs: t * ns,
            gu: &a.gu,
            act: &a.act_shared,
            y: &a.y_shared,
            linear: opts,
        };
        let routed_io = FfnIo {
            pairs: &a.pairs,
            n_pairs: t * top_k,
            act: &a.act,
            y: &a.y_routed,
            ..shared_io
        };
        // GEMV `other` beside `slab`'s gate_up with its silu·up epilogue over `io`, where both
        // run as one GEMV dispatch
        let beside_gate_up =
            |other: (&Linear, GemvArgs<'_>), slab: Option<&FfnSlab>, io: &FfnIo, op| {
                let args = io.silu_args();
                match slab.filter(|s| s.gate_up.w.silu_mul_fits(&args, opts)) {
                    Some(s) => Linear::pair_call(gpu, other, (&s.gate_up, args), opts, op),
                    None => Ok(None),
                }
            };
        let first = beside_gate_up(
            (router, router_args),
            shared.as_ref(),
            &shared_io,
            "router ∥ shared gate_up",
        )?;
        let shared_down_left = first.is_some();
        match first {
            Some(c) => b.push(c),
            None => b.push(router.call(gpu, router_args, opts, "router")?),
        }
        b.push(top_k_call);
        let ops = ["shared gate_up", "shared down"];
        let mut routed_done = false;
        match shared {
            Some(sh) if shared_down_left => {
                // the shared down beside the routed GEMV its format names
                // (BENCHMARKS.md#decision-gemv-pairs)
                let down = shared_io.down_args();
                let calls = match routed.as_ref() {
                    Some(r) => {
                        let beside = format::row(r.down.w.encoding().format).shared_down_beside;
                        let pair = match beside {
                            RoutedGemv::GateUp => beside_gate_up(
                                (&sh.down, down),
                                Some(r),
                                &routed_io,
                                "shared down ∥ routed gate_up",
                            )?,
                            RoutedGemv::Down => Linear::pair_call(
                                gpu,
                                (&sh.down, down),
                                (&r.down, routed_io.down_args()),
                                opts,
                                "shared down ∥ routed down",
                            )?,
                        };
                        // the routed FFN's calls with the paired GEMV replaced by the pair
                        pair.map(|pair| {
                            let ops = ["routed gate_up", "routed down"];
                            let mut calls = ffn_calls(gpu, r, *inter, routed_io, ops)?;
                            // a gate_up pair carries the silu·up epilogue: no silu_mul call after it
                            let at = match beside {
                                RoutedGemv::GateUp if calls.len() == 2 => 0,
                                RoutedGemv::GateUp => {
                                    anyhow::bail!("routed gate_up pair without its epilogue")
                                }
                                RoutedGemv::Down => calls.len() - 1,
                            };
                            calls[at] = pair;
                            anyhow::Ok(calls)
                        })
                        .transpose()?
                    }
                    None => None,
                };
                match calls {
                    Some(calls) => {
                        b.phase(Phase::Routed);
                        for c in calls {
                            b.push(c);
                        }
                        routed_done = true;
                    }
                    None => {
                        b.phase(Phase::Shared);
                        b.push(sh.down.call(gpu, down, opts, ops[1])?);
                    }
                }
            }
            Some(sh) => {
                b.phase(Phase::Shared);
                for c in ffn_calls(gpu, sh, *inter, shared_io, ops)? {
                    b.push(c);
                }
            }
            None => {}
        }
        if !routed_done {
            b.phase(Phase::Routed);
            match routed {
                Some(routed) => {
                    let ops = ["routed gate_up", "routed down"];
                    for c in ffn_calls(gpu, routed, *inter, routed_io, ops)? {
                        b.push(c);
                    }
                }
                None => b.nodes.push(Node::Routed { layer: li }),
            }
        }
        b.phase(Phase::Other);
        let sh = shared.as_ref().map(|_| (&a.y_shared, &a.shared_gammas, ns));
        // the combine is the conv's input: one dispatch
        let l = &self.res.layers[li];
        b.push(
            ShortConvKernel {
                tokens: t,
                channels: hid,
                kernel: self.kernel,
                accumulate: true,
            }
            .bind_combine_at(
                gpu,
                Some(self.slot_of()),
                &a.y_routed,
                &a.gammas,
                *top_k,
                sh,
                [&l.conv_w[MLP_SCONV], &l.conv_state[MLP_SCONV], &a.h],
            )?,
        );
        Ok(b)
    }

    /// The head: final norm of the last token (or of every token), ÷ `logits_mup_width_multiplier`,
    /// `lm_head` GEMV over the first `logits_width()` rows, and for the last token the two-pass
    /// argmax (greedy id and the logits' non-finite flag into the status words). Nothing for an
    /// inner prefill chunk.
    fn head(&self) -> Result<Block> {
        let (gpu, a, t, hid, eps) = (self.gpu, &self.res.acts, self.t, self.hid, self.eps);
        let mup = self.cfg.logits_mup_width_multiplier as f32;
        let mut b = Block::new(Phase::Head, None);
        match self.head {
            Head::None => {}
            Head::Last => {
                let mut n = RmsNorm::rows(1, hid, eps);
                n.x_off = (t - 1) * hid;
                b.push(n.bind(gpu, &a.h, &self.res.norm, &a.hn)?);
                b.push(DivConst { n: hid, c: mup }.bind(gpu, &a.hn)?);
                let args = GemvArgs::new(&a.hn, 1, &a.dense_pairs, 1, &a.logits);
                b.push(
                    self.res
                        .lm_head
                        .call(gpu, args, &self.res.linear, "lm_head")?,
                );
                b.push(
                    Argmax {
                        vocab: self.cfg.logits_width() as u32,
                        out_idx: 0,
                    }
                    .bind_flagged(
                        gpu,
                        &a.logits,
                        &a.argmax,
                        Some(status::LOGITS_BAD as u32),
                    )?,
                );
            }
            Head::All => {
                b.push(RmsNorm::rows(t, hid, eps).bind(gpu, &a.h, &self.res.norm, &a.hn)?);
                b.push(DivConst { n: t * hid, c: mup }.bind(gpu, &a.hn)?);
                let args = self.dense(&a.hn, &a.logits);
                b.push(
                    self.res
                        .lm_head
                        .call(gpu, args, &self.res.linear, "lm_head")?,
                );
            }
        }
        Ok(b)
    }
}

/// The pieces the block functions share.
impl Recipe<'_> {
    /// A dense GEMV of the step's tokens: `y = W x` per token.
    fn dense<'b>(&'b self, x: &'b wgpu::Buffer, y: &'b wgpu::Buffer) -> GemvArgs<'b> {
        GemvArgs::new(x, self.t, &self.res.acts.dense_pairs, self.t, y)
    }

    /// Layer `li`'s q, k, v and r projections of the normed `xn` into `q`, `k_raw`, `v_raw` and `r`. A joint
    /// slab runs one GEMV writing the four outputs as row segments where the GEMV is chosen and
    /// segments fit ([`crate::gpu::linear::slab::GpuWeights::segments_fit`]; every one-token step on
    /// common devices), else one GEMV or GEMM into the `qkvr` scratch and a [`SplitColumns`];
    /// separate slabs run four GEMVs.
    fn projections(&self, li: usize, xn: &wgpu::Buffer) -> Result<Vec<Call>> {
        let (gpu, a) = (self.gpu, &self.res.acts);
        let outs = [&a.q, &a.k_raw, &a.v_raw, &a.r];
        match &self.res.layers[li].proj {
            Projections::Separate(lin) => {
                let ops = ["q_proj", "k_proj", "v_proj", "r_proj"];
                let calls = lin.iter().zip(outs).zip(ops);
                calls
                    .map(|((w, y), op)| w.call(gpu, self.dense(xn, y), &self.res.linear, op))
                    .collect()
            }
            Projections::Joint { w, rows } => {
                let packed = self.dense(xn, &a.qkvr);
                if w.w.segments_fit(gpu)
                    && route::route(&w.w, &packed, &self.res.linear)
                        .gemm_tile()
                        .is_none()
                {
                    let segs: Vec<(u32, &wgpu::Buffer)> = rows.iter().copied().zip(outs).collect();
                    let args = self.dense(xn, &a.q).segments(&segs);
                    return Ok(vec![w.call(gpu, args, &self.res.linear, "qkvr_proj")?]);
                }
                let split = SplitColumns {
                    tokens: self.t,
                    widths: *rows,
                };
                Ok(vec![
                    w.call(gpu, packed, &self.res.linear, "qkvr_proj")?,
                    split.bind(gpu, &a.qkvr, outs)?,
                ])
            }
        }
    }

    /// The normed `h` (norm `weight`) that GEMVs read: `xn`, after the RMSNorm kernel pushed onto
    /// `b`.
    fn normed<'b>(&'b self, b: &mut Block, weight: &'b wgpu::Buffer) -> Result<&'b wgpu::Buffer> {
        let a = &self.res.acts;
        b.push(RmsNorm::rows(self.t, self.hid, self.eps).bind(self.gpu, &a.h, weight, &a.xn)?);
        Ok(&a.xn)
    }

    /// Layer `li`'s attention after the projections as separate kernels: the k and v short convs
    /// (one dispatch), the per-head q and k norms (in place), and the attention (τ, relative
    /// bias, sliding mask, KV append) into `attn`.
    fn attention(&self, li: usize) -> Result<[Call; 4]> {
        let (gpu, a, t, eps) = (self.gpu, &self.res.acts, self.t, self.eps);
        let l = &self.res.layers[li];
        let shape = l.attn_shape(t);
        let (h, kvh, d) = (shape.heads, shape.kv_heads, shape.head_dim);
        let k_conv = [
            &a.k_raw,
            &l.conv_w[K_SCONV],
            &l.conv_state[K_SCONV],
            &a.k_new,
        ];
        let v_conv = [
            &a.v_raw,
            &l.conv_w[V_SCONV],
            &l.conv_state[V_SCONV],
            &a.v_new,
        ];
        Ok([
            ShortConvKernel {
                tokens: t,
                channels: kvh * d,
                kernel: self.kernel,
                accumulate: false,
            }
            .bind_pair(gpu, k_conv, v_conv)?,
            RmsNorm::rows(t * h, d, eps).bind_inplace(gpu, &a.q, &l.q_norm)?,
            RmsNorm::rows(t * kvh, d, eps).bind_inplace(gpu, &a.k_new, &l.k_norm)?,
            shape.bind(
                gpu,
                &self.res.pos,
                &a.q,
                &a.k_new,
                &a.v_new,
                &a.r,
                &l.rel_proj,
                &l.k_cache,
                &l.v_cache,
                &a.attn,
            )?,
        ])
    }

    /// Layer `li`'s attention after the projections as one [`FusedAttention`] call (k/v convs
    /// over the conv ring in the caches, q/k norms, attention, KV write) into `attn`.
    fn fused_attention(&self, li: usize) -> Result<Call> {
        let a = &self.res.acts;
        let l = &self.res.layers[li];
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
        let fused = FusedAttention::new(l.attn_shape(self.t), self.kernel, self.eps);
        if self.batch {
            return Ok(fused.bind_batch(self.gpu, &self.res.pos, &a.seq, &io)?);
        }
        Ok(fused.bind(self.gpu, &self.res.pos, &io)?)
    }

    /// Where the stateful kernels of this step find their tokens' sequence slots.
    fn slot_of(&self) -> SlotOf<'_> {
        if self.batch {
            SlotOf::Batch(&self.res.acts.seq)
        } else {
            SlotOf::Pos(&self.res.pos)
        }
    }

    /// `y (+)= sconv(x)` with layer `li`'s conv `wi` over `ch` channels.
    fn conv(
        &self,
        li: usize,
        wi: usize,
        ch: u32,
        accumulate: bool,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
    ) -> Result<Call> {
        let l = &self.res.layers[li];
        Ok(ShortConvKernel {
            tokens: self.t,
            channels: ch,
            kernel: self.kernel,
            accumulate,
        }
        .bind_at(
            self.gpu,
            self.slot_of(),
            x,
            &l.conv_w[wi],
            &l.conv_state[wi],
            y,
        )?)
    }
}
