//! Expert streaming (`GpuModel::with_placement`): routed experts placed into a small pool of GPU
//! slots from the mapped weights give the resident GPU model's teacher-forced logits (prefill
//! chunk and decode steps, relative error ≤ 1e-5 per row; a wrong expert in a slot moves them
//! even where the peaked tiny models keep the greedy tokens), and the same greedy tokens as the
//! fully resident GPU model, the CPU oracle and transformers; a `--gpu-mem`-style byte budget
//! that streams gives the same logits; an injected GPU failure falls back to the CPU for that layer and
//! keeps the tokens; a budget that holds everything is resident; the usage file ranks a pinned
//! hot set; the CLI reports the streaming stats and survives a corrupt usage file. Needs a GPU
//! adapter (lavapipe on CI); without one the tests FAIL, they never skip.
use crate::model_common;
use crate::ops_util::shared_gpu as gpu;
use inkling_wgpu::container::{convert, ConvertOptions};
use inkling_wgpu::formats::Encoding;
use inkling_wgpu::model::generate::{generate, GenerateParams};
use inkling_wgpu::model::sampling::SamplingParams;
use inkling_wgpu::model::usage::{self, Usage};
use inkling_wgpu::model::weights::Mlp;
use inkling_wgpu::model::{
    Checkpoint, CpuModel, Forward, GpuModel, GpuModelOptions, Placement, Weights,
};
use model_common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn opts() -> GpuModelOptions {
    GpuModelOptions {
        max_chunk: 64,
        ..GpuModelOptions::new(96)
    }
}

/// [`opts`] with the routed experts placed by `placement`, recording into `usage`.
fn placed(placement: Placement, usage: Option<Usage>) -> GpuModelOptions {
    GpuModelOptions {
        placement,
        usage,
        ..opts()
    }
}

fn greedy_ids(m: &mut dyn Forward, prompt: &[u32], eos: &[u32], max: usize) -> Vec<u32> {
    let p = GenerateParams {
        max_new_tokens: max,
        sampling: SamplingParams::default(),
        seed: 0,
        eos_ids: eos.to_vec(),
    };
    generate(m, prompt, &p, &mut |_| Ok(()))
        .unwrap()
        .generated_ids
}

/// Teacher-forced logits of `seq` on `m` from a fresh start: the first `prefill` tokens in one
/// chunk (a row per token), then one decode step per token.
fn teacher_logits(m: &mut dyn Forward, seq: &[u32], prefill: usize) -> Vec<Vec<f32>> {
    m.reset();
    let mut rows = m.forward_all(&seq[..prefill]).unwrap();
    for &t in &seq[prefill..] {
        rows.push(m.forward(&[t]).unwrap());
    }
    rows
}

/// Every row of `got` within 1e-5 relative error of `want`'s.
fn assert_rows_close(what: &str, got: &[Vec<f32>], want: &[Vec<f32>]) {
    assert_eq!(got.len(), want.len(), "{what}: rows");
    for (p, (g, w)) in got.iter().zip(want).enumerate() {
        let e = rel_err(g, w);
        assert!(
            e <= 1e-5,
            "{what}: position {p} logits rel err {e:e} > 1e-5"
        );
    }
}

/// (top_k, routed experts in the whole model)
fn sizes(w: &Weights<'_>) -> (usize, usize) {
    let mut k = 0;
    let mut total = 0;
    for l in &w.layers {
        if let Mlp::Moe(m) = &l.mlp {
            k = k.max(m.top_k);
            total += m.experts.len();
        }
    }
    (k, total)
}

fn convert_experts(name: &str, experts: &str) -> PathBuf {
    let dst = scratch(&format!("stream-{name}-{experts}"));
    let opts = ConvertOptions {
        experts: Some(Encoding::parse(experts).unwrap()),
        shared: Some(Encoding::parse("bf16").unwrap()),
        dense: Some(Encoding::parse("bf16").unwrap()),
        ..Default::default()
    };
    convert(&fixture(name), &dst, &opts).unwrap();
    dst
}

