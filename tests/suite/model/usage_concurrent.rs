//! Two saves of one model's usage at once: the usage file ends up with both runs' counts (each run
//! adds what it routed to what is on disk when it saves, under a lock). One streamed `generate` run
//! gives the counts of a run; two threads then save what two such runs, started from the same table
//! on disk, would save, each holding the lock for a while.
use crate::model_common::{copy_fixture, scratch};
use inkling_wgpu::model::usage::{fingerprint, Usage};
use std::process::{Command, Stdio};
use std::time::Duration;

fn streamed_run(model: &str, usage: &str) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
        .args(["generate", "--model", model, "--prompt-ids", "5,6,7,8"])
        .args(["--max-tokens", "6", "--temperature", "0", "--json"])
        .args(["--expert-slots", "4", "--usage-file", usage])
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
    wait_ok(streamed_run(d, u));
    let one = Usage::load(&usage, &fp, l, e).unwrap().unwrap();
    let routed: u64 = one.counts.iter().flatten().sum();
    assert!(routed > 0);

    // two at once, both started from the table on disk, each holding the lock for a while as it
    // saves: 1 + 2 runs' counts
    let started = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let base = Usage::load(&usage, &fp, l, e).unwrap().unwrap();
                let mut mine = base.clone();
                mine.merge(&one);
                started.wait();
                mine.save_merged_holding(&usage, &base, Duration::from_millis(1500))
                    .unwrap();
            });
        }
    });
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
