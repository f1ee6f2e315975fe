//! The engine thread: owns the forward backend and a [`Session`] (so a request that extends the
//! previous sequence exactly reuses its KV cache and conv states), takes [`Job`]s from a bounded
//! queue one at a time and streams [`Event`]s back. A job whose event receiver is gone or closed
//! (the client disconnected, or the server is shutting down) is skipped when it comes up, or
//! halted at its next token when running.
use super::logprobs::{self, TokenLp};
use super::tools::{CallEvent, CallParser, Choice, Tools};
use crate::chat::parse::{Block, OutputParser};
use crate::chat::session::{Finish, Halt, Session};
use crate::chat::specials::Specials;
use crate::chat::stop::StopMatcher;
use crate::model::generate::{GenerateParams, LogitOptions, StepLogprobs};
use crate::model::text::TextStream;
use crate::model::Forward;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::OnceLock;
use tokenizers::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

/// How the generated ids become text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobKind {
    /// A chat turn: TMLv0 blocks; `in_text` when the prompt ended with `<|content_text|>`.
    Chat { in_text: bool },
    /// Plain text: every non-special id detokenised.
    Completion,
}

pub struct Job {
    /// The whole prompt.
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    /// Stop strings, matched on the answer text.
    pub stop: Vec<String>,
    pub kind: JobKind,
    /// Logit bias and log-probabilities.
    pub logit: LogitOptions,
    /// Chat with tools: tool calls are parsed from the output.
    pub tools: Option<Tools>,
    pub events: UnboundedSender<Event>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The job left the queue; its prefill starts.
    Started,
    /// Text made final (after stop-string matching for the answer), with the log-probabilities
    /// of the answer tokens since the last delta (when asked for; the text may be empty then).
    Delta {
        block: Block,
        text: String,
        logprobs: Vec<TokenLp>,
    },
    /// A tool call the model writes: its start, pieces of its arguments, its end.
    Tool(CallEvent),
    /// The end: "stop", "length" or "tool_calls".
    Done {
        finish: &'static str,
        prompt_tokens: usize,
        /// Prompt tokens whose state was reused from the previous request.
        cached_tokens: usize,
        generated_ids: Vec<u32>,
    },
    Error(String),
}

/// What the engine shares with the HTTP side.
#[derive(Default)]
pub struct Shared {
    /// Set once the model is loaded.
    pub ready: AtomicBool,
    /// Stop ids of the loaded model (`<|content_model_end_sampling|>` and its EOS ids).
    pub stop_ids: OnceLock<Vec<u32>>,
    /// Context length in tokens that the loaded model runs with (`cli::load::ChatModel::ctx`):
    /// the bound of prompt + completion, and the number the context-length errors give.
    pub ctx: OnceLock<usize>,
    pub counters: Counters,
    /// How expert streaming went so far, after the last finished job (`None`: resident).
    pub experts: std::sync::Mutex<Option<crate::model::StreamStats>>,
}

/// Request counts since start (shown by `/health`).
#[derive(Default)]
pub struct Counters {
    /// Generation requests received (accepted or not).
    pub requests: AtomicU64,
    /// Finished with "stop" or "length".
    pub completed: AtomicU64,
    /// Refused with 429 (queue full).
    pub rejected: AtomicU64,
    /// Dropped by their client while queued or running.
    pub cancelled: AtomicU64,
    /// Failed in the engine.
    pub failed: AtomicU64,
    /// Prompt tokens reused from the previous request's state.
    pub cached_tokens: AtomicU64,
}

impl Counters {
    pub fn to_json(&self) -> serde_json::Value {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        serde_json::json!({
            "requests": g(&self.requests),
            "completed": g(&self.completed),
            "rejected_429": g(&self.rejected),
            "cancelled": g(&self.cancelled),
            "failed": g(&self.failed),
            "cached_tokens": g(&self.cached_tokens),
        })
    }
}

/// Run jobs until every sender is gone.
pub fn run(
    model: &mut dyn Forward,
    tok: &Tokenizer,
    sp: &Specials,
    jobs: Receiver<Job>,
    shared: &Shared,
) {
    let mut session = Session::new(model);
    let note_experts = |session: &mut Session<'_>| {
        *shared.experts.lock().unwrap_or_else(|e| e.into_inner()) = session.model().stream_stats();
    };
    note_experts(&mut session);
    shared.ready.store(true, Ordering::SeqCst);
    let c = &shared.counters;
    for job in jobs {
        if job.events.is_closed() {
            c.cancelled.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let r = run_job(&mut session, tok, sp, &job);
        note_experts(&mut session);
        match r {
            Ok(Some(done)) => {
                if let Event::Done { cached_tokens, .. } = &done {
                    c.cached_tokens
                        .fetch_add(*cached_tokens as u64, Ordering::Relaxed);
                }
                c.completed.fetch_add(1, Ordering::Relaxed);
                let _ = job.events.send(done);
            }
            Ok(None) => {
                c.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                c.failed.fetch_add(1, Ordering::Relaxed);
                let _ = job.events.send(Event::Error(format!("{e:#}")));
            }
        }
    }
}

