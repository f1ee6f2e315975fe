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
