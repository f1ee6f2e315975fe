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
/// `stats.prompt_tokens` counts the tokens fed here.
pub fn generate_continue(
    model: &mut dyn Forward,
    prompt: &[u32],
    params: &GenerateParams,
    on_token: &mut dyn FnMut(u32) -> anyhow::Result<()>,
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
    if greedy && !penalties {
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
                on_token(id)?;
                Ok(out.len() < params.max_new_tokens)
            })?;
            stats.prefill_s = prefill_s;
            stats.ttft_s = ttft_s;
            return Ok(finish_output(out, finish, stats, t_first));
        }
    }
    // the ids the penalties look at: this call's prompt, then the generated ones
    let mut history: Vec<u32> = if penalties { prompt.to_vec() } else { vec![] };
    let (mut generated, mut first) = (0usize, true);
    let mut next = |model: &mut dyn Forward, tokens: &[u32]| -> anyhow::Result<u32> {
        if penalties {
            // after the prompt, `tokens` is the id generated last
            if !first {
                history.extend_from_slice(tokens);
                generated += tokens.len();
            }
            first = false;
            let mut logits = model.forward(tokens)?;
            penalize(&mut logits, &history, generated, &params.sampling);
            return Ok(if greedy {
                argmax(&logits)
            } else {
                sample(&logits, &params.sampling, &mut rng)
            });
        }
        if greedy {
            model.forward_greedy(tokens)
        } else {
            Ok(sample(&model.forward(tokens)?, &params.sampling, &mut rng))
        }
    };
    let t0 = Instant::now();
    let mut id = next(model, prompt)?;
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
        on_token(id)?;
        if out.len() >= params.max_new_tokens {
            break;
        }
        id = next(model, &[id])?;
    }
    Ok(finish_output(out, finish, stats, t_first))
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
