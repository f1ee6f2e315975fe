//! The request parser of `serve` (`serve::api::{chat_request, completion_request}`) on bodies it
//! must refuse: every error names its field as a JSON path (`param` and the message), bodies that
//! are not JSON objects, not JSON or not UTF-8 say so, messages without `content` are refused, and
//! prompt text that cannot fit in the context is refused by its size in bytes.
use crate::chat_common::tokenizer_and_renderer;
use inkling_wgpu::chat::Renderer;
use inkling_wgpu::model::sampling::SamplingParams;
use inkling_wgpu::serve::api::{self, ApiError, Limits, Request};

/// The renderer of the chat fixture and what the parser needs of its limits.
pub struct Parser {
    pub renderer: Renderer,
    pub vocab: usize,
    pub stop: Vec<u32>,
    pub longest_token_bytes: usize,
}

impl Parser {
    pub fn new() -> Parser {
        let (tok, renderer) = tokenizer_and_renderer();
        Parser {
            vocab: tok.get_vocab_size(true),
            stop: vec![renderer.specials().model_end_sampling],
            longest_token_bytes: api::longest_token_bytes(&tok),
            renderer,
        }
    }

    /// Limits with a context of `ctx` tokens.
    pub fn limits(&self, ctx: usize) -> Limits<'_> {
        Limits {
            model_id: "tiny",
            ctx,
            stop_ids: &self.stop,
            vocab: self.vocab,
            sampling: SamplingParams::default(),
            longest_token_bytes: self.longest_token_bytes,
        }
    }

    pub fn chat(&self, body: &[u8]) -> Result<Request, ApiError> {
        api::chat_request(body, &self.renderer, &self.limits(4096))
    }

    pub fn completion(&self, body: &[u8]) -> Result<Request, ApiError> {
        api::completion_request(body, &self.renderer, &self.limits(4096))
    }
}

/// The error of `r`, checked to be a 400 whose envelope's `param` is `param` (`None`: null).
fn refused(r: Result<Request, ApiError>, param: Option<&str>, body: &str) -> ApiError {
    let e = match r {
        Ok(req) => panic!("{body}: accepted ({req:?})"),
        Err(e) => e,
    };
    let env = e.body();
    assert_eq!(e.status, 400, "{body}: {env}");
    assert_eq!(env["error"]["param"].as_str(), param, "{body}: {env}");
    assert_eq!(
        env["error"]["type"], "invalid_request_error",
        "{body}: {env}"
    );
    if let Some(p) = param {
        let m = env["error"]["message"].as_str().unwrap();
        assert!(
            m.contains(p),
            "{body}: the message does not name `{p}`: {m}"
        );
    }
    e
}

const USER: &str = r#"{"role":"user","content":"hi"}"#;

