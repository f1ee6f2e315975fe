//! Tool calls: the tool declaration block and a tool conversation rendered to the exact ids of
//! Inkling's format (o200k with Inkling's special table, ../shared/reference/
//! INKLING-CHAT-AND-SERVE.md §3.3–3.4), the model's tool-call blocks parsed from exact token
//! sequences, and `serve` of the chat fixture with the tool specials added (a scratch copy), with
//! a forced (named) `tool_choice`, driven by the official `openai` client
//! (tests/python/tools_logprobs.py, which also covers logprobs).
use super::server::{post_json, Server};
use crate::chat_common::chat_model;
use crate::model_common::scratch;
use flate2::read::GzDecoder;
use inkling_wgpu::chat::render::ToolCall;
use inkling_wgpu::chat::{Block, Effort, Message, OutputParser, Renderer, Role};
use inkling_wgpu::serve::tools::{self, CallEvent, CallParser, ParsedCall, ToolDecl};
use serde_json::json;
use std::io::Read;
use std::path::PathBuf;
use tokenizers::{AddedToken, Tokenizer};

fn o200k_inkling() -> (Tokenizer, Renderer) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizer-o200k-inkling/tokenizer.json.gz");
    let mut json = Vec::new();
    GzDecoder::new(&std::fs::read(path).unwrap()[..])
        .read_to_end(&mut json)
        .unwrap();
    let tok = Tokenizer::from_bytes(&json).unwrap();
    let r = Renderer::new(&tok).unwrap();
    (tok, r)
}

