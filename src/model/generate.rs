//! The decode loop shared by the CLI and the tests: prefill, then one token at a time, stopping on
//! any EOS id or at `max_new_tokens`.
use super::sampling::{argmax, penalize, sample, Rng, SamplingParams};
use super::Forward;
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct GenerateParams {
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    pub seed: u64,
    /// Stop as soon as any of these is generated (it is kept in `generated_ids`, never printed).
    pub eos_ids: Vec<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Eos,
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Eos => "eos",
            FinishReason::Length => "length",
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct GenStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Seconds of the prompt's forward.
    pub prefill_s: f64,
    /// Seconds from the start of the prefill to the first token chosen.
    pub ttft_s: f64,
    /// Decode tokens per second after the first token (0 when fewer than two tokens).
    pub decode_tok_s: f64,
}

#[derive(Clone, Debug)]
pub struct GenOutput {
    /// Generated ids, including the final EOS when `finish_reason == Eos` (as transformers returns).
    pub generated_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    pub stats: GenStats,
}

/// The number of new tokens that fit the model's context: `requested`, or `max_positions −
/// prompt_len` when the prompt and `requested` new tokens would pass `max_positions`
/// (`max_position_embeddings`; `None`: no limit). Errors when the prompt alone fills the context.
pub fn fit_new_tokens(
    requested: usize,
    prompt_len: usize,
    max_positions: Option<usize>,
) -> anyhow::Result<usize> {
    let Some(max) = max_positions else {
        return Ok(requested);
    };
    anyhow::ensure!(
        prompt_len < max,
        "the prompt has {prompt_len} tokens and the model's context (max_position_embeddings) \
         is {max} positions: shorten the prompt to fewer than {max} tokens"
    );
    Ok(requested.min(max - prompt_len))
}

/// Run generation from a fresh state (`model.reset()` first). `on_token` is called for every
/// generated token except an EOS, in order, as soon as it is chosen.
pub fn generate(
    model: &mut dyn Forward,
    prompt: &[u32],
    params: &GenerateParams,
    on_token: &mut dyn FnMut(u32) -> anyhow::Result<()>,
) -> anyhow::Result<GenOutput> {
    model.reset();
    generate_continue(model, prompt, params, on_token)
}

/// [`generate`] without the reset: `prompt` is fed after the tokens the model already holds
/// (KV cache and conv states kept), so a chat turn prefills only its new tokens.
/// `stats.prompt_tokens` counts the tokens fed here. The penalties see `prompt` and the ids
/// generated ([`generate_continue_with`] also takes what the model holds).
pub fn generate_continue(
    model: &mut dyn Forward,
    prompt: &[u32],
    params: &GenerateParams,
    on_token: &mut dyn FnMut(u32) -> anyhow::Result<()>,
) -> anyhow::Result<GenOutput> {
    let none = LogitOptions::default();
    generate_continue_with(model, &[], prompt, params, &none, &mut |id, _| on_token(id))
}

/// Per-request options on the logits beyond [`SamplingParams`] (the server's `logit_bias` and
/// `logprobs`). Either one makes the decode read the whole logit row each step (no greedy
/// pipeline, no argmax-only readback), as the penalties do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogitOptions {
    /// Added to the logit of each id (after the penalties, before temperature and sampling).
    pub bias: Vec<(u32, f32)>,
    /// Report the log-probability of each chosen token and of this many most likely ones.
    pub logprobs: Option<usize>,
}

impl LogitOptions {
    pub fn needs_logits(&self) -> bool {
        !self.bias.is_empty() || self.logprobs.is_some()
    }
}

/// The log-probabilities of one step: log-softmax of the model's raw logits (before the
/// penalties, the bias and the temperature).
#[derive(Clone, Debug, PartialEq)]
pub struct StepLogprobs {
    /// Of the chosen id.
    pub logprob: f32,
    /// The most likely ids, most likely first (ties by id).
    pub top: Vec<(u32, f32)>,
}

