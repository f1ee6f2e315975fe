//! Two streamed `generate` runs of one model at once: the usage file ends up with both runs'
//! counts (each run adds what it routed to what is on disk when it saves, under a lock).
use crate::model_common::{copy_fixture, scratch};
use inkling_wgpu::model::usage::{fingerprint, Usage};
use std::process::{Command, Stdio};

fn streamed_run(model: &str, usage: &str, hold_ms: &str) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
        .args(["generate", "--model", model, "--prompt-ids", "5,6,7,8"])
        .args(["--max-tokens", "6", "--temperature", "0", "--json"])
        .args(["--expert-slots", "4", "--usage-file", usage])
        .env("INKLING_USAGE_HOLD_MS", hold_ms)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn wait_ok(c: std::process::Child) {
    let o = c.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn two_concurrent_runs_both_count() {
    let dir = copy_fixture("tiny-causal-f32", "usage-two");
    let d = dir.to_str().unwrap();
    let cfg = inkling_wgpu::model::Checkpoint::open(&dir).unwrap().config;
    let (l, e) = (cfg.num_hidden_layers, cfg.n_routed_experts);
    let fp = fingerprint(&dir).unwrap();
    let usage = scratch("usage-two-file").join("u.json");
    let u = usage.to_str().unwrap();

    // one run alone: the counts of one run
    wait_ok(streamed_run(d, u, "0"));
    let one = Usage::load(&usage, &fp, l, e).unwrap().unwrap();
    let routed: u64 = one.counts.iter().flatten().sum();
    assert!(routed > 0);

    // two at once, each holding the lock for a while as it saves: 1 + 2 runs' counts
    let a = streamed_run(d, u, "1500");
    let b = streamed_run(d, u, "1500");
    wait_ok(a);
    wait_ok(b);
    let three = Usage::load(&usage, &fp, l, e).unwrap().unwrap();
    for (r3, r1) in three.counts.iter().zip(&one.counts) {
        for (c3, c1) in r3.iter().zip(r1) {
            assert_eq!(*c3, 3 * c1, "{:?} vs {:?}", three.counts, one.counts);
        }
    }
    let left: Vec<_> = std::fs::read_dir(usage.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!left.iter().any(|n| n.ends_with(".tmp")), "{left:?}");
}
