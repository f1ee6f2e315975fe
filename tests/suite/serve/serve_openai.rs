//! `inkling-wgpu serve` on 127.0.0.1 with an ephemeral port, exercised by the official `openai`
//! Python client (tests/python/openai_client.py): the same tokens as `generate`, chat and
//! completion streamed and not, usage, stop strings across chunks, multi-byte UTF-8, errors, the
//! bounded queue (429), cancellation of queued and running requests, SSE pings, state reuse.
//!
//! Needs python3 with `openai` (tests/python/requirements.txt): `.ci/run` installs it into
//! `.ci/.venv`, which this test uses when present; `INKLING_TEST_PYTHON` names another
//! interpreter. A missing interpreter or package fails the test.
use crate::chat_common::chat_model;
use crate::model_common::scratch;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_inkling-wgpu");
/// Prompts whose greedy continuations on the chat fixture hold multi-byte characters made of
/// several byte tokens ('Ԑ', '栆').
const PROMPTS: [[u32; 3]; 2] = [[50, 51, 57], [170, 171, 177]];
const MAX_TOKENS: usize = 24;
/// Bound on the Python script's run (it makes ~40 requests of at most 24 tokens, plus one
/// long stream that is cut off).
const LIMIT: Duration = Duration::from_secs(600);

/// Kills the server when the test ends, however it ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn generate_json(model: &str, prompt: &[u32]) -> serde_json::Value {
    let ids: Vec<String> = prompt.iter().map(u32::to_string).collect();
    let out = Command::new(BIN)
        .args(["generate", "--model", model, "--json", "--max-tokens"])
        .arg(MAX_TOKENS.to_string())
        .args(["--prompt-ids", &ids.join(",")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    serde_json::json!({
        "prompt_ids": v["prompt_ids"],
        "generated_ids": v["generated_ids"],
        "text": v["text"],
        "finish_reason": v["finish_reason"],
        "max_tokens": MAX_TOKENS,
    })
}

#[test]
fn serve_with_the_openai_client() {
    let py = crate::serve::test_python::python_with_openai();
    let model = chat_model();
    let model = model.to_str().unwrap();

    // what `generate` gives for the same prompt ids
    let expected: Vec<serde_json::Value> =
        PROMPTS.iter().map(|p| generate_json(model, p)).collect();
    assert!(
        expected.iter().any(|c| c["text"]
            .as_str()
            .unwrap()
            .chars()
            .any(|ch| !ch.is_ascii() && ch != '\u{FFFD}')),
        "no multi-byte character in the expected texts: {expected:?}"
    );
    let dir = scratch("serve");
    let exp_path = dir.join("expected.json");
    std::fs::write(&exp_path, serde_json::to_vec(&expected).unwrap()).unwrap();

    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--model",
            model,
            "--port",
            "0",
            "--parallel",
            "1",
            "--queue",
            "3",
            "--ping-ms",
            "20",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let server = Server(child);
    let mut lines = BufReader::new(stderr).lines();
    let first = lines.next().expect("a line from serve").unwrap();
    let addr = first
        .split("listening on ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_string();
    assert!(addr.starts_with("http://127.0.0.1:"), "{first}");
    assert!(first.contains("loopback only"), "{first}");
    // keep reading the server's stderr so it never blocks on a full pipe
    let log = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());

    let mut script = Command::new(&py)
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/openai_client.py"))
        .arg(&addr)
        .arg(&exp_path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = script.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > LIMIT {
            let _ = script.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = script.wait_with_output().unwrap();
    drop(server);
    let server_log = log.join().unwrap().join("\n");
    let report = format!(
        "--- script stdout\n{}\n--- script stderr\n{}\n--- server stderr\n{first}\n{server_log}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{report}");
    match status {
        Some(s) if s.success() => {}
        Some(s) => panic!("the openai client checks failed ({s}):\n{report}"),
        None => panic!("the openai client checks ran past {LIMIT:?}:\n{report}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}
