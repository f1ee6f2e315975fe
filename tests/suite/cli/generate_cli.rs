//! `inkling-wgpu generate` end to end on the CPU device, against transformers' tokens, and `--device gpu` against the CPU device and transformers.
use crate::model_common;
use model_common::*;
use std::process::Command;

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
        .arg("generate")
        .args(args)
        .output()
        .unwrap()
}

fn json_of(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "exit {:?}, stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    assert_eq!(
        stdout.trim().lines().count(),
        1,
        "--json prints exactly one line: {stdout}"
    );
    serde_json::from_str(stdout.trim()).unwrap()
}

#[test]
fn cli_json_reproduces_transformers_on_both_layouts() {
    for name in FIXTURES {
        let r = reference(name);
        let dir = fixture(name);
        let tok = inkling_wgpu::model::text::load_tokenizer(&dir)
            .unwrap()
            .unwrap();
        for c in &r.cases {
            let ids = ids_arg(&c.prompt_ids);
            let out = run(&[
                "--model",
                dir.to_str().unwrap(),
                "--prompt-ids",
                &ids,
                "--temperature",
                "0",
                "--device",
                "cpu",
                "--json",
            ]);
            let v = json_of(&out);
            assert_eq!(ids_of(&v["prompt_ids"]), c.prompt_ids);
            assert_eq!(
                ids_of(&v["generated_ids"]),
                c.generated_ids,
                "{name}: generated_ids"
            );
            assert_eq!(
                v["finish_reason"],
                c.finish_reason.as_str(),
                "{name}: finish_reason"
            );
            // text is the decode of the generated ids without the EOS
            let printed = if c.finish_reason == "eos" {
                &c.generated_ids[..c.generated_ids.len() - 1]
            } else {
                &c.generated_ids[..]
            };
            assert_eq!(
                v["text"].as_str().unwrap(),
                tok.decode(printed, false).unwrap()
            );
            let s = &v["stats"];
            assert_eq!(s["prompt_tokens"], c.prompt_ids.len());
            assert_eq!(s["generated_tokens"], c.generated_ids.len());
            assert_eq!(s["backend"], "cpu");
            for k in ["prefill_s", "ttft_s", "decode_tok_s"] {
                assert!(s[k].as_f64().unwrap() >= 0.0, "{k}");
            }
            // one arrival time per printed token, from 0, never going back
            let times: Vec<f64> = s["token_times_s"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_f64().unwrap())
                .collect();
            assert_eq!(times.len(), printed.len(), "{name}: token_times_s");
            assert_eq!(times[0], 0.0, "{name}");
            assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
            assert!(s["adapter"].is_string());
        }
    }
}

