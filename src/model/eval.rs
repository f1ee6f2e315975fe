//! Perplexity over a token stream, and the KL divergence of its token distributions to a base model.
//!
//! Windows follow the strided sliding-window method of Hugging Face's guide "Perplexity of
//! fixed-length models" (transformers docs, `perplexity.md`): window k covers tokens
//! `[k·stride, min(k·stride + ctx, n))`, the model starts each window with an empty cache, and a
//! window scores only the tokens the previous window did not score (each scored token is
//! predicted from at least `ctx − stride` tokens of context, except in the first window). Token 0
//! is never predicted. With `stride = ctx` the windows are disjoint and the first token of each is
//! not scored, as in that guide.
//!
//! For a scored token t with logits z (the `logits_width()` values after token t−1):
//! `nll_t = logsumexp(z) − z[t]` (nats, f64). Perplexity = `exp(Σ nll / N)`; bits per byte =
//! `Σ nll / (ln 2 · bytes)` for the UTF-8 bytes the scored tokens cover. With a base model run on
//! the same windows: `KL_t = Σ_v p_base(v) (ln p_base(v) − ln p(v))` (KL(base ‖ model), as
//! llama.cpp's `--kl-divergence`), and top-1 agreement = share of tokens where both argmaxes
//! (ties to the lowest id) agree.
use super::Forward;
use anyhow::{ensure, Result};

/// One window: tokens `[begin, end)` are fed, targets `[first_target, end)` are scored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub begin: usize,
    pub end: usize,
    pub first_target: usize,
}

/// The windows of the module docs over `n` tokens. Needs `ctx ≥ 2` and `1 ≤ stride ≤ ctx`
/// (otherwise an error); fewer than 2 tokens give no window.
pub fn windows(n: usize, ctx: usize, stride: usize) -> Result<Vec<Window>> {
    ensure!(
        ctx >= 2,
        "the context must hold at least 2 tokens, got {ctx}"
    );
    ensure!(
        (1..=ctx).contains(&stride),
        "the stride must be between 1 and the context ({ctx}), got {stride}"
    );
    let mut out = Vec::new();
    let mut prev_end = 0;
    let mut begin = 0;
    if n < 2 {
        return Ok(out);
    }
    loop {
        let end = (begin + ctx).min(n);
        let first_target = prev_end.max(begin + 1);
        if first_target < end {
            out.push(Window {
                begin,
                end,
                first_target,
            });
        }
        prev_end = end;
        if end == n {
            break;
        }
        begin += stride;
    }
    Ok(out)
}

/// Sums over the scored tokens; the figures are methods.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EvalStats {
    /// Tokens scored.
    pub tokens: usize,
    /// Σ nll and Σ nll² (nats).
    pub nll_sum: f64,
    pub nll_sq_sum: f64,
    /// With a base model: Σ KL, Σ KL², tokens whose top-1 agrees, the base's Σ nll.
    pub base: Option<BaseStats>,
}

/// The base-model sums of [`EvalStats`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BaseStats {
    pub kl_sum: f64,
    pub kl_sq_sum: f64,
    pub top1_same: usize,
    pub nll_sum: f64,
}

fn mean_and_stderr(sum: f64, sq_sum: f64, n: usize) -> (f64, f64) {
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let m = sum / n as f64;
    // one value has no sample variance: its standard error is unknown (NaN), not 0
    let var = if n > 1 {
        ((sq_sum / n as f64 - m * m) * n as f64 / (n - 1) as f64).max(0.0)
    } else {
        f64::NAN
    };
    (m, (var / n as f64).sqrt())
}

impl EvalStats {
    /// Mean nll (nats per token) and its standard error.
    pub fn nll(&self) -> (f64, f64) {
        mean_and_stderr(self.nll_sum, self.nll_sq_sum, self.tokens)
    }
    /// Perplexity `exp(mean nll)` and its standard error by the delta method (`ppl · se(nll)`).
    pub fn perplexity(&self) -> (f64, f64) {
        let (m, se) = self.nll();
        (m.exp(), m.exp() * se)
    }
    /// Bits per byte over `bytes` UTF-8 bytes.
    pub fn bits_per_byte(&self, bytes: usize) -> f64 {
        self.nll_sum / (std::f64::consts::LN_2 * bytes as f64)
    }
    /// Mean KL divergence to the base (nats per token) and its standard error.
    pub fn kl(&self) -> Option<(f64, f64)> {
        let b = self.base.as_ref()?;
        Some(mean_and_stderr(b.kl_sum, b.kl_sq_sum, self.tokens))
    }
    /// Share of scored tokens whose argmax agrees with the base's, in [0, 1].
    pub fn top1_agreement(&self) -> Option<f64> {
        let b = self.base.as_ref()?;
        Some(b.top1_same as f64 / self.tokens as f64)
    }
    /// The base's perplexity over the same tokens.
    pub fn base_perplexity(&self) -> Option<f64> {
        let b = self.base.as_ref()?;
        Some((b.nll_sum / self.tokens as f64).exp())
    }
}

