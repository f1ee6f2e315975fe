//! The OpenAI API surface: request bodies (`/v1/chat/completions`, `/v1/completions`) parsed and
//! validated into an engine job, response and chunk bodies, and error envelopes
//! (`{"error":{"message","type","param","code"}}` with the HTTP status).
//!
//! Bodies are parsed with `serde_path_to_error`, so every refusal names the field it is about as a
//! JSON path in `param` and the message (`messages[1].role`, `max_tokens`); a body that is not a
//! JSON object, not valid JSON or not valid UTF-8 says so with its line and column. Prompts are
//! bounded in bytes before they are tokenised ([`Limits::max_prompt_bytes`]).
use crate::chat::render::ToolCall;
use crate::chat::{Effort, Message, Renderer, Role};
use crate::model::generate::GenerateParams;
use crate::model::sampling::SamplingParams;
use serde::Deserialize;
use serde_json::{json, Value};
use std::borrow::Cow;

/// An error response: HTTP status and the envelope's fields.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    /// The JSON path of the field the error is about (`messages[0].content`), if any.
    pub param: Option<Cow<'static, str>>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(Cow::Borrowed),
            code: None,
        }
    }

    /// A 400 about the field at JSON path `path` (built at run time: `messages[3].role`); the
    /// message starts with the path.
    pub fn bad_field(message: impl std::fmt::Display, path: String) -> ApiError {
        ApiError {
            message: format!("`{path}`: {message}"),
            param: Some(Cow::Owned(path)),
            ..ApiError::bad_request("", None)
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
    top_k: Option<u64>,
    /// vLLM's extension: min-p sampling in [0, 1].
    min_p: Option<f64>,
    /// vLLM's (transformers') repetition penalty > 0, over the last `repeat_last_n` ids.
    repetition_penalty: Option<f64>,
    /// llama.cpp server's window of the repetition penalty.
    repeat_last_n: Option<u64>,
    /// OpenAI's, in [-2, 2], over the tokens generated so far.
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    /// Not implemented: refused when set (never ignored).
    logit_bias: Option<Value>,
    logprobs: Option<Value>,
    top_logprobs: Option<Value>,
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
    tools: Option<Vec<Value>>,
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

/// `T` from a request body that must be a JSON object. Errors name the JSON path of the field
/// (`param` and the message); a body that is not UTF-8, not JSON or not an object says so, with
/// the byte, or line and column, where it goes wrong.
fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if let Err(e) = std::str::from_utf8(body) {
        return Err(ApiError::bad_request(
            format!(
                "the request body is not valid UTF-8 (at byte {})",
                e.valid_up_to()
            ),
            None,
        ));
    }
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object ({...})",
            None,
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let v = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        // `?` stands for a segment serde_path_to_error could not name (a key that is not a string)
        let path = e.path().to_string();
        let path = path.trim_end_matches(".?").trim_end_matches('?');
        let known = !matches!(path, "" | ".");
        json_error(known.then(|| path.to_string()), e.into_inner())
    })?;
    de.end().map_err(|e| json_error(None, e))?;
    Ok(v)
}

/// A serde_json error at JSON path `field` → a 400 naming the field (type and value errors) or
/// saying that the body is not valid JSON (syntax errors, with line and column).
fn json_error(field: Option<String>, e: serde_json::Error) -> ApiError {
    let at = format!("line {} column {}", e.line(), e.column());
    let full = e.to_string();
    let what = full.strip_suffix(&format!(" at {at}")).unwrap_or(&full);
    // serde reports a missing field at the object holding it: name the field itself
    let missing = what
        .strip_prefix("missing field `")
        .and_then(|m| m.strip_suffix('`'));
    let field = match (missing, field) {
        (Some(m), Some(p)) => Some(format!("{p}.{m}")),
        (Some(m), None) => Some(m.to_string()),
        (None, f) => f,
    };
    let in_field = field
        .as_ref()
        .map_or(String::new(), |p| format!(" (in `{p}`)"));
    // a number beyond f64 (`1e400`) is a syntax error to serde_json, but the field is what is wrong
    let data = e.classify() == serde_json::error::Category::Data || what == "number out of range";
    let message = if data {
        match &field {
            Some(p) => format!("invalid `{p}`: {what} (at {at})"),
            None => format!("invalid request body: {what} (at {at})"),
        }
    } else if what.contains("surrogate") || what.contains("hex escape") {
        // serde_json's words for a `\u` escape of a lone UTF-16 surrogate (`"\ud800"`), which
        // no UTF-8 string can hold
        format!(
            "the request body is not valid JSON text at {at}{in_field}: a \\u escape is a lone \
             UTF-16 surrogate (such as \\ud800), which is not a character and cannot be UTF-8 \
             ({what})"
        )
    } else {
        format!("the request body is not valid JSON at {at}{in_field}: {what}")
    };
    ApiError {
        param: field.map(Cow::Owned),
        ..ApiError::bad_request(message, None)
    }
}

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
    let b: ChatBody = parse(body)?;
    let common: Common = parse(body)?;
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
        for (j, c) in m.tool_calls.unwrap_or_default().into_iter().enumerate() {
            text_bytes = text_bytes
                .saturating_add(c.function.arguments.len())
                .saturating_add(c.function.name.len());
            let arguments: Value = serde_json::from_str(&c.function.arguments).map_err(|e| {
                ApiError::bad_field(
                    format!("tool call arguments are not JSON: {e}"),
                    format!("messages[{i}].tool_calls[{j}].function.arguments"),
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
    check_prompt_bytes(text_bytes, lim, "messages")?;
    let mut prompt = r
        .render_for_generation(&messages, Some(effort))
        .map_err(|e| ApiError::bad_request(format!("{e:#}"), Some("messages")))?;
    let in_text = prompt.last() == Some(&r.specials().content_text);
    let req = finish(common, std::mem::take(&mut prompt), "messages", None, lim)?;
    Ok(Request { in_text, ..req })
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
    finish(common, prompt, "prompt", Some(16), lim)
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
    for (name, v) in [
        ("logit_bias", &c.logit_bias),
        ("logprobs", &c.logprobs),
        ("top_logprobs", &c.top_logprobs),
    ] {
        if v.as_ref()
            .is_some_and(|v| !v.is_null() && *v != Value::Bool(false))
        {
            return Err(ApiError::bad_request(
                format!("{name} is not supported by this server"),
                Some(name),
            ));
        }
    }
    let min_p = c.min_p.unwrap_or(d.min_p as f64);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(ApiError::bad_request(
            format!("min_p must be in [0, 1], got {min_p}"),
            Some("min_p"),
        ));
    }
    let repetition_penalty = c.repetition_penalty.unwrap_or(d.repeat_penalty as f64);
    if !(repetition_penalty.is_finite() && repetition_penalty > 0.0) {
        return Err(ApiError::bad_request(
            format!("repetition_penalty must be a finite number > 0 (1 = off), got {repetition_penalty}"),
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
                min_p: min_p as f32,
                repeat_penalty: repetition_penalty as f32,
                repeat_last_n: c
                    .repeat_last_n
                    .map_or(d.repeat_last_n, |n| n.min(usize::MAX as u64) as usize),
                presence_penalty,
                frequency_penalty,
            },
            // without a seed, each request samples differently (as OpenAI's API does)
            seed: c.seed.unwrap_or_else(crate::model::sampling::random_seed),
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
