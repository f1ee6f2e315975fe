//! `logprobs` of `serve` (CPU device, the chat fixture) against the log-softmax of the CPU
//! model's own logits over the same ids: completions (`logprobs` 0–5) and chat (`logprobs` +
//! `top_logprobs`), streamed and not, sampled with penalties (the values are of the raw logits,
//! before temperature and penalties), and `logit_bias` steering the choice without changing them.
use super::server::{next_data, post_json, request, status, Server};
use crate::chat_common::{chat_model, json_ids, tokenizer_and_renderer};
use inkling_wgpu::model::{Checkpoint, CpuModel, Weights};
use serde_json::{json, Value};

/// Log-softmax rows of the CPU model's logits over `ids` (row t: the distribution of id t+1).
fn log_softmax_rows(ids: &[u32]) -> Vec<Vec<f64>> {
    let ck = Checkpoint::open(&chat_model()).unwrap();
    let w = Weights::load(&ck).unwrap();
    let rows = CpuModel::new(&w).forward_all(ids).unwrap();
    rows.iter()
        .map(|r| {
            let max = r.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let lse = max + r.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
            r.iter().map(|&x| x as f64 - lse).collect()
        })
        .collect()
}

/// The `n` largest values of a row, descending.
fn top(row: &[f64], n: usize) -> Vec<f64> {
    let mut v = row.to_vec();
    v.sort_by(|a, b| b.total_cmp(a));
    v.truncate(n);
    v
}

/// The tolerance of served values against the CPU's f64 log-softmax of its f32 logits.
const CPU_TOL: f64 = 2e-4;
/// The GPU's f32 logits differ from the CPU's by float rounding (logits of tens).
const GPU_TOL: f64 = 5e-3;

fn close_tol(a: f64, b: f64, tol: f64, what: &str) {
    assert!(
        (a - b).abs() < tol,
        "{what}: served {a}, CPU log-softmax {b}"
    );
}

fn close(a: f64, b: f64, what: &str) {
    close_tol(a, b, CPU_TOL, what)
}

/// The streamed chunks' `choices[0]` of a request.
fn stream_choices(addr: &str, path: &str, body: &Value) -> Vec<Value> {
    let mut r = request(addr, "POST", path, Some(body));
    assert_eq!(status(&mut r), 200);
    let mut out = Vec::new();
    while let Some(d) = next_data(&mut r) {
        if d == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(&d).unwrap();
        if let Some(c) = v["choices"].get(0) {
            out.push(c.clone());
        }
    }
    out
}

#[test]
fn completion_logprobs_are_the_log_softmax_of_the_cpu_logits() {
    completion_logprobs(&[], CPU_TOL);
}

#[test]
fn completion_logprobs_on_the_gpu_equal_the_cpu_log_softmax() {
    completion_logprobs(&["--device", "gpu"], GPU_TOL);
}

