//! `serve` against an outside reference: the two-turn conversation of
//! `tests/fixtures/tiny-chat-f32/chat_reference.json` (transformers 5.24.0 on prompt ids rendered
//! from the TMLv0 grammar by `tools/chat_reference.py`) sent as OpenAI chat requests.
use super::server::{next_data, post_json, request, status, Server};
use crate::chat_common::{chat_reference, json_ids};
use serde_json::{json, Value};

/// Each turn, without streaming: `prompt_token_ids` and `token_ids` (vLLM's `return_token_ids`)
/// are transformers' prompt and greedy continuation, `message.content` its text,
/// `message.reasoning_content` its thinking (absent when there is none), finish and usage agree;
/// the second turn sends the first answer back with its `reasoning_content`, which the official
/// renderer drops. Streamed, the first turn's `reasoning_content` and `content` deltas add up to
/// the same thinking and text.
#[test]
fn serve_reproduces_the_transformers_conversation_with_thinking() {
    conversation_as_transformers(&[]);
}

/// [`serve_reproduces_the_transformers_conversation_with_thinking`] with the routed experts
/// streamed through one and then two expert slots: the same ids, and `/health` says how
/// streaming went (the usage file off: nothing is written into the fixture).
#[test]
fn serve_streaming_experts_reproduces_the_transformers_conversation() {
    for slots in ["1", "2"] {
        let server = conversation_as_transformers(&[
            "--device",
            "gpu",
            "--expert-slots",
            slots,
            "--usage-file",
            "off",
        ]);
        let h = server.health();
        let x = &h["experts"];
        assert_eq!(x["slots"].as_u64(), Some(slots.parse().unwrap()), "{h}");
        assert!(x["misses"].as_u64().unwrap() > 0, "{h}");
        assert!(x["bytes_read"].as_u64().unwrap() > 0, "{h}");
    }
    let server = Server::start(&[]);
    let h = server.health();
    assert_eq!(h["experts"], json!({"resident": true}), "{h}");
}

