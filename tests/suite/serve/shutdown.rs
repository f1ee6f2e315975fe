//! `serve` shuts down gracefully on SIGINT and SIGTERM: a running streamed request ends with an
//! SSE error event (OpenAI envelope, `shutting_down`) and `data: [DONE]`, a queued non-streamed
//! one with 503 and the envelope, then one line on stderr and exit status 0.
use super::server::{next_data, post_json, request, status, Server};
use serde_json::{json, Value};
use std::time::Duration;

/// Bound on the exit after the signal (it takes milliseconds; past this the test fails).
const EXIT_LIMIT: Duration = Duration::from_secs(30);

/// Greedy on the chat fixture, this prompt runs to the length limit (no EOS in 4000 tokens), which
/// takes the CPU device seconds: the generation is still running when the signal comes.
fn long_completion(stream: bool) -> Value {
    json!({"prompt": [100], "max_tokens": 4000, "temperature": 0, "stream": stream})
}

fn is_shutdown_error(v: &Value) -> bool {
    v["error"]["code"] == "shutting_down"
        && v["error"]["type"] == "server_error"
        && v["error"]["message"] == "the server is shutting down"
}

#[test]
fn sigint_ends_the_running_stream_and_the_queued_request_then_exits_0() {
    let mut server = Server::start(&["--parallel", "1"]);
    let addr = server.addr.clone();
    let mut a = request(
        &addr,
        "POST",
        "/v1/completions",
        Some(&long_completion(true)),
    );
    assert_eq!(status(&mut a), 200);
    let first = next_data(&mut a).expect("a first chunk");
    let first: Value = serde_json::from_str(&first).unwrap();
    assert_eq!(first["object"], "text_completion", "{first}");
    // B waits in the queue behind A; /health counts it once its handler has queued it
    let b =
        std::thread::spawn(move || post_json(&addr, "/v1/completions", &long_completion(false)));
    while server.health()["counts"]["requests"] != 2 {
        std::thread::sleep(Duration::from_millis(10));
    }
    server.signal(libc::SIGINT);

    let mut rest = Vec::new();
    while let Some(d) = next_data(&mut a) {
        rest.push(d);
    }
    let n = rest.len();
    assert!(n >= 2, "the stream's end: {rest:?}");
    assert_eq!(rest[n - 1], "[DONE]", "{:?}", &rest[n.saturating_sub(3)..]);
    let err: Value = serde_json::from_str(&rest[n - 2]).unwrap();
    assert!(is_shutdown_error(&err), "before [DONE]: {err}");
    assert!(
        !rest
            .iter()
            .any(|d| d.contains("\"finish_reason\":\"length\"")),
        "the stream ran to its length limit before the signal"
    );
    let (code, body) = b.join().unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(is_shutdown_error(&body), "{body}");

    let (st, log) = server.wait_exit(EXIT_LIMIT);
    assert_eq!(st.code(), Some(0), "{st}: {log:#?}");
    assert!(
        log.iter()
            .any(|l| l == "inkling-wgpu serve: shut down (SIGINT); 2 requests ended early"),
        "{log:#?}"
    );
}

#[test]
fn sigterm_with_no_request_in_flight_exits_0() {
    let mut server = Server::start(&["--parallel", "1"]);
    server.signal(libc::SIGTERM);
    let (st, log) = server.wait_exit(EXIT_LIMIT);
    assert_eq!(st.code(), Some(0), "{st}: {log:#?}");
    assert_eq!(
        log.last().map(String::as_str),
        Some("inkling-wgpu serve: shut down (SIGTERM); 0 requests ended early"),
        "{log:#?}"
    );
}
