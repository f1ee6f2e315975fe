//! The OpenAI API surface: request bodies (`/v1/chat/completions`, `/v1/completions`) parsed and
//! validated into an engine job (sampling, logit bias, log-probabilities, tools), and `usage`.
//!
//! Bodies are parsed with `serde_path_to_error` ([`super::error`]), so every refusal names the
//! field it is about as a JSON path in `param` and the message (`messages[1].role`,
//! `max_tokens`); a body that is not a JSON object, not valid JSON or not valid UTF-8 says so with
//! its line and column. Top-level fields an endpoint does not take are refused by name
//! ([`super::fields`]). Prompts are bounded in bytes before they are tokenised
//! ([`Limits::longest_token_bytes`]).
use super::fields::{self, Schema};
use super::tools::{self, Choice, Tools};
use crate::chat::render::ToolCall;
use crate::chat::{Effort, Message, Renderer, Role};
use crate::model::generate::{GenerateParams, LogitOptions};
use crate::model::sampling::SamplingParams;
use serde::Deserialize;
use serde_json::{json, Value};
use std::borrow::Cow;

use super::error::parse;
pub use super::error::ApiError;

/// `stop`: one string or up to 4.
#[derive(Deserialize, Debug)]
#[serde(untagged, expecting = "expected a string or an array of strings")]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `reasoning_effort`: a named effort or a number.
#[derive(Deserialize, Debug)]
#[serde(
    untagged,
    expecting = "expected an effort name (none, low, medium, high) or a number"
)]
enum EffortField {
    Name(String),
    Value(f64),
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// The fields both endpoints share, parsed from the same body as the endpoint's own fields (a
/// second pass: `#[serde(flatten)]` would hide the paths of errors in these fields).
#[derive(Deserialize, Debug)]
struct Common {
    model: Option<String>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    /// -1 or 0: off (vLLM's -1), else the k most likely tokens.
    top_k: Option<i64>,
    /// vLLM's extension: min-p sampling in [0, 1].
    min_p: Option<f64>,
    /// vLLM's (transformers') repetition penalty > 0, over the last `repeat_last_n` ids.
    repetition_penalty: Option<f64>,
    /// llama.cpp server's window of the repetition penalty (0 = off, -1 = the whole sequence).
    repeat_last_n: Option<i64>,
    /// OpenAI's, in [-2, 2], over the tokens generated so far.
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    /// Token id (as a string) → bias in [-100, 100] added to its logit.
    logit_bias: Option<std::collections::BTreeMap<String, f64>>,
    /// Chat: a boolean; completions: how many top alternatives, 0 to 5.
    logprobs: Option<Value>,
    /// Chat: how many top alternatives, 0 to 20 (needs `logprobs: true`).
    top_logprobs: Option<u64>,
    /// Any 64-bit integer, negative ones included (OpenAI's schema; clients send them): a
    /// negative seed is taken as its two's-complement u64.
    seed: Option<serde_json::Number>,
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
#[serde(
    untagged,
    expecting = "expected a string or an array of content parts ({\"type\": \"text\", \"text\": ...})"
)]
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

/// `/v1/chat/completions`' own fields (with [`Common`]).
#[derive(Deserialize, Debug)]
struct ChatBody {
    messages: Vec<ChatMessage>,
    reasoning_effort: Option<EffortField>,
}

#[derive(Deserialize, Debug)]
#[serde(
    untagged,
    expecting = "expected a string, an array of token ids (below 2^32), or an array holding one of either"
)]
enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

/// `/v1/completions`' own fields (with [`Common`]).
#[derive(Deserialize, Debug)]
struct CompletionBody {
    prompt: Prompt,
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
    /// Logit bias and log-probabilities (`logit.logprobs`: how many top alternatives).
    pub logit: LogitOptions,
    /// Chat with tools declared (and `tool_choice` not "none"): tool calls are parsed from the
    /// output.
    pub tools: Option<Tools>,
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
    /// [`longest_token_bytes`] of the tokenizer: prompt text of more than `ctx` × this many
    /// bytes cannot fit in the context and is refused before it is tokenised.
    pub longest_token_bytes: usize,
}

