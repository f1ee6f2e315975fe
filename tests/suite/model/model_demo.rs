//! The bundled demo model (`tests/fixtures/austen-demo`: an Inkling trained on Jane Austen, shipped
//! as a container with int4-g64 routed experts and bf16 elsewhere) against transformers 5.24.0 run
//! on the container's decoded values (tools/make_demo_model.py): greedy continuations through EOS
//! on CPU and GPU, teacher-forced logits at the stored positions (1e-4 relative to transformers,
//! GPU 1e-5 to CPU), the tokenizer on the held-out text as Python encodes it, and the README's
//! first command printing readable English on both devices. GPU tests need an adapter (lavapipe
//! on CI); without one they FAIL, they never skip.
use crate::model_common;
use crate::ops_util::shared_gpu as gpu;
use inkling_wgpu::formats::Format;
use inkling_wgpu::model::weights::Mlp;
use inkling_wgpu::model::{Checkpoint, CpuModel, GpuModel, GpuModelOptions, Weights};
use model_common::*;

const DEMO: &str = "austen-demo";
/// Longest reference sequence (prompt + continuation) is below this.
const MAX_SEQ: usize = 160;

/// Positions whose teacher-forced rows reference.safetensors keeps, per case.
fn logits_positions() -> Vec<Vec<usize>> {
    let text = std::fs::read_to_string(fixture(DEMO).join("reference.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            ids(&c["logits_positions"])
                .into_iter()
                .map(|p| p as usize)
                .collect()
        })
        .collect()
}

/// One case's teacher-forced input and transformers' rows at the kept positions.
struct TeacherForced {
    /// Prompt + continuation without its last token.
    seq: Vec<u32>,
    /// Positions whose rows reference.safetensors keeps.
    pos: Vec<usize>,
    /// Transformers' logits at those positions, `[pos.len()][logits_width]`.
    want: Vec<Vec<f32>>,
}

fn teacher_forced_cases() -> Vec<TeacherForced> {
    let r = reference(DEMO);
    r.cases
        .iter()
        .zip(logits_positions())
        .map(|(c, pos)| {
            let mut seq = c.prompt_ids.clone();
            seq.extend_from_slice(&c.generated_ids[..c.generated_ids.len() - 1]);
            let want = reference_logits(DEMO, &c.logits_key);
            assert_eq!(want.len(), pos.len(), "{}: stored rows", c.logits_key);
            assert!(seq.len() < MAX_SEQ);
            TeacherForced { seq, pos, want }
        })
        .collect()
}

fn worst_rel_err(got: &[Vec<f32>], pos: &[usize], want: &[Vec<f32>], tol: f64, what: &str) -> f64 {
    let mut worst = 0f64;
    for (&p, w) in pos.iter().zip(want) {
        assert_eq!(got[p].len(), w.len(), "{what}: width at {p}");
        let e = rel_err(&got[p], w);
        worst = worst.max(e);
        assert!(
            e < tol,
            "{what}: position {p} relative error {e:.3e} ≥ {tol:.0e}"
        );
    }
    worst
}

#[test]
fn demo_is_the_default_model_and_a_quantised_container() {
    assert_eq!(inkling_wgpu::bundled_model_dir(), fixture(DEMO));
    let ck = Checkpoint::open(&fixture(DEMO)).unwrap();
    let w = Weights::load(&ck).unwrap();
    let r = reference(DEMO);
    assert_eq!(ck.generation.clone().unwrap().eos_token_ids, r.eos);
    assert_eq!(w.config.logits_width(), r.logits_width);
    let c = &w.config;
    assert!(
        c.sliding_window_size < 512,
        "window shorter than the trained context"
    );
    let mut sparse = 0;
    for l in &w.layers {
        if let Mlp::Moe(moe) = &l.mlp {
            sparse += 1;
            for e in &moe.experts {
                assert_eq!(e.gate.enc.format, Format::Int4Grouped);
                assert_eq!(e.gate.enc.group_size, 64);
            }
            assert!(!moe.shared.is_empty());
            assert_eq!(moe.shared[0].up.enc.format, Format::Bf16);
        }
    }
    assert!(
        sparse >= 1 && sparse < w.layers.len(),
        "a dense layer before the sparse ones"
    );
    assert_eq!(w.layers[0].attn.q.enc.format, Format::Bf16);
}

#[test]
fn cpu_matches_transformers_on_the_demo() {
    let ck = Checkpoint::open(&fixture(DEMO)).unwrap();
    let w = Weights::load(&ck).unwrap();
    let r = reference(DEMO);
    assert_eq!(r.cases[0].finish_reason, "eos");
    let mut m = CpuModel::new(&w);
    for (ci, c) in r.cases.iter().enumerate() {
        m.reset();
        check_greedy_case(&mut m, DEMO, ci, c, &r.eos);
    }
    for (ci, TeacherForced { seq, pos, want }) in teacher_forced_cases().iter().enumerate() {
        let got = CpuModel::new(&w).forward_all(seq).unwrap();
        let e = worst_rel_err(&got, pos, want, 1e-4, &format!("demo case {ci} CPU"));
        eprintln!(
            "demo case {ci} ({} positions): CPU vs transformers {e:.3e}",
            seq.len()
        );
    }
}

