//! `info` without `--model` reports the bundled model, as every other command defaults to it; its
//! table has a header row and its counts are in the right number.
use std::process::Command;

fn info(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
        .arg("info")
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "info {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn info_defaults_to_the_bundled_model_with_a_header_row() {
    let bundled = inkling_wgpu::bundled_model_dir();
    let default = info(&[]);
    let explicit = info(&["--model", bundled.to_str().unwrap()]);
    let header: Vec<&str> = default.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["tensor", "format", "bytes", "shape"], "{default}");
    // the same tensors, formats and totals as the checkout's copy; only the directory differs
    let body = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| !l.contains(" shard"))
            .map(String::from)
            .collect()
    };
    assert_eq!(body(&default), body(&explicit));
    assert!(
        default.lines().count() > 10 && default.contains("int4-g64"),
        "{default}"
    );
    // counts in the right number: `1 shard`, and `1 tensors` nowhere
    assert!(default.contains(": 1 shard, "), "{default}");
    assert!(!default.contains(" 1 tensors"), "{default}");
    // --summary: the totals alone, no header
    let summary = info(&["--summary"]);
    assert!(!summary.starts_with("tensor "), "{summary}");
    assert!(summary.contains("total resident size"), "{summary}");
}