/// One job; `Ok(None)` when its client went away.
fn run_job(
    session: &mut Session<'_>,
    tok: &Tokenizer,
    sp: &Specials,
    job: &Job,
) -> anyhow::Result<Option<Event>> {
    let _ = job.events.send(Event::Started);
    let forced = job.tools.as_ref().and_then(|t| match &t.choice {
        Choice::Named(n) => Some(n.as_str()),
        _ => None,
    });
    let mut out = Output {
        parser: match job.kind {
            JobKind::Chat { in_text } => {
                let p = OutputParser::new(tok, sp, in_text);
                Some(if job.tools.is_some() {
                    p.with_tools(forced.is_some())
                } else {
                    p
                })
            }
            JobKind::Completion => None,
        },
        calls: match (job.kind, &job.tools) {
            (JobKind::Chat { in_text }, Some(_)) => Some(CallParser::new(tok, sp, in_text, forced)),
            _ => None,
        },
        // one call only: a named choice, or parallel_tool_calls false
        one_call: forced.is_some() || job.tools.as_ref().is_some_and(|t| !t.parallel),
        made_calls: 0,
        plain: TextStream::new(tok),
        stop: StopMatcher::new(&job.stop),
        sp,
        tok,
        lps: Vec::new(),
        events: &job.events,
    };
    let turn = session.generate_with(&job.prompt, &job.params, &job.logit, &mut |id, lp| {
        if job.events.is_closed() {
            return Err(Halt::Cancelled.into());
        }
        out.push(id, lp)
    })?;
    let finish = match turn.finish {
        Finish::Halted(Halt::Cancelled) => return Ok(None),
        Finish::Halted(Halt::Stop) | Finish::Eos => "stop",
        Finish::Length => "length",
    };
    // a stop string's own tokens get no log-probabilities
    if turn.finish != Finish::Halted(Halt::Stop) {
        out.finish()?;
        out.flush_logprobs();
    }
    let finish = if out.made_calls > 0 && finish == "stop" {
        "tool_calls"
    } else {
        finish
    };
    if out.parser.as_ref().is_some_and(|p| p.strayed()) {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            eprintln!(
                "inkling-wgpu serve: warning: the model wrote text outside any content block (it \
                 does not follow Inkling's chat format); that text is sent as the answer's content"
            )
        });
    }
    Ok(Some(Event::Done {
        finish,
        prompt_tokens: job.prompt.len(),
        cached_tokens: turn.reused,
        generated_ids: turn.generated_ids,
    }))
}

/// Generated ids → text, tool-call and log-probability events.
struct Output<'a, 't> {
    parser: Option<OutputParser<'t>>,
    calls: Option<CallParser<'t>>,
    /// End the turn after the first tool call.
    one_call: bool,
    made_calls: usize,
    plain: TextStream<'t>,
    stop: StopMatcher,
    sp: &'a Specials,
    tok: &'t Tokenizer,
    /// Log-probabilities of answer tokens not yet sent.
    lps: Vec<TokenLp>,
    events: &'a UnboundedSender<Event>,
}

impl Output<'_, '_> {
    fn push(&mut self, id: u32, lp: Option<&StepLogprobs>) -> anyhow::Result<()> {
        if let Some(lp) = lp {
            // answer tokens only: ordinary ids of a text block (or of a completion)
            let answer = !self.sp.is_special(id)
                && self
                    .parser
                    .as_ref()
                    .is_none_or(|p| p.block() == Block::Text);
            if answer {
                self.lps.push(logprobs::entry(self.tok, id, lp));
            }
        }
        if let Some(c) = self.calls.as_mut() {
            let events = c.push(id)?;
            if self.send_calls(events) && self.one_call {
                return Err(Halt::Stop.into());
            }
        }
        let piece = match self.parser.as_mut() {
            Some(p) => p.push(id)?.map(|pc| (pc.block, pc.text)),
            None if self.sp.is_special(id) => None,
            None => Some((Block::Text, self.plain.step(id)?)),
        };
        if let Some((block, text)) = piece {
            self.emit(block, &text);
            if self.stop.stopped() {
                return Err(Halt::Stop.into());
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> anyhow::Result<()> {
        if let Some(c) = self.calls.as_mut() {
            let events = c.finish()?;
            self.send_calls(events);
        }
        let tail = match self.parser.as_mut() {
            Some(p) => p.finish()?.map(|pc| (pc.block, pc.text)),
            None => Some((Block::Text, self.plain.finish()?)),
        };
        if let Some((block, text)) = tail {
            self.emit(block, &text);
        }
        let held = self.stop.finish();
        self.send(Block::Text, held);
        Ok(())
    }

    fn emit(&mut self, block: Block, text: &str) {
        match block {
            Block::Text => {
                let t = self.stop.push(text);
                self.send(block, t);
            }
            Block::Thinking => self.send(block, text.to_string()),
            Block::Other => {}
        }
    }

    fn send(&mut self, block: Block, text: String) {
        let mut logprobs = if block == Block::Text {
            std::mem::take(&mut self.lps)
        } else {
            vec![]
        };
        if block == Block::Text && self.stop.stopped() {
            // the text before the matched stop string: the held tokens it covers keep their
            // log-probabilities, the ones inside the stop string get none
            let mut room = text.len();
            let keep = logprobs
                .iter()
                .take_while(|e| match room.checked_sub(e.bytes.len()) {
                    Some(r) => {
                        room = r;
                        true
                    }
                    None => false,
                })
                .count();
            logprobs.truncate(keep);
        }
        if !text.is_empty() || !logprobs.is_empty() {
            let _ = self.events.send(Event::Delta {
                block,
                text,
                logprobs,
            });
        }
    }

    /// Send tool-call events; whether a call ended among them.
    fn send_calls(&mut self, events: Vec<CallEvent>) -> bool {
        let mut ended = false;
        for e in events {
            if matches!(e, CallEvent::End(_)) {
                self.made_calls += 1;
                ended = true;
            }
            let _ = self.events.send(Event::Tool(e));
        }
        ended
    }

    /// Send the log-probabilities still held (of tokens whose text a stop string held back).
    fn flush_logprobs(&mut self) {
        if !self.lps.is_empty() {
            self.send(Block::Text, String::new());
        }
    }
}
