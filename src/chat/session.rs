//! Generation over a growing token sequence: when a prompt extends exactly the sequence the model
//! state holds (the previous prompt and its generated ids, as far as they were fed), only the new
//! tokens are prefilled; otherwise the state is reset and the whole prompt is prefilled. Both
//! give the same tokens (the KV cache and conv states of a prefix do not depend on how the prefix
//! was chunked, up to float rounding).
use crate::model::generate::{
    generate_continue_with, FinishReason, GenStats, GenerateParams, LogitOptions, StepLogprobs,
};
use crate::model::Forward;
use std::time::Instant;

/// Returned (as the error) by an `on_token` callback to end generation early, keeping what was
/// generated so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Halt {
    /// The user or the client stopped it (Ctrl-C, disconnect).
    #[error("generation cancelled")]
    Cancelled,
    /// A stop string matched.
    #[error("stop string matched")]
    Stop,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    Eos,
    Length,
    Halted(Halt),
}

/// One generation through a [`Session`].
#[derive(Clone, Debug)]
pub struct Turn {
    /// Generated ids, including the final EOS when `finish == Eos`.
    pub generated_ids: Vec<u32>,
    pub finish: Finish,
    /// `prompt_tokens` counts the tokens prefilled this turn (the prompt minus `reused`).
    pub stats: GenStats,
    /// Prompt tokens whose KV and conv state was already held.
    pub reused: usize,
}

/// A forward backend and the token sequence its state holds.
pub struct Session<'m> {
    model: &'m mut dyn Forward,
    held: Vec<u32>,
}

impl<'m> Session<'m> {
    pub fn new(model: &'m mut dyn Forward) -> Session<'m> {
        model.reset();
        Session {
            model,
            held: Vec::new(),
        }
    }

    pub fn model(&mut self) -> &mut dyn Forward {
        self.model
    }

    /// The ids the state holds, in order.
    pub fn held(&self) -> &[u32] {
        &self.held
    }

    /// Forget the sequence.
    pub fn reset(&mut self) {
        self.model.reset();
        self.held.clear();
    }

    /// Generate after `prompt` (the whole sequence: conversation so far + new tokens).
    /// `on_token` is called for every generated id except an EOS; returning a [`Halt`] error
    /// ends the turn with [`Finish::Halted`]. Any other error resets the state and is returned.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        on_token: &mut dyn FnMut(u32) -> anyhow::Result<()>,
    ) -> anyhow::Result<Turn> {
        let none = LogitOptions::default();
        self.generate_with(prompt, params, &none, &mut |id, _| on_token(id))
    }

    /// [`Session::generate`] with [`LogitOptions`] (logit bias, log-probabilities, which
    /// `on_token` gets with each id when asked for).
    pub fn generate_with(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        opts: &LogitOptions,
        on_token: &mut dyn FnMut(u32, Option<&StepLogprobs>) -> anyhow::Result<()>,
    ) -> anyhow::Result<Turn> {
        anyhow::ensure!(!prompt.is_empty(), "the prompt has no tokens");
        let held = self.held.len();
        let reuse = held > 0
            && self.model.position() == held
            && prompt.len() > held
            && prompt[..held] == self.held[..];
        let start = if reuse { held } else { 0 };
        if !reuse {
            self.reset();
        }
        let mut ids = Vec::new();
        let t0 = Instant::now();
        let mut t_first = None;
        let res = generate_continue_with(
            self.model,
            &prompt[..start],
            &prompt[start..],
            params,
            opts,
            &mut |id, lp| {
                ids.push(id);
                t_first.get_or_insert_with(Instant::now);
                on_token(id, lp)
            },
        );
        let (generated_ids, finish, stats) = match res {
            Ok(out) => {
                let finish = match out.finish_reason {
                    FinishReason::Eos => Finish::Eos,
                    FinishReason::Length => Finish::Length,
                };
                (out.generated_ids, finish, out.stats)
            }
            Err(e) => match e.downcast_ref::<Halt>() {
                Some(&h) => {
                    let stats = halted_stats(prompt.len() - start, ids.len(), t0, t_first);
                    (ids, Finish::Halted(h), stats)
                }
                None => {
                    self.reset();
                    return Err(e);
                }
            },
        };
        // the state holds a prefix of prompt + generated (the GPU's pipelined decode may have fed
        // the last id, the unpipelined loop has not)
        let pos = self.model.position();
        let known = prompt.len() + generated_ids.len();
        if pos <= known {
            self.held = prompt.to_vec();
            self.held.extend_from_slice(&generated_ids);
            self.held.truncate(pos);
        } else {
            self.reset();
        }
        Ok(Turn {
            generated_ids,
            finish,
            stats,
            reused: start,
        })
    }
}

/// Stats of a halted turn, from the session's own clock.
fn halted_stats(
    prompt_tokens: usize,
    generated: usize,
    t0: Instant,
    t_first: Option<Instant>,
) -> GenStats {
    let mut s = GenStats {
        prompt_tokens,
        generated_tokens: generated,
        ..Default::default()
    };
    if let Some(t1) = t_first {
        s.prefill_s = (t1 - t0).as_secs_f64();
        s.ttft_s = s.prefill_s;
        let dt = t1.elapsed().as_secs_f64();
        if generated > 1 && dt > 0.0 {
            s.decode_tok_s = (generated - 1) as f64 / dt;
        }
    }
    s
}