pub use crate::model::text::longest_token_bytes;

/// The text of message `i`'s content (text parts joined).
fn text_of(c: Content, i: usize) -> Result<String, ApiError> {
    match c {
        Content::Text(s) => Ok(s),
        Content::Parts(parts) => {
            let mut s = String::new();
            for (j, p) in parts.into_iter().enumerate() {
                match (p.kind.as_str(), p.text) {
                    ("text", Some(t)) => s.push_str(&t),
                    ("text", None) => {
                        return Err(ApiError::bad_field(
                            "a text content part needs `text`",
                            format!("messages[{i}].content[{j}].text"),
                        ))
                    }
                    (k, _) => {
                        return Err(ApiError::bad_field(
                            format!("content part of type {k:?} is not supported (text only)"),
                            format!("messages[{i}].content[{j}].type"),
                        ))
                    }
                }
            }
            Ok(s)
        }
    }
}

/// The top-level fields of a body that parsed as `schema`'s typed fields, checked by
/// [`fields::check`] (unknown, refused or unsupported values refused by name).
fn fields_of(schema: Schema, body: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    let map: serde_json::Map<String, Value> = parse(body)?;
    fields::check(schema, &map)?;
    Ok(map)
}

/// Refuses a prompt of `bytes` bytes of text that cannot fit in the context (more than `ctx` ×
/// [`Limits::longest_token_bytes`]), before it is tokenised; `param` names the field.
fn check_prompt_bytes(bytes: usize, lim: &Limits<'_>, param: &'static str) -> Result<(), ApiError> {
    let limit = lim.ctx.saturating_mul(lim.longest_token_bytes);
    if bytes <= limit {
        return Ok(());
    }
    Err(ApiError {
        param: Some(Cow::Borrowed(param)),
        ..ApiError::new(
            400,
            "invalid_request_error",
            "context_length_exceeded",
            format!(
                "The prompt text is {bytes} bytes, more than this model's maximum context length \
                 of {} tokens can hold ({} bytes: no token stands for more than {} bytes). Please \
                 reduce the prompt.",
                lim.ctx, limit, lim.longest_token_bytes
            ),
        )
    })
}

