//! `serve`'s chat page (`/`) in a real browser: headless Chromium driven by Selenium
//! (tests/python/chat_page.py) against `serve --device cpu` of the chat fixture on loopback. The
//! page loads with no external resource, shows the model id, streams an answer to a message sent
//! with a system prompt, effort `none`, temperature 0 and 60 max tokens, and writes its stats line; the answer
//! equals the server's own non-streamed answer to the same request. The screenshot goes to
//! `target/screenshots/chat-page.png` (CI keeps it as an artifact).
//!
//! Needs Chromium and its driver (Debian's `chromium` and `chromium-driver`, or `CHROMIUM` and
//! `CHROMEDRIVER`) and the `selenium` package in the tests' Python (tests/python/requirements.txt,
//! `.ci/run` installs all of them); any of them missing fails the test, as the `openai` client
//! missing fails the serve test.
use super::server::{post_json, Server};
use std::path::PathBuf;
use std::process::Command;

#[test]
fn chat_page_streams_an_answer_in_headless_chromium() {
    let py = crate::serve::test_python::python();
    let probe = Command::new(&py)
        .args(["-c", "import selenium; print(selenium.__version__)"])
        .output();
    assert!(
        probe.as_ref().is_ok_and(|o| o.status.success()),
        "{} with the `selenium` package is needed (pip install -r tests/python/requirements.txt): \
         {probe:?}",
        py.display()
    );
    for (var, default) in [
        ("CHROMIUM", "/usr/bin/chromium"),
        ("CHROMEDRIVER", "/usr/bin/chromedriver"),
    ] {
        let p = std::env::var(var).unwrap_or_else(|_| default.into());
        assert!(
            std::path::Path::new(&p).exists(),
            "{p} is missing: install Debian's chromium and chromium-driver (.ci/run does), or set {var}"
        );
    }
    let server = Server::start(&[]);
    let page = server.request("GET", "/", b"");
    assert_eq!(page.0, 200, "{page:?}");
    assert!(page.1.contains("text/html"), "{}", page.1);
    assert!(
        !page.2.contains("http://") && !page.2.contains("https://"),
        "the page must not load anything from elsewhere"
    );
    let shot = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/screenshots/chat-page.png");
    let _ = std::fs::remove_file(&shot);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/chat_page.py");
    let out = Command::new(&py)
        .arg(&script)
        .arg(format!("http://{}", server.addr))
        .arg(&shot)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chat_page.py failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(v["model"], "tiny-chat-f32", "{v}");
    assert_eq!(v["user"], "Hello there", "{v}");
    assert_eq!(v["errors"], serde_json::json!([]), "{v}");
    assert_eq!(v["stop_disabled"], true, "{v}");
    assert_eq!(v["send_enabled"], true, "{v}");
    // the same request, not streamed
    let (status, want) = post_json(
        &server.addr,
        "/v1/chat/completions",
        &serde_json::json!({
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Hello there"}
            ],
            "reasoning_effort": "none",
            "temperature": 0,
            "max_tokens": 60,
        }),
    );
    assert_eq!(status, 200, "{want}");
    let content = want["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!content.trim().is_empty(), "{want}");
    // WebDriver's element text writes line breaks as "\n"
    let content = content.replace("\r\n", "\n").replace('\r', "\n");
    assert_eq!(
        v["answer"].as_str().unwrap().trim(),
        content.trim(),
        "{v} vs {want}"
    );
    let stats = v["stats"].as_str().unwrap();
    let n = want["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(
        stats.contains(&format!("| {n} tok"))
            && stats.contains(&format!("{} prompt tok", want["usage"]["prompt_tokens"])),
        "stats {stats:?} vs usage {}",
        want["usage"]
    );
    let finish = want["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(stats.ends_with(&format!("{finish}]")), "{stats}");
    let png = std::fs::read(&shot).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "the screenshot is a PNG");
}