/// `ids` as the comma-separated list `--prompt-ids` takes.
fn ids_arg(ids: &[u32]) -> String {
    ids.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn cli_text_prompt_streams_and_prints_stats() {
    // Default model (the bundled demo) and a text prompt: the README demo.
    let r = reference("austen-demo");
    let c = &r.cases[2];
    let max = c.max_new_tokens.to_string();
    // greedy: the bundled model's generation_config.json samples
    let out = run(&[
        "--prompt",
        "Once upon a time",
        "--device",
        "cpu",
        "--temperature",
        "0",
        "--max-tokens",
        &max,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tok = inkling_wgpu::model::text::load_tokenizer(&inkling_wgpu::bundled_model_dir())
        .unwrap()
        .unwrap();
    let want = tok.decode(&c.generated_ids, false).unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.trim_end_matches('\n'), want);
    let stderr = String::from_utf8(out.stderr).unwrap();
    let prompt_tokens = format!("prompt tokens {}", c.prompt_ids.len());
    for k in [prompt_tokens.as_str(), "prefill", "TTFT", "tok/s", "cpu"] {
        assert!(stderr.contains(k), "stats line lacks `{k}`: {stderr}");
    }
}

#[test]
fn cli_eos_is_not_printed_and_sampling_is_seeded() {
    let r = reference("austen-demo");
    let c = &r.cases[0];
    assert_eq!(c.finish_reason, "eos");
    let ids = ids_arg(&c.prompt_ids);
    let v = json_of(&run(&[
        "--prompt-ids",
        &ids,
        "--device",
        "cpu",
        "--json",
        "--temperature",
        "0",
    ]));
    let tok = inkling_wgpu::model::text::load_tokenizer(&inkling_wgpu::bundled_model_dir())
        .unwrap()
        .unwrap();
    let eos_text = tok
        .decode(&[*c.generated_ids.last().unwrap()], false)
        .unwrap();
    let text = v["text"].as_str().unwrap();
    assert_eq!(
        text,
        tok.decode(&c.generated_ids[..c.generated_ids.len() - 1], false)
            .unwrap()
    );
    assert!(!text.ends_with(&eos_text) || eos_text.is_empty());

    let sample = |seed: &str| {
        json_of(&run(&[
            "--prompt-ids",
            &ids,
            "--device",
            "cpu",
            "--json",
            "--temperature",
            "1.3",
            "--top-k",
            "40",
            "--top-p",
            "0.9",
            "--seed",
            seed,
            "--max-tokens",
            "10",
        ]))["generated_ids"]
            .clone()
    };
    assert_eq!(sample("3"), sample("3"));
    // --max-tokens caps the length (on the length case: the EOS case stops after one token)
    let long = &r.cases[1];
    let long_ids = ids_arg(&long.prompt_ids);
    let v = json_of(&run(&[
        "--prompt-ids",
        &long_ids,
        "--device",
        "cpu",
        "--json",
        "--max-tokens",
        "3",
        "--temperature",
        "0",
    ]));
    assert_eq!(
        ids_of(&v["generated_ids"]),
        long.generated_ids[..3].to_vec()
    );
    assert_eq!(v["finish_reason"], "length");
}

#[test]
fn cli_errors_are_clear() {
    // No prompt.
    let out = run(&["--device", "cpu"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--prompt"));
    // Missing model dir names config.json.
    let out = run(&[
        "--model",
        "/nonexistent-inkling-dir",
        "--prompt-ids",
        "1",
        "--device",
        "cpu",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("config.json"));
}

/// `--device gpu` (the default) reproduces the CPU device's and transformers' greedy tokens on
/// every fixture (case 0, through its EOS), and the CPU's on the bundled model; the suite needs a
/// GPU adapter (lavapipe on CI), so a GPU run that fails is a failure, never a skip.
#[test]
fn gpu_device_generates_the_cpu_and_transformers_tokens() {
    let both = |model: Option<&str>, ids: &str, max: &str| {
        // greedy (the bundled model's generation_config.json samples)
        let mut args = vec![
            "--prompt-ids",
            ids,
            "--json",
            "--max-tokens",
            max,
            "--temperature",
            "0",
        ];
        if let Some(m) = model {
            args.extend(["--model", m]);
        }
        let on = |device: &str| {
            let mut a = args.clone();
            a.extend(["--device", device]);
            json_of(&run(&a))
        };
        (on("gpu"), on("cpu"))
    };
    for name in FIXTURES {
        let r = reference(name);
        let c = &r.cases[0];
        let dir = fixture(name);
        let ids = ids_arg(&c.prompt_ids);
        let max = c.max_new_tokens.to_string();
        let (gpu, cpu) = both(Some(dir.to_str().unwrap()), &ids, &max);
        assert_eq!(
            ids_of(&gpu["generated_ids"]),
            c.generated_ids,
            "{name}: --device gpu vs transformers"
        );
        assert_eq!(gpu["generated_ids"], cpu["generated_ids"], "{name}");
        assert_eq!(gpu["text"], cpu["text"], "{name}");
        assert_eq!(gpu["finish_reason"], c.finish_reason.as_str(), "{name}");
    }
    let (gpu, cpu) = both(None, "1,2", "6");
    assert_eq!(ids_of(&gpu["generated_ids"]).len(), 6, "{gpu}");
    assert_eq!(gpu["generated_ids"], cpu["generated_ids"], "bundled model");
}

/// Sampling without `--seed` draws a fresh seed each run (as llama.cpp and mlx-lm do) and prints
/// it, in the stats line and `stats.seed`; that seed repeats the run. Greedy runs print none.
#[test]
fn sampling_without_a_seed_draws_one_and_prints_it() {
    let sampled = |seed: Option<&str>, json: bool| {
        let mut args = vec!["--prompt", "It is a truth", "--device", "cpu"];
        args.extend(["--temperature", "1.0", "--max-tokens", "24"]);
        if let Some(s) = seed {
            args.extend(["--seed", s]);
        }
        if json {
            args.push("--json");
        }
        run(&args)
    };
    let a = json_of(&sampled(None, true));
    let b = json_of(&sampled(None, true));
    let (sa, sb) = (&a["stats"]["seed"], &b["stats"]["seed"]);
    assert!(sa.is_u64() && sb.is_u64(), "{a}");
    assert_ne!(sa, sb, "two runs without --seed drew the same seed");
    let again = json_of(&sampled(Some(&sa.to_string()), true));
    assert_eq!(again["generated_ids"], a["generated_ids"]);
    assert_eq!(again["stats"]["seed"], *sa);
    let text = sampled(None, false);
    let stderr = String::from_utf8_lossy(&text.stderr);
    assert!(stderr.contains(" | seed "), "{stderr}");
    let greedy = run(&[
        "--prompt",
        "It is",
        "--device",
        "cpu",
        "--max-tokens",
        "4",
        "--temperature",
        "0",
    ]);
    let stderr = String::from_utf8_lossy(&greedy.stderr);
    assert!(!stderr.contains("seed"), "{stderr}");
}

/// On a software adapter (lavapipe) the GPU path says once that `--device cpu` is faster, and
/// the stats line names the adapter type in words; on a hardware adapter neither note appears.
#[test]
fn a_software_adapter_is_named_and_points_at_the_cpu_path() {
    let gpu = inkling_wgpu::gpu::device::Gpu::new().expect("a GPU adapter");
    let out = run(&["--prompt", "It is", "--max-tokens", "2"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let notes = stderr.matches("`--device cpu`").count();
    if gpu.is_cpu() {
        assert_eq!(notes, 1, "{stderr}");
        assert!(stderr.contains("software adapter on the CPU)"), "{stderr}");
    } else {
        assert_eq!(notes, 0, "{stderr}");
    }
    assert!(!stderr.contains(", Cpu)"), "{stderr}");
}

/// The sampled continuation the library gives on the CPU (`CpuModel`, `generate` with the
/// fixture's EOS ids, the same seed): what `--device cpu` must print for the same flags.
fn library_sampled(
    name: &str,
    prompt: &[u32],
    sampling: inkling_wgpu::model::sampling::SamplingParams,
    seed: u64,
    max: usize,
) -> Vec<u32> {
    use inkling_wgpu::model::{Checkpoint, CpuModel, Weights};
    let ck = Checkpoint::open(&fixture(name)).unwrap();
    let w = Weights::load(&ck).unwrap();
    let p = inkling_wgpu::model::generate::GenerateParams {
        max_new_tokens: max,
        sampling,
        seed,
        eos_ids: reference(name).eos,
    };
    inkling_wgpu::model::generate::generate(&mut CpuModel::new(&w), prompt, &p, &mut |_| Ok(()))
        .unwrap()
        .generated_ids
}

/// `--temperature`, `--top-k`, `--top-p` and `--seed` reach the sampler: for four settings that
/// differ in one flag each and six seeds, `generate --device cpu` prints exactly the library's
/// sampled continuation for those parameters and seed (same logits, same PRNG draws), and no two
/// settings give the same continuations over the seeds, so a flag dropped on the way (parsed but
/// not passed, or passed as the default) changes the output.
#[test]
fn sampling_flags_reach_the_sampler() {
    use inkling_wgpu::model::sampling::SamplingParams;
    let name = "tiny-causal-f32";
    let c = &reference(name).cases[0];
    let prompt = ids_arg(&c.prompt_ids);
    let dir = fixture(name);
    let settings = SAMPLING_SETTINGS;
    let mut seen: Vec<Vec<Vec<u32>>> = Vec::new();
    for (t, k, p) in settings {
        let mut runs = Vec::new();
        for seed in 1..=6u64 {
            let v = json_of(&run(&[
                "--model",
                dir.to_str().unwrap(),
                "--prompt-ids",
                &prompt,
                "--device",
                "cpu",
                "--json",
                "--max-tokens",
                "8",
                "--temperature",
                &t.to_string(),
                "--top-k",
                &k.to_string(),
                "--top-p",
                &p.to_string(),
                "--seed",
                &seed.to_string(),
            ]));
            let sp = SamplingParams {
                temperature: t,
                top_k: k,
                top_p: p,
                ..Default::default()
            };
            let want = library_sampled(name, &c.prompt_ids, sp, seed, 8);
            assert_eq!(
                ids_of(&v["generated_ids"]),
                want,
                "T {t} top-k {k} top-p {p} seed {seed}"
            );
            runs.push(want);
        }
        assert!(
            !seen.contains(&runs),
            "T {t} top-k {k} top-p {p}: the same continuations as another setting"
        );
        seen.push(runs);
    }
}

/// One token is the prompt's forward, no decode step: the summary line and `--profile` say so
/// instead of printing a rate and a table of zeros.
#[test]
fn one_token_reports_no_decode_step() {
    let dir = fixture("tiny-causal-f32");
    let out = run(&[
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "1",
        "--temperature",
        "0",
        "--profile",
        "--usage-file",
        "off",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("1 generated, no decode step"), "{err}");
    assert!(err.contains("no decode step ran"), "{err}");
    assert!(!err.contains("tok/s"), "{err}");
    assert!(!err.contains("GPU ms/token"), "{err}");
}
