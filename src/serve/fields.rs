//! Which top-level request fields each endpoint takes, so that none is ignored in silence: every
//! field of OpenAI's chat-completions and completions request schemas (and the extensions of
//! llama.cpp's and vLLM's servers that this engine has) is implemented, accepted as metadata that
//! cannot change the answer, or refused with a 400 naming it; a field of neither list is refused
//! with a "did you mean" hint.
use super::error::ApiError;
use serde_json::{Map, Value};

/// The two generation endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schema {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// What the server does with a field.
#[derive(Clone, Copy, Debug)]
pub enum Rule {
    /// Implemented: parsed and validated by the endpoint (`serve::api`).
    Implemented,
    /// Accepted and recorded nowhere: it cannot change the answer (`user`, `metadata`).
    Metadata,
    /// Accepted only with the values `ok` accepts (its default, or null); any other value is
    /// refused with the reason.
    Only(fn(&Value) -> bool, &'static str),
    /// Refused whenever it is present and not null.
    Refused(&'static str),
}

fn is_false(v: &Value) -> bool {
    *v == Value::Bool(false)
}

fn is_one(v: &Value) -> bool {
    v.as_u64() == Some(1)
}

fn is_text_format(v: &Value) -> bool {
    v.get("type").and_then(Value::as_str) == Some("text")
}

fn is_text_modality(v: &Value) -> bool {
    v.as_array()
        .is_some_and(|a| a.iter().all(|m| m.as_str() == Some("text")))
}

fn is_empty_string(v: &Value) -> bool {
    v.as_str() == Some("")
}

fn is_medium(v: &Value) -> bool {
    v.as_str() == Some("medium")
}

fn is_string(v: &Value) -> bool {
    v.is_string()
}

/// Fields both endpoints share (OpenAI's, then the extensions).
const COMMON: &[(&str, Rule)] = &[
    ("model", Rule::Implemented),
    ("frequency_penalty", Rule::Implemented),
    ("presence_penalty", Rule::Implemented),
    ("logit_bias", Rule::Implemented),
    ("logprobs", Rule::Implemented),
    ("max_tokens", Rule::Implemented),
    ("n", Rule::Implemented),
    ("seed", Rule::Implemented),
    ("stop", Rule::Implemented),
    ("stream", Rule::Implemented),
    ("stream_options", Rule::Implemented),
    ("temperature", Rule::Implemented),
    ("top_p", Rule::Implemented),
    ("user", Rule::Metadata),
    // extensions (llama.cpp's server, vLLM)
    ("max_completion_tokens", Rule::Implemented),
    ("top_k", Rule::Implemented),
    ("min_p", Rule::Implemented),
    ("repetition_penalty", Rule::Implemented),
    ("repeat_last_n", Rule::Implemented),
    ("return_token_ids", Rule::Implemented),
];

/// `/v1/chat/completions`' own fields.
const CHAT: &[(&str, Rule)] = &[
    ("messages", Rule::Implemented),
    ("top_logprobs", Rule::Implemented),
    ("reasoning_effort", Rule::Implemented),
    ("tools", Rule::Implemented),
    ("tool_choice", Rule::Implemented),
    ("parallel_tool_calls", Rule::Implemented),
    ("metadata", Rule::Metadata),
    ("safety_identifier", Rule::Metadata),
    // the prompt cache here is automatic (the previous request's state is reused)
    ("prompt_cache_key", Rule::Metadata),
    ("prompt_cache_retention", Rule::Metadata),
    // a tier changes the price and latency of OpenAI's service, not the answer
    (
        "service_tier",
        Rule::Only(is_string, "service_tier must be a string"),
    ),
    (
        "store",
        Rule::Only(
            is_false,
            "this server stores no completions (store: false only)",
        ),
    ),
    (
        "response_format",
        Rule::Only(
            is_text_format,
            "only {\"type\": \"text\"} is supported: JSON modes (json_object, json_schema) need \
             constrained decoding, which this server does not have",
        ),
    ),
    (
        "modalities",
        Rule::Only(is_text_modality, "only the \"text\" modality is supported"),
    ),
    (
        "verbosity",
        Rule::Only(
            is_medium,
            "verbosity is not supported (Inkling has no verbosity control; \"medium\" only)",
        ),
    ),
    ("audio", Rule::Refused("audio output is not supported")),
    (
        "prediction",
        Rule::Refused("predicted outputs are not supported"),
    ),
    (
        "web_search_options",
        Rule::Refused("web search is not supported"),
    ),
    (
        "functions",
        Rule::Refused("`functions` is deprecated and not supported: declare them in `tools`"),
    ),
    (
        "function_call",
        Rule::Refused("`function_call` is deprecated and not supported: use `tool_choice`"),
    ),
];

/// `/v1/completions`' own fields.
const COMPLETION: &[(&str, Rule)] = &[
    ("prompt", Rule::Implemented),
    (
        "best_of",
        Rule::Only(is_one, "only best_of = 1 is supported"),
    ),
    (
        "echo",
        Rule::Only(is_false, "echo is not supported (echo: false only)"),
    ),
    (
        "suffix",
        Rule::Only(is_empty_string, "suffix (insertion) is not supported"),
    ),
];

/// Every field `schema` knows and its rule.
pub fn fields(schema: Schema) -> impl Iterator<Item = (&'static str, Rule)> {
    let own = match schema {
        Schema::Chat => CHAT,
        Schema::Completion => COMPLETION,
    };
    COMMON.iter().chain(own).copied()
}

/// The rule of field `name` of `schema` (`None`: not a field of it).
pub fn rule(schema: Schema, name: &str) -> Option<Rule> {
    fields(schema).find(|(n, _)| *n == name).map(|(_, r)| r)
}

/// Refuse the first top-level field of `body` that `schema` does not take, or takes with other
/// values only; `param` names it.
pub fn check(schema: Schema, body: &Map<String, Value>) -> Result<(), ApiError> {
    for (name, v) in body {
        if name.is_empty() {
            return Err(ApiError::bad_request(
                "the request body has a field with an empty name",
                None,
            ));
        }
        let refuse = |why: &str| Err(ApiError::bad_field(why, name.clone()));
        match rule(schema, name) {
            None => return refuse(&unknown(schema, name)),
            Some(Rule::Implemented) => {}
            Some(Rule::Metadata) => match (name.as_str(), v) {
                (_, Value::Null) => {}
                ("metadata", v) => {
                    if let Err(why) = check_metadata(v) {
                        return refuse(&why);
                    }
                }
                (_, v) if !v.is_string() => return refuse("expected a string"),
                _ => {}
            },
            Some(_) if v.is_null() => {}
            Some(Rule::Only(ok, _)) if ok(v) => {}
            Some(Rule::Only(_, why) | Rule::Refused(why)) => return refuse(why),
        }
    }
    Ok(())
}

/// OpenAI's `metadata`: an object of at most 16 pairs, keys of at most 64 characters, string
/// values of at most 512; what is wrong, in words.
fn check_metadata(v: &Value) -> Result<(), String> {
    let Some(m) = v.as_object() else {
        return Err("expected an object of string values".into());
    };
    if m.len() > 16 {
        return Err(format!("at most 16 key-value pairs, got {}", m.len()));
    }
    for (k, v) in m {
        if k.chars().count() > 64 {
            return Err(format!("key {k:?} is longer than 64 characters"));
        }
        match v.as_str() {
            Some(s) if s.chars().count() > 512 => {
                return Err(format!("the value of {k:?} is longer than 512 characters"))
            }
            Some(_) => {}
            None => return Err(format!("the value of {k:?} is not a string")),
        }
    }
    Ok(())
}

/// Refuse a field of message `i` (a JSON object whose `role` is valid) that its role does not
/// take: `function_call` and `audio` of an assistant message (when not null), and any field of
/// no OpenAI message. `reasoning_content` and `refusal` of an assistant message are taken and
/// not rendered (the official renderer drops reasoning from history); `name` is the header of a
/// tool message and not rendered for other roles (Inkling's blocks of those roles carry none).
pub fn check_message(i: usize, m: &Map<String, Value>) -> Result<(), ApiError> {
    let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
    for (k, v) in m {
        let known = match k.as_str() {
            "role" | "content" | "name" => true,
            "tool_calls" | "refusal" | "reasoning_content" => role == "assistant",
            "tool_call_id" => role == "tool",
            "function_call" | "audio" if role == "assistant" => {
                if v.is_null() {
                    true
                } else {
                    let why = if k == "audio" {
                        "audio is not supported"
                    } else {
                        "`function_call` is deprecated and not supported: use `tool_calls`"
                    };
                    return Err(ApiError::bad_field(why, format!("messages[{i}].{k}")));
                }
            }
            _ => false,
        };
        if !known {
            return Err(ApiError::bad_field(
                format!("not a field of a {role:?} message"),
                format!("messages[{i}].{k}"),
            ));
        }
    }
    if let Some(Value::Array(calls)) = m.get("tool_calls") {
        for (j, c) in calls.iter().enumerate() {
            check_tool_call(c, &format!("messages[{i}].tool_calls[{j}]"))?;
        }
    }
    Ok(())
}

/// The keys of an assistant message's tool call (`id`, `type` "function", `function` with `name`
/// and `arguments`): any other key is refused by its path `at.…`.
fn check_tool_call(c: &Value, at: &str) -> Result<(), ApiError> {
    let Some(o) = c.as_object() else {
        return Ok(()); // the typed parse names a call that is not an object
    };
    if let Some(k) = o
        .keys()
        .find(|k| !["id", "type", "function"].contains(&k.as_str()))
    {
        return Err(ApiError::bad_field(
            "not a field of a tool call",
            format!("{at}.{k}"),
        ));
    }
    match o.get("type") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "function" => {}
        Some(_) => {
            return Err(ApiError::bad_field(
                "only tool calls of type \"function\" are supported",
                format!("{at}.type"),
            ))
        }
    }
    if let Some(f) = o.get("function").and_then(Value::as_object) {
        if let Some(k) = f
            .keys()
            .find(|k| !["name", "arguments"].contains(&k.as_str()))
        {
            return Err(ApiError::bad_field(
                "not a field of a tool call's `function`",
                format!("{at}.function.{k}"),
            ));
        }
    }
    Ok(())
}

/// The message for an unknown field: the nearest known name when one is close.
fn unknown(schema: Schema, name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    let best = fields(schema)
        .map(|(n, _)| (distance(&lower, n), n))
        .min_by_key(|&(d, _)| d);
    let endpoint = match schema {
        Schema::Chat => "/v1/chat/completions",
        Schema::Completion => "/v1/completions",
    };
    let mut m = format!("unknown field of {endpoint}");
    match best {
        Some((d, n)) if d <= 2.max(name.len() / 3) => m.push_str(&format!(": did you mean `{n}`?")),
        _ => {}
    }
    if schema == Schema::Completion && rule(Schema::Chat, name).is_some() {
        m.push_str(&format!(" (`{name}` is a field of /v1/chat/completions)"));
    }
    m
}

/// Levenshtein distance of two ASCII-ish strings (by chars).
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance() {
        assert_eq!(distance("max_token", "max_tokens"), 1);
        assert_eq!(distance("temprature", "temperature"), 1);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("kitten", "sitting"), 3);
    }

    #[test]
    fn unknown_fields_get_a_hint() {
        let m = unknown(Schema::Chat, "max_token");
        assert!(m.contains("did you mean `max_tokens`"), "{m}");
        let m = unknown(Schema::Chat, "zzzzzzzzzz");
        assert!(!m.contains("did you mean"), "{m}");
        let m = unknown(Schema::Completion, "messages");
        assert!(m.contains("field of /v1/chat/completions"), "{m}");
    }
}