fn completion_logprobs(extra: &[&str], tol: f64) {
    let close = |a: f64, b: f64, what: &str| close_tol(a, b, tol, what);
    let (_, r) = tokenizer_and_renderer();
    let sp = r.specials().clone();
    let server = Server::start(extra);
    let prompt: Vec<u32> = vec![50, 51, 57, 60, 61];
    // sampled, with penalties: the values must still be those of the raw logits
    let body = json!({
        "prompt": prompt, "max_tokens": 10, "temperature": 0.8, "seed": 3,
        "presence_penalty": 1.0, "logprobs": 5, "return_token_ids": true,
    });
    let (code, v) = post_json(&server.addr, "/v1/completions", &body);
    assert_eq!(code, 200, "{v}");
    let c = &v["choices"][0];
    let gen = json_ids(&c["token_ids"]);
    let lp = &c["logprobs"];
    let mut all = prompt.clone();
    all.extend(&gen);
    let rows = log_softmax_rows(&all[..all.len() - 1]);
    // every generated id that is not special (an EOS is not part of the text)
    let shown: Vec<(usize, u32)> = gen
        .iter()
        .copied()
        .enumerate()
        .filter(|&(_, id)| !sp.is_special(id))
        .collect();
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), shown.len(), "{lp}");
    assert!(shown.len() >= 5, "too few tokens to check: {gen:?}");
    for (k, &(i, id)) in shown.iter().enumerate() {
        let row = &rows[prompt.len() - 1 + i];
        let what = format!("token {k} (id {id})");
        close(
            lp["token_logprobs"][k].as_f64().unwrap(),
            row[id as usize],
            &what,
        );
        let mut served: Vec<f64> = lp["top_logprobs"][k]
            .as_object()
            .unwrap()
            .values()
            .map(|x| x.as_f64().unwrap())
            .collect();
        served.sort_by(|a, b| b.total_cmp(a));
        let want = top(row, 5);
        // alternatives with the same text merge into one key
        assert!(
            !served.is_empty() && served.len() <= 5,
            "{what}: {served:?}"
        );
        close(served[0], want[0], &what);
        for x in &served {
            assert!(
                want.iter().any(|w| (w - x).abs() < tol),
                "{what}: {x} not in {want:?}"
            );
        }
    }
    let off: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(off[0], 0);
    assert!(off.windows(2).all(|w| w[0] <= w[1]), "{off:?}");
    let text = c["text"].as_str().unwrap();
    let joined: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    if !joined.contains('\u{FFFD}') {
        assert_eq!(joined, text);
    }

    // streamed: the same tokens and values, spread over the chunks
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let chunks = stream_choices(&server.addr, "/v1/completions", &sbody);
    let mut stoks = Vec::new();
    let mut slps = Vec::new();
    let mut soff = Vec::new();
    for ch in &chunks {
        if let Some(l) = ch["logprobs"].as_object() {
            stoks.extend(l["tokens"].as_array().unwrap().iter().cloned());
            slps.extend(l["token_logprobs"].as_array().unwrap().iter().cloned());
            soff.extend(
                l["text_offset"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap()),
            );
        }
    }
    assert_eq!(&stoks, tokens);
    assert_eq!(&slps, lp["token_logprobs"].as_array().unwrap());
    assert_eq!(soff, off);

    // logprobs 0: the chosen token's only
    let (_, v0) = post_json(
        &server.addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 3, "logprobs": 0}),
    );
    let l0 = &v0["choices"][0]["logprobs"];
    assert!(
        l0["top_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m.as_object().unwrap().is_empty()),
        "{l0}"
    );
    // without logprobs: null
    let (_, vn) = post_json(
        &server.addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 3}),
    );
    assert!(vn["choices"][0]["logprobs"].is_null());

    // logit_bias +100 on one id: greedy picks it every step; its logprobs stay the raw ones
    let forced = 77u32;
    let (code, vb) = post_json(
        &server.addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 3, "logit_bias": {forced.to_string(): 100},
                "logprobs": 1, "return_token_ids": true}),
    );
    assert_eq!(code, 200, "{vb}");
    assert_eq!(json_ids(&vb["choices"][0]["token_ids"]), [forced; 3]);
    let mut biased = prompt.clone();
    biased.extend([forced; 2]);
    let rows = log_softmax_rows(&biased);
    for k in 0..3 {
        close(
            vb["choices"][0]["logprobs"]["token_logprobs"][k]
                .as_f64()
                .unwrap(),
            rows[prompt.len() - 1 + k][forced as usize],
            &format!("biased token {k}"),
        );
    }
}