#[test]
fn gpu_matches_transformers_and_cpu_on_the_demo() {
    let gpu = gpu();
    let ck = Checkpoint::open(&fixture(DEMO)).unwrap();
    let w = Weights::load(&ck).unwrap();
    let r = reference(DEMO);
    let mut m = GpuModel::new(&gpu, &w, GpuModelOptions::new(MAX_SEQ)).unwrap();
    for (ci, c) in r.cases.iter().enumerate() {
        m.reset();
        check_greedy_case(&mut m, DEMO, ci, c, &r.eos);
    }
    for (ci, TeacherForced { seq, pos, want }) in teacher_forced_cases().iter().enumerate() {
        m.reset();
        let got = m.forward_all(seq).unwrap();
        let e = worst_rel_err(&got, pos, want, 1e-4, &format!("demo case {ci} GPU"));
        let cpu = CpuModel::new(&w).forward_all(seq).unwrap();
        let all: Vec<usize> = (0..seq.len()).collect();
        let ec = worst_rel_err(
            &got,
            &all,
            &cpu,
            1e-5,
            &format!("demo case {ci} GPU vs CPU"),
        );
        eprintln!("demo case {ci}: GPU vs transformers {e:.3e}, vs CPU {ec:.3e}");
    }
}

#[test]
fn tokenizer_matches_python_on_the_heldout_text() {
    let dir = fixture(DEMO);
    let tok = inkling_wgpu::model::text::load_tokenizer(&dir)
        .unwrap()
        .unwrap();
    let text = std::fs::read_to_string(dir.join("heldout-test.txt")).unwrap();
    let want: Vec<u32> = std::fs::read(dir.join("heldout-test.u16"))
        .unwrap()
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as u32)
        .collect();
    let got = tok.encode(text.as_str(), false).unwrap();
    assert_eq!(
        got.get_ids(),
        &want[..],
        "held-out ids differ from Python's"
    );
    assert_eq!(
        tok.decode(&want, false).unwrap(),
        text,
        "decode(encode(text)) != text"
    );
    for (t, ids_py, decoded) in reference(DEMO).tokenizer_roundtrip {
        let ids = tok.encode(t.as_str(), false).unwrap().get_ids().to_vec();
        assert_eq!(ids, ids_py, "{t:?}");
        assert_eq!(tok.decode(&ids, false).unwrap(), decoded, "{t:?}");
    }
    // Inkling's chat specials, by name, as special tokens (skipped by a decode that skips them).
    let required = inkling_wgpu::chat::specials::REQUIRED.iter().map(|r| r.0);
    for name in std::iter::once("<|endoftext|>").chain(required) {
        let id = tok
            .token_to_id(name)
            .unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(
            tok.decode(&[id], true).unwrap(),
            "",
            "{name} is not special"
        );
    }
}

/// The README's first command (`generate --prompt "Once upon a time"`, the bundled model) on
/// `device`: transformers' greedy continuation, readable text, no replacement characters.
fn readme_command(device: &str) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
        .args([
            "generate",
            "--prompt",
            "Once upon a time",
            "--device",
            device,
            // greedy, to compare with transformers (the model's generation_config.json samples)
            "--temperature",
            "0",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{device}: {stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        !stdout.contains('\u{fffd}'),
        "{device}: replacement character in {stdout:?}"
    );
    let r = reference(DEMO);
    let c = &r.cases[2];
    assert_eq!(c.prompt_ids.len(), 5);
    let tok = inkling_wgpu::model::text::load_tokenizer(&fixture(DEMO))
        .unwrap()
        .unwrap();
    // `generate` prints special tokens as text (the demo now knows the chat format's)
    let want = tok.decode(&c.generated_ids, false).unwrap();
    assert!(
        stdout.starts_with(want.as_str()),
        "{device}: {stdout:?} does not start with transformers' {want:?}"
    );
    let words = stdout.split_whitespace().count();
    let letters = stdout.chars().filter(|ch| ch.is_ascii_alphabetic()).count();
    assert!(words >= 20, "{device}: {stdout:?}");
    assert!(
        letters * 10 >= stdout.len() * 7,
        "{device}: mostly letters: {stdout:?}"
    );
}

#[test]
fn readme_first_command_prints_english_on_cpu() {
    readme_command("cpu");
}

#[test]
fn readme_first_command_prints_english_on_gpu() {
    readme_command("gpu");
}
