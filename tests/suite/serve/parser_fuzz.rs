//! Fuzzing of `serve`'s request parser (`serve::api::{chat_request, completion_request}`, the
//! functions that turn a body into a request): seeded mutations of valid bodies (truncation, byte
//! flips and insertions, values swapped for other types, huge and out-of-range numbers, lone
//! surrogates, deep nesting, dropped and duplicated keys). No input may panic, and every refusal
//! must be an OpenAI envelope with a message, an error type and a 4xx status.
//!
//! The suite runs [`ITERATIONS`] mutations; the ignored `parser_fuzz_long` runs
//! `INKLING_FUZZ_ITERATIONS` (default 200 000) from seed `INKLING_FUZZ_SEED` (default 1):
//! `cargo test --test suite parser_fuzz_long -- --ignored`.
use super::request_errors::Parser;
use crate::ops_util::Rng;
use serde_json::{json, Value};

/// Mutations per endpoint in the suite.
const ITERATIONS: usize = 1500;

fn chat_bodies() -> Vec<Value> {
    vec![
        json!({"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}),
        json!({
            "model": "tiny", "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "again"}],
            "temperature": 0.5, "top_p": 0.9, "top_k": 5, "seed": 7, "stop": ["x", "y"],
            "stream": true, "stream_options": {"include_usage": true}, "n": 1,
            "reasoning_effort": "low", "return_token_ids": true, "max_completion_tokens": 3,
        }),
        json!({"messages": [
            {"role": "user", "content": "call"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "function": {"name": "f", "arguments": "{\"a\": [1, 2]}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "3"}],
            "reasoning_effort": 0.3, "tools": []}),
    ]
}

fn completion_bodies() -> Vec<Value> {
    vec![
        json!({"prompt": "once upon a time", "max_tokens": 5, "temperature": 0}),
        json!({"prompt": [50, 51, 57], "stop": "q", "seed": 3, "stream": false}),
        json!({"prompt": ["one"], "top_k": 2, "top_p": 0.5, "model": "tiny"}),
        json!({"prompt": [[1, 2, 3]], "max_tokens": 1, "return_token_ids": true}),
    ]
}

/// Replacements for a value, as JSON text: other types, numbers out of every range, a lone
/// surrogate, deep nesting.
fn hostile_value(rng: &mut Rng) -> String {
    match rng.pick(16) {
        0 => "\"12\"".into(),
        1 => "18446744073709551616".into(),
        2 => "-1".into(),
        3 => "1e400".into(),
        4 => "-1e400".into(),
        5 => "1.5".into(),
        6 => "null".into(),
        7 => "true".into(),
        8 => "[]".into(),
        9 => "{}".into(),
        10 => "\"\\ud800\"".into(),
        11 => "\"\\udc00x\\ud800\\u0041\"".into(),
        12 => {
            let d = 1 + rng.pick(3000);
            format!("{}{}", "[".repeat(d), "]".repeat(d))
        }
        13 => {
            let d = 1 + rng.pick(300);
            format!("{}1{}", "{\"a\":".repeat(d), "}".repeat(d))
        }
        14 => "340282366920938463463374607431768211456".into(),
        _ => format!("\"{}\"", "<|content_text|>".repeat(1 + rng.pick(4))),
    }
}

/// A random value inside `v` (itself included), as a mutable reference.
fn pick<'a>(v: &'a mut Value, rng: &mut Rng) -> &'a mut Value {
    if rng.pick(3) == 0 {
        return v;
    }
    let n = match v {
        Value::Object(m) => m.len(),
        Value::Array(a) => a.len(),
        _ => 0,
    };
    if n == 0 {
        return v;
    }
    let i = rng.pick(n);
    match v {
        Value::Object(m) => {
            let k = m.keys().nth(i).unwrap().clone();
            pick(m.get_mut(&k).unwrap(), rng)
        }
        Value::Array(a) => pick(&mut a[i], rng),
        _ => unreachable!(),
    }
}

/// One mutation of `base`, as body bytes.
fn mutate(base: &Value, rng: &mut Rng) -> Vec<u8> {
    const HOLE: &str = "\"@@HOLE@@\"";
    let mut v = base.clone();
    let mut bytes = match rng.pick(7) {
        // swap a value for a hostile one (1 to 3 times)
        0 | 1 => {
            let mut holes = Vec::new();
            for _ in 0..1 + rng.pick(3) {
                *pick(&mut v, rng) = json!("@@HOLE@@");
                holes.push(hostile_value(rng));
            }
            let mut s = v.to_string();
            for h in holes {
                s = s.replacen(HOLE, &h, 1);
            }
            s.into_bytes()
        }
        // drop a key
        2 => {
            if let Value::Object(m) = pick(&mut v, rng) {
                if let Some(k) = m.keys().next().cloned() {
                    m.remove(&k);
                }
            }
            v.to_string().into_bytes()
        }
        // duplicate a key (textually: serde_json's maps cannot hold two)
        3 => {
            let s = v.to_string();
            match s.find("\":") {
                Some(i) => {
                    let start = s[..i].rfind('"').unwrap_or(0);
                    let key = &s[start..i + 2];
                    format!("{{{key}1,{}", &s[1..]).into_bytes()
                }
                None => s.into_bytes(),
            }
        }
        _ => v.to_string().into_bytes(),
    };
    // byte-level damage on top, sometimes
    match rng.pick(6) {
        0 if !bytes.is_empty() => {
            let n = rng.pick(bytes.len());
            bytes.truncate(n);
        }
        1 if !bytes.is_empty() => {
            for _ in 0..1 + rng.pick(4) {
                let i = rng.pick(bytes.len());
                bytes[i] = rng.next_u64() as u8;
            }
        }
        2 => {
            let i = rng.pick(bytes.len() + 1);
            let junk: &[u8] = match rng.pick(5) {
                0 => b"\xff\xfe",
                1 => b"\\",
                2 => b"\"",
                3 => b",,",
                _ => b"\xe2\x82",
            };
            bytes.splice(i..i, junk.iter().copied());
        }
        _ => {}
    }
    bytes
}

/// `iterations` mutations per endpoint from `seed`: panics name the body that broke the parser.
fn fuzz(seed: u64, iterations: usize) {
    let p = Parser::new();
    let mut rng = Rng(seed);
    let (chat, completion) = (chat_bodies(), completion_bodies());
    let (mut accepted, mut refused) = (0usize, 0usize);
    for _ in 0..iterations {
        for is_chat in [true, false] {
            let bases = if is_chat { &chat } else { &completion };
            let body = mutate(&bases[rng.pick(bases.len())], &mut rng);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if is_chat {
                    p.chat(&body)
                } else {
                    p.completion(&body)
                }
            }));
            let shown: String = String::from_utf8_lossy(&body).chars().take(600).collect();
            match r {
                Err(_) => panic!("the parser panicked (seed {seed}) on {shown}"),
                Ok(Ok(_)) => accepted += 1,
                Ok(Err(e)) => {
                    refused += 1;
                    let env = e.body();
                    let msg = env["error"]["message"].as_str().unwrap_or_default();
                    assert!(!msg.trim().is_empty(), "no message for {shown}: {env}");
                    assert!(
                        env["error"]["type"].is_string(),
                        "no type for {shown}: {env}"
                    );
                    assert!((400..500).contains(&e.status), "{shown}: {env}");
                    if let Some(param) = env["error"]["param"].as_str() {
                        // `?` stands for a segment serde_path_to_error could not name, unless a
                        // key of the body holds it
                        let named = param.split('.').all(|seg| {
                            let key = seg.split('[').next().unwrap_or_default();
                            !key.contains('?') || shown.contains(&format!("\"{key}\""))
                        });
                        assert!(!param.is_empty() && named, "{shown}: {env}");
                    }
                }
            }
        }
    }
    // the mutations are neither all harmless nor all fatal
    assert!(
        accepted > 0 && refused > 0,
        "{accepted} accepted, {refused} refused"
    );
}

#[test]
fn parser_fuzz() {
    fuzz(0x5EED, ITERATIONS);
}

#[test]
#[ignore = "long: cargo test --test suite parser_fuzz_long -- --ignored"]
fn parser_fuzz_long() {
    let env = |k: &str, d: u64| std::env::var(k).map_or(d, |v| v.parse().expect(k));
    fuzz(
        env("INKLING_FUZZ_SEED", 1),
        env("INKLING_FUZZ_ITERATIONS", 200_000) as usize,
    );
}
