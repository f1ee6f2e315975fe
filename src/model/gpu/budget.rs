//! GPU memory and traffic budgets: the resident part's size before upload, one expert slot's
//! size, how many slots a placement gives, and the bytes a one-token step reads.
use super::resident::{Resident, ResidentMlp};
use crate::formats::{Format, QMatrix};
use crate::gpu::linear::slab::gpu_row_stride;
use crate::human_bytes;
use crate::model::stream::Placement;
use crate::model::weights::{Ffn, Mlp, Weights};
use anyhow::{ensure, Result};

/// GPU bytes of the per-sequence state of `seq_slots` sequences of `max_seq` tokens: per layer
/// the k and v caches with the fused attention's conv ring, and the attn and mlp conv states
/// (f32; sliding layers hold their window).
pub(super) fn state_bytes(w: &Weights<'_>, max_seq: usize, seq_slots: usize) -> u64 {
    let cfg = &w.config;
    let kk = cfg.conv_kernel_size as u64;
    let hid = cfg.hidden_size as u64;
    let per_slot: u64 = (0..w.layers.len())
        .map(|i| {
            let g = cfg.attn(i);
            let cap = g.window.unwrap_or(max_seq) as u64;
            2 * 4 * (cap + kk) * g.kv_dim() as u64 + 2 * 4 * kk.saturating_sub(1) * hid
        })
        .sum();
    seq_slots as u64 * per_slot
}

/// An estimate of the GPU bytes of everything but the routed experts: dense linears, shared
/// experts, router, embedding table, head, norms and conv weights as stored, the KV caches and
/// conv states of `seq_slots` sequences of `max_seq` tokens ([`state_bytes`]), and the
/// activations of a `max_chunk` chunk.
pub(super) fn resident_bytes_estimate(
    w: &Weights<'_>,
    max_seq: usize,
    max_chunk: usize,
    seq_slots: usize,
) -> u64 {
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
    b += state_bytes(w, max_seq, seq_slots);
    for (i, l) in w.layers.iter().enumerate() {
        let a = &l.attn;
        b += q(&a.q) + q(&a.k) + q(&a.v) + q(&a.r) + q(&a.o);
        b += v(&a.q_norm) + v(&a.k_norm) + v(&a.rel_proj) + v(&l.input_norm);
        b += v(&l.post_attn_norm) + v(&a.k_sconv.w) + v(&a.v_sconv.w);
        b += v(&l.attn_sconv.w) + v(&l.mlp_sconv.w);
        // the fused attention's constants buffer, the unfused k/v conv states
        b += v(&a.rel_proj) + v(&a.q_norm) + v(&a.k_norm) + v(&a.k_sconv.w) + v(&a.v_sconv.w);
        b += 4 * (cfg.conv_kernel_size as u64) * 2 * cfg.attn(i).kv_dim() as u64;
        b += match &l.mlp {
            Mlp::Dense(d) => ffn(&d.ffn),
            Mlp::Moe(m) => q(&m.router) + m.shared.iter().map(ffn).sum::<u64>(),
        };
    }
    // activations of a chunk: the logits and their readback copy, the expert FFN buffers
    // (gate‖up, activation, outputs, streamed part outputs) and a bound of 64 hidden-size
    // vectors per token for the rest
    let t = max_chunk.min(max_seq) as u64;
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

/// GPU bytes of one expert slot (gate‖up and down, padded rows, scales); 0 without a sparse layer.
pub(super) fn slot_bytes(w: &Weights<'_>) -> u64 {
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

/// How many expert slots `placement` gives: `None` = fully resident (every routed expert fits,
/// or no budget was given). Errors: zero slots asked for, or a budget below the resident part
/// ([`resident_bytes_estimate`] for `max_seq`, `max_chunk`, `seq_slots`) plus one slot.
pub(super) fn plan_slots(
    w: &Weights<'_>,
    placement: Placement,
    (max_seq, max_chunk, seq_slots): (usize, usize, usize),
) -> Result<Option<usize>> {
    let sparse = w
        .layers
        .iter()
        .filter(|l| matches!(l.mlp, Mlp::Moe(_)))
        .count();
    let total = sparse * w.config.n_routed_experts;
    let slot = slot_bytes(w);
    Ok(match placement {
        Placement::Resident => None,
        Placement::Slots(n) => {
            ensure!(n >= 1, "--expert-slots must be at least 1");
            (n < total).then_some(n)
        }
        Placement::GpuMem(b) => {
            let est = resident_bytes_estimate(w, max_seq, max_chunk, seq_slots);
            let free = b.saturating_sub(est);
            let n = (free / slot.max(1)) as usize;
            ensure!(
                n >= 1,
                "a GPU memory budget of {} holds no expert slot: the resident part (dense \
                 weights, shared experts, KV cache, activations) needs about {} and one expert \
                 slot {}",
                human_bytes(b),
                human_bytes(est),
                human_bytes(slot)
            );
            (n < total).then_some(n)
        }
    })
}

/// The bytes a one-token step reads: a fixed part and, per layer, the KV entries it attends over.
pub(super) struct DecodeBytes {
    /// One embedding row, every norm, conv weight and conv state, rel_proj, every dense linear
    /// (q/k/v/r/o, router and its bias, dense MLPs), `top_k` routed experts and every shared
    /// expert per sparse layer, and the head's `lm_head` rows.
    fixed: u64,
    /// Per layer: (KV cache capacity in tokens, K or V floats per token).
    kv: Vec<(u64, u64)>,
}

impl DecodeBytes {
    pub fn of(r: &Resident) -> DecodeBytes {
        let ffn = |f: &super::resident::FfnSlab| f.ffn_bytes();
        let mut b = r.embed_row_bytes + r.embed_norm.size() + r.norm.size() + r.lm_head.bytes();
        for l in &r.layers {
            b += l.input_norm.size() + l.post_norm.size();
            b += l
                .proj
                .linears()
                .into_iter()
                .chain([&l.o])
                .map(|x| x.bytes())
                .sum::<u64>();
            b += l.q_norm.size() + l.k_norm.size() + l.rel_proj.size();
            b += l.conv_w.iter().map(|x| x.size()).sum::<u64>();
            b += l.conv_state.iter().map(|x| x.size()).sum::<u64>();
            b += match &l.mlp {
                ResidentMlp::Dense(d) => ffn(&d.ffn),
                ResidentMlp::Moe(m) => {
                    m.router.bytes()
                        + m.bias.size()
                        + m.top_k as u64 * m.expert_bytes
                        + m.shared.as_ref().map_or(0, |s| s.n as u64 * ffn(s))
                }
            };
        }
        let kv = r
            .layers
            .iter()
            .map(|l| (l.cache_capacity as u64, l.geom.kv_dim() as u64))
            .collect();
        DecodeBytes { fixed: b, kv }
    }

    /// Bytes of the one-token step at position `pos`: the fixed part plus `min(pos + 1,
    /// capacity)` K and V entries of f32 per layer.
    pub fn at(&self, pos: usize) -> u64 {
        let kv: u64 = self
            .kv
            .iter()
            .map(|&(cap, kvd)| 2 * (pos as u64 + 1).min(cap) * kvd * 4)
            .sum();
        self.fixed + kv
    }
}
