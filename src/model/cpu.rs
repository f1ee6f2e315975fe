//! The CPU forward: plain f32 code, the oracle for the GPU path and its fallback.
//!
//! Semantics follow transformers 5.24.0 `InklingForCausalLM` (see tests/fixtures/NOTES-for-rust.md).
//! Matrix-vector products go through [`QMatrix::gemv`] (f64 accumulation); everything else is f32.
//! A call processes a chunk of T ≥ 1 tokens layer by layer; attention of the chunk's queries reads
//! the keys retained in the cache *and* the chunk's own keys before the chunk is written into the
//! cache, so a chunk longer than a sliding window never overwrites keys that its own earlier
//! queries still need.
use super::cache::{Cache, LayerCache, ATTN_SCONV, K_SCONV, MLP_SCONV, V_SCONV};
use super::error::{ModelError, Result};
use super::weights::{AttnWeights, Ffn, Mlp, MoeWeights, Weights};
use crate::formats::QMatrix;

/// `y = weight * (x * rsqrt(mean(x²) + eps))` over each `dim`-sized row of `x`, in place.
pub fn rms_norm_rows(x: &mut [f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    for row in x.chunks_exact_mut(dim) {
        let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / dim as f64;
        let inv = 1.0 / (ms as f32 + eps).sqrt();
        for (v, &w) in row.iter_mut().zip(weight) {
            *v = w * (*v * inv);
        }
    }
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `y = W x` for each row of `x` ([T][cols]) → [T][rows].
fn linear_rows(m: &QMatrix<'_>, x: &[f32]) -> Vec<f32> {
    let t = x.len() / m.cols;
    let mut y = vec![0f32; t * m.rows];
    for (xr, yr) in x.chunks_exact(m.cols).zip(y.chunks_exact_mut(m.rows)) {
        m.gemv(xr, yr);
    }
    y
}

/// One SwiGLU expert FFN on one token: `down(silu(gate x) · up x)`, `x` `[H]` → `[H]` (f32,
/// dequantised from the expert's own bytes; transformers' `InklingMLP` / expert forward).
pub fn expert_ffn(f: &Ffn<'_>, x: &[f32]) -> Vec<f32> {
    ffn(f, x)
}

fn ffn(f: &Ffn<'_>, x: &[f32]) -> Vec<f32> {
    let mut g = vec![0f32; f.gate.rows];
    let mut u = vec![0f32; f.up.rows];
    f.gate.gemv(x, &mut g);
    f.up.gemv(x, &mut u);
    for (gv, uv) in g.iter_mut().zip(&u) {
        *gv = silu(*gv) * uv;
    }
    let mut y = vec![0f32; f.down.rows];
    f.down.gemv(&g, &mut y);
    y
}

/// `log(sigmoid(x))` without underflow, as torch's `log_sigmoid`: `min(x, 0) − log1p(exp(−|x|))`.
#[inline]
pub fn log_sigmoid(x: f32) -> f32 {
    x.min(0.0) - (-x.abs()).exp().ln_1p()
}

/// The router logits of one token: `W_router x`, `x` `[H]` → `[E + S]` (routed first, then shared).
pub fn router_logits(moe: &MoeWeights<'_>, x: &[f32]) -> Vec<f32> {
    let mut logits = vec![0f32; moe.router.rows];
    moe.router.gemv(x, &mut logits);
    logits
}

/// The MoE router for one token: returns (chosen routed expert ids, their weights, shared gammas).
/// See [`route_logits`].
pub fn route(moe: &MoeWeights<'_>, x: &[f32]) -> (Vec<usize>, Vec<f32>, Vec<f32>) {
    route_logits(moe, &router_logits(moe, x))
}

/// The router's choice and weights from its logits `[E + S]`, as transformers 5.24.0
/// `InklingTopkRouter.forward` (everything f32).
///
/// Selection: top-k of `sigmoid(L) + e_score_correction_bias` over the routed logits; exact ties
/// go to the lower expert index and NaN ranks below every value (a true −inf included). torch.topk
/// promises no order among exact ties, so a tie at the k-th place is the one case where the choice
/// may differ from transformers (README, *Bad input*); the order of the chosen set does not matter
/// since the outputs are summed. Weights: over the chosen routed logits and all shared logits
/// (the shared-expert sink), `exp(logsigmoid(l) − logsumexp(logsigmoid(l)))` times
/// `route_scale · gate.global_scale`: finite even where every sigmoid underflows to 0 in f32.
pub fn route_logits(moe: &MoeWeights<'_>, logits: &[f32]) -> (Vec<usize>, Vec<f32>, Vec<f32>) {
    let e = moe.experts.len();
    let choice: Vec<f32> = (0..e)
        .map(|i| sigmoid(logits[i]) + moe.router_bias[i])
        .collect();
    let mut order: Vec<usize> = (0..e).collect();
    order.sort_by(|&a, &b| rank_desc(choice[a], choice[b]).then(a.cmp(&b)));
    order.truncate(moe.top_k);
    let ls: Vec<f32> = order
        .iter()
        .map(|&i| logits[i])
        .chain(logits[e..].iter().copied())
        .map(log_sigmoid)
        .collect();
    let m = ls.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = m + ls.iter().map(|&v| (v - m).exp()).sum::<f32>().ln();
    let scale = moe.route_scale * moe.router_scale;
    let w: Vec<f32> = ls.iter().map(|&v| (v - lse).exp() * scale).collect();
    let (routed, shared) = w.split_at(moe.top_k);
    (order, routed.to_vec(), shared.to_vec())
}

/// Descending order of router scores, NaN last (below −inf); −0 and +0 are equal.
fn rank_desc(a: f32, b: f32) -> std::cmp::Ordering {
    match (a.is_nan(), b.is_nan()) {
        (false, false) => b.partial_cmp(&a).expect("no NaN"),
        (an, bn) => an.cmp(&bn),
    }
}

/// One token's MoE output; `layer` and `position` (0-based) name the place in the error when the
/// router logits hold a NaN or an Inf.
fn moe_forward(moe: &MoeWeights<'_>, x: &[f32], layer: usize, position: usize) -> Result<Vec<f32>> {
    let logits = router_logits(moe, x);
    if logits.iter().any(|v| !v.is_finite()) {
        return Err(ModelError::NonFiniteRouter { position, layer });
    }
    let (ids, weights, gammas) = route_logits(moe, &logits);
    let mut y = vec![0f32; x.len()];
    for (&id, &w) in ids.iter().zip(&weights) {
        for (a, b) in y.iter_mut().zip(ffn(&moe.experts[id], x)) {
            *a += w * b;
        }
    }
    for (s, &g) in moe.shared.iter().zip(&gammas) {
        for (a, b) in y.iter_mut().zip(ffn(s, x)) {
            *a += g * b;
        }
    }
    Ok(y)
}

/// Attention of a chunk `xn` ([T][hidden], already input-normalised) at absolute positions
/// `p0..p0+T`; updates the layer's KV cache and k/v conv states; returns o_proj output [T][hidden].
fn attention(
    aw: &AttnWeights<'_>,
    lc: &mut LayerCache,
    xn: &[f32],
    p0: usize,
    eps: f32,
) -> Vec<f32> {
    let g = aw.geom;
    let d = g.head_dim;
    let (qd, kvd) = (g.q_dim(), g.kv_dim());
    let t_len = xn.len() / aw.q.cols;
    let mut q = linear_rows(&aw.q, xn);
    let k = linear_rows(&aw.k, xn);
    let v = linear_rows(&aw.v, xn);
    let r = linear_rows(&aw.r, xn);
    let mut k = lc.conv[K_SCONV].apply(&aw.k_sconv.w, &k);
    let v = lc.conv[V_SCONV].apply(&aw.v_sconv.w, &v);
    rms_norm_rows(&mut q, &aw.q_norm, eps);
    rms_norm_rows(&mut k, &aw.k_norm, eps);

    assert_eq!(
        lc.kv.len(),
        p0,
        "KV cache length disagrees with the sequence position"
    );
    let lo = lc.kv.first_retained();
    let key = |j: usize| -> (&[f32], &[f32]) {
        if j < p0 {
            lc.kv.get(j)
        } else {
            let s = (j - p0) * kvd;
            (&k[s..s + kvd], &v[s..s + kvd])
        }
    };
    let group = g.heads / g.kv_heads;
    let inv_d = 1.0 / d as f32;
    let mut out = vec![0f32; t_len * qd];
    let mut rel = vec![0f32; g.rel_extent];
    let mut scores: Vec<f32> = Vec::new();
    for t in 0..t_len {
        let i = p0 + t;
        let tau = g.tau(i);
        let jmin = match g.window {
            Some(w) => (i + 1).saturating_sub(w).max(lo),
            None => lo,
        };
        for h in 0..g.heads {
            let kvh = h / group;
            let qh = &q[t * qd + h * d..t * qd + (h + 1) * d];
            // rel[dist] = Σ_r r[t,h,r] · proj[r, dist]
            let rh = &r[(t * g.heads + h) * g.d_rel..(t * g.heads + h + 1) * g.d_rel];
            for (dist, o) in rel.iter_mut().enumerate() {
                *o = rh
                    .iter()
                    .enumerate()
                    .map(|(ri, &rv)| rv * aw.rel_proj[ri * g.rel_extent + dist])
                    .sum();
            }
            scores.clear();
            for j in jmin..=i {
                let (kj, _) = key(j);
                let kh = &kj[kvh * d..(kvh + 1) * d];
                let dot: f32 = qh.iter().zip(kh).map(|(a, b)| (a * tau) * b).sum();
                let dist = i - j;
                let bias = if dist < g.rel_extent { rel[dist] } else { 0.0 };
                scores.push(dot * inv_d + tau * bias);
            }
            let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
            let mut sum = 0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            let oh = &mut out[t * qd + h * d..t * qd + (h + 1) * d];
            for (n, j) in (jmin..=i).enumerate() {
                let p = scores[n] / sum;
                let (_, vj) = key(j);
                for (o, &vv) in oh.iter_mut().zip(&vj[kvh * d..(kvh + 1) * d]) {
                    *o += p * vv;
                }
            }
        }
    }
    for t in 0..t_len {
        lc.kv
            .push(&k[t * kvd..(t + 1) * kvd], &v[t * kvd..(t + 1) * kvd]);
    }
    linear_rows(&aw.o, &out)
}

/// The CPU model: weights plus one sequence's cache.
pub struct CpuModel<'w, 'a> {
    pub weights: &'w Weights<'a>,
    pub cache: Cache,
}

impl<'w, 'a> CpuModel<'w, 'a> {
    pub fn new(weights: &'w Weights<'a>) -> Self {
        CpuModel {
            weights,
            cache: Cache::new(&weights.config),
        }
    }

    /// Tokens consumed so far.
    pub fn position(&self) -> usize {
        self.cache.pos
    }

    /// Forget the sequence.
    pub fn reset(&mut self) {
        self.cache.reset();
    }

    /// Feed `tokens` (a prefill chunk or one decode token) and return the logits of the last one
    /// (`config.logits_width()` values). Errors: no tokens, a token past the vocabulary, and a NaN
    /// or an Inf in a router's logits or in the returned logits ([`ModelError::NonFiniteRouter`]
    /// naming position and layer, [`ModelError::NonFiniteLogits`] naming the position; the cache
    /// is then inconsistent until [`CpuModel::reset`]).
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        Ok(self.run(tokens, false)?.pop().expect("at least one row"))
    }

    /// Feed `tokens` and return the logits of every position of the chunk.
    pub fn forward_all(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.run(tokens, true)
    }

    fn run(&mut self, tokens: &[u32], all: bool) -> Result<Vec<Vec<f32>>> {
        let w = self.weights;
        let cfg = &w.config;
        let hdim = cfg.hidden_size;
        let eps = cfg.rms_norm_eps as f32;
        if tokens.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= cfg.vocab_size) {
            return Err(ModelError::TokenOutOfRange {
                id,
                vocab: cfg.vocab_size,
            });
        }
        let t_len = tokens.len();
        let p0 = self.cache.pos;
        let mut x = vec![0f32; t_len * hdim];
        for (row, &id) in x.chunks_exact_mut(hdim).zip(tokens) {
            w.embed.dequantize_row(id as usize, row);
        }
        rms_norm_rows(&mut x, &w.embed_norm, eps);

        for (li, (lw, lc)) in w
            .layers
            .iter()
            .zip(self.cache.layers.iter_mut())
            .enumerate()
        {
            let mut xn = x.clone();
            rms_norm_rows(&mut xn, &lw.input_norm, eps);
            let a = attention(&lw.attn, lc, &xn, p0, eps);
            let a = lc.conv[ATTN_SCONV].apply(&lw.attn_sconv.w, &a);
            for (xv, av) in x.iter_mut().zip(&a) {
                *xv += av;
            }
            let mut xn = x.clone();
            rms_norm_rows(&mut xn, &lw.post_attn_norm, eps);
            let mut m = Vec::with_capacity(x.len());
            for (ti, row) in xn.chunks_exact(hdim).enumerate() {
                match &lw.mlp {
                    Mlp::Dense(dm) => {
                        m.extend(ffn(&dm.ffn, row).into_iter().map(|y| y * dm.global_scale))
                    }
                    Mlp::Moe(moe) => m.extend(moe_forward(moe, row, li, p0 + ti)?),
                }
            }
            let m = lc.conv[MLP_SCONV].apply(&lw.mlp_sconv.w, &m);
            for (xv, mv) in x.iter_mut().zip(&m) {
                *xv += mv;
            }
        }
        self.cache.pos += t_len;

        let first = if all { 0 } else { t_len - 1 };
        let head = w.lm_head.rows_view(0, cfg.logits_width());
        let mup = cfg.logits_mup_width_multiplier as f32;
        let mut out = Vec::with_capacity(t_len - first);
        for (ti, row) in x.chunks_exact(hdim).enumerate().skip(first) {
            let mut h = row.to_vec();
            rms_norm_rows(&mut h, &w.norm, eps);
            for v in h.iter_mut() {
                *v /= mup;
            }
            let mut logits = vec![0f32; head.rows];
            head.gemv(&h, &mut logits);
            super::status::check_logits(&logits, logits.len(), p0 + ti)?;
            out.push(logits);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_order_puts_nan_below_minus_infinity_and_ties_to_the_lower_index() {
        let score = [0.5, f32::NAN, f32::NEG_INFINITY, 0.5, 0.9, -0.0, 0.0];
        let mut order: Vec<usize> = (0..score.len()).collect();
        order.sort_by(|&a, &b| rank_desc(score[a], score[b]).then(a.cmp(&b)));
        assert_eq!(order, [4, 0, 3, 5, 6, 2, 1]);
    }

    #[test]
    fn log_sigmoid_is_finite_where_sigmoid_underflows() {
        assert_eq!(sigmoid(-120.0), 0.0);
        assert_eq!(log_sigmoid(-120.0), -120.0);
        assert!((log_sigmoid(0.0) + std::f32::consts::LN_2).abs() < 1e-7);
        let tiny = log_sigmoid(40.0);
        assert!(tiny < 0.0 && tiny > -1e-17, "{tiny}");
    }
}