/// [`StepLogprobs`] of `chosen` and the `n` most likely ids in `logits` (NaN logits never rank).
pub fn step_logprobs(logits: &[f32], chosen: u32, n: usize) -> StepLogprobs {
    let max = logits
        .iter()
        .copied()
        .filter(|x| !x.is_nan())
        .fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits
        .iter()
        .filter(|x| !x.is_nan())
        .map(|&x| (x as f64 - max).exp())
        .sum();
    let lse = max + sum.ln();
    let lp = |id: u32| {
        logits
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |&x| (x as f64 - lse) as f32)
    };
    let mut top: Vec<u32> = Vec::with_capacity(n + 1);
    if n > 0 {
        let mut idx: Vec<u32> = (0..logits.len() as u32)
            .filter(|&i| !logits[i as usize].is_nan())
            .collect();
        let by = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        if idx.len() > n {
            idx.select_nth_unstable_by(n - 1, by);
            idx.truncate(n);
        }
        idx.sort_by(by);
        top = idx;
    }
    StepLogprobs {
        logprob: lp(chosen),
        top: top.into_iter().map(|i| (i, lp(i))).collect(),
    }
}

/// [`generate_continue`] with [`LogitOptions`]: `on_token` also gets the step's log-probabilities
/// when `opts.logprobs` asks for them. `held` is what the model already holds before `prompt` (the
/// earlier turns of a chat): the penalties' window reaches into it, as it would had the whole
/// sequence been prefilled.
pub fn generate_continue_with(
    model: &mut dyn Forward,
    held: &[u32],
    prompt: &[u32],
    params: &GenerateParams,
    opts: &LogitOptions,
    on_token: &mut dyn FnMut(u32, Option<&StepLogprobs>) -> anyhow::Result<()>,
) -> anyhow::Result<GenOutput> {
    anyhow::ensure!(!prompt.is_empty(), "the prompt has no tokens");
    let mut rng = Rng::new(params.seed);
    let mut stats = GenStats {
        prompt_tokens: prompt.len(),
        ..Default::default()
    };
    let mut out = Vec::new();
    if params.max_new_tokens == 0 {
        return Ok(GenOutput {
            generated_ids: out,
            finish_reason: FinishReason::Length,
            stats,
        });
    }
    // Greedy decoding asks the backend for the argmax only (the GPU reads back 4 bytes), through
    // its pipelined path when it has one (the GPU: one step in flight, no host round trip between
    // steps).
    let greedy = params.sampling.temperature <= 0.0;
    let penalties = params.sampling.has_penalties();
    let full = penalties || opts.needs_logits();
    if greedy && !full {
        let t0 = Instant::now();
        let mut finish = FinishReason::Length;
        let mut t_first = None;
        let mut prefill_s = 0.0;
        let mut ttft_s = 0.0;
        if let Some(pipe) = model.greedy_pipeline() {
            pipe.greedy_stream(prompt, params.max_new_tokens, &mut |id| {
                out.push(id);
                if t_first.is_none() {
                    // the prompt's forward ends with the first id's readback
                    prefill_s = t0.elapsed().as_secs_f64();
                    ttft_s = prefill_s;
                    t_first = Some(Instant::now());
                }
                if params.eos_ids.contains(&id) {
                    finish = FinishReason::Eos;
                    return Ok(false);
                }
                on_token(id, None)?;
                Ok(out.len() < params.max_new_tokens)
            })?;
            stats.prefill_s = prefill_s;
            stats.ttft_s = ttft_s;
            return Ok(finish_output(out, finish, stats, t_first));
        }
    }
    let mut sampler = Sampler::new(params, opts, held, prompt);
    let mut first = true;
    type Step = (u32, Option<StepLogprobs>);
    let mut next = |model: &mut dyn Forward, tokens: &[u32]| -> anyhow::Result<Step> {
        if full {
            // after the prompt, `tokens` is the id generated last
            if !first {
                tokens.iter().for_each(|&id| sampler.fed(id));
            }
            first = false;
            return Ok(sampler.pick(model.forward(tokens)?));
        }
        if greedy {
            Ok((model.forward_greedy(tokens)?, None))
        } else {
            let id = sample(&model.forward(tokens)?, &params.sampling, &mut rng);
            Ok((id, None))
        }
    };
    let t0 = Instant::now();
    let (mut id, mut lp) = next(model, prompt)?;
    stats.prefill_s = t0.elapsed().as_secs_f64();
    let mut finish = FinishReason::Length;
    let mut t_first = None;
    loop {
        out.push(id);
        if t_first.is_none() {
            stats.ttft_s = t0.elapsed().as_secs_f64();
            t_first = Some(Instant::now());
        }
        if params.eos_ids.contains(&id) {
            finish = FinishReason::Eos;
            break;
        }
        on_token(id, lp.as_ref())?;
        if out.len() >= params.max_new_tokens {
            break;
        }
        (id, lp) = next(model, &[id])?;
    }
    Ok(finish_output(out, finish, stats, t_first))
}