#[test]
fn chat_logprobs_are_the_log_softmax_of_the_cpu_logits() {
    let (_, r) = tokenizer_and_renderer();
    let sp = r.specials().clone();
    let server = Server::start(&[]);
    let body = json!({
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "reasoning_effort": "none", "max_tokens": 12, "logprobs": true, "top_logprobs": 3,
        "return_token_ids": true,
    });
    let (code, v) = post_json(&server.addr, "/v1/chat/completions", &body);
    assert_eq!(code, 200, "{v}");
    let c = &v["choices"][0];
    let prompt = json_ids(&c["prompt_token_ids"]);
    let gen = json_ids(&c["token_ids"]);
    assert_eq!(
        prompt.last(),
        Some(&sp.content_text),
        "effort none prefills a text block"
    );
    let mut all = prompt.clone();
    all.extend(&gen);
    let rows = log_softmax_rows(&all[..all.len() - 1]);
    // content tokens: ordinary ids while the text block is open
    let mut in_text = true;
    let mut shown = Vec::new();
    for (i, &id) in gen.iter().enumerate() {
        if sp.is_special(id) {
            in_text = id == sp.content_text;
        } else if in_text {
            shown.push((i, id));
        }
    }
    let content = c["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), shown.len(), "{gen:?}: {}", c["logprobs"]);
    assert!(!shown.is_empty());
    let mut text_bytes = Vec::new();
    for (e, &(i, id)) in content.iter().zip(&shown) {
        let row = &rows[prompt.len() - 1 + i];
        let what = format!("chat token at {i} (id {id})");
        close(e["logprob"].as_f64().unwrap(), row[id as usize], &what);
        let alts = e["top_logprobs"].as_array().unwrap();
        assert_eq!(alts.len(), 3, "{what}");
        for (a, w) in alts.iter().zip(top(row, 3)) {
            close(a["logprob"].as_f64().unwrap(), w, &what);
        }
        text_bytes.extend(
            e["bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u8),
        );
    }
    // the bytes of the content tokens are the answer text
    assert_eq!(
        String::from_utf8_lossy(&text_bytes),
        c["message"]["content"].as_str().unwrap()
    );
    // streamed: the same entries
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let streamed: Vec<Value> = stream_choices(&server.addr, "/v1/chat/completions", &sbody)
        .iter()
        .filter_map(|ch| ch["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(&streamed, content);
}

/// A stop string that starts at token k: the answer is the text before it, and its tokens (and
/// only they) carry log-probabilities, streamed and not.
#[test]
fn a_stop_strings_tokens_get_no_logprobs() {
    let server = Server::start(&[]);
    let prompt: Vec<u32> = vec![50, 51, 57, 60, 61];
    let body = json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 1});
    let (code, v) = post_json(&server.addr, "/v1/completions", &body);
    assert_eq!(code, 200, "{v}");
    let text0 = v["choices"][0]["text"].as_str().unwrap().to_string();
    let tokens0: Vec<String> = v["choices"][0]["logprobs"]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    // the first token k ≥ 1 whose text first occurs where it starts, after whole-character tokens
    let (k, off) = (1..tokens0.len())
        .map(|k| (k, tokens0[..k].concat().len()))
        .find(|&(k, off)| {
            let upto = tokens0[..=k].concat();
            let t = &tokens0[k];
            !t.trim().is_empty()
                && !upto.contains('\u{fffd}')
                && text0.starts_with(&upto)
                && text0.find(t.as_str()) == Some(off)
        })
        .unwrap_or_else(|| panic!("no usable stop token in {tokens0:?} ({text0:?})"));
    let stop = tokens0[k].clone();
    let body = json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 1, "stop": [stop]});
    let (code, v) = post_json(&server.addr, "/v1/completions", &body);
    assert_eq!(code, 200, "{v}");
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "stop", "{v}");
    assert_eq!(c["text"].as_str().unwrap(), &text0[..off], "{v}");
    let tokens: Vec<&str> = c["logprobs"]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens, tokens0[..k].to_vec(), "stop {stop:?}: {v}");
    assert_eq!(c["logprobs"]["token_logprobs"].as_array().unwrap().len(), k);
    // streamed: the same tokens
    let mut body = body;
    body["stream"] = json!(true);
    let streamed: Vec<String> = stream_choices(&server.addr, "/v1/completions", &body)
        .iter()
        .flat_map(|c| {
            c["logprobs"]["tokens"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    assert_eq!(streamed, tokens0[..k].to_vec(), "streamed, stop {stop:?}");
}