/// The calls that ended among `events`.
fn ended(events: &[CallEvent]) -> Vec<ParsedCall> {
    events
        .iter()
        .filter_map(|e| match e {
            CallEvent::End(c) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

fn weather() -> ToolDecl {
    ToolDecl {
        name: "get_weather".into(),
        description: Some("Weather of a city".into()),
        parameters: Some(json!({"type": "object", "properties": {"city": {"type": "string"}}})),
    }
}

#[test]
fn a_tool_conversation_renders_to_inklings_ids() {
    let (tok, r) = o200k_inkling();
    let e = |s: &str| r.encode_text(s).unwrap();
    let decl = tools::declaration_json(&[weather()]);
    assert_eq!(
        decl,
        r#"[{"description":"Weather of a city","name":"get_weather","parameters":{"properties":{"city":{"type":"string"}},"type":"object"},"type":"function"}]"#
    );
    let mut call = Message::new(Role::Model, "");
    call.tool_calls.push(ToolCall {
        name: "get_weather".into(),
        arguments: json!({"city": "SF"}),
    });
    let mut result = Message::new(Role::Tool, "sunny");
    result.name = Some("get_weather".into());
    let msgs = [
        Message::new(Role::System, "sys"),
        Message::new(Role::User, "Weather?"),
        call,
        result,
    ];
    let mut got = r.tool_declaration(&decl).unwrap();
    got.extend(r.render(&msgs, Some(Effort::DEFAULT)).unwrap());
    // Inkling's table: message_system 200002, content_xml 200024, end_message 200010,
    // content_text 200004, message_user 200000, message_model 200001, invoke_tool_json 200049,
    // model_end_sampling 200006, message_tool 200003
    let mut want = vec![200002];
    want.extend(e("tool_declare"));
    want.push(200024);
    want.extend(e(&decl));
    want.extend([200010, 200002, 200004]);
    want.extend(e("sys"));
    want.extend([200010]);
    // the effort block (the reference's golden ids)
    want.extend([
        200002, 200004, 133850, 6942, 3211, 25, 220, 15, 13, 24, 200010,
    ]);
    want.extend([200000, 200004]);
    want.extend(e("Weather?"));
    want.extend([200010, 200001]);
    want.extend(e("get_weather"));
    want.push(200049);
    want.extend(e(r#"{"name":"get_weather","args":{"city":"SF"}}"#));
    want.extend([200010, 200006, 200003]);
    want.extend(e("get_weather"));
    want.push(200004);
    want.extend(e("sunny"));
    want.push(200010);
    assert_eq!(got, want);
    // and the reference's text of the round trip
    let text = tok.decode(&got, false).unwrap();
    assert!(
        text.starts_with("<|message_system|>tool_declare<|content_xml|>[{\"description\""),
        "{text}"
    );
    assert!(
        text.ends_with(
            "<|message_model|>get_weather<|content_invoke_tool_json|>{\"name\":\"get_weather\",\
             \"args\":{\"city\":\"SF\"}}<|end_message|><|content_model_end_sampling|>\
             <|message_tool|>get_weather<|content_text|>sunny<|end_message|>"
        ),
        "{text}"
    );
    // a forced call's prefix after the generation prompt
    let p = r
        .tool_call_prefix("get_weather", &tools::forced_json_prefix("get_weather"))
        .unwrap();
    let mut wp = e("get_weather");
    wp.push(200049);
    wp.extend(e(r#"{"name":"get_weather","args":"#));
    assert_eq!(p, wp);
}

#[test]
fn tool_call_blocks_parse_from_the_exact_token_sequence() {
    let (tok, r) = o200k_inkling();
    let sp = r.specials().clone();
    let e = |s: &str| r.encode_text(s).unwrap();
    // after the generation prompt <|message_model|>: a text block, then two calls
    let mut out = vec![sp.content_text];
    out.extend(e("Let me check."));
    out.extend([sp.end_message, sp.message_model]);
    out.extend(e("get_weather"));
    out.push(200049);
    out.extend(e(r#"{"name":"get_weather","args":{"city":"SF"}}"#));
    out.extend([sp.end_message, sp.message_model]);
    out.extend(e("get_time"));
    out.push(200049);
    out.extend(e(r#"{"name":"get_time","args":{"tz":"PST","n":[1,2]}}"#));
    out.extend([sp.end_message, sp.model_end_sampling]);
    let mut calls = Vec::new();
    let mut text = String::new();
    let mut cp = CallParser::new(&tok, &sp, false, None);
    let mut op = OutputParser::new(&tok, &sp, false).with_tools(false);
    for &id in &out {
        calls.extend(cp.push(id).unwrap());
        if let Some(p) = op.push(id).unwrap() {
            if p.block == Block::Text {
                text.push_str(&p.text);
            }
        }
    }
    calls.extend(cp.finish().unwrap());
    if let Some(p) = op.finish().unwrap() {
        text.push_str(&p.text);
    }
    assert_eq!(
        text, "Let me check.",
        "the tool names are headers, not answer text"
    );
    assert!(!op.strayed());
    let ends = ended(&calls);
    let got: Vec<(&str, &str)> = ends
        .iter()
        .map(|c| (c.name.as_str(), c.arguments.as_str()))
        .collect();
    // the arguments as the model wrote them
    assert_eq!(
        got,
        [
            ("get_weather", r#"{"city":"SF"}"#),
            ("get_time", r#"{"tz":"PST","n":[1,2]}"#)
        ]
    );
    // streamed: each call's start, then its arguments in pieces that join to the end's
    let mut joined: Vec<(String, String, usize)> = Vec::new();
    for ev in &calls {
        match ev {
            CallEvent::Start(n) => joined.push((n.clone(), String::new(), 0)),
            CallEvent::Args(a) => {
                let j = joined.last_mut().expect("arguments before a start");
                j.1.push_str(a);
                j.2 += 1;
            }
            CallEvent::End(_) => {}
        }
    }
    assert_eq!(joined.len(), 2);
    for ((n, a, pieces), c) in joined.iter().zip(&ends) {
        assert_eq!((n, a), (&c.name, &c.arguments));
        assert!(*pieces >= 2, "{n}: the arguments came in {pieces} piece(s)");
    }
    // a forced call: the prompt holds the prefix, the model writes the arguments and `}`
    let mut cp = CallParser::new(&tok, &sp, false, Some("get_weather"));
    let mut forced = e(r#"{"city":"Paris"}}"#);
    forced.extend([sp.end_message, sp.model_end_sampling]);
    let evs: Vec<CallEvent> = forced.iter().flat_map(|&id| cp.push(id).unwrap()).collect();
    assert_eq!(evs.first(), Some(&CallEvent::Start("get_weather".into())));
    let calls = ended(&evs);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "get_weather");
    assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
    // a call that does not start as {"name":…,"args": comes whole at its end
    let mut cp = CallParser::new(&tok, &sp, false, None);
    let mut odd = vec![sp.message_model];
    odd.extend(e("f"));
    odd.push(200049);
    odd.extend(e("[1, 2]"));
    odd.push(sp.end_message);
    let evs: Vec<CallEvent> = odd.iter().flat_map(|&id| cp.push(id).unwrap()).collect();
    assert_eq!(
        evs,
        [CallEvent::End(ParsedCall {
            name: "f".into(),
            arguments: "[1, 2]".into()
        })]
    );
    // text outside any block with tools declared is still the answer (and flagged)
    let mut op = OutputParser::new(&tok, &sp, false).with_tools(false);
    let mut stray = e("Loose");
    stray.push(sp.model_end_sampling);
    let pieces: Vec<_> = stray
        .iter()
        .filter_map(|&id| op.push(id).unwrap())
        .collect();
    assert_eq!(pieces.len(), 1);
    assert_eq!(pieces[0].text, "Loose");
    assert!(op.strayed());
}

/// A scratch copy of the chat fixture whose tokenizer also has `<|content_xml|>` (409) and
/// `<|content_invoke_tool_json|>` (410), inside the model's 416 embedding rows (its 409 logits
/// can never choose them).
pub fn tool_model() -> PathBuf {
    let dir = scratch("tool-model");
    for f in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer_config.json",
    ] {
        std::fs::copy(chat_model().join(f), dir.join(f)).unwrap();
    }
    let mut tok = Tokenizer::from_file(chat_model().join("tokenizer.json")).unwrap();
    tok.add_special_tokens(&[
        AddedToken::from("<|content_xml|>", true),
        AddedToken::from("<|content_invoke_tool_json|>", true),
    ]);
    assert_eq!(tok.token_to_id("<|content_invoke_tool_json|>"), Some(410));
    tok.save(dir.join("tokenizer.json"), false).unwrap();
    dir
}

#[test]
fn serve_forces_a_named_tool_call_and_the_openai_client_round_trips() {
    let model = tool_model();
    let server = Server::start_model(&model, &[]);
    let tools_v = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let body = json!({
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": tools_v, "max_tokens": 10, "temperature": 0, "return_token_ids": true,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    });
    let (code, v) = post_json(&server.addr, "/v1/chat/completions", &body);
    assert_eq!(code, 200, "{v}");
    let c = &v["choices"][0];
    let calls = c["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(calls[0]["type"], "function");
    assert!(calls[0]["function"]["arguments"].is_string());
    // the prompt ends with the forced prefix: <|message_model|>get_weather<|content_invoke_tool_json|>{"name":…,"args":
    let prompt = crate::chat_common::json_ids(&c["prompt_token_ids"]);
    let tok = Tokenizer::from_file(model.join("tokenizer.json")).unwrap();
    let text = tok.decode(&prompt, false).unwrap();
    assert!(
        text.starts_with("<|message_system|>tool_declare<|content_xml|>[{\"name\":\"get_weather\""),
        "{text}"
    );
    assert!(
        text.ends_with("<|message_model|>get_weather<|content_invoke_tool_json|>{\"name\":\"get_weather\",\"args\":"),
        "{text}"
    );
    let finish = c["finish_reason"].as_str().unwrap();
    assert!(["tool_calls", "length"].contains(&finish), "{finish}");
    // the official client
    let (ok, report) = super::test_python::run_script("tools_logprobs.py", &server.addr);
    println!("{v}\n{report}");
    assert!(ok, "{report}");
    assert!(report.contains("all checks passed"), "{report}");
    let _ = std::fs::remove_dir_all(&model);
}

/// A call cut off by `max_tokens` (arguments that are not JSON) sent back in the next turn, as
/// agent loops do, is taken (rendered as a JSON string), not refused.
#[test]
fn a_cut_off_calls_arguments_come_back_without_an_error() {
    let model = tool_model();
    let server = Server::start_model(&model, &[]);
    let body = json!({
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"S"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "max_tokens": 3, "temperature": 0,
    });
    let (code, v) = post_json(&server.addr, "/v1/chat/completions", &body);
    assert_eq!(code, 200, "{v}");
    assert!(v["choices"][0]["finish_reason"].is_string(), "{v}");
}
