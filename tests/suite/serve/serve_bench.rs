//! `benches/serve_bench.py` (standard library only) against `serve` of the chat fixture on the
//! CPU: small settings, every JSON field checked for each concurrency level.
use super::server::Server;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

#[test]
fn serve_bench_reports_throughput_and_ttft_per_concurrency() {
    let server = Server::start(&[]);
    let out = Command::new(super::test_python::python())
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/serve_bench.py"))
        .args(["--url", &format!("http://{}", server.addr)])
        .args([
            "--model",
            "tiny-chat-f32",
            "--tokens",
            "6",
            "--concurrency",
            "1,2,4",
        ])
        .args(["--endpoint", "completions", "--prompt", "Once upon a time"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["model"], "tiny-chat-f32");
    assert_eq!(v["tokens"], 6);
    let levels = v["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 3);
    for (lv, n) in levels.iter().zip([1u64, 2, 4]) {
        let f = |k: &str, s: &str| lv[k][s].as_f64().unwrap_or_else(|| panic!("{k}.{s}: {lv}"));
        assert_eq!(lv["concurrency"], n, "{lv}");
        assert_eq!(lv["requests"], n, "{lv}");
        assert_eq!(lv["errors"], 0, "{lv}");
        let toks = lv["completion_tokens"].as_u64().unwrap();
        assert!(toks >= n && toks <= 6 * n, "{lv}");
        assert!(lv["wall_s"].as_f64().unwrap() > 0.0, "{lv}");
        assert!(lv["aggregate_tok_s"].as_f64().unwrap() > 0.0, "{lv}");
        assert!(
            f("per_request_tok_s", "median") >= f("per_request_tok_s", "min"),
            "{lv}"
        );
        assert!(f("per_request_tok_s", "min") > 0.0, "{lv}");
        assert!(f("ttft_s", "max") >= f("ttft_s", "median"), "{lv}");
        assert!(f("ttft_s", "median") > 0.0, "{lv}");
        assert!(lv["decode_tok_s"].get("median").is_some(), "{lv}");
    }
}

/// A URL without `http://` is refused before any request (exit 2, naming `--url`), and a server
/// that is not there counts as errors with a non-zero exit, never as a clean run.
#[test]
fn serve_bench_refuses_a_bad_url_and_counts_a_missing_server_as_errors() {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/serve_bench.py");
    let run = |url: &str| {
        Command::new(super::test_python::python())
            .arg(&script)
            .args([
                "--url",
                url,
                "--model",
                "m",
                "--tokens",
                "2",
                "--concurrency",
                "1",
            ])
            .output()
            .unwrap()
    };
    let out = run("127.0.0.1:9");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--url"));
    // port 9 (discard) on loopback: nothing listens there in the test machines
    let out = run("http://127.0.0.1:9");
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["levels"][0]["errors"], 1, "{v}");
    assert_eq!(v["levels"][0]["requests"], 1, "{v}");
}
