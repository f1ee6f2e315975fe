//! No request field is ignored in silence: every field of OpenAI's chat-completions and
//! completions request schemas (listed here, from the API reference's `CreateChatCompletionRequest`
//! and `CreateCompletionRequest`) is implemented (a value reaches the engine's job), accepted as
//! metadata, or refused with a 400 whose `param` names it; unknown fields are refused with a hint.
use super::request_errors::Parser;
use crate::chat_common::tokenizer_and_renderer;
use inkling_wgpu::chat::Renderer;
use inkling_wgpu::serve::api::{self, ApiError, Request};
use inkling_wgpu::serve::fields::{self, Rule, Schema};
use inkling_wgpu::serve::tools::Choice;
use serde_json::{json, Value};
use tokenizers::{AddedToken, Tokenizer};

/// Every top-level field of OpenAI's `CreateChatCompletionRequest`.
const CHAT_SCHEMA: [&str; 35] = [
    "messages",
    "model",
    "modalities",
    "verbosity",
    "reasoning_effort",
    "max_completion_tokens",
    "frequency_penalty",
    "presence_penalty",
    "web_search_options",
    "top_logprobs",
    "response_format",
    "audio",
    "store",
    "stream",
    "stop",
    "logit_bias",
    "logprobs",
    "max_tokens",
    "n",
    "prediction",
    "seed",
    "stream_options",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "function_call",
    "functions",
    "metadata",
    "temperature",
    "top_p",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "service_tier",
];

/// Every top-level field of OpenAI's `CreateCompletionRequest`.
const COMPLETION_SCHEMA: [&str; 18] = [
    "model",
    "prompt",
    "best_of",
    "echo",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "max_tokens",
    "n",
    "presence_penalty",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "suffix",
    "temperature",
    "top_p",
    "user",
];

/// The extensions (llama.cpp's and vLLM's servers) the engine has.
const EXTENSIONS: [&str; 6] = [
    "max_completion_tokens",
    "top_k",
    "min_p",
    "repetition_penalty",
    "repeat_last_n",
    "return_token_ids",
];

/// The chat fixture's tokenizer with the two tool specials added (ids 409, 410), and its renderer.
pub fn tool_tokenizer() -> (Tokenizer, Renderer) {
    let (mut tok, _) = tokenizer_and_renderer();
    tok.add_special_tokens(&[
        AddedToken::from("<|content_xml|>", true),
        AddedToken::from("<|content_invoke_tool_json|>", true),
    ]);
    let r = Renderer::new(&tok).unwrap();
    (tok, r)
}

fn refused_naming(r: Result<Request, ApiError>, field: &str, what: &str) {
    match r {
        Ok(_) => panic!("{what}: accepted"),
        Err(e) => {
            assert_eq!(e.status, 400, "{what}: {e:?}");
            // the field itself, or a path inside it (`tools[0].type`)
            let param = e.param.as_deref().unwrap_or_default();
            let inside = param
                .strip_prefix(field)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']));
            assert!(inside, "{what}: {e:?}");
            assert!(e.message.contains(field), "{what}: {}", e.message);
        }
    }
}

const TOOL: &str = r#"{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}"#;