/// Parse and validate a `/v1/chat/completions` body. Runs the tokenizer: call it off the async
/// runtime's thread.
pub fn chat_request(body: &[u8], r: &Renderer, lim: &Limits<'_>) -> Result<Request, ApiError> {
    // the typed fields first: their errors name paths inside known fields only
    let b: ChatBody = parse(body)?;
    let common: Common = parse(body)?;
    let map = fields_of(Schema::Chat, body)?;
    let tools = tools::parse(
        map.get("tools"),
        map.get("tool_choice"),
        map.get("parallel_tool_calls"),
    )?;
    if tools.is_some()
        && (r.specials().content_xml.is_none() || r.specials().invoke_tool_json.is_none())
    {
        return Err(ApiError::bad_request(
            "`tools`: this model's tokenizer has no <|content_xml|> or \
             <|content_invoke_tool_json|> token, so it cannot take tool declarations",
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
    let mut text_bytes = 0usize;
    for (i, m) in b.messages.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Model,
            "tool" => Role::Tool,
            other => {
                return Err(ApiError::bad_field(
                    format!(
                        "unknown message role {other:?} (system, developer, user, assistant, tool)"
                    ),
                    format!("messages[{i}].role"),
                ))
            }
        };
        if let Some(obj) = map["messages"].get(i).and_then(Value::as_object) {
            if obj.keys().any(String::is_empty) {
                return Err(ApiError::bad_request(
                    format!("messages[{i}] has a field with an empty name"),
                    Some("messages"),
                ));
            }
            fields::check_message(i, obj)?;
        }
        let content = match (m.content, role) {
            (Some(c), _) => text_of(c, i)?,
            // an assistant turn may carry tool calls only
            (None, Role::Model) if m.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) => {
                String::new()
            }
            (None, _) => {
                return Err(ApiError::bad_field(
                    format!(
                        "a {:?} message needs `content` (only an assistant message with \
                         `tool_calls` may leave it out)",
                        m.role
                    ),
                    format!("messages[{i}].content"),
                ))
            }
        };
        text_bytes = text_bytes.saturating_add(content.len());
        let mut msg = Message::new(role, content);
        for c in m.tool_calls.unwrap_or_default() {
            text_bytes = text_bytes
                .saturating_add(c.function.arguments.len())
                .saturating_add(c.function.name.len());
            // arguments that are not JSON (a call cut off by max_tokens, or text the model wrote
            // that way, which this server hands out as they are) are rendered as a JSON string
            let arguments: Value = serde_json::from_str(&c.function.arguments)
                .unwrap_or_else(|_| Value::String(c.function.arguments.clone()));
            if let Some(id) = c.id {
                call_names.push((id, c.function.name.clone()));
            }
            msg.tool_calls.push(ToolCall {
                name: c.function.name,
                arguments,
            });
        }
        msg.name =
            match (role, m.name, m.tool_call_id) {
                (Role::Tool, Some(n), _) => Some(n),
                (Role::Tool, None, Some(id)) => {
                    let name = call_names.iter().find(|(i, _)| *i == id);
                    let Some((_, n)) = name else {
                        return Err(ApiError::bad_field(
                            format!("no earlier assistant tool call has the id {id:?}"),
                            format!("messages[{i}].tool_call_id"),
                        ));
                    };
                    Some(n.clone())
                }
                (Role::Tool, None, None) => return Err(ApiError::bad_field(
                    "a tool message needs `tool_call_id` (the id of the call it answers) or `name`",
                    format!("messages[{i}].tool_call_id"),
                )),
                _ => None,
            };
        messages.push(msg);
    }
    let decl_json = tools.as_ref().map(|t| tools::declaration_json(&t.decls));
    let decl_bytes = decl_json.as_ref().map_or(0, String::len);
    check_prompt_bytes(text_bytes.saturating_add(decl_bytes), lim, "messages")?;
    let rendered = (|| {
        let mut prompt = match &decl_json {
            Some(j) => r.tool_declaration(j)?,
            None => vec![],
        };
        match tools.as_ref().map(|t| &t.choice) {
            Some(Choice::Named(name)) => {
                prompt.extend(r.render(&messages, Some(effort))?);
                prompt.push(r.specials().message_model);
                prompt.extend(r.tool_call_prefix(name, &tools::forced_json_prefix(name))?);
            }
            _ => prompt.extend(r.render_for_generation(&messages, Some(effort))?),
        }
        anyhow::Ok(prompt)
    })();
    let prompt = rendered.map_err(|e| ApiError::bad_request(format!("{e:#}"), Some("messages")))?;
    let forced = matches!(tools.as_ref().map(|t| &t.choice), Some(Choice::Named(_)));
    let in_text = !forced && prompt.last() == Some(&r.specials().content_text);
    let logprobs =
        match (&common.logprobs, common.top_logprobs) {
            (None | Some(Value::Null) | Some(Value::Bool(false)), None) => None,
            (None | Some(Value::Null) | Some(Value::Bool(false)), Some(_)) => {
                return Err(ApiError::bad_request(
                    "top_logprobs needs logprobs: true",
                    Some("top_logprobs"),
                ))
            }
            (Some(Value::Bool(true)), n) => match n {
                Some(n) if n > 20 => {
                    return Err(ApiError::bad_request(
                        format!("top_logprobs must be in [0, 20], got {n}"),
                        Some("top_logprobs"),
                    ))
                }
                n => Some(n.unwrap_or(0) as usize),
            },
            (Some(_), _) => return Err(ApiError::bad_request(
                "logprobs must be true or false (give the number of alternatives in top_logprobs)",
                Some("logprobs"),
            )),
        };
    let mut req = finish(common, prompt, "messages", None, lim)?;
    req.logit.logprobs = logprobs;
    match &tools {
        // "none": the tool-call token can never be sampled
        Some(t) if t.choice == Choice::None => req.logit.bias.extend(
            r.specials()
                .invoke_tool_json
                .map(|id| (id, f32::NEG_INFINITY)),
        ),
        _ => {}
    }
    let tools = tools.filter(|t| t.choice != Choice::None);
    Ok(Request {
        in_text,
        tools,
        ..req
    })
}