/// `ln softmax(z)` in f64.
fn log_softmax(z: &[f32]) -> Vec<f64> {
    let m = z.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    let lse = m + z.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    z.iter().map(|&v| v as f64 - lse).collect()
}

/// First index of the largest value.
fn argmax(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Positions fed per `forward_all` call while scoring (bounds the logits held at once).
pub const SCORE_CHUNK: usize = 128;

/// Score `tokens` over `wins` with `model` (and `base` on the same windows, for KL and top-1
/// agreement). Each window starts from a reset model; `on_scored(n)` is called after every chunk
/// with the number of tokens it scored. Logit rows must have the same width in both models.
pub fn evaluate(
    model: &mut dyn Forward,
    mut base: Option<&mut dyn Forward>,
    tokens: &[u32],
    wins: &[Window],
    on_scored: &mut dyn FnMut(usize),
) -> Result<EvalStats> {
    let mut st = EvalStats {
        base: base.as_ref().map(|_| BaseStats::default()),
        ..Default::default()
    };
    for w in wins {
        model.reset();
        if let Some(b) = base.as_deref_mut() {
            b.reset();
        }
        // Tokens before the first target's predecessor only build the cache.
        let ctx_part = &tokens[w.begin..w.first_target - 1];
        if !ctx_part.is_empty() {
            model.forward_greedy(ctx_part)?;
            if let Some(b) = base.as_deref_mut() {
                b.forward_greedy(ctx_part)?;
            }
        }
        let mut t0 = w.first_target;
        while t0 < w.end {
            let t1 = (t0 + SCORE_CHUNK).min(w.end);
            let feed = &tokens[t0 - 1..t1 - 1];
            let rows = model.forward_all(feed)?;
            let base_rows = match base.as_deref_mut() {
                Some(b) => Some(b.forward_all(feed)?),
                None => None,
            };
            for (j, row) in rows.iter().enumerate() {
                let target = tokens[t0 + j] as usize;
                ensure!(
                    target < row.len(),
                    "token id {target} is outside the {} logits of the model",
                    row.len()
                );
                let lp = log_softmax(row);
                let nll = -lp[target];
                st.tokens += 1;
                st.nll_sum += nll;
                st.nll_sq_sum += nll * nll;
                if let (Some(br), Some(bs)) = (&base_rows, st.base.as_mut()) {
                    let brow = &br[j];
                    ensure!(
                        brow.len() == row.len(),
                        "the base model gives {} logits per token, the model {}",
                        brow.len(),
                        row.len()
                    );
                    let blp = log_softmax(brow);
                    let kl: f64 = blp
                        .iter()
                        .zip(&lp)
                        .map(|(&b, &m)| {
                            if b > f64::NEG_INFINITY {
                                b.exp() * (b - m)
                            } else {
                                0.0
                            }
                        })
                        .sum();
                    bs.kl_sum += kl;
                    bs.kl_sq_sum += kl * kl;
                    bs.top1_same += (argmax(&blp) == argmax(&lp)) as usize;
                    bs.nll_sum += -blp[target];
                }
            }
            on_scored(t1 - t0);
            t0 = t1;
        }
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Result;

    /// The windows score every token 1..n exactly once (stride < ctx).
    #[test]
    fn windows_cover_each_token_once() {
        for (n, ctx, stride) in [(10, 4, 2), (10, 4, 4), (9, 5, 3), (3, 8, 4), (100, 16, 1)] {
            let ws = windows(n, ctx, stride).unwrap();
            let mut seen = vec![0; n];
            for w in &ws {
                assert!(w.end - w.begin <= ctx && w.first_target > w.begin);
                for s in &mut seen[w.first_target..w.end] {
                    *s += 1;
                }
            }
            assert_eq!(seen[0], 0);
            if stride < ctx {
                assert!(
                    seen[1..].iter().all(|&c| c == 1),
                    "{n} {ctx} {stride}: {seen:?}"
                );
            } else {
                // disjoint windows: the first token of each later window is not scored
                let unscored: Vec<usize> = (1..n).filter(|&i| seen[i] == 0).collect();
                let starts: Vec<usize> = ws.iter().skip(1).map(|w| w.begin).collect();
                assert_eq!(unscored, starts);
            }
        }
        assert_eq!(
            windows(10, 4, 2).unwrap(),
            [(0, 4, 1), (2, 6, 4), (4, 8, 6), (6, 10, 8)].map(|(begin, end, first_target)| {
                Window {
                    begin,
                    end,
                    first_target,
                }
            })
        );
        assert!(windows(1, 4, 2).unwrap().is_empty());
        assert!(windows(10, 1, 1).is_err());
        assert!(windows(10, 4, 5).is_err());
        assert!(windows(10, 4, 0).is_err());
    }

    /// A backend whose logits after token id `t` are `f(t)` (2 values).
    struct Table {
        f: fn(u32) -> [f32; 2],
        pos: usize,
        calls: Vec<(usize, usize)>,
    }

    impl Forward for Table {
        fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
            Ok(self.forward_all(tokens)?.pop().unwrap())
        }
        fn forward_all(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
            self.calls.push((self.pos, tokens.len()));
            self.pos += tokens.len();
            Ok(tokens.iter().map(|&t| (self.f)(t).to_vec()).collect())
        }
        fn reset(&mut self) {
            self.pos = 0;
        }
        fn position(&self) -> usize {
            self.pos
        }
        fn backend(&self) -> &'static str {
            "cpu"
        }
        fn adapter(&self) -> String {
            "table".into()
        }
    }

    #[test]
    fn evaluate_sums_nll_kl_and_agreement() {
        // model: uniform after every token; base: 3:1 for id 0 after token 1, else uniform
        let mut m = Table {
            f: |_| [0.0, 0.0],
            pos: 0,
            calls: vec![],
        };
        let mut b = Table {
            f: |t| if t == 1 { [3f32.ln(), 0.0] } else { [0.0, 0.0] },
            pos: 0,
            calls: vec![],
        };
        let tokens = [1u32, 0, 1, 1, 0, 0];
        let wins = windows(tokens.len(), 4, 2).unwrap();
        let mut scored = 0;
        let st = evaluate(&mut m, Some(&mut b), &tokens, &wins, &mut |n| scored += n).unwrap();
        assert_eq!((st.tokens, scored), (5, 5));
        // every window starts from position 0; only predecessors of targets are fed for logits
        assert_eq!(m.calls, [(0, 3), (0, 1), (1, 2)]);
        assert!((st.perplexity().0 - 2.0).abs() < 1e-12);
        // after token 1 (three of the five predictions): KL(0.75,0.25 ‖ 0.5,0.5)
        let kl1 = 0.75 * (1.5f64).ln() + 0.25 * (0.5f64).ln();
        assert!((st.kl().unwrap().0 - 3.0 * kl1 / 5.0).abs() < 1e-7); // ln 3 is rounded to f32
                                                                      // argmax ties go to id 0 in both, so top-1 always agrees
        assert_eq!(st.top1_agreement(), Some(1.0));
        // base nll: targets after token 1 are 0, 1, 0 (−ln .75, −ln .25, −ln .75), after 0: ln 2
        let bn = -(0.75f64.ln() * 2.0 + 0.25f64.ln()) + 2.0 * 2f64.ln();
        assert!((st.base_perplexity().unwrap() - (bn / 5.0).exp()).abs() < 1e-6);
    }

    #[test]
    fn stats_formulas() {
        let st = EvalStats {
            tokens: 2,
            nll_sum: 2.0_f64.ln() + 8.0_f64.ln(),
            nll_sq_sum: 2.0_f64.ln().powi(2) + 8.0_f64.ln().powi(2),
            base: None,
        };
        assert!((st.perplexity().0 - 4.0).abs() < 1e-12);
        // 4 bits over 1 byte
        assert!((st.bits_per_byte(1) - 4.0).abs() < 1e-12);
        let lp = log_softmax(&[0.0, 0.0, 0.0, 0.0]);
        assert!(lp.iter().all(|&v| (v + 4f64.ln()).abs() < 1e-15));
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
    }
}
