//! The OpenAI API surface: request bodies (`/v1/chat/completions`, `/v1/completions`) parsed and
//! validated into an engine job, response and chunk bodies, and error envelopes
//! (`{"error":{"message","type","param","code"}}` with the HTTP status).
use crate::chat::render::ToolCall;
use crate::chat::{Effort, Message, Renderer, Role};
use crate::model::generate::GenerateParams;
use crate::model::sampling::SamplingParams;
use serde::Deserialize;
use serde_json::{json, Value};

/// An error response: HTTP status and the envelope's fields.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
        }
    }

    pub fn new(status: u16, kind: &'static str, code: &'static str, message: String) -> ApiError {
        ApiError {
            status,
            message,
            kind,
            param: None,
            code: Some(code),
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// `stop`: one string or up to 4.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `reasoning_effort`: a named effort or a number.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum EffortField {
    Name(String),
    Value(f64),
}

#[derive(Deserialize, Debug, Default)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// The fields both endpoints share.
#[derive(Deserialize, Debug)]
struct Common {
    model: Option<String>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<u64>,
    seed: Option<u64>,
    stop: Option<Stop>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    n: Option<u64>,
    /// vLLM's extension: `token_ids` (and `prompt_token_ids`) in the choices.
    #[serde(default)]
    return_token_ids: bool,
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize, Debug)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize, Debug)]
struct FunctionCall {
    name: String,
    arguments: String,
}

#[derive(Deserialize, Debug)]
struct ToolCallIn {
    id: Option<String>,
    function: FunctionCall,
}

#[derive(Deserialize, Debug)]
struct ChatMessage {
    role: String,
    content: Option<Content>,
    name: Option<String>,
    tool_calls: Option<Vec<ToolCallIn>>,
    tool_call_id: Option<String>,
}

#[derive(Deserialize, Debug)]
struct ChatBody {
    messages: Vec<ChatMessage>,
    reasoning_effort: Option<EffortField>,
    tools: Option<Vec<Value>>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(Deserialize, Debug)]
struct CompletionBody {
    prompt: Prompt,
    #[serde(flatten)]
    common: Common,
}

/// What a request asks the engine for, validated.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub return_token_ids: bool,
    /// Chat: the prompt ends with `<|content_text|>` (no thinking block).
    pub in_text: bool,
}

/// What validation needs to know about the server.
pub struct Limits<'a> {
    pub model_id: &'a str,
    /// Context length in tokens (the one the engine runs with, [`super::engine::Shared::ctx`]).
    pub ctx: usize,
    pub stop_ids: &'a [u32],
    /// Vocabulary size: prompt ids must be below it.
    pub vocab: usize,
    /// Sampling when a request does not say (the model's generation_config.json).
    pub sampling: SamplingParams,
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}"), None))
}

fn text_of(c: Option<Content>) -> Result<String, ApiError> {
    match c {
        None => Ok(String::new()),
        Some(Content::Text(s)) => Ok(s),
        Some(Content::Parts(parts)) => {
            let mut s = String::new();
            for p in parts {
                match (p.kind.as_str(), p.text) {
                    ("text", Some(t)) => s.push_str(&t),
                    (k, _) => {
                        return Err(ApiError::bad_request(
                            format!("content part of type {k:?} is not supported (text only)"),
                            Some("messages"),
                        ))
                    }
                }
            }
            Ok(s)
        }
    }
}

/// Parse and validate a `/v1/chat/completions` body.
pub fn chat_request(body: &[u8], r: &Renderer, lim: &Limits<'_>) -> Result<Request, ApiError> {
    let b: ChatBody = parse(body)?;
    if b.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::bad_request(
            "tool declarations (`tools`) are not supported by this server",
            Some("tools"),
        ));
    }
    if b.messages.is_empty() {
        return Err(ApiError::bad_request(
            "`messages` must hold at least one message",
            Some("messages"),
        ));
    }
    let effort = match b.reasoning_effort {
        None => Ok(Effort::DEFAULT),
        Some(EffortField::Name(s)) => Effort::parse(&s),
        Some(EffortField::Value(v)) => Effort::from_value(v),
    }
    .map_err(|e| ApiError::bad_request(e, Some("reasoning_effort")))?;
    let mut messages = Vec::new();
    let mut call_names: Vec<(String, String)> = Vec::new();
    for m in b.messages {
        let role = match m.role.as_str() {
            "system" | "developer" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Model,
            "tool" => Role::Tool,
            other => {
                return Err(ApiError::bad_request(
                    format!(
                        "unknown message role {other:?} (system, developer, user, assistant, tool)"
                    ),
                    Some("messages"),
                ))
            }
        };
        let mut msg = Message::new(role, text_of(m.content)?);
        for c in m.tool_calls.unwrap_or_default() {
            let arguments: Value = serde_json::from_str(&c.function.arguments).map_err(|e| {
                ApiError::bad_request(
                    format!("tool call arguments are not JSON: {e}"),
                    Some("messages"),
                )
            })?;
            if let Some(id) = c.id {
                call_names.push((id, c.function.name.clone()));
            }
            msg.tool_calls.push(ToolCall {
                name: c.function.name,
                arguments,
            });
        }
        msg.name = match (role, m.name, m.tool_call_id) {
            (Role::Tool, Some(n), _) => Some(n),
            (Role::Tool, None, Some(id)) => call_names
                .iter()
                .find(|(i, _)| *i == id)
                .map(|(_, n)| n.clone()),
            _ => None,
        };
        messages.push(msg);
    }
    let mut prompt = r
        .render_for_generation(&messages, Some(effort))
        .map_err(|e| ApiError::bad_request(format!("{e:#}"), Some("messages")))?;
    let in_text = prompt.last() == Some(&r.specials().content_text);
    let req = finish(b.common, std::mem::take(&mut prompt), "messages", None, lim)?;
    Ok(Request { in_text, ..req })
}

