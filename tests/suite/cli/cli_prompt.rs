//! `generate`'s CLI conventions: where the prompt comes from (`--prompt -`, `--prompt-file`, piped
//! stdin), sampling flags at temperature 0 (a warning), and `--max-tokens` capped at the model's
//! context on GPU and CPU.
use crate::model_common::{copy_fixture, fixture, scratch};
use std::io::Write;
use std::process::{Command, Output, Stdio};

fn generate(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"));
    c.arg("generate")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = c.spawn().unwrap();
    if let Some(bytes) = stdin {
        child.stdin.take().unwrap().write_all(bytes).unwrap();
    }
    child.wait_with_output().unwrap()
}

fn json(o: &Output) -> serde_json::Value {
    assert!(
        o.status.success(),
        "{:?}: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const TEXT: &str = "Once upon a time";

fn base(model: &str) -> Vec<&str> {
    vec![
        "--model",
        model,
        "--device",
        "cpu",
        "--json",
        "--max-tokens",
        "3",
    ]
}

#[test]
fn prompt_from_flag_stdin_file_and_pipe_is_the_same_prompt() {
    let m = fixture("tiny-causal-f32");
    let m = m.to_str().unwrap();
    let mut a = base(m);
    a.extend(["--prompt", TEXT]);
    let want = json(&generate(&a, None))["prompt_ids"].clone();
    assert!(want.as_array().unwrap().len() > 1);

    let mut a = base(m);
    a.extend(["--prompt", "-"]);
    assert_eq!(
        json(&generate(&a, Some(TEXT.as_bytes())))["prompt_ids"],
        want
    );

    let f = scratch("prompt-file").join("prompt.txt");
    std::fs::write(&f, TEXT).unwrap();
    let mut a = base(m);
    a.extend(["--prompt-file", f.to_str().unwrap()]);
    assert_eq!(json(&generate(&a, None))["prompt_ids"], want);

    // no prompt flag, stdin a pipe: the pipe is the prompt
    assert_eq!(
        json(&generate(&base(m), Some(TEXT.as_bytes())))["prompt_ids"],
        want
    );
}

#[test]
fn prompt_sources_are_utf8_checked_and_named() {
    let m = fixture("tiny-causal-f32");
    let m = m.to_str().unwrap();
    let bad = b"Once \xff upon";
    let f = scratch("prompt-bad").join("bad.txt");
    std::fs::write(&f, bad).unwrap();
    let mut a = base(m);
    a.extend(["--prompt-file", f.to_str().unwrap()]);
    let e = stderr(&generate(&a, None));
    assert!(
        e.contains(&format!("--prompt-file {}", f.display()))
            && e.contains("is not UTF-8 text (invalid byte at offset 5)"),
        "{e}"
    );

    let mut a = base(m);
    a.extend(["--prompt", "-"]);
    let e = stderr(&generate(&a, Some(bad)));
    assert!(
        e.contains("the prompt on standard input is not UTF-8 text"),
        "{e}"
    );

    let mut a = base(m);
    a.extend(["--prompt-file", "/nonexistent/prompt.txt"]);
    let e = stderr(&generate(&a, None));
    assert!(e.contains("--prompt-file /nonexistent/prompt.txt"), "{e}");

    // nothing at all (stdin empty): says every way to give one
    let o = generate(&base(m), None);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("no prompt: give --prompt TEXT, --prompt - (standard input), --prompt-file PATH or --prompt-ids"),
        "{e}"
    );
}

#[test]
fn sampling_flags_at_temperature_zero_warn_and_change_nothing() {
    let m = fixture("tiny-causal-f32");
    let m = m.to_str().unwrap();
    let mut a = base(m);
    a.extend(["--prompt-ids", "5,6,7"]);
    let plain = json(&generate(&a, None));

    let mut b = a.clone();
    b.extend(["--top-k", "40", "--seed", "7"]);
    let o = generate(&b, None);
    let e = stderr(&o);
    assert!(
        e.contains("warning: --top-k and --seed have no effect: the temperature is 0, so decoding is greedy (generation_config.json does not set do_sample); add --temperature T (e.g. 0.8) to sample"),
        "{e}"
    );
    assert_eq!(json(&o)["generated_ids"], plain["generated_ids"]);

    let mut b = a.clone();
    b.extend(["--temperature", "0", "--top-p", "0.5", "--min-p", "0.1"]);
    let e = stderr(&generate(&b, None));
    assert!(
        e.contains(
            "warning: --top-p and --min-p have no effect: the temperature is 0, so decoding is greedy; add"
        ),
        "{e}"
    );

    // sampling on: no warning
    let mut b = a.clone();
    b.extend(["--temperature", "0.8", "--top-k", "40", "--seed", "7"]);
    let o = generate(&b, None);
    assert!(o.status.success());
    assert!(!stderr(&o).contains("warning:"), "{}", stderr(&o));
}

#[test]
fn max_tokens_is_capped_at_the_context_on_gpu_and_cpu() {
    // the tiny model with a context of 12 positions
    let dir = copy_fixture("tiny-causal-f32", "short-context");
    let cfg_path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["max_position_embeddings"] = 12.into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let d = dir.to_str().unwrap();
    let mut outs = Vec::new();
    for dev in ["gpu", "cpu"] {
        let o = generate(
            &[
                "--model",
                d,
                "--device",
                dev,
                "--json",
                "--prompt-ids",
                "5,6,7",
                "--max-tokens",
                "1000000",
                "--temperature",
                "0",
            ],
            None,
        );
        let e = stderr(&o);
        assert!(
            e.contains("warning: generating at most 9 tokens, not 1000000: the prompt's 3 tokens and the model's context of 12 positions (max_position_embeddings) leave no more"),
            "{dev}: {e}"
        );
        let v = json(&o);
        let ids = v["generated_ids"].as_array().unwrap().clone();
        assert!(ids.len() <= 9, "{dev}: {ids:?}");
        if v["finish_reason"] == "length" {
            assert_eq!(ids.len(), 9, "{dev}");
        }
        outs.push(ids);
    }
    assert_eq!(outs[0], outs[1], "GPU and CPU choose the same tokens");

    // a prompt that fills the context is refused
    let ids: Vec<String> = (1..=12).map(|i| i.to_string()).collect();
    let o = generate(
        &[
            "--model",
            d,
            "--device",
            "cpu",
            "--prompt-ids",
            &ids.join(","),
        ],
        None,
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("the prompt has 12 tokens and the model's context (max_position_embeddings) is 12 positions"),
        "{}",
        stderr(&o)
    );
}

/// A prompt file or pipe that cannot fit the model's context is refused once it passes the
/// bound (context × the tokenizer's longest token), not read to the end: `/dev/zero` ends.
#[test]
fn an_endless_prompt_file_is_refused_not_read_forever() {
    let o = generate(
        &[
            "--device",
            "cpu",
            "--prompt-file",
            "/dev/zero",
            "--max-tokens",
            "1",
        ],
        None,
    );
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("--prompt-file /dev/zero holds more than") && e.contains("bytes"),
        "{e}"
    );
}