/// Streamed at several slot counts (down to one layer's top-k, and one slot) = resident = CPU
/// by greedy tokens, and on the source fixtures = transformers' tokens; and the streamed
/// teacher-forced logits of prompt + continuation (prefill chunk, then decode steps, after the
/// greedy run warmed the slots) = the resident model's within 1e-5 per row.
fn check_dir(dir: &Path, reference_ids: Option<&[u32]>, prompt: &[u32], eos: &[u32], max: usize) {
    let g = gpu();
    let ck = Checkpoint::open(dir).unwrap();
    let w = Weights::load(&ck).unwrap();
    let (k, total) = sizes(&w);
    assert!(
        total > k,
        "{}: the fixture must have more experts than top-k",
        dir.display()
    );
    let cpu = greedy_ids(&mut CpuModel::new(&w), prompt, eos, max);
    let mut resident = GpuModel::new(&g, &w, opts()).unwrap();
    let res = greedy_ids(&mut resident, prompt, eos, max);
    assert_eq!(res, cpu, "{}: resident GPU vs CPU", dir.display());
    let mut seq = prompt.to_vec();
    seq.extend_from_slice(&res);
    let want = teacher_logits(&mut resident, &seq, prompt.len());
    // the resident logits themselves against the CPU on the same weights
    let cpu_rows = teacher_logits(&mut CpuModel::new(&w), &seq, prompt.len());
    assert_rows_close(
        &format!("{}: resident GPU vs CPU", dir.display()),
        &want,
        &cpu_rows,
    );
    if let Some(r) = reference_ids {
        assert_eq!(res, r, "{}: resident GPU vs transformers", dir.display());
    }
    for slots in [1, k, k + 1, total - 1] {
        let mut m = GpuModel::new(&g, &w, placed(Placement::Slots(slots), None)).unwrap();
        let ids = greedy_ids(&mut m, prompt, eos, max);
        assert_eq!(ids, cpu, "{}: {slots} slots vs CPU", dir.display());
        let s = m.stream_stats().expect("streaming");
        assert_eq!(s.slots, slots);
        assert!(
            s.misses > 0 && s.uploads == s.misses,
            "{slots} slots: {s:?}"
        );
        assert!(s.bytes_read > 0, "{slots} slots: {s:?}");
        assert_eq!(s.cpu_fallbacks, 0);
        if slots == 1 {
            assert_eq!(
                s.hits + s.misses,
                s.misses,
                "one slot for several layers: no hits"
            );
        }
        // every expert request of every token of every sparse layer was counted
        let u = m.usage().unwrap();
        let recorded: u64 = u.counts.iter().flatten().sum();
        let sparse = w
            .layers
            .iter()
            .filter(|l| matches!(l.mlp, Mlp::Moe(_)))
            .count();
        let fed = prompt.len() + ids.len() - 1;
        assert_eq!(
            recorded as usize,
            sparse * k * fed,
            "{slots} slots: usage counts"
        );
        let got = teacher_logits(&mut m, &seq, prompt.len());
        assert_rows_close(
            &format!("{}: {slots} slots vs resident", dir.display()),
            &got,
            &want,
        );
    }
}

#[test]
fn streamed_experts_give_the_resident_cpu_and_transformers_tokens() {
    for name in FIXTURES {
        let r = reference(name);
        let c = &r.cases[0];
        check_dir(
            &fixture(name),
            Some(&c.generated_ids),
            &c.prompt_ids,
            &r.eos,
            c.max_new_tokens,
        );
    }
}