/// The reference conversation against a `serve` started with `args`; returns the server.
fn conversation_as_transformers(args: &[&str]) -> Server {
    let g = chat_reference();
    let turns = g["serve"].as_array().unwrap();
    let max = g["max_tokens"].as_u64().unwrap();
    let msgs = g["messages"].as_array().unwrap();
    let server = Server::start(args);
    let mut history: Vec<Value> = Vec::new();
    for (n, (t, m)) in turns.iter().zip(msgs).enumerate() {
        history.push(json!({"role": "user", "content": m}));
        let body = json!({
            "model": "tiny-chat-f32", "messages": history, "max_tokens": max, "temperature": 0,
            "return_token_ids": true,
        });
        let (code, v) = post_json(&server.addr, "/v1/chat/completions", &body);
        assert_eq!(code, 200, "turn {n}: {v}");
        let c = &v["choices"][0];
        assert_eq!(
            json_ids(&c["prompt_token_ids"]),
            json_ids(&t["prompt_ids"]),
            "turn {n}: prompt ids vs the TMLv0 rendering"
        );
        assert_eq!(
            json_ids(&c["token_ids"]),
            json_ids(&t["generated_ids"]),
            "turn {n}: greedy continuation vs transformers"
        );
        let msg = &c["message"];
        assert_eq!(msg["content"], t["text"], "turn {n}: content");
        let thinking = t["thinking"].as_str().unwrap();
        if thinking.is_empty() {
            assert!(msg.get("reasoning_content").is_none(), "turn {n}: {msg}");
        } else {
            assert_eq!(
                msg["reasoning_content"], thinking,
                "turn {n}: reasoning_content"
            );
        }
        let finish = if t["finish"] == "eos" {
            "stop"
        } else {
            "length"
        };
        assert_eq!(c["finish_reason"], finish, "turn {n}");
        assert_eq!(
            v["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
            t["prompt_ids"].as_array().unwrap().len(),
            "turn {n}: usage"
        );
        assert_eq!(
            v["usage"]["completion_tokens"].as_u64().unwrap() as usize,
            t["generated_ids"].as_array().unwrap().len(),
            "turn {n}: usage"
        );
        let mut back = json!({"role": "assistant", "content": msg["content"]});
        if !thinking.is_empty() {
            back["reasoning_content"] = msg["reasoning_content"].clone();
        }
        history.push(back);
    }
    assert!(!turns[0]["thinking"].as_str().unwrap().is_empty());

    // the first turn streamed
    let body = json!({
        "model": "tiny-chat-f32", "messages": [{"role": "user", "content": msgs[0]}], "max_tokens": max,
        "temperature": 0, "stream": true,
    });
    let mut r = request(&server.addr, "POST", "/v1/chat/completions", Some(&body));
    assert_eq!(status(&mut r), 200);
    let (mut thinking, mut text) = (String::new(), String::new());
    while let Some(d) = next_data(&mut r) {
        if d == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(&d).unwrap();
        let delta = &v["choices"][0]["delta"];
        if let Some(s) = delta["reasoning_content"].as_str() {
            thinking.push_str(s);
        }
        if let Some(s) = delta["content"].as_str() {
            text.push_str(s);
        }
    }
    assert_eq!(
        thinking,
        turns[0]["thinking"].as_str().unwrap(),
        "streamed reasoning_content"
    );
    assert_eq!(text, turns[0]["text"].as_str().unwrap(), "streamed content");
    server
}

/// `temperature`, `top_k`, `top_p` and `seed` of a completion request reach the sampler: for four
/// settings that differ in one field each and four seeds, `token_ids` is exactly the library's
/// sampled continuation on the CPU for those parameters and seed (the stop ids serve uses), and
/// no two settings give the same continuations.
#[test]
fn serve_sampling_fields_reach_the_sampler() {
    use crate::chat_common::{chat_model, stop_ids, tokenizer_and_renderer};
    use inkling_wgpu::model::generate::{generate, GenerateParams};
    use inkling_wgpu::model::sampling::SamplingParams;
    use inkling_wgpu::model::{Checkpoint, CpuModel, Weights};
    let ck = Checkpoint::open(&chat_model()).unwrap();
    let w = Weights::load(&ck).unwrap();
    let (_, r) = tokenizer_and_renderer();
    let stop = stop_ids(&ck, &r);
    let prompt: Vec<u32> = vec![50, 51, 57, 60, 61];
    let server = Server::start(&[]);
    let settings = crate::model_common::SAMPLING_SETTINGS;
    let mut seen: Vec<Vec<Vec<u32>>> = Vec::new();
    for (t, k, p) in settings {
        let mut runs = Vec::new();
        for seed in 1..=4u64 {
            let body = json!({
                "model": "tiny-chat-f32", "prompt": prompt, "max_tokens": 8,
                "temperature": t, "top_k": k, "top_p": p, "seed": seed,
                "return_token_ids": true,
            });
            let (code, v) = post_json(&server.addr, "/v1/completions", &body);
            assert_eq!(code, 200, "{v}");
            let params = GenerateParams {
                max_new_tokens: 8,
                sampling: SamplingParams {
                    temperature: t,
                    top_k: k,
                    top_p: p,
                    ..Default::default()
                },
                seed,
                eos_ids: stop.clone(),
            };
            let want = generate(&mut CpuModel::new(&w), &prompt, &params, &mut |_| Ok(()))
                .unwrap()
                .generated_ids;
            assert_eq!(
                json_ids(&v["choices"][0]["token_ids"]),
                want,
                "T {t} top_k {k} top_p {p} seed {seed}"
            );
            runs.push(want);
        }
        assert!(
            !seen.contains(&runs),
            "T {t} top_k {k} top_p {p}: the same continuations as another setting"
        );
        seen.push(runs);
    }
}

/// `/v1/models` says when the model was made (its config.json's modification time, not 0); each
/// response id is its endpoint's prefix and 16 hex digits, counting up from a random start (ids
/// stay distinct across restarts); a negative seed samples as its two's-complement u64.
#[test]
fn model_created_response_ids_and_negative_seeds() {
    use crate::chat_common::{chat_model, stop_ids, tokenizer_and_renderer};
    use inkling_wgpu::model::generate::{generate, GenerateParams};
    use inkling_wgpu::model::sampling::SamplingParams;
    use inkling_wgpu::model::{Checkpoint, CpuModel, Weights};
    let server = Server::start(&[]);
    let (code, _, body) = server.request("GET", "/v1/models", b"");
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let mtime = std::fs::metadata(chat_model().join("config.json"))
        .unwrap()
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(v["data"][0]["created"], mtime, "{v}");

    let prompt: Vec<u32> = vec![50, 51, 57, 60, 61];
    let body = json!({
        "model": "tiny-chat-f32", "prompt": prompt, "max_tokens": 8, "temperature": 1.0,
        "seed": -5, "return_token_ids": true,
    });
    let (c1, v1) = post_json(&server.addr, "/v1/completions", &body);
    let (c2, v2) = post_json(&server.addr, "/v1/completions", &body);
    assert_eq!((c1, c2), (200, 200), "{v1} {v2}");
    let id = |v: &Value| {
        let s = v["id"].as_str().unwrap().to_string();
        let hex = s.strip_prefix("cmpl-").expect("a cmpl- id").to_string();
        assert!(
            hex.len() == 16 && hex.chars().all(|c| c.is_ascii_hexdigit()),
            "{s}"
        );
        u64::from_str_radix(&hex, 16).unwrap()
    };
    assert_eq!(id(&v2), id(&v1) + 1);

    let ck = Checkpoint::open(&chat_model()).unwrap();
    let w = Weights::load(&ck).unwrap();
    let (_, r) = tokenizer_and_renderer();
    let params = GenerateParams {
        max_new_tokens: 8,
        sampling: SamplingParams {
            temperature: 1.0,
            ..Default::default()
        },
        seed: (-5i64) as u64,
        eos_ids: stop_ids(&ck, &r),
    };
    let want = generate(&mut CpuModel::new(&w), &prompt, &params, &mut |_| Ok(()))
        .unwrap()
        .generated_ids;
    assert_eq!(json_ids(&v1["choices"][0]["token_ids"]), want);
    assert_eq!(json_ids(&v2["choices"][0]["token_ids"]), want);
}