/// Parse and validate a `/v1/completions` body (prompt text is encoded without chat format).
pub fn completion_request(
    body: &[u8],
    r: &Renderer,
    lim: &Limits<'_>,
) -> Result<Request, ApiError> {
    let b: CompletionBody = parse(body)?;
    let bad = |m: &str| ApiError::bad_request(m.to_string(), Some("prompt"));
    let prompt = match b.prompt {
        Prompt::Text(s) => r.encode_text(&s).map_err(|e| bad(&format!("{e:#}")))?,
        Prompt::Ids(ids) => ids,
        Prompt::Texts(v) if v.len() == 1 => {
            r.encode_text(&v[0]).map_err(|e| bad(&format!("{e:#}")))?
        }
        Prompt::IdLists(mut v) if v.len() == 1 => v.remove(0),
        _ => return Err(bad("batched prompts are not supported: give one prompt")),
    };
    if let Some(&id) = prompt.iter().find(|&&id| id as usize >= lim.vocab) {
        return Err(bad(&format!(
            "prompt token id {id} is outside the vocabulary (size {})",
            lim.vocab
        )));
    }
    // the legacy endpoint's default is 16 tokens
    finish(b.common, prompt, "prompt", Some(16), lim)
}

/// The shared fields: model, sampling, lengths (context check), stop strings. `prompt_param` is
/// the request field the prompt came from (`messages` or `prompt`), named by the errors about its
/// length; `default_max` is the completion length in tokens when the request gives none (`None`:
/// the rest of the context).
fn finish(
    c: Common,
    prompt: Vec<u32>,
    prompt_param: &'static str,
    default_max: Option<usize>,
    lim: &Limits<'_>,
) -> Result<Request, ApiError> {
    if let Some(m) = &c.model {
        if m != lim.model_id {
            return Err(ApiError {
                param: Some("model"),
                ..ApiError::new(
                    404,
                    "invalid_request_error",
                    "model_not_found",
                    format!(
                        "The model `{m}` does not exist; this server serves `{}`",
                        lim.model_id
                    ),
                )
            });
        }
    }
    if c.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request("only n = 1 is supported", Some("n")));
    }
    if prompt.is_empty() {
        return Err(ApiError::bad_request(
            "the prompt has no tokens",
            Some(prompt_param),
        ));
    }
    let d = lim.sampling;
    let temperature = c.temperature.unwrap_or(d.temperature as f64);
    if !(temperature.is_finite() && (0.0..=2.0).contains(&temperature)) {
        return Err(ApiError::bad_request(
            format!("temperature must be in [0, 2], got {temperature}"),
            Some("temperature"),
        ));
    }
    let top_p = c.top_p.unwrap_or(d.top_p as f64);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad_request(
            format!("top_p must be in (0, 1], got {top_p}"),
            Some("top_p"),
        ));
    }
    let stop = match c.stop {
        None => vec![],
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if stop.len() > 4 {
        return Err(ApiError::bad_request(
            "at most 4 stop strings",
            Some("stop"),
        ));
    }
    let asked = c.max_completion_tokens.or(c.max_tokens);
    if asked == Some(0) {
        return Err(ApiError::bad_request(
            "max_tokens must be at least 1",
            Some("max_tokens"),
        ));
    }
    let room = lim.ctx.saturating_sub(prompt.len());
    let too_long = |n: u64| ApiError {
        param: Some(prompt_param),
        ..ApiError::new(
            400,
            "invalid_request_error",
            "context_length_exceeded",
            format!(
                "This model's maximum context length is {} tokens. However, you requested {} \
                     tokens ({} in the prompt, {n} in the completion). Please reduce the prompt \
                     or the completion length.",
                lim.ctx,
                prompt.len() as u64 + n,
                prompt.len()
            ),
        )
    };
    let max_new = match asked {
        Some(n) if n > room as u64 => return Err(too_long(n)),
        Some(n) => n as usize,
        None if room == 0 => return Err(too_long(1)),
        None => default_max.map_or(room, |d| d.min(room)),
    };
    let include_usage = c
        .stream_options
        .unwrap_or_default()
        .include_usage
        .unwrap_or(false);
    Ok(Request {
        params: GenerateParams {
            max_new_tokens: max_new,
            sampling: SamplingParams {
                temperature: temperature as f32,
                top_k: c.top_k.map_or(d.top_k, |k| k as usize),
                top_p: top_p as f32,
            },
            // without a seed, each request samples differently (as OpenAI's API does)
            seed: c.seed.unwrap_or_else(|| {
                use std::hash::{BuildHasher, Hasher};
                std::collections::hash_map::RandomState::new()
                    .build_hasher()
                    .finish()
            }),
            eos_ids: lim.stop_ids.to_vec(),
        },
        prompt,
        stop,
        stream: c.stream,
        include_usage: include_usage && c.stream,
        return_token_ids: c.return_token_ids,
        in_text: false,
    })
}

/// `usage` of a response.
pub fn usage(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    })
}
