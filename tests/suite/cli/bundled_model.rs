//! The default model comes from the binary itself: a copy of the binary outside the checkout,
//! with its own cache directory, generates the same tokens as the checkout's fixture; an
//! unwritable cache says what to pass instead.
use crate::model_common::scratch_outside;
use std::process::Command;

fn json_ids(o: &std::process::Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["generated_ids"].clone()
}

#[test]
fn default_model_runs_from_the_binary_alone() {
    let root = scratch_outside("bundled");
    let exe = root.join("inkling-wgpu");
    std::fs::copy(env!("CARGO_BIN_EXE_inkling-wgpu"), &exe).unwrap();
    let cache = root.join("cache");
    let args = [
        "generate",
        "--prompt-ids",
        "5,6,7",
        "--device",
        "cpu",
        "--json",
        "--max-tokens",
        "4",
        // greedy: the bundled model's generation_config.json samples
        "--temperature",
        "0",
    ];
    let run = || {
        Command::new(&exe)
            .args(args)
            .current_dir(&root)
            .env("XDG_CACHE_HOME", &cache)
            .env("HOME", &root)
            .output()
            .unwrap()
    };
    let first = json_ids(&run());
    let want = json_ids(
        &Command::new(&exe)
            .args(args)
            .arg("--model")
            .arg(inkling_wgpu::bundled_model_dir())
            .output()
            .unwrap(),
    );
    assert_eq!(first, want);
    // written once to the cache, keyed by the embedded bytes' hash
    let dirs: Vec<_> = std::fs::read_dir(cache.join("inkling-wgpu"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert_eq!(
        dirs[0].file_name().unwrap().to_string_lossy(),
        format!("bundled-{}", inkling_wgpu::bundled::content_hash())
    );
    for (name, bytes) in inkling_wgpu::bundled::FILES {
        assert_eq!(&std::fs::read(dirs[0].join(name)).unwrap()[..], *bytes);
    }
    // a damaged cache is rewritten
    std::fs::write(dirs[0].join("config.json"), b"{}").unwrap();
    assert_eq!(json_ids(&run()), want);
    // again: the same directory, nothing else
    assert_eq!(
        std::fs::read_dir(cache.join("inkling-wgpu"))
            .unwrap()
            .count(),
        1
    );

    // nowhere to write it: an error that says what to pass
    let blocker = root.join("not-a-dir");
    std::fs::write(&blocker, b"").unwrap();
    let o = Command::new(&exe)
        .args(args)
        .env("XDG_CACHE_HOME", &blocker)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("the bundled model could not be written to") && e.contains("pass --model DIR"),
        "{e}"
    );
    std::fs::remove_dir_all(&root).ok();
}

/// `chat` and `serve` without `--model` from a copy of the binary in an empty directory, with its
/// own cache and home (the checkout is never named): `chat` answers a piped message and prints its
/// stats line, `serve` loads the bundled model and lists it as `austen-demo`. The binary holds no
/// path into the checkout's fixtures (it embeds their bytes, never their location).
#[test]
fn chat_and_serve_run_the_bundled_model_from_the_binary_alone() {
    use std::io::{BufRead, BufReader, Read, Write};
    let root = scratch_outside("bundled-chat");
    let exe = root.join("inkling-wgpu");
    std::fs::copy(env!("CARGO_BIN_EXE_inkling-wgpu"), &exe).unwrap();
    let bytes = std::fs::read(&exe).unwrap();
    let fixtures = format!("{}/tests/fixtures", env!("CARGO_MANIFEST_DIR"));
    assert!(
        !bytes
            .windows(fixtures.len())
            .any(|w| w == fixtures.as_bytes()),
        "the binary names {fixtures}"
    );
    let cmd = |args: &[&str]| {
        let mut c = Command::new(&exe);
        c.args(args)
            .current_dir(&root)
            .env("XDG_CACHE_HOME", root.join("cache"))
            .env("HOME", &root)
            .env_remove("CARGO_MANIFEST_DIR");
        c
    };
    let mut chat = cmd(&[
        "chat",
        "--device",
        "cpu",
        "--max-tokens",
        "12",
        "--seed",
        "1",
    ])
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    chat.stdin.take().unwrap().write_all(b"Hello\n").unwrap();
    let out = chat.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("[prompt ") && stderr.contains(" tok "),
        "no stats line: {stderr}"
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).trim().is_empty(),
        "{stderr}"
    );

    let mut serve = cmd(&["serve", "--device", "cpu", "--port", "0"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(serve.stderr.take().unwrap()).lines();
    let mut addr = None;
    let mut log = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        log.push(line.clone());
        if let Some(rest) = line.split("listening on http://").nth(1) {
            addr = rest.split_whitespace().next().map(str::to_string);
        }
        if line.contains("model loaded") || line.starts_with("error") {
            break;
        }
    }
    let addr = addr.unwrap_or_else(|| panic!("{log:#?}"));
    assert!(log.last().unwrap().contains("model loaded"), "{log:#?}");
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    write!(s, "GET /v1/models HTTP/1.0\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let _ = serve.kill();
    let _ = serve.wait();
    assert!(resp.contains("\"austen-demo\""), "{resp}");
    std::fs::remove_dir_all(&root).ok();
}