/// The choice of each generated id of one sequence from its logits, as [`generate_continue_with`]
/// makes it when it reads whole logit rows: the penalties over the history (the prompt, then the
/// ids fed back), the logit bias, then the argmax (temperature 0) or a draw from the sampling
/// distribution with the sequence's own [`Rng`]; and the log-probabilities of the raw logits when
/// asked for. The server runs one per request, so requests decoded in one batch never share a
/// random stream.
pub struct Sampler {
    sampling: SamplingParams,
    opts: LogitOptions,
    rng: Rng,
    /// The prompt (when there are penalties), then every id fed back.
    history: Vec<u32>,
    /// Ids fed back so far.
    generated: usize,
}

impl Sampler {
    /// A sampler for a sequence that starts with `held` then `prompt` (the penalties' window
    /// reaches into both; they are copied only when there are penalties).
    pub fn new(
        params: &GenerateParams,
        opts: &LogitOptions,
        held: &[u32],
        prompt: &[u32],
    ) -> Sampler {
        let penalties = params.sampling.has_penalties();
        Sampler {
            sampling: params.sampling,
            opts: opts.clone(),
            rng: Rng::new(params.seed),
            history: if penalties {
                [held, prompt].concat()
            } else {
                vec![]
            },
            generated: 0,
        }
    }

    /// The next id after a step whose logits (`config.logits_width()` values) are `logits`, and
    /// its log-probabilities when `opts.logprobs` asks for them.
    pub fn pick(&mut self, mut logits: Vec<f32>) -> (u32, Option<StepLogprobs>) {
        let raw = self.opts.logprobs.map(|_| logits.clone());
        penalize(&mut logits, &self.history, self.generated, &self.sampling);
        for &(id, b) in &self.opts.bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += b;
            }
        }
        let id = if self.sampling.temperature <= 0.0 {
            argmax(&logits)
        } else {
            sample(&logits, &self.sampling, &mut self.rng)
        };
        let lp = raw.map(|r| step_logprobs(&r, id, self.opts.logprobs.unwrap_or(0)));
        (id, lp)
    }

    /// Whether [`Sampler::pick`] is the plain argmax of the logits (temperature 0, no penalties,
    /// no bias, no log-probabilities): then the backend's [`Forward::forward_greedy`] gives the
    /// same id without handing back the logits.
    pub fn argmax_only(&self) -> bool {
        self.sampling.temperature <= 0.0
            && !self.sampling.has_penalties()
            && !self.opts.needs_logits()
    }

    /// `id`, picked last, was fed to the model: it joins the history the penalties look at.
    pub fn fed(&mut self, id: u32) {
        if self.sampling.has_penalties() {
            self.history.push(id);
        }
        self.generated += 1;
    }
}

fn finish_output(
    out: Vec<u32>,
    finish: FinishReason,
    mut stats: GenStats,
    t_first: Option<Instant>,
) -> GenOutput {
    stats.generated_tokens = out.len();
    if let Some(t1) = t_first {
        let dt = t1.elapsed().as_secs_f64();
        let n = out.len().saturating_sub(1);
        stats.decode_tok_s = if n > 0 && dt > 0.0 {
            n as f64 / dt
        } else {
            0.0
        };
    }
    GenOutput {
        generated_ids: out,
        finish_reason: finish,
        stats,
    }
}