/// Parse and validate a `/v1/completions` body (prompt text is encoded without chat format).
/// Runs the tokenizer: call it off the async runtime's thread.
pub fn completion_request(
    body: &[u8],
    r: &Renderer,
    lim: &Limits<'_>,
) -> Result<Request, ApiError> {
    let b: CompletionBody = parse(body)?;
    let common: Common = parse(body)?;
    fields_of(Schema::Completion, body)?;
    let logprobs = match &common.logprobs {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) if n <= 5 => Some(n as usize),
            _ => {
                return Err(ApiError::bad_request(
                    format!(
                        "logprobs must be an integer in [0, 5] (how many alternatives), got {v}"
                    ),
                    Some("logprobs"),
                ))
            }
        },
    };
    let bad = |m: &str| ApiError::bad_request(m.to_string(), Some("prompt"));
    let encode = |s: &str| {
        check_prompt_bytes(s.len(), lim, "prompt")?;
        r.encode_text(s).map_err(|e| bad(&format!("{e:#}")))
    };
    let prompt = match b.prompt {
        Prompt::Text(s) => encode(&s)?,
        Prompt::Ids(ids) => ids,
        Prompt::Texts(v) if v.len() == 1 => encode(&v[0])?,
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
    let mut req = finish(common, prompt, "prompt", Some(16), lim)?;
    req.logit.logprobs = logprobs;
    Ok(req)
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
                param: Some("model".into()),
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
    let mut bias = Vec::new();
    for (k, &b) in c.logit_bias.iter().flatten() {
        let id = k
            .parse::<u32>()
            .ok()
            .filter(|&id| (id as usize) < lim.vocab);
        let Some(id) = id else {
            return Err(ApiError::bad_field(
                format!(
                    "the key {k:?} is not a token id of this model's vocabulary (0 to {})",
                    lim.vocab.saturating_sub(1)
                ),
                "logit_bias".into(),
            ));
        };
        if !(-100.0..=100.0).contains(&b) {
            return Err(ApiError::bad_field(
                format!("the bias of token {id} must be in [-100, 100], got {b}"),
                "logit_bias".into(),
            ));
        }
        bias.push((id, b as f32));
    }
    let min_p = c.min_p.unwrap_or(d.min_p as f64);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(ApiError::bad_request(
            format!("min_p must be in [0, 1], got {min_p}"),
            Some("min_p"),
        ));
    }
    let repetition_penalty = c.repetition_penalty.unwrap_or(d.repeat_penalty as f64);
    // applied in f32: the value as f32 must still be finite and > 0 (1e39 is +inf there, 1e-50 is 0)
    let narrowed = repetition_penalty as f32;
    if !(narrowed.is_finite() && narrowed > 0.0) {
        return Err(ApiError::bad_request(
            format!(
                "repetition_penalty must be a number > 0 (1 = off) within f32 range, got \
                 {repetition_penalty}"
            ),
            Some("repetition_penalty"),
        ));
    }
    let penalty = |v: Option<f64>, name: &'static str, default: f32| match v {
        Some(x) if !(-2.0..=2.0).contains(&x) => Err(ApiError::bad_request(
            format!("{name} must be in [-2, 2], got {x}"),
            Some(name),
        )),
        Some(x) => Ok(x as f32),
        None => Ok(default),
    };
    let presence_penalty = penalty(c.presence_penalty, "presence_penalty", d.presence_penalty)?;
    let frequency_penalty = penalty(
        c.frequency_penalty,
        "frequency_penalty",
        d.frequency_penalty,
    )?;
    let seed = match &c.seed {
        None => None,
        Some(n) => Some(
            n.as_u64()
                .or_else(|| n.as_i64().map(|i| i as u64))
                .ok_or_else(|| {
                    ApiError::bad_request(
                        format!("seed must be a 64-bit integer, got {n}"),
                        Some("seed"),
                    )
                })?,
        ),
    };
    let stop = match c.stop {
        None => vec![],
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if let Some(i) = stop.iter().position(|s| s.is_empty()) {
        return Err(ApiError {
            param: Some(format!("stop[{i}]").into()),
            ..ApiError::bad_request(format!("stop[{i}]: a stop string must not be empty"), None)
        });
    }
    if stop.len() > 4 {
        return Err(ApiError::bad_request(
            "at most 4 stop strings",
            Some("stop"),
        ));
    }
    if let (Some(a), Some(b)) = (c.max_completion_tokens, c.max_tokens) {
        if a != b {
            return Err(ApiError::bad_request(
                format!(
                    "max_tokens ({b}) and max_completion_tokens ({a}) disagree; give one of them"
                ),
                Some("max_tokens"),
            ));
        }
    }
    let top_k = match c.top_k {
        None => d.top_k,
        Some(k) if k >= 0 => usize::try_from(k).unwrap_or(usize::MAX),
        Some(-1) => 0,
        Some(k) => {
            return Err(ApiError::bad_request(
                format!("top_k must be a whole number ≥ 0, or -1 (0 and -1: off), got {k}"),
                Some("top_k"),
            ))
        }
    };
    let repeat_last_n = match c.repeat_last_n {
        None => d.repeat_last_n,
        Some(n) if n >= 0 => usize::try_from(n).unwrap_or(usize::MAX),
        Some(-1) => crate::model::sampling::WHOLE_SEQUENCE,
        Some(n) => {
            return Err(ApiError::bad_request(
                format!(
                    "repeat_last_n must be a whole number ≥ 0 (0 = off), or -1 (the whole \
                     sequence), got {n}"
                ),
                Some("repeat_last_n"),
            ))
        }
    };
    let asked = c.max_completion_tokens.or(c.max_tokens);
    if asked == Some(0) {
        return Err(ApiError::bad_request(
            "max_tokens must be at least 1",
            Some("max_tokens"),
        ));
    }
    let room = lim.ctx.saturating_sub(prompt.len());
    let too_long = |n: u64| ApiError {
        param: Some(prompt_param.into()),
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
    if c.stream_options.is_some() && !c.stream {
        // OpenAI's answer too: stream_options has no meaning without a stream
        return Err(ApiError::bad_request(
            "stream_options is only allowed when stream is true",
            Some("stream_options"),
        ));
    }
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
                top_k,
                top_p: top_p as f32,
                min_p: min_p as f32,
                repeat_penalty: narrowed,
                repeat_last_n,
                presence_penalty,
                frequency_penalty,
            },
            // without a seed, each request samples differently (as OpenAI's API does)
            seed: seed.unwrap_or_else(crate::model::sampling::random_seed),
            eos_ids: lim.stop_ids.to_vec(),
        },
        prompt,
        stop,
        stream: c.stream,
        include_usage: include_usage && c.stream,
        return_token_ids: c.return_token_ids,
        in_text: false,
        logit: LogitOptions {
            bias,
            logprobs: None,
        },
        tools: None,
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
