//! Concurrent requests to `serve --parallel 4` (continuous batching), on the CPU and the GPU:
//! six completions and two chat turns sent at once, greedy and seeded-sampled, streamed and not,
//! each answer identical (ids, text, finish reason, usage) to the same request served alone
//! afterwards; `/health` reports 4 slots and more tokens than decode steps (shared steps); the same
//! through the official `openai` client.
use super::server::{next_data, post_json, request, status, Server};
use serde_json::{json, Value};

/// The requests of the burst: completions of different prompt ids and lengths (one sampled with
/// a seed, one streamed), and two chat turns.
fn requests() -> Vec<(&'static str, Value)> {
    let mut v = Vec::new();
    for i in 0..6u32 {
        let prompt: Vec<u32> = (0..2 + 3 * i)
            .map(|j| (40 + 17 * j + 29 * i) % 400)
            .collect();
        let mut body = json!({
            "prompt": prompt, "max_tokens": 8 + 4 * i, "temperature": 0,
            "return_token_ids": true,
        });
        if i == 2 {
            body["temperature"] = json!(0.8);
            body["seed"] = json!(7);
        }
        if i == 4 {
            body["stream"] = json!(true);
        }
        v.push(("/v1/completions", body));
    }
    for q in ["Tell me a story.", "What is two and two?"] {
        v.push((
            "/v1/chat/completions",
            json!({
                "messages": [{"role": "user", "content": q}], "max_tokens": 20,
                "temperature": 0, "reasoning_effort": "none",
            }),
        ));
    }
    v
}

/// The answer of one request, without the fields that differ between runs (ids, times).
fn answer(addr: &str, path: &str, body: &Value) -> Value {
    if body["stream"] == true {
        let mut r = request(addr, "POST", path, Some(body));
        assert_eq!(status(&mut r), 200);
        let mut text = String::new();
        let mut finish = Value::Null;
        while let Some(d) = next_data(&mut r) {
            if d == "[DONE]" {
                break;
            }
            let v: Value = serde_json::from_str(&d).unwrap();
            let c = &v["choices"][0];
            text.push_str(c["text"].as_str().unwrap_or(""));
            if !c["finish_reason"].is_null() {
                finish = c["finish_reason"].clone();
            }
        }
        return json!({"text": text, "finish_reason": finish});
    }
    let (code, v) = post_json(addr, path, body);
    assert_eq!(code, 200, "{v}");
    let c = &v["choices"][0];
    json!({
        "text": c["text"], "message": c["message"], "finish_reason": c["finish_reason"],
        "token_ids": c["token_ids"], "completion_tokens": v["usage"]["completion_tokens"],
        "prompt_tokens": v["usage"]["prompt_tokens"],
    })
}

fn check(extra: &[&str]) {
    let mut args = vec!["--parallel", "4"];
    args.extend_from_slice(extra);
    let server = Server::start(&args);
    let h = server.health();
    assert_eq!(h["slots"], json!({"total": 4, "in_use": 0}), "{h}");
    let reqs = requests();
    let addr = server.addr.clone();
    let handles: Vec<_> = reqs
        .iter()
        .cloned()
        .map(|(p, b)| {
            let addr = addr.clone();
            std::thread::spawn(move || answer(&addr, p, &b))
        })
        .collect();
    // several slots run at once while the burst is under way
    let mut busiest = 0;
    while !handles.iter().all(|h| h.is_finished()) {
        busiest = busiest.max(server.health()["slots"]["in_use"].as_u64().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let together: Vec<Value> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(
        busiest >= 2,
        "at most {busiest} slots in use during the burst"
    );
    for (i, ((p, b), got)) in reqs.iter().zip(&together).enumerate() {
        let alone = answer(&server.addr, p, b);
        assert_eq!(
            got, &alone,
            "{extra:?}: request {i} ({p}) together vs alone"
        );
        assert!(!got["finish_reason"].is_null(), "{got}");
    }
    let h = server.health();
    assert_eq!(h["slots"]["in_use"], 0, "{h}");
    assert_eq!(h["counts"]["completed"], 2 * reqs.len() as u64, "{h}");
}

#[test]
fn cpu_concurrent_requests_equal_each_alone() {
    check(&[]);
}

#[test]
fn gpu_concurrent_requests_equal_each_alone() {
    check(&["--device", "gpu"]);
}

/// The official `openai` client: eight concurrent requests (chat and completions, streamed and
/// not, greedy, sampled with a seed, with logprobs) equal each alone (tests/python/concurrency.py).
#[test]
fn openai_client_concurrent_requests_equal_each_alone() {
    let server = Server::start(&["--parallel", "4"]);
    let (ok, report) = super::test_python::run_script("concurrency.py", &server.addr);
    assert!(ok, "{report}");
    assert!(report.contains("all checks passed"), "{report}");
}

/// `--parallel 2 --queue 1`, six long requests at once on an idle server: exactly three are taken
/// (two run, one waits for a slot) and three get 429, however fast the engine drains its queue:
/// the capacity is `--parallel` + `--queue`.
#[test]
fn a_burst_past_the_slots_and_the_queue_gets_429() {
    let server = Server::start(&["--parallel", "2", "--queue", "1"]);
    let long = json!({"prompt": [100], "max_tokens": 4000, "temperature": 0});
    let burst: Vec<_> = (0..6)
        .map(|_| {
            let (addr, b) = (server.addr.clone(), long.clone());
            std::thread::spawn(move || post_json(&addr, "/v1/completions", &b).0)
        })
        .collect();
    let mut codes: Vec<u16> = burst.into_iter().map(|h| h.join().unwrap()).collect();
    codes.sort();
    assert_eq!(codes, [200, 200, 200, 429, 429, 429]);
    let h = server.health();
    assert_eq!(h["counts"]["rejected_429"], 3, "{h}");
    assert_eq!(h["counts"]["completed"], 3, "{h}");
}