#[test]
fn every_schema_field_is_implemented_or_refused_by_name() {
    // the lists are the server's: every schema field has a rule, every rule is a schema field or
    // an extension
    for (schema, list) in [
        (Schema::Chat, &CHAT_SCHEMA[..]),
        (Schema::Completion, &COMPLETION_SCHEMA[..]),
    ] {
        for f in list {
            assert!(
                fields::rule(schema, f).is_some(),
                "{schema:?}: {f} has no rule"
            );
        }
        for (f, _) in fields::fields(schema) {
            assert!(
                list.contains(&f) || EXTENSIONS.contains(&f),
                "{schema:?}: {f} is neither a schema field nor an extension"
            );
        }
    }
    let p = Parser::new();
    let (_, tools_r) = tool_tokenizer();
    let lim = p.limits(4096);
    let chat = |extra: &str| {
        let body = format!(r#"{{"messages":[{{"role":"user","content":"hi"}}],{extra}}}"#);
        api::chat_request(body.as_bytes(), &tools_r, &lim)
    };
    // (field, a value other than the default, accepted?)
    let tools_v = format!("[{TOOL}]");
    let cases: &[(&str, &str, bool)] = &[
        ("model", r#""tiny""#, true),
        ("modalities", r#"["text"]"#, true),
        ("modalities", r#"["text","audio"]"#, false),
        ("verbosity", r#""medium""#, true),
        ("verbosity", r#""low""#, false),
        ("reasoning_effort", r#""low""#, true),
        ("max_completion_tokens", "5", true),
        ("frequency_penalty", "0.5", true),
        ("presence_penalty", "0.5", true),
        ("web_search_options", "{}", false),
        ("response_format", r#"{"type":"text"}"#, true),
        ("response_format", r#"{"type":"json_object"}"#, false),
        (
            "response_format",
            r#"{"type":"json_schema","json_schema":{"name":"x","schema":{}}}"#,
            false,
        ),
        ("audio", r#"{"voice":"alloy","format":"wav"}"#, false),
        ("store", "false", true),
        ("store", "true", false),
        ("stream", "true", true),
        ("stop", r#""x""#, true),
        ("logit_bias", r#"{"5":2}"#, true),
        ("logit_bias", r#"{"999999":2}"#, false),
        ("logit_bias", r#"{"5":101}"#, false),
        ("logprobs", "true", true),
        ("logprobs", "3", false),
        ("max_tokens", "5", true),
        ("n", "1", true),
        ("n", "2", false),
        ("prediction", r#"{"type":"content","content":"x"}"#, false),
        ("seed", "7", true),
        // only with "stream": true (as OpenAI answers)
        ("stream_options", r#"{"include_usage":true}"#, false),
        ("tools", &tools_v, true),
        ("tools", r#"[{"type":"custom"}]"#, false),
        ("tool_choice", r#""auto""#, true),
        // no tools declared: nothing to require
        ("tool_choice", r#""required""#, false),
        ("parallel_tool_calls", "false", true),
        ("function_call", r#""auto""#, false),
        ("functions", r#"[{"name":"f"}]"#, false),
        ("metadata", r#"{"k":"v"}"#, true),
        ("temperature", "0.5", true),
        ("top_p", "0.5", true),
        ("user", r#""u""#, true),
        ("safety_identifier", r#""s""#, true),
        ("prompt_cache_key", r#""k""#, true),
        ("prompt_cache_retention", r#""24h""#, true),
        ("service_tier", r#""auto""#, true),
        ("top_k", "3", true),
        ("min_p", "0.1", true),
        ("repetition_penalty", "1.1", true),
        ("repeat_last_n", "8", true),
    ];
    let mut seen = std::collections::BTreeSet::new();
    for &(f, v, ok) in cases {
        seen.insert(f);
        let what = format!("chat {f}: {v}");
        let r = chat(&format!("\"{f}\":{v}"));
        if ok {
            r.unwrap_or_else(|e| panic!("{what}: {e:?}"));
        } else {
            refused_naming(r, f, &what);
        }
    }
    for f in CHAT_SCHEMA.iter().chain(&EXTENSIONS) {
        assert!(
            seen.contains(f) || ["messages", "top_logprobs", "return_token_ids"].contains(f),
            "chat {f}: no case"
        );
    }
    // implemented means the value reaches the job
    let r = chat(
        r#""logit_bias":{"5":2.5},"logprobs":true,"top_logprobs":4,"max_completion_tokens":3"#,
    )
    .unwrap();
    assert_eq!(r.logit.bias, [(5, 2.5)]);
    assert_eq!(r.logit.logprobs, Some(4));
    assert_eq!(r.params.max_new_tokens, 3);
    refused_naming(
        chat(r#""top_logprobs":4"#),
        "top_logprobs",
        "top_logprobs alone",
    );
    refused_naming(
        chat(r#""logprobs":true,"top_logprobs":21"#),
        "top_logprobs",
        "21",
    );
    let r = chat(&format!(r#""tools":[{TOOL}],"tool_choice":{{"type":"function","function":{{"name":"get_weather"}}}},"parallel_tool_calls":false"#)).unwrap();
    let t = r.tools.unwrap();
    assert_eq!(t.choice, Choice::Named("get_weather".into()));
    assert!(!t.parallel);
    // "required" with one function: that function named
    let r = chat(&format!(r#""tools":[{TOOL}],"tool_choice":"required""#)).unwrap();
    assert_eq!(r.tools.unwrap().choice, Choice::Named("get_weather".into()));
    // "none": the tool-call token is banned
    let r = chat(&format!(r#""tools":[{TOOL}],"tool_choice":"none""#)).unwrap();
    assert!(r.tools.is_none());
    assert_eq!(r.logit.bias, [(410, f32::NEG_INFINITY)]);
    // the chat fixture's own tokenizer has no tool specials: tools refused by name
    refused_naming(
        p.chat(
            format!(r#"{{"messages":[{{"role":"user","content":"hi"}}],"tools":[{TOOL}]}}"#)
                .as_bytes(),
        ),
        "tools",
        "tools without tool specials",
    );

    let completion = |extra: &str| {
        let body = format!(r#"{{"prompt":"hi",{extra}}}"#);
        p.completion(body.as_bytes())
    };
    let cases: &[(&str, &str, bool)] = &[
        ("model", r#""tiny""#, true),
        ("best_of", "1", true),
        ("best_of", "2", false),
        ("echo", "false", true),
        ("echo", "true", false),
        ("frequency_penalty", "0.5", true),
        ("logit_bias", r#"{"5":-3}"#, true),
        ("logprobs", "2", true),
        ("logprobs", "6", false),
        ("logprobs", "true", false),
        ("max_tokens", "5", true),
        ("n", "1", true),
        ("n", "3", false),
        ("presence_penalty", "0.5", true),
        ("seed", "7", true),
        ("stop", r#"["x","y"]"#, true),
        ("stream", "true", true),
        // only with "stream": true (as OpenAI answers)
        ("stream_options", r#"{"include_usage":true}"#, false),
        ("suffix", r#""""#, true),
        ("suffix", r#"" end""#, false),
        ("temperature", "0.5", true),
        ("top_p", "0.5", true),
        ("user", r#""u""#, true),
        ("top_k", "3", true),
        ("min_p", "0.1", true),
        ("return_token_ids", "true", true),
    ];
    let mut seen = std::collections::BTreeSet::new();
    for &(f, v, ok) in cases {
        seen.insert(f);
        let what = format!("completion {f}: {v}");
        let r = completion(&format!("\"{f}\":{v}"));
        if ok {
            r.unwrap_or_else(|e| panic!("{what}: {e:?}"));
        } else {
            refused_naming(r, f, &what);
        }
    }
    for f in COMPLETION_SCHEMA {
        assert!(seen.contains(f) || f == "prompt", "completion {f}: no case");
    }
    let r = completion(r#""logprobs":2,"logit_bias":{"7":-1}"#).unwrap();
    assert_eq!(r.logit.logprobs, Some(2));
    assert_eq!(r.logit.bias, [(7, -1.0)]);
    // a chat-only field on the completions endpoint
    refused_naming(
        completion(r#""top_logprobs":2"#),
        "top_logprobs",
        "top_logprobs",
    );
    refused_naming(completion(r#""tools":[]"#), "tools", "tools");
}

#[test]
fn unknown_fields_are_refused_with_a_hint() {
    let p = Parser::new();
    for (body, field, hint) in [
        (
            r#"{"messages":[{"role":"user","content":"hi"}],"max_token":5}"#,
            "max_token",
            Some("max_tokens"),
        ),
        (
            r#"{"messages":[{"role":"user","content":"hi"}],"temprature":0.5}"#,
            "temprature",
            Some("temperature"),
        ),
        (
            r#"{"messages":[{"role":"user","content":"hi"}],"xyzzy_plugh":1}"#,
            "xyzzy_plugh",
            None,
        ),
    ] {
        let e = p.chat(body.as_bytes()).unwrap_err();
        assert_eq!(e.status, 400);
        assert_eq!(e.param.as_deref(), Some(field), "{e:?}");
        let env: Value = e.body();
        let m = env["error"]["message"].as_str().unwrap();
        assert!(m.contains("unknown field"), "{m}");
        match hint {
            Some(h) => assert!(m.contains(&format!("did you mean `{h}`")), "{m}"),
            None => assert!(!m.contains("did you mean"), "{m}"),
        }
    }
    let e = p
        .completion(br#"{"prompt":"hi","messages":[]}"#)
        .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("messages"));
    assert!(e.message.contains("/v1/chat/completions"), "{}", e.message);
    let _ = json!(null);
}

#[test]
fn metadata_fields_change_nothing() {
    let p = Parser::new();
    let base = r#"{"messages":[{"role":"user","content":"hi"}],"seed":1"#;
    let a = p.chat(format!("{base}}}").as_bytes()).unwrap();
    let b = p
        .chat(format!(r#"{base},"user":"u","metadata":{{"k":"v"}},"store":false,"service_tier":"default","prompt_cache_key":"x"}}"#).as_bytes())
        .unwrap();
    assert_eq!(a.prompt, b.prompt);
    assert_eq!(a.params.sampling, b.params.sampling);
    assert_eq!(a.params.max_new_tokens, b.params.max_new_tokens);
    assert!(matches!(
        fields::rule(Schema::Chat, "user"),
        Some(Rule::Metadata)
    ));
}

#[test]
fn message_fields_are_taken_or_refused_by_name() {
    let p = Parser::new();
    let chat = |m: &str| {
        p.chat(format!(r#"{{"messages":[{{"role":"user","content":"hi"}},{m}]}}"#).as_bytes())
    };
    for ok in [
        r#"{"role":"assistant","content":"x","refusal":null,"reasoning_content":"r","name":"bot"}"#,
        r#"{"role":"assistant","content":"x","function_call":null,"audio":null}"#,
        r#"{"role":"tool","content":"sunny","tool_call_id":"c1","name":"get_weather"}"#,
        r#"{"role":"system","content":"s","name":"n"}"#,
    ] {
        chat(ok).unwrap_or_else(|e| panic!("{ok}: {e:?}"));
    }
    for (bad, param) in [
        (
            r#"{"role":"assistant","content":"x","function_call":{"name":"f","arguments":"{}"}}"#,
            "messages[1].function_call",
        ),
        (
            r#"{"role":"assistant","content":"x","audio":{"id":"a"}}"#,
            "messages[1].audio",
        ),
        (
            r#"{"role":"user","content":"x","tool_calls":[]}"#,
            "messages[1].tool_calls",
        ),
        (
            r#"{"role":"user","content":"x","tool_call_id":"c"}"#,
            "messages[1].tool_call_id",
        ),
        (
            r#"{"role":"user","content":"x","contents":"y"}"#,
            "messages[1].contents",
        ),
        (
            r#"{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"},"qqq":1}]}"#,
            "messages[1].tool_calls[0].qqq",
        ),
        (
            r#"{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}","zzz":1}}]}"#,
            "messages[1].tool_calls[0].function.zzz",
        ),
        (
            r#"{"role":"assistant","tool_calls":[{"id":"c","type":"custom","function":{"name":"f","arguments":"{}"}}]}"#,
            "messages[1].tool_calls[0].type",
        ),
        // a tool result must answer a call (by its id) or name its function
        (
            r#"{"role":"tool","content":"sunny","tool_call_id":"call_zzz"}"#,
            "messages[1].tool_call_id",
        ),
        (
            r#"{"role":"tool","content":"sunny"}"#,
            "messages[1].tool_call_id",
        ),
    ] {
        refused_naming(chat(bad), param, bad);
    }
}

/// Metadata fields are taken only with the schema's types, and `stream_options` only with its
/// own keys.
#[test]
fn metadata_types_and_stream_options_keys_are_checked() {
    let p = Parser::new();
    let chat = |f: &str| {
        p.chat(format!(r#"{{"messages":[{{"role":"user","content":"hi"}}],{f}}}"#).as_bytes())
    };
    let long_key = format!(r#""metadata":{{"{}":"v"}}"#, "k".repeat(65));
    let long_value = format!(r#""metadata":{{"k":"{}"}}"#, "v".repeat(513));
    let pairs = |n: usize| {
        let kv: Vec<String> = (0..n).map(|i| format!(r#""k{i}":"v""#)).collect();
        format!(r#""metadata":{{{}}}"#, kv.join(","))
    };
    let (sixteen, seventeen) = (pairs(16), pairs(17));
    let edge = format!(
        r#""metadata":{{"{}":"{}"}}"#,
        "k".repeat(64),
        "v".repeat(512)
    );
    for ok in [
        r#""user":"u""#,
        r#""metadata":{"k":"v"}"#,
        sixteen.as_str(),
        edge.as_str(),
        r#""safety_identifier":"s""#,
        r#""stream":true,"stream_options":{"include_usage":true}"#,
    ] {
        chat(ok).unwrap_or_else(|e| panic!("{ok}: {e:?}"));
    }
    for (bad, field) in [
        (r#""user":5"#, "user"),
        (r#""metadata":5"#, "metadata"),
        (r#""metadata":{"k":5}"#, "metadata"),
        (long_key.as_str(), "metadata"),
        (long_value.as_str(), "metadata"),
        (seventeen.as_str(), "metadata"),
        (r#""safety_identifier":{}"#, "safety_identifier"),
        (
            r#""stream":true,"stream_options":{"foo":1}"#,
            "stream_options",
        ),
        (
            r#""stream_options":{"include_usage":true}"#,
            "stream_options",
        ),
        (
            r#""stream":false,"stream_options":{"include_usage":true}"#,
            "stream_options",
        ),
    ] {
        refused_naming(chat(bad), field, bad);
    }
}