#[test]
fn streamed_int4_g32_and_int3_containers_equal_resident_and_cpu() {
    for (name, enc) in [
        ("tiny-causal-f32", "int4-g32"),
        ("tiny-mm-bf16", "int3-g64"),
    ] {
        let dir = convert_experts(name, enc);
        let r = reference(name);
        let c = &r.cases[0];
        check_dir(&dir, None, &c.prompt_ids, &r.eos, c.max_new_tokens);
        // a prompt whose routed experts' prefill runs the GEMM (20 pairs per expert, past every
        // format's gemm_min_pairs)
        let long: Vec<u32> = (0..80u32).map(|k| (k * 37 + 5) % 200).collect();
        check_dir(&dir, None, &long, &r.eos, 4);
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn injected_gpu_failure_mid_generation_keeps_the_reference_tokens() {
    let g = gpu();
    let name = "tiny-causal-f32";
    let r = reference(name);
    let c = &r.cases[0];
    let ck = Checkpoint::open(&fixture(name)).unwrap();
    let w = Weights::load(&ck).unwrap();
    let (k, _) = sizes(&w);
    let layer = w
        .layers
        .iter()
        .position(|l| matches!(l.mlp, Mlp::Moe(_)))
        .unwrap();
    // in the prefill (several tokens at once) and in a decode step
    for pos in [1, c.prompt_ids.len() + 2] {
        let mut m = GpuModel::new(&g, &w, placed(Placement::Slots(k), None)).unwrap();
        m.inject_routed_failure(pos, layer).unwrap();
        let ids = greedy_ids(&mut m, &c.prompt_ids, &r.eos, c.max_new_tokens);
        assert_eq!(ids, c.generated_ids, "failure at position {pos}");
        assert_eq!(m.stream_stats().unwrap().cpu_fallbacks, 1, "position {pos}");
    }
    // a resident model has no streamed layer to fail
    let mut m = GpuModel::new(&g, &w, opts()).unwrap();
    assert!(m.inject_routed_failure(1, layer).is_err());
}

/// A failed layer must not leave the cache believing its slots hold experts that never arrived:
/// with nearly every expert resident, later hits on those experts would silently compute with
/// the slots' old bytes. Teacher-forced logits after the failure match the resident model's.
#[test]
fn a_failed_upload_leaves_no_stale_slot_behind() {
    let g = gpu();
    for name in ["tiny-causal-f32", "tiny-mm-bf16"] {
        let r = reference(name);
        let c = &r.cases[0];
        let ck = Checkpoint::open(&fixture(name)).unwrap();
        let w = Weights::load(&ck).unwrap();
        let (_, total) = sizes(&w);
        let mut seq = c.prompt_ids.clone();
        seq.extend_from_slice(&c.generated_ids);
        let mut resident = GpuModel::new(&g, &w, opts()).unwrap();
        let want: Vec<Vec<f32>> = seq
            .iter()
            .map(|&t| resident.forward(&[t]).unwrap())
            .collect();
        for layer in (0..w.layers.len()).filter(|&i| matches!(w.layers[i].mlp, Mlp::Moe(_))) {
            for slots in [total - 1, total / 2] {
                let mut m = GpuModel::new(&g, &w, placed(Placement::Slots(slots), None)).unwrap();
                m.inject_routed_failure(1, layer).unwrap();
                for (p, &t) in seq.iter().enumerate() {
                    let got = m.forward(&[t]).unwrap();
                    let e = rel_err(&got, &want[p]);
                    assert!(
                        e < 1e-5,
                        "{name}: failure in layer {layer}, {slots} slots: position {p} rel err {e:e}"
                    );
                }
                assert_eq!(m.stream_stats().unwrap().cpu_fallbacks, 1);
            }
        }
    }
}

/// `Placement::GpuMem` (what `--gpu-mem` builds): a budget holding every expert is resident; the
/// resident estimate plus 3.5 slots streams with exactly three, whose teacher-forced logits equal
/// the resident model's within 1e-5 per row; budgets holding no slot, and zero slots, are refused.
#[test]
fn a_budget_that_holds_everything_is_resident_and_a_tiny_one_is_refused() {
    let g = gpu();
    let ck = Checkpoint::open(&fixture("tiny-causal-f32")).unwrap();
    let w = Weights::load(&ck).unwrap();
    let (_, total) = sizes(&w);
    let m = GpuModel::new(&g, &w, placed(Placement::GpuMem(1 << 40), None)).unwrap();
    assert!(m.stream_stats().is_none(), "1 TiB holds every expert");
    let m = GpuModel::new(&g, &w, placed(Placement::Slots(total), None)).unwrap();
    assert!(m.stream_stats().is_none(), "a slot per expert is resident");
    // the resident part plus three slots: streams with exactly three
    let est = GpuModel::resident_bytes_estimate(&w, &opts());
    let slot = GpuModel::slot_bytes(&w);
    let b = est + 3 * slot + slot / 2;
    let mut m = GpuModel::new(&g, &w, placed(Placement::GpuMem(b), None)).unwrap();
    assert_eq!(m.stream_stats().unwrap().slots, 3);
    // the budget's three slots compute the resident model's logits
    let r = reference("tiny-causal-f32");
    let c = &r.cases[0];
    let mut seq = c.prompt_ids.clone();
    seq.extend_from_slice(&c.generated_ids);
    let mut resident = GpuModel::new(&g, &w, opts()).unwrap();
    let want = teacher_logits(&mut resident, &seq, c.prompt_ids.len());
    let got = teacher_logits(&mut m, &seq, c.prompt_ids.len());
    assert_rows_close("a 3-slot byte budget vs resident", &got, &want);
    assert!(m.stream_stats().unwrap().misses > 0);
    let e = GpuModel::new(&g, &w, placed(Placement::GpuMem(1000), None))
        .err()
        .expect("a 1000-byte budget must be refused");
    assert!(format!("{e:#}").contains("holds no expert slot"), "{e:#}");
    let e = GpuModel::new(&g, &w, placed(Placement::Slots(0), None))
        .err()
        .expect("zero slots must be refused");
    assert!(format!("{e:#}").contains("at least 1"), "{e:#}");
}

#[test]
fn the_usage_file_pins_a_hot_set_and_tokens_do_not_change() {
    let g = gpu();
    let name = "tiny-causal-f32";
    let r = reference(name);
    let c = &r.cases[0];
    let dir = fixture(name);
    let ck = Checkpoint::open(&dir).unwrap();
    let w = Weights::load(&ck).unwrap();
    let (k, _) = sizes(&w);
    let fp = usage::fingerprint(&dir).unwrap();
    let (nl, ne) = (w.config.num_hidden_layers, w.config.n_routed_experts);
    let slots = 2 * k + 1;
    let mut m = GpuModel::new(
        &g,
        &w,
        placed(Placement::Slots(slots), Some(Usage::new(&fp, nl, ne))),
    )
    .unwrap();
    let first = greedy_ids(&mut m, &c.prompt_ids, &r.eos, c.max_new_tokens);
    let cold = m.stream_stats().unwrap();
    assert_eq!(cold.pinned, 0);
    let tmp = scratch("usage");
    let path = tmp.join(usage::USAGE_FILE);
    m.usage().unwrap().save(&path).unwrap();
    let hot = usage::load_or_warn(&path, &fp, nl, ne).expect("the file just written");
    assert_eq!(hot.counts, m.usage().unwrap().counts);
    let mut m2 = GpuModel::new(&g, &w, placed(Placement::Slots(slots), Some(hot))).unwrap();
    let second = greedy_ids(&mut m2, &c.prompt_ids, &r.eos, c.max_new_tokens);
    assert_eq!(second, first);
    assert_eq!(second, c.generated_ids);
    let warm = m2.stream_stats().unwrap();
    assert_eq!(warm.pinned, slots / 2, "{warm:?}");
    assert!(warm.startup_bytes > 0);
    // counts accumulate across runs
    let total = |u: &Usage| u.counts.iter().flatten().sum::<u64>();
    assert_eq!(
        total(m2.usage().unwrap()),
        2 * total(m.usage().unwrap()),
        "the second run adds to the loaded counts"
    );
    std::fs::remove_dir_all(&tmp).ok();
}

fn cli(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
        .args(args)
        .env("NODEVICE_SELECT", "1")
        .output()
        .unwrap()
}

#[test]
fn cli_streams_reports_stats_and_survives_a_corrupt_usage_file() {
    let dir = copy_fixture("tiny-causal-f32", "stream-cli");
    let d = dir.to_str().unwrap();
    let base = [
        "generate",
        "--model",
        d,
        "--prompt",
        "Once upon a time",
        "--max-tokens",
        "12",
        "--json",
    ];
    let run = |extra: &[&str]| {
        let mut a: Vec<&str> = base.to_vec();
        a.extend_from_slice(extra);
        let out = cli(&a);
        assert!(
            out.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (v, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (resident, _) = run(&[]);
    assert_eq!(resident["stats"]["experts"]["resident"], true);
    let usage_path = dir.join(usage::USAGE_FILE);
    assert!(!usage_path.exists(), "a resident run writes no usage file");

    let (streamed, err) = run(&["--expert-slots", "2"]);
    assert_eq!(streamed["generated_ids"], resident["generated_ids"]);
    let x = &streamed["stats"]["experts"];
    assert_eq!(x["slots"], 2);
    assert!(x["misses"].as_u64().unwrap() > 0, "{x}");
    assert!(x["bytes_read"].as_u64().unwrap() > 0, "{x}");
    assert!(x["hit_rate"].as_f64().is_some(), "{x}");
    assert!(err.contains("experts: 2 slots"), "{err}");
    assert!(
        usage_path.exists(),
        "the streamed run writes the usage file"
    );

    // a usage file of this model is read (pins) and rewritten with more counts
    let counts = |p: &Path| -> u64 {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
        v["counts"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r.as_array().unwrap())
            .map(|c| c.as_u64().unwrap())
            .sum()
    };
    let before = counts(&usage_path);
    let (again, err) = run(&["--expert-slots", "2"]);
    assert_eq!(again["generated_ids"], resident["generated_ids"]);
    assert!(!err.contains("warning"), "{err}");
    assert_eq!(
        counts(&usage_path),
        2 * before,
        "the second run adds its counts"
    );

    // a corrupt usage file: warned about, ignored, and NOT replaced (it may be the user's)
    std::fs::write(&usage_path, b"{ not json").unwrap();
    let (again, err) = run(&["--expert-slots", "5"]);
    assert_eq!(again["generated_ids"], resident["generated_ids"]);
    assert!(err.contains("warning: ignoring usage file"), "{err}");
    assert!(err.contains("not overwriting it"), "{err}");
    assert_eq!(std::fs::read(&usage_path).unwrap(), b"{ not json");

    // --usage-file naming someone else's file or a directory: never replaced
    let theirs = dir.join("notes.txt");
    std::fs::write(&theirs, b"my notes").unwrap();
    let (again, err) = run(&[
        "--expert-slots",
        "5",
        "--usage-file",
        theirs.to_str().unwrap(),
    ]);
    assert_eq!(again["generated_ids"], resident["generated_ids"]);
    assert!(err.contains("not overwriting it"), "{err}");
    assert_eq!(std::fs::read(&theirs).unwrap(), b"my notes");
    let sub = dir.join("a-directory");
    std::fs::create_dir(&sub).unwrap();
    let (again, err) = run(&["--expert-slots", "5", "--usage-file", sub.to_str().unwrap()]);
    assert_eq!(again["generated_ids"], resident["generated_ids"]);
    assert!(err.contains("not a regular file"), "{err}");
    assert!(sub.is_dir());

    // a dangling *.safetensors link does not stop a streamed run nor its usage file
    #[cfg(unix)]
    {
        let link = dir.join("old-00001.safetensors");
        std::os::unix::fs::symlink(dir.join("gone"), &link).unwrap();
        std::fs::remove_file(&usage_path).unwrap();
        let (again, err) = run(&["--expert-slots", "2"]);
        assert_eq!(again["generated_ids"], resident["generated_ids"]);
        assert!(!err.contains("warning"), "{err}");
        assert!(usage_path.exists());
        std::fs::remove_file(&link).unwrap();
    }

    // a slot count that holds every expert is resident and touches no usage file
    std::fs::remove_file(&usage_path).unwrap();
    let (all, _) = run(&["--expert-slots", "1000000"]);
    assert_eq!(all["stats"]["experts"]["resident"], true);
    assert!(!usage_path.exists());

    // zero slots is refused by the argument parser
    let out = cli(&[
        "generate",
        "--model",
        d,
        "--prompt",
        "x",
        "--expert-slots",
        "0",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--expert-slots"));

    // --gpu-mem in GiB: a huge budget is resident; a bad value is a clear error
    let (big, _) = run(&["--gpu-mem", "1024"]);
    assert_eq!(big["stats"]["experts"]["resident"], true);
    // a budget in GiB of the resident part (as the CLI sizes it) plus 3.5 slots streams with
    // exactly three slots and keeps the tokens (the logits of such a budget: the GpuMem test)
    let ck = Checkpoint::open(&dir).unwrap();
    let w = Weights::load(&ck).unwrap();
    let max_seq = resident["prompt_ids"].as_array().unwrap().len() + 12;
    let est = GpuModel::resident_bytes_estimate(&w, &GpuModelOptions::new(max_seq));
    let slot = GpuModel::slot_bytes(&w);
    let gib = (est + 3 * slot + slot / 2) as f64 / (1u64 << 30) as f64;
    let (budget, _) = run(&["--gpu-mem", &format!("{gib:.12}"), "--usage-file", "off"]);
    assert_eq!(
        budget["stats"]["experts"]["slots"], 3,
        "{}",
        budget["stats"]
    );
    assert_eq!(budget["generated_ids"], resident["generated_ids"]);
    let out = cli(&[
        "generate",
        "--model",
        d,
        "--prompt",
        "x",
        "--gpu-mem",
        "lots",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("positive number of GiB"));

    // --profile while streaming: the upload stall per token, no pretend phase times
    let (prof, err) = run(&[
        "--expert-slots",
        "2",
        "--profile",
        "--peak-gbs",
        "100",
        "--usage-file",
        "off",
    ]);
    assert_eq!(prof["generated_ids"], resident["generated_ids"]);
    assert!(err.contains("upload stall"), "{err}");
    assert!(
        err.contains("per-phase GPU times unavailable while experts stream"),
        "{err}"
    );
    let stall = prof["profile"]["upload_stall_ms_per_token"]
        .as_f64()
        .unwrap();
    assert!(stall >= 0.0 && stall.is_finite(), "{stall}");
    assert!(
        prof["profile"]["phases_ms"].is_null(),
        "{}",
        prof["profile"]
    );

    // the failure hook through the CLI: same tokens, one warning
    let (failed, err) = run(&[
        "--expert-slots",
        "2",
        "--inject-gpu-failure",
        "3:1",
        "--usage-file",
        "off",
    ]);
    assert_eq!(failed["generated_ids"], resident["generated_ids"]);
    assert_eq!(failed["stats"]["experts"]["cpu_fallbacks"], 1);
    assert_eq!(err.matches("recomputing it on the CPU").count(), 1, "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A usage file that passes every check may still rank keys the model cannot pin (counts on a
/// dense layer): they are skipped, the run goes on, the tokens do not change.
#[test]
fn usage_counts_on_a_dense_layer_are_skipped_not_fatal() {
    let g = gpu();
    let name = "tiny-causal-f32";
    let r = reference(name);
    let c = &r.cases[0];
    let dir = fixture(name);
    let ck = Checkpoint::open(&dir).unwrap();
    let w = Weights::load(&ck).unwrap();
    assert!(
        matches!(w.layers[0].mlp, Mlp::Dense(_)),
        "layer 0 of {name} is dense"
    );
    let (k, _) = sizes(&w);
    let (nl, ne) = (w.config.num_hidden_layers, w.config.n_routed_experts);
    let mut u = Usage::new("fp", nl, ne);
    for _ in 0..1000 {
        u.record(0, 0); // the dense layer, ranked first
    }
    u.record(1, 3);
    u.record(2, 5);
    let slots = 2 * k + 2;
    let mut m = GpuModel::new(&g, &w, placed(Placement::Slots(slots), Some(u))).unwrap();
    assert_eq!(
        m.stream_stats().unwrap().pinned,
        2,
        "only the sparse layers' keys"
    );
    let ids = greedy_ids(&mut m, &c.prompt_ids, &r.eos, c.max_new_tokens);
    assert_eq!(ids, c.generated_ids);
}

/// The one-token steps, and the streamed parts a one-token step can have, are built with the
/// model: after the prompt, a decode builds no pipeline (its first step would otherwise wait for
/// the driver's compiler), resident (both the stepwise and the pipelined greedy decode) or
/// streamed through one or two slots. A device of its own, so no other test's pipelines count.
#[test]
fn decoding_builds_no_pipeline() {
    let g = crate::ops_util::gpu();
    let ck = Checkpoint::open(&fixture("tiny-causal-f32")).unwrap();
    let w = Weights::load(&ck).unwrap();
    let prompt = [1, 2, 3, 4, 5];
    for placement in [
        Placement::Resident,
        Placement::Slots(1),
        Placement::Slots(2),
    ] {
        let mut m = GpuModel::new(&g, &w, placed(placement, None)).unwrap();
        let mut id = m.forward_greedy(&prompt).unwrap();
        let before = g.compiles.read();
        for _ in 0..6 {
            id = m.forward_greedy(&[id]).unwrap();
        }
        assert_eq!(
            g.compiles.read().count,
            before.count,
            "{placement:?}: pipelines built by stepwise decode"
        );
        if m.can_stream_greedy() {
            m.reset();
            let mut at_first = None;
            m.greedy_stream(&prompt, 8, &mut |_| {
                at_first.get_or_insert(g.compiles.read().count);
                Ok(true)
            })
            .unwrap();
            assert_eq!(
                Some(g.compiles.read().count),
                at_first,
                "{placement:?}: pipelines built by the pipelined greedy decode"
            );
        }
    }
}
