//! What the HTTP side and the engine thread exchange: a [`Job`] (one generation request), the
//! [`Event`]s streamed back, and the [`Shared`] state and [`Counters`] that `/health` shows.
use super::logprobs::TokenLp;
use super::tools::{CallEvent, Tools};
use crate::chat::parse::Block;
use crate::model::generate::{GenerateParams, LogitOptions};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
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
    /// Sequence slots of the loaded model (`serve --parallel`), set once it is loaded.
    pub slots: OnceLock<usize>,
    /// Slots running a request now.
    pub busy_slots: AtomicUsize,
    /// Requests accepted and not yet ended, queued or running (the HTTP side counts one up
    /// before it queues a job, [`Shared::job_ended`] counts it down).
    pub admitted: AtomicUsize,
}

impl Shared {
    /// A job accepted by the HTTP side ended (finished, cancelled, failed, skipped or refused).
    pub fn job_ended(&self) {
        let _ = self
            .admitted
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_sub(1))
            });
    }

    /// `/health`'s `slots` object: `total` (0 until the model is loaded) and `in_use`.
    pub fn slots_json(&self) -> serde_json::Value {
        serde_json::json!({
            "total": self.slots.get().copied().unwrap_or(0),
            "in_use": self.busy_slots.load(Ordering::Relaxed),
        })
    }
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
    /// Decode steps run (each feeds one token to every running request).
    pub decode_steps: AtomicU64,
    /// Tokens fed by those steps: `decode_tokens / decode_steps` is the mean batch size.
    pub decode_tokens: AtomicU64,
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
            "decode_steps": g(&self.decode_steps),
            "decode_tokens": g(&self.decode_tokens),
        })
    }
}