#[test]
fn every_field_error_names_its_json_path() {
    let p = Parser::new();
    let chat = |extra: &str| format!(r#"{{"messages":[{USER}],{extra}}}"#);
    let cases: Vec<(String, &str)> = vec![
        (chat(r#""max_tokens":"12""#), "max_tokens"),
        (chat(r#""max_tokens":18446744073709551616"#), "max_tokens"),
        (chat(r#""max_tokens":-3"#), "max_tokens"),
        (chat(r#""temperature":"hot""#), "temperature"),
        (chat(r#""temperature":1e400"#), "temperature"),
        (chat(r#""stream":"yes""#), "stream"),
        (chat(r#""seed":"7""#), "seed"),
        (chat(r#""top_k":1.5"#), "top_k"),
        (chat(r#""stop":[1]"#), "stop"),
        (chat(r#""stream_options":{"include_usage":1}"#), "stream_options.include_usage"),
        (r#"{"messages":"hi"}"#.into(), "messages"),
        (r#"{"messages":[{"content":"x"}]}"#.into(), "messages[0].role"),
        (r#"{"stream":true}"#.into(), "messages"),
        (format!(r#"{{"messages":[{USER},{{"role":5,"content":"x"}}]}}"#), "messages[1].role"),
        (format!(r#"{{"messages":[{USER},{{"role":"wizard","content":"x"}}]}}"#), "messages[1].role"),
        (r#"{"messages":[{"role":"user","content":7}]}"#.into(), "messages[0].content"),
        (
            r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#.into(),
            "messages[0].content[0].type",
        ),
        (
            r#"{"messages":[{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":5}}]}]}"#.into(),
            "messages[0].tool_calls[0].function.arguments",
        ),
        (chat(r#""n":2"#), "n"),
    ];
    for (body, param) in &cases {
        let e = refused(p.chat(body.as_bytes()), Some(param), body);
        assert!(
            !e.message.contains("not valid JSON"),
            "{body}: {}",
            e.message
        );
    }
    for (body, param) in [
        (r#"{"prompt":"hi","max_tokens":"12"}"#, "max_tokens"),
        (r#"{"prompt":[1,-2]}"#, "prompt"),
        (r#"{"prompt":{}}"#, "prompt"),
        (r#"{"prompt":"hi","top_p":"x"}"#, "top_p"),
        (r#"{"max_tokens":2}"#, "prompt"),
    ] {
        refused(p.completion(body.as_bytes()), Some(param), body);
    }
}

#[test]
fn user_system_and_tool_messages_need_content() {
    let p = Parser::new();
    for role in ["user", "system", "developer", "tool"] {
        for content in ["", r#","content":null"#] {
            let body = format!(r#"{{"messages":[{USER},{{"role":"{role}"{content}}}]}}"#);
            let e = refused(p.chat(body.as_bytes()), Some("messages[1].content"), &body);
            assert!(e.message.contains("needs `content`"), "{}", e.message);
        }
    }
    // an assistant turn with tool calls only passes this check (the fixture's tokenizer cannot
    // render tool calls, which is the error it gets); one with neither does not
    let calls = r#"{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]}"#;
    let body = format!(
        r#"{{"messages":[{USER},{calls},{{"role":"tool","tool_call_id":"c","content":"1"}}]}}"#
    );
    let e = p.chat(body.as_bytes()).unwrap_err();
    assert!(e.message.contains("needed to render a tool call"), "{e:?}");
    let body = format!(r#"{{"messages":[{USER},{{"role":"assistant"}},{USER}]}}"#);
    refused(p.chat(body.as_bytes()), Some("messages[1].content"), &body);
}

#[test]
fn bodies_that_are_not_json_objects_say_so() {
    let p = Parser::new();
    let m = |r, body: &[u8], param| refused(r, param, &String::from_utf8_lossy(body)).message;
    // a lone UTF-16 surrogate: no string can hold it
    let body = br#"{"messages":[{"role":"user","content":"\ud800"}]}"#;
    let msg = m(p.chat(body), body, Some("messages[0].content"));
    assert!(
        msg.contains("not valid JSON")
            && msg.contains("surrogate")
            && msg.contains("line 1 column"),
        "{msg}"
    );
    let body = br#"{"prompt":"a\udc00b"}"#;
    let msg = m(p.completion(body), body, Some("prompt"));
    assert!(msg.contains("surrogate"), "{msg}");
    // raw bytes that are not UTF-8
    let body = b"{\"prompt\":\"a\xff\"}";
    let msg = m(p.completion(body), body, None);
    assert!(
        msg.contains("not valid UTF-8") && msg.contains("byte 12"),
        "{msg}"
    );
    for body in [&b"[1,2]"[..], b"\"x\"", b"", b"  null"] {
        let msg = m(p.chat(body), body, None);
        assert!(msg.contains("must be a JSON object"), "{msg}");
    }
    for body in [
        &br#"{"prompt":"hi"} x"#[..],
        b"{not json",
        br#"{"prompt":"hi""#,
    ] {
        let msg = m(p.completion(body), body, None);
        assert!(msg.contains("not valid JSON at line 1 column"), "{msg}");
    }
}

#[test]
fn prompt_text_that_cannot_fit_is_refused_by_its_bytes() {
    let p = Parser::new();
    let (ctx, longest) = (16, p.longest_token_bytes);
    assert!(
        (1..=64).contains(&longest),
        "longest token of the fixture: {longest} bytes"
    );
    let lim = p.limits(ctx);
    let limit = ctx * longest;
    let text = "ab ".repeat(limit / 3 + 1);
    let prompt = serde_json::to_string(&text).unwrap();
    for (body, param) in [
        (format!(r#"{{"prompt":{prompt}}}"#), "prompt"),
        (format!(r#"{{"prompt":[{prompt}]}}"#), "prompt"),
        (
            format!(r#"{{"messages":[{{"role":"user","content":{prompt}}}]}}"#),
            "messages",
        ),
        (
            format!(
                r#"{{"messages":[{{"role":"user","content":[{{"type":"text","text":{prompt}}}]}}]}}"#
            ),
            "messages",
        ),
    ] {
        let r = if param == "prompt" {
            api::completion_request(body.as_bytes(), &p.renderer, &lim)
        } else {
            api::chat_request(body.as_bytes(), &p.renderer, &lim)
        };
        let e = r.expect_err(&body[..40]);
        assert_eq!(e.code, Some("context_length_exceeded"), "{e:?}");
        assert_eq!(e.param.as_deref(), Some(param), "{e:?}");
        for part in [
            format!("{} bytes", text.len()),
            format!("{ctx} tokens"),
            format!("{limit} bytes"),
            format!("{longest} bytes"),
        ] {
            assert!(e.message.contains(&part), "no {part:?} in {}", e.message);
        }
    }
    // within the byte limit, the token count decides (as before)
    let body = r#"{"prompt":"ab ab ab ab","max_tokens":100}"#;
    let e = api::completion_request(body.as_bytes(), &p.renderer, &lim).unwrap_err();
    assert_eq!(e.code, Some("context_length_exceeded"), "{e:?}");
    assert!(
        e.message.contains("in the prompt, 100 in the completion"),
        "{e:?}"
    );
}

/// `max_tokens` and `max_completion_tokens` that disagree, and an empty stop string, are refused
/// naming the field instead of one silently winning or the empty string matching everywhere.
#[test]
fn conflicting_limits_and_empty_stops_are_refused_by_name() {
    let p = Parser::new();
    let body = format!(r#"{{"messages":[{USER}],"max_tokens":2,"max_completion_tokens":5}}"#);
    refused(p.chat(body.as_bytes()), Some("max_tokens"), &body);
    let same = format!(r#"{{"messages":[{USER}],"max_tokens":5,"max_completion_tokens":5}}"#);
    assert!(p.chat(same.as_bytes()).is_ok(), "{same}");
    let body = format!(r#"{{"messages":[{USER}],"stop":["x",""]}}"#);
    let e = refused(p.chat(body.as_bytes()), Some("stop[1]"), &body);
    assert!(e.body()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("empty"));
}

/// The penalties and min-p reach the sampling settings; out-of-range values and the fields the
/// server does not implement (`logit_bias`, `logprobs`, `top_logprobs`) are refused by name,
/// never ignored.
#[test]
fn penalties_are_taken_and_bad_values_refused_by_name() {
    let p = Parser::new();
    let body = format!(
        r#"{{"messages":[{USER}],"presence_penalty":0.5,"frequency_penalty":-1,"repetition_penalty":1.2,"repeat_last_n":8,"min_p":0.1}}"#
    );
    let s = p.chat(body.as_bytes()).unwrap().params.sampling;
    assert_eq!(
        (
            s.presence_penalty,
            s.frequency_penalty,
            s.repeat_penalty,
            s.repeat_last_n,
            s.min_p
        ),
        (0.5, -1.0, 1.2, 8, 0.1)
    );
    for (field, bad) in [
        ("presence_penalty", "2.5"),
        ("frequency_penalty", "-3"),
        ("repetition_penalty", "0"),
        // +inf and 0 once narrowed to the f32 the sampler applies
        ("repetition_penalty", "1e39"),
        ("repetition_penalty", "1e-50"),
        ("min_p", "1.5"),
        ("repeat_last_n", "-2"),
        ("top_k", "-2"),
        ("logit_bias", r#"{"5":101}"#),
        ("logit_bias", r#"{"x":1}"#),
        ("logprobs", "2"),
        ("top_logprobs", "2"),
    ] {
        let body = format!(r#"{{"messages":[{USER}],"{field}":{bad}}}"#);
        refused(p.chat(body.as_bytes()), Some(field), &body);
    }
    // -1: vLLM's top_k off, llama.cpp's repeat_last_n over the whole sequence
    let body = format!(r#"{{"messages":[{USER}],"top_k":-1,"repeat_last_n":-1}}"#);
    let s = p.chat(body.as_bytes()).unwrap().params.sampling;
    assert_eq!(
        (s.top_k, s.repeat_last_n),
        (0, inkling_wgpu::model::sampling::WHOLE_SEQUENCE)
    );
    // a negative seed (OpenAI's schema allows any 64-bit integer) is its two's complement
    let body = format!(r#"{{"messages":[{USER}],"seed":-5}}"#);
    assert_eq!(p.chat(body.as_bytes()).unwrap().params.seed, (-5i64) as u64);
    let body = format!(r#"{{"messages":[{USER}],"seed":18446744073709551615}}"#);
    assert_eq!(p.chat(body.as_bytes()).unwrap().params.seed, u64::MAX);
    for bad in ["1.5", "1e30"] {
        let body = format!(r#"{{"messages":[{USER}],"seed":{bad}}}"#);
        refused(p.chat(body.as_bytes()), Some("seed"), &body);
    }
    // null and false are "not asked"
    let body = format!(r#"{{"messages":[{USER}],"logprobs":false,"logit_bias":null}}"#);
    assert!(p.chat(body.as_bytes()).is_ok(), "{body}");
}
