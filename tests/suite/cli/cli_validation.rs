//! Bad command-line values get a clear error and a non-zero exit (found by a fresh-user review).
use std::path::PathBuf;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn run_err(args: &[&str]) -> String {
    let out = bin().args(args).output().unwrap();
    assert!(!out.status.success(), "{args:?} should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A bad value on the command line exits 2 (clap's status for a command-line error) with one
/// `error:` line naming the flag; returns that stderr.
fn run_usage_err(args: &[&str]) -> String {
    let out = bin().args(args).output().unwrap();
    let e = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {e}");
    assert!(e.starts_with("error: "), "{args:?}: {e}");
    e
}

#[test]
fn sampling_values_out_of_range_are_refused() {
    let m = fixture("tiny-causal-f32");
    let m = m.to_str().unwrap();
    for cmd in ["generate", "chat"] {
        for t in ["-1", "nan", "inf"] {
            let e = run_usage_err(&[cmd, "--model", m, "--device", "cpu", "--temperature", t]);
            assert!(
                e.contains("--temperature") && e.contains("expected a finite number ≥ 0"),
                "{cmd} {t}: {e}"
            );
        }
        for p in ["0", "2", "-0.5", "nan"] {
            let e = run_usage_err(&[cmd, "--model", m, "--device", "cpu", "--top-p", p]);
            assert!(
                e.contains("--top-p") && e.contains("expected a number in (0, 1]"),
                "{cmd} {p}: {e}"
            );
        }
    }
}

/// Values the parser cannot judge alone exit 2 as well: an encoding name, a slot count of 0 (in
/// words, not as a range of 2^64), a context past the model's.
#[test]
fn bad_values_exit_2_and_say_what_is_expected() {
    let m = fixture("tiny-causal-f32");
    let m = m.to_str().unwrap();
    let tmp = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("inkling-cli-exit2-{}", std::process::id()));
    let out = tmp.join("out");
    let e = run_usage_err(&[
        "convert",
        "--model",
        m,
        "--out",
        out.to_str().unwrap(),
        "--experts",
        "int5",
    ]);
    assert!(e.contains("--experts int5"), "{e}");
    assert!(!out.exists(), "a refused convert creates nothing");
    let e = run_usage_err(&[
        "generate",
        "--model",
        m,
        "--prompt-ids",
        "5",
        "--expert-slots",
        "0",
    ]);
    assert!(e.contains("expected a whole number of at least 1"), "{e}");
    assert!(!e.contains("18446744073709551615"), "{e}");
    // the bundled model's context is 512 positions (max_position_embeddings)
    let demo = fixture("austen-demo");
    let demo = demo.to_str().unwrap();
    let text = tmp.join("text.txt");
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::write(&text, "It is a truth universally acknowledged.").unwrap();
    for args in [
        vec!["chat", "--model", demo, "--device", "cpu", "--ctx", "1000"],
        vec![
            "serve", "--model", demo, "--device", "cpu", "--ctx", "1000", "--port", "0",
        ],
        vec![
            "perplexity",
            "--model",
            demo,
            "--device",
            "cpu",
            "--ctx",
            "1000",
            "--file",
            text.to_str().unwrap(),
        ],
    ] {
        let e = run_usage_err(&args);
        assert!(
            e.contains("--ctx 1000 is more than the model's context of 512 positions")
                && e.contains("max_position_embeddings"),
            "{args:?}: {e}"
        );
    }
    // values judged after parsing: each names its flag and exits 2
    let out = out.to_str().unwrap();
    let text = text.to_str().unwrap();
    let ppl = [
        "perplexity",
        "--model",
        m,
        "--device",
        "cpu",
        "--file",
        text,
    ];
    for (args, names) in [
        (
            [&ppl[..], &["--stride", "0"]].concat(),
            "--stride 0: the stride must be",
        ),
        (
            vec!["bench", "prefill", "--model", m, "--prompt", "0"],
            "--prompt",
        ),
        (
            vec!["bench", "prefill", "--model", m, "--chunk", "0"],
            "--chunk",
        ),
        (
            vec!["bench", "prefill", "--model", m, "--tiles", "3x8"],
            "--tiles 3x8",
        ),
        (
            [&ppl[..], &["--max-tokens", "0"]].concat(),
            "--max-tokens 0",
        ),
        (
            vec![
                "generate",
                "--model",
                m,
                "--device",
                "cpu",
                "--prompt-ids",
                "1,99999999",
            ],
            "--prompt-ids: token id 99999999 (entry 2) is outside the vocabulary",
        ),
        (
            vec!["bench", "gemm", "--quick", "--tiles", "4x"],
            "--tiles 4x: want RMxBN",
        ),
        (
            vec!["bench", "gemm", "--quick", "--tiles", "1x16,,2x16"],
            "--tiles 1x16,,2x16: entry 2 is empty",
        ),
        (
            vec!["bench", "gemm", "--quick", "--tiles", "4x16,2x8,4x16"],
            "the tile 4x16 is listed twice (entry 3)",
        ),
        (
            vec!["bench", "prefill", "--model", m, "--tiles", "2x8,2x8"],
            "the tile 2x8 is listed twice (entry 2)",
        ),
        (
            vec!["bench", "kernels", "--formats", "bogus"],
            "--formats bogus",
        ),
        (
            vec![
                "synth",
                "--preset",
                "tiny",
                "--layers",
                "0",
                "--experts",
                "int4",
                "--out",
                out,
            ],
            "--layers",
        ),
        (
            vec![
                "synth",
                "--preset",
                "inkling-small",
                "--layers",
                "99999",
                "--experts",
                "int4-g64",
                "--dry-run",
            ],
            "--layers 99999: want 1 to 1024 layers",
        ),
        (
            vec![
                "synth",
                "--preset",
                "tiny",
                "--layers",
                "2",
                "--dense-layers",
                "3",
                "--experts",
                "int4",
                "--out",
                out,
            ],
            "--dense-layers 3: at most --layers (2)",
        ),
        (
            vec![
                "synth",
                "--preset",
                "tiny",
                "--layers",
                "1",
                "--experts",
                "int4",
                "--vocab",
                "100",
                "--dry-run",
            ],
            "--vocab 100: at least 409, the bundled tokenizer's vocabulary",
        ),
        (
            vec![
                "synth",
                "--preset",
                "tiny",
                "--layers",
                "1",
                "--experts",
                "int4",
                "--vocab",
                "3000000000",
                "--dry-run",
            ],
            "--vocab 3000000000: at most 2147483647, the loader's limit for vocab_size",
        ),
        (
            vec!["serve", "--model-id", " "],
            "invalid value ' ' for '--model-id <MODEL_ID>': expected a name clients can send",
        ),
        (
            vec![
                "synth",
                "--preset",
                "bogus",
                "--layers",
                "2",
                "--experts",
                "int4",
                "--out",
                out,
            ],
            "bogus",
        ),
        (
            vec![
                "generate",
                "--model",
                m,
                "--prompt-ids",
                "5",
                "--device",
                "cpu",
                "--profile",
            ],
            "--profile",
        ),
        (
            vec!["chat", "--model", m, "--max-tokens", "0"],
            "--max-tokens",
        ),
        (
            vec![
                "generate",
                "--model",
                m,
                "--prompt-ids",
                "5",
                "--max-tokens",
                "0",
            ],
            "--max-tokens",
        ),
    ] {
        let e = run_usage_err(&args);
        assert!(e.contains(names), "{args:?}: {e}");
    }
    assert!(!tmp.join("out").exists(), "a refused synth creates nothing");
    std::fs::remove_dir_all(&tmp).ok();
}

/// `WGPU_BACKEND` with a name wgpu does not know is named, with the valid names, instead of
/// "no adapter, install a driver".
#[test]
fn an_unknown_backend_name_is_named_with_the_valid_ones() {
    let out = bin()
        .env("WGPU_BACKEND", "vulkn")
        .args([
            "generate",
            "--model",
            fixture("tiny-causal-f32").to_str().unwrap(),
            "--prompt-ids",
            "5,6",
        ])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(
        e.contains("WGPU_BACKEND=\"vulkn\"")
            && e.contains("no such backend")
            && e.contains("vulkan, metal or dx12"),
        "{e}"
    );
    assert!(
        !e.contains("install a Vulkan") && !e.contains("Backends("),
        "{e}"
    );
}

/// `chat` and `serve` on a folder that does not exist say so (not "no tokenizer.json").
#[test]
fn chat_and_serve_name_a_missing_model_folder() {
    for args in [
        &["chat", "--model", "/nonexistent/inkling", "--device", "cpu"][..],
        &[
            "serve",
            "--model",
            "/nonexistent/inkling",
            "--device",
            "cpu",
            "--port",
            "0",
        ],
    ] {
        let (cmd, e) = (args[0], run_err(args));
        assert!(
            e.contains("/nonexistent/inkling: no such model directory"),
            "{cmd}: {e}"
        );
        assert!(!e.contains("tokenizer.json"), "{cmd}: {e}");
    }
}

#[test]
fn no_adapter_names_the_backend_and_suggests_cpu() {
    let out = bin()
        .env("WGPU_BACKEND", "gl")
        .args([
            "generate",
            "--model",
            fixture("tiny-causal-f32").to_str().unwrap(),
            "--prompt-ids",
            "5,6",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("WGPU_BACKEND=\"gl\"") && e.contains("GL is not built"),
        "{e}"
    );
    assert!(e.contains("--device cpu"), "{e}");
}

#[test]
fn convert_refuses_a_destination_inside_the_source() {
    let tmp = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("inkling-cli-validation-{}", std::process::id()));
    let src = tmp.join("src");
    std::fs::create_dir_all(&src).unwrap();
    for f in std::fs::read_dir(fixture("tiny-causal-f32")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, src.join(f.file_name().unwrap())).unwrap();
    }
    let dst = src.join("sub");
    let e = run_err(&[
        "convert",
        "--model",
        src.to_str().unwrap(),
        "--out",
        dst.to_str().unwrap(),
    ]);
    assert!(e.contains("lies inside the source directory"), "{e}");
    assert!(!dst.exists(), "nothing may be created inside the source");
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn a_missing_model_dir_is_named_once() {
    let e = run_err(&[
        "generate",
        "--model",
        "/nonexistent/inkling",
        "--prompt-ids",
        "1",
        "--device",
        "cpu",
    ]);
    assert_eq!(
        e.matches("/nonexistent/inkling: no such model directory")
            .count(),
        1,
        "{e}"
    );
    assert!(!e.contains("config.json:"), "{e}");
}

/// A `--tiles` tile past the device's workgroup memory (1x32 on a WebGPU-default device) is a
/// usage error naming the tile and the wgpu limit, before anything is timed.
#[test]
fn a_tile_past_the_workgroup_memory_is_a_usage_error() {
    let out = bin()
        .env("INKLING_LIMITS", "webgpu")
        .args([
            "bench",
            "gemm",
            "--quick",
            "--formats",
            "bf16",
            "--dense-only",
        ])
        .args(["--tiles", "4x16,1x32"])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{e}");
    assert!(e.contains("--tiles 1x32"), "{e}");
    assert!(e.contains("max_compute_workgroup_storage_size"), "{e}");
    assert!(!e.contains("dense ["), "nothing is timed first: {e}");
}

/// A file given as `--model` is "not a directory", for `generate` (Checkpoint::open), `chat` (the
/// tokenizer's check), `info` and `convert` (the shard list), never "no such model directory".
#[test]
fn a_file_as_model_is_not_a_directory() {
    let file = fixture("tiny-causal-f32").join("config.json");
    let f = file.to_str().unwrap();
    for args in [
        &[
            "generate",
            "--model",
            f,
            "--prompt-ids",
            "1",
            "--device",
            "cpu",
        ][..],
        &["chat", "--model", f, "--device", "cpu"],
        &["info", "--model", f],
        &["convert", "--model", f, "--out", "/nonexistent/out"],
    ] {
        let e = run_err(args);
        assert!(
            e.contains(&format!("{f}: not a directory")),
            "{}: {e}",
            args[0]
        );
        assert!(!e.contains("no such model directory"), "{}: {e}", args[0]);
    }
}

/// Second fresh-user review: a --max-tokens past what the GPU positions can index, a bad
/// --peak-gbs, an empty --usage-file, a non-positive rms_norm_eps, and `--force` onto a source
/// checkpoint are clear errors; `--gpu-mem 24GiB` is understood.
#[test]
fn huge_max_tokens_bad_bandwidth_empty_usage_file_bad_eps_and_force_onto_a_source() {
    let m = fixture("tiny-causal-f32");
    let m = m.to_str().unwrap();
    // capped at the context (4096 positions) with a warning (tests/suite/cli/cli_prompt.rs has GPU)
    for n in ["4294967295", "18446744073709551615"] {
        let out = bin()
            .args([
                "generate",
                "--model",
                m,
                "--prompt-ids",
                "5,6",
                "--device",
                "cpu",
            ])
            .args(["--max-tokens", n])
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{n}: {e}");
        assert!(
            e.contains(&format!("warning: generating at most 4094 tokens, not {n}")),
            "{n}: {e}"
        );
    }
    for g in ["nan", "0", "inf"] {
        let e = run_err(&["bench", "decode", "--model", m, "--peak-gbs", g]);
        assert!(e.contains("bandwidth in GB/s"), "{g}: {e}");
    }
    let e = run_err(&[
        "generate",
        "--model",
        m,
        "--prompt-ids",
        "5,6",
        "--expert-slots",
        "2",
        "--usage-file",
        "",
    ]);
    assert!(e.contains("--usage-file needs a path"), "{e}");
    let out = bin()
        .args([
            "generate",
            "--model",
            m,
            "--prompt-ids",
            "5,6",
            "--max-tokens",
            "2",
        ])
        .args(["--gpu-mem", "24GiB", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let tmp = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("inkling-cli-eps-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    for e in std::fs::read_dir(fixture("tiny-causal-f32")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tmp.join(e.file_name())).unwrap();
    }
    let before = std::fs::read(tmp.join("model.safetensors")).unwrap();
    let t = tmp.to_str().unwrap();
    let e = run_err(&["convert", "--model", m, "--out", t, "--force"]);
    assert!(
        e.contains("a source checkpoint (no container stamp), not a conversion"),
        "{e}"
    );
    assert_eq!(
        std::fs::read(tmp.join("model.safetensors")).unwrap(),
        before
    );
    let cfg = tmp.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    v["rms_norm_eps"] = serde_json::json!(-1.0);
    std::fs::write(&cfg, serde_json::to_vec(&v).unwrap()).unwrap();
    let e = run_err(&[
        "generate",
        "--model",
        t,
        "--prompt-ids",
        "5,6",
        "--device",
        "cpu",
    ]);
    assert!(e.contains("rms_norm_eps"), "{e}");
    std::fs::remove_dir_all(&tmp).ok();
}

/// `bench kernels --tune` is checked before anything is printed and names the flag and its rule;
/// `bench compare` refuses JSON that is not a `bench kernels --json` file.
#[test]
fn bench_tune_and_compare_inputs_are_checked() {
    for t in ["3:1", "a:1", "64:0", "64"] {
        let out = bin()
            .args(["bench", "kernels", "--quick", "--tune", t])
            .output()
            .unwrap();
        assert!(!out.status.success(), "--tune {t}");
        assert!(out.stdout.is_empty(), "--tune {t}: printed before failing");
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.contains(&format!("--tune {t}")), "{e}");
    }
    let p = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("inkling-cmp-{}.json", std::process::id()));
    std::fs::write(&p, b"{}").unwrap();
    let s = p.to_str().unwrap();
    let e = run_err(&["bench", "compare", s, s]);
    assert!(
        e.contains("is not a `bench kernels --json` file (no \"results\" array)"),
        "{e}"
    );
    let _ = std::fs::remove_file(&p);
}

/// `serve` binds before it loads the model: a host that does not resolve is an error naming it,
/// without "model loaded" first.
#[test]
fn serve_fails_on_a_bad_host_before_loading_the_model() {
    let m = fixture("tiny-chat-f32");
    let e = run_err(&[
        "serve",
        "--model",
        m.to_str().unwrap(),
        "--device",
        "cpu",
        "--host",
        "nosuchhost.invalid",
    ]);
    assert!(e.contains("binding nosuchhost.invalid:8080"), "{e}");
    assert!(!e.contains("model loaded"), "{e}");
}

/// `bench batch` sizes and step counts are checked by the parser (exit 2, in words): a batch of
/// 0 or past `serve --parallel`'s 256, 0 steps, and (`bench decode` too) a step count that would
/// overflow with the probe prompt. No device is opened for them.
#[test]
fn bench_batch_values_exit_2() {
    for (flag, v, want) in [
        ("--batch", "0", "expected a whole number from 1 to 256"),
        ("--batch", "1,300", "expected a whole number from 1 to 256"),
        ("--tokens", "0", "expected a whole number from 1 to 1048576"),
        (
            "--batch",
            "1,2,1",
            "the batch of 1 is listed twice (entry 3)",
        ),
    ] {
        let e = run_usage_err(&["bench", "batch", flag, v]);
        assert!(e.contains(flag) && e.contains(want), "{flag} {v}: {e}");
    }
    // a step count past usize once the probe prompt is added: refused, not wrapped; one past the
    // bundled model's context: refused before any GPU work, naming the largest that fits
    for cmd in ["batch", "decode"] {
        let e = run_usage_err(&["bench", cmd, "--tokens", "18446744073709551615"]);
        assert!(
            e.contains("expected a whole number from 1 to 1048576"),
            "{cmd}: {e}"
        );
        let e = run_usage_err(&["bench", cmd, "--tokens", "600"]);
        assert!(
            e.contains("--tokens 600: the probe's 16-token prompt and 600 steps pass the model's context of 512 positions"),
            "{cmd}: {e}"
        );
    }
}

/// A negative number given to a flag that takes a whole number is that flag's bad value (exit 2,
/// the flag named), never clap's "unexpected argument '-1'".
#[test]
fn negative_numbers_are_bad_values_of_their_flag() {
    let m = fixture("tiny-causal-f32");
    let m = m.to_str().unwrap();
    for (args, flag) in [
        (vec!["synth", "--layers", "-1", "--dry-run"], "--layers"),
        (
            vec!["synth", "--dense-layers", "-2", "--dry-run"],
            "--dense-layers",
        ),
        (
            vec!["bench", "decode", "--model", m, "--tokens", "-3"],
            "--tokens",
        ),
        (
            vec!["bench", "prefill", "--model", m, "--prompt", "-16"],
            "--prompt",
        ),
        (
            vec!["serve", "--model", m, "--parallel", "-1"],
            "--parallel",
        ),
        (vec!["perplexity", "--model", m, "--ctx", "-8"], "--ctx"),
        (
            vec![
                "generate",
                "--model",
                m,
                "--prompt-ids",
                "5",
                "--max-tokens",
                "-1",
            ],
            "--max-tokens",
        ),
        (
            vec!["generate", "--model", m, "--prompt-ids", "5,-6"],
            "--prompt-ids",
        ),
        (
            vec!["convert", "--model", m, "--max-shard-mib", "-1"],
            "--max-shard-mib",
        ),
        (vec!["chat", "--model", m, "--effort", "-0.5"], "--effort"),
        (
            vec![
                "generate",
                "--model",
                m,
                "--prompt-ids",
                "5",
                "--gpu-mem",
                "-1",
            ],
            "--gpu-mem",
        ),
        (vec!["serve", "--model", m, "--port", "-1"], "--port"),
    ] {
        let e = run_usage_err(&args);
        // the bad value: the flag's argument, or its one negative element in a list
        let given = args[args.iter().position(|a| *a == flag).unwrap() + 1];
        let v = given.split(',').find(|x| x.starts_with('-')).unwrap();
        assert!(
            e.starts_with(&format!("error: invalid value '{v}' for '{flag}")),
            "{args:?}: {e}"
        );
    }
}

/// generation_config.json's `max_new_tokens` of 0 is refused naming the file and field, as
/// transformers' `GenerationConfig.validate` refuses it.
#[test]
fn a_generation_config_max_new_tokens_of_0_is_refused() {
    let dir = crate::model_common::copy_fixture("tiny-causal-f32", "max-new-0");
    let file = dir.join("generation_config.json");
    let g = std::fs::read_to_string(&file).unwrap();
    assert!(g.contains("\"max_new_tokens\": 16"), "{g}");
    std::fs::write(
        &file,
        g.replace("\"max_new_tokens\": 16", "\"max_new_tokens\": 0"),
    )
    .unwrap();
    let e = run_err(&[
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "5",
        "--device",
        "cpu",
    ]);
    assert!(
        e.starts_with(&format!(
            "error: {}: max_new_tokens must be at least 1",
            file.display()
        )),
        "{e}"
    );
    // a flag covers it, as it covers the file's other values
    let o = bin()
        .args([
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            "5",
        ])
        .args(["--device", "cpu", "--max-tokens", "2", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::remove_dir_all(&dir).ok();
}

/// `--top-k -1` is off, as `serve`'s `top_k: -1` (vLLM's meaning): the same sampled tokens as
/// `--top-k 0`; other negative values are refused naming the flag and the rule.
#[test]
fn top_k_minus_one_is_off() {
    let m = fixture("tiny-causal-f32");
    let m = m.to_str().unwrap();
    let ids = |k: &str| {
        let out = bin()
            .args([
                "generate",
                "--model",
                m,
                "--device",
                "cpu",
                "--prompt-ids",
                "5,6",
            ])
            .args([
                "--max-tokens",
                "12",
                "--temperature",
                "1.5",
                "--seed",
                "7",
                "--json",
            ])
            .args(["--top-k", k])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["generated_ids"].clone()
    };
    let off = ids("0");
    assert!(off.as_array().is_some_and(|a| !a.is_empty()), "{off}");
    assert_eq!(ids("-1"), off);
    assert_ne!(ids("1"), off, "top-k 1 is greedy, unlike these samples");
    let e = run_usage_err(&[
        "generate",
        "--model",
        m,
        "--prompt-ids",
        "5",
        "--top-k",
        "-2",
    ]);
    assert!(
        e.contains("--top-k") && e.contains("expected a whole number ≥ 0 (0 or -1 = off)"),
        "{e}"
    );
}

/// An `--out` that is a file is a usage error naming the flag, for `convert` and `synth`, and the
/// file is left as it was.
#[test]
fn an_out_that_is_a_file_is_named() {
    let tmp = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("inkling-out-file-{}", std::process::id()));
    std::fs::write(&tmp, b"mine").unwrap();
    let t = tmp.to_str().unwrap();
    let m = fixture("tiny-causal-f32");
    for args in [
        vec!["convert", "--model", m.to_str().unwrap(), "--out", t],
        vec![
            "synth",
            "--preset",
            "tiny",
            "--layers",
            "1",
            "--experts",
            "int4",
            "--out",
            t,
        ],
    ] {
        let e = run_usage_err(&args);
        assert!(
            e.contains(&format!("--out {t}: not a directory")),
            "{args:?}: {e}"
        );
    }
    assert_eq!(std::fs::read(&tmp).unwrap(), b"mine");
    std::fs::remove_file(&tmp).ok();
}
