//! `inkling-wgpu perplexity` against transformers' perplexity (tools/perplexity_reference.py) on the
//! same model, text and windows, on the CPU and GPU; `--kl-base`; bad input.
use crate::model_common::*;
use inkling_wgpu::container::{convert, ConvertOptions};
use inkling_wgpu::formats::{Encoding, ScaleRule};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const TEXT: &str = "perplexity-text.txt";

fn text() -> PathBuf {
    fixture(TEXT)
}

/// The text a fixture's perplexity.json was computed on (`text_file`, relative to the fixture).
fn text_of(name: &str) -> PathBuf {
    let p = fixture(name).join("perplexity.json");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    fixture(name).join(v["text_file"].as_str().unwrap())
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
        .arg("perplexity")
        .args(args)
        .output()
        .unwrap()
}

fn json(args: &[&str]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.push("--json");
    let out = run(&a);
    assert!(
        out.status.success(),
        "{args:?}: exit {:?}, stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn failure(args: &[&str]) -> String {
    let out = run(args);
    assert!(!out.status.success(), "{args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs()
}

/// The reference cases of `tests/fixtures/<name>/perplexity.json`.
fn cases(name: &str) -> Vec<serde_json::Value> {
    let p = fixture(name).join("perplexity.json");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    v["cases"].as_array().unwrap().clone()
}

fn case_args(dir: &Path, text: &Path, c: &serde_json::Value, device: &str) -> Vec<String> {
    let mut a: Vec<String> = [
        "--model",
        dir.to_str().unwrap(),
        "--file",
        text.to_str().unwrap(),
        "--ctx",
        &c["ctx"].to_string(),
        "--stride",
        &c["stride"].to_string(),
        "--device",
        device,
    ]
    .map(String::from)
    .to_vec();
    if !c["bos"].as_bool().unwrap() {
        a.push("--no-bos".into());
    }
    if let Some(n) = c["max_tokens"].as_u64() {
        a.extend(["--max-tokens".to_string(), n.to_string()]);
    }
    a
}

fn check_case(v: &serde_json::Value, c: &serde_json::Value) {
    for k in ["tokens_scored", "windows", "bytes", "ctx", "stride", "bos"] {
        assert_eq!(v[k], c[k], "{k}: {v} vs {c}");
    }
    for k in ["perplexity", "bits_per_byte"] {
        let (ours, theirs) = (v[k].as_f64().unwrap(), c[k].as_f64().unwrap());
        assert!(
            rel(ours, theirs) <= 1e-4,
            "{k}: ours {ours}, transformers {theirs} (ctx {}, stride {})",
            c["ctx"],
            c["stride"]
        );
    }
}

#[test]
fn perplexity_matches_transformers_on_cpu() {
    let name = "tiny-causal-f32";
    for c in cases(name) {
        let a = case_args(&fixture(name), &text_of(name), &c, "cpu");
        let v = json(&a.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(v["backend"], "cpu");
        check_case(&v, &c);
    }
}

/// The bundled demo model (an int4-g64 container; transformers runs its decoded values) on the
/// first 400 tokens of its held-out text, windows of 128 (past the sliding window of 64 and τ's
/// floor) every 48 tokens.
#[test]
fn demo_model_perplexity_matches_transformers_on_cpu() {
    let name = "austen-demo";
    let c = &cases(name)[0];
    let a = case_args(&fixture(name), &text_of(name), c, "cpu");
    let v = json(&a.iter().map(String::as_str).collect::<Vec<_>>());
    check_case(&v, c);
    let ppl = v["perplexity"].as_f64().unwrap();
    assert!(ppl > 10.0 && ppl < 100.0, "a trained model: {ppl}");
}

#[test]
fn perplexity_matches_transformers_on_gpu() {
    let name = "tiny-causal-f32";
    let c = &cases(name)[0];
    let a = case_args(&fixture(name), &text_of(name), c, "gpu");
    let v = json(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(v["backend"], "gpu");
    check_case(&v, c);
}

#[test]
fn kl_base_against_itself_and_a_quantised_container() {
    let name = "tiny-causal-f32";
    let c = &cases(name)[0];
    let f32_dir = fixture(name);
    let base = f32_dir.to_str().unwrap();
    let mut a = case_args(&f32_dir, &text_of(name), c, "cpu");
    a.extend(["--kl-base".to_string(), base.to_string()]);
    let v = json(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let kb = &v["kl_base"];
    assert!(kb["mean_kl"].as_f64().unwrap().abs() < 1e-9, "{kb}");
    assert_eq!(kb["top1_agreement"].as_f64(), Some(1.0));
    assert_eq!(kb["base_perplexity"], v["perplexity"]);

    let dst = scratch("ppl-int3");
    let opts = ConvertOptions {
        experts: Some(Encoding::parse("int3-g64").unwrap()),
        shared: None,
        dense: None,
        scales: ScaleRule::Mse,
        ..Default::default()
    };
    convert(&f32_dir, &dst, &opts).unwrap();
    let mut a = case_args(&dst, &text_of(name), c, "cpu");
    a.extend(["--kl-base".to_string(), base.to_string()]);
    let v = json(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let kb = &v["kl_base"];
    // the base's figures are the f32 model's, so they match transformers
    let bp = kb["base_perplexity"].as_f64().unwrap();
    assert!(rel(bp, c["perplexity"].as_f64().unwrap()) <= 1e-4, "{kb}");
    let kl = kb["mean_kl"].as_f64().unwrap();
    let top1 = kb["top1_agreement"].as_f64().unwrap();
    assert!(kl > 1e-3 && kl.is_finite(), "{kb}");
    assert!(top1 > 0.0 && top1 < 1.0, "{kb}");
    assert_ne!(v["perplexity"], c["perplexity"]);
    std::fs::remove_dir_all(&dst).unwrap();
}

#[test]
fn bad_input_names_the_file_or_the_option() {
    let dir = fixture("tiny-causal-f32");
    let m = dir.to_str().unwrap();
    let on_cpu = |file: &Path| {
        failure(&[
            "--model",
            m,
            "--file",
            file.to_str().unwrap(),
            "--device",
            "cpu",
        ])
    };
    let e = on_cpu(Path::new("/nonexistent/x.txt"));
    assert!(e.contains("/nonexistent/x.txt"), "{e}");

    let tmp = scratch("ppl-bad");
    let bin = tmp.join("latin1.txt");
    std::fs::write(&bin, b"caf\xe9").unwrap();
    let e = on_cpu(&bin);
    assert!(e.contains("latin1.txt") && e.contains("not UTF-8"), "{e}");

    let empty = tmp.join("empty.txt");
    std::fs::write(&empty, b"").unwrap();
    let e = on_cpu(&empty);
    assert!(
        e.ends_with("empty.txt: the text gives 0 token(s); perplexity scores each one after the prepended BOS, so it needs at least 1\n"),
        "{e}"
    );
    let one = tmp.join("one.txt");
    std::fs::write(&one, b"a").unwrap();
    let e = failure(&[
        "--model",
        m,
        "--file",
        one.to_str().unwrap(),
        "--device",
        "cpu",
        "--no-bos",
    ]);
    assert!(
        e.ends_with("one.txt: the text gives 1 token(s); with --no-bos the first token is not scored, so perplexity needs at least 2\n"),
        "{e}"
    );

    let t = text();
    let t = t.to_str().unwrap();
    let e = failure(&[
        "--model", m, "--file", t, "--ctx", "8", "--stride", "9", "--device", "cpu",
    ]);
    assert!(e.contains("stride"), "{e}");
    let e = failure(&["--model", m, "--file", t, "--ctx", "1", "--device", "cpu"]);
    assert!(e.contains("context"), "{e}");
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// One scored token has no standard error: `n/a` in the text and null in the JSON, not ± 0.
#[test]
fn one_scored_token_has_no_standard_error() {
    let t = text();
    let t = t.to_str().unwrap();
    let args = [
        "--device",
        "cpu",
        "--file",
        t,
        "--max-tokens",
        "2",
        "--no-bos",
    ];
    let v = json(&args);
    assert_eq!(v["tokens_scored"], 1, "{v}");
    assert!(v["perplexity"].as_f64().unwrap() > 1.0, "{v}");
    assert!(
        v["perplexity_stderr"].is_null() && v["nll_stderr"].is_null(),
        "{v}"
    );
    let out = run(&args);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains(" ± n/a (one token) | "), "{s}");
    let v = json(&[
        "--device",
        "cpu",
        "--file",
        t,
        "--max-tokens",
        "3",
        "--no-bos",
    ]);
    assert!(v["perplexity_stderr"].as_f64().unwrap() > 0.0, "{v}");
}
