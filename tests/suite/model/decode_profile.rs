//! Decode profiling (`GpuModel::start_profile`, `generate --profile`, `bench decode`): profile
//! mode chooses the same tokens and logits as the single-pass step, phase times are non-negative
//! and sum to at most the step's GPU span, `bench decode --json` has every key, and its
//! bytes_per_token equals a count by hand. No speed thresholds. Needs a GPU adapter (lavapipe on
//! CI); fails without one.
use crate::model_common;
use crate::ops_util::shared_gpu as gpu;
use inkling_wgpu::formats::QMatrix;
use inkling_wgpu::model::weights::{Ffn, Mlp};
use inkling_wgpu::model::{Checkpoint, GpuModel, GpuModelOptions, Weights};
use model_common::*;
use std::process::Command;

fn greedy_run(m: &mut GpuModel, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    m.reset();
    let mut id = m.forward_greedy(prompt).unwrap();
    let mut ids = vec![id];
    let mut logits = Vec::new();
    for _ in 0..steps {
        // alternate the argmax-only step and the logits step, both one token
        if ids.len() % 2 == 0 {
            let l = m.forward(&[id]).unwrap();
            id = inkling_wgpu::model::sampling::argmax(&l);
            logits.push(l);
        } else {
            id = m.forward_greedy(&[id]).unwrap();
        }
        ids.push(id);
    }
    (ids, logits)
}

#[test]
fn profile_mode_keeps_tokens_and_phases_add_up() {
    let gpu = gpu();
    for name in FIXTURES {
        let ck = Checkpoint::open(&fixture(name)).unwrap();
        let w = Weights::load(&ck).unwrap();
        let mut m = GpuModel::new(&gpu, &w, GpuModelOptions::new(64)).unwrap();
        let prompt: Vec<u32> = (0..7).map(|i| (i * 37 + 5) % 300).collect();
        let steps = 12;
        let (ids, logits) = greedy_run(&mut m, &prompt, steps);
        m.start_profile();
        let (ids_p, logits_p) = greedy_run(&mut m, &prompt, steps);
        let p = m.take_profile().unwrap();
        assert_eq!(ids, ids_p, "{name}: profile mode changed the tokens");
        assert_eq!(logits, logits_p, "{name}: profile mode changed the logits");
        assert_eq!(p.steps, steps, "{name}: decode steps counted");
        let want_bytes: f64 = (0..steps)
            .map(|k| m.decode_bytes(prompt.len() + k) as f64)
            .sum();
        assert_eq!(
            p.bytes_sum, want_bytes,
            "{name}: bytes summed over the steps"
        );
        assert_eq!(gpu.has_timestamps(), p.phase_s.is_some());
        if let (Some(ph), Some(span)) = (p.phase_s, p.span_s) {
            assert!(ph.iter().all(|&x| x >= 0.0), "{name}: {ph:?}");
            let sum: f64 = ph.iter().sum();
            assert!(span > 0.0, "{name}: span {span}");
            assert!(
                sum <= span * (1.0 + 1e-9),
                "{name}: phases {sum} s > span {span} s"
            );
            let ms = p.phase_ms().unwrap();
            let total = p.total_ms().unwrap();
            assert!(ms.iter().sum::<f64>() <= total * (1.0 + 1e-9));
        }
        // out of profile mode nothing is counted
        greedy_run(&mut m, &prompt, 2);
        assert_eq!(m.take_profile().unwrap().steps, 0);
    }
}

fn mat_bytes(m: &QMatrix<'_>) -> u64 {
    (m.data.len() + 4 * m.scales.len()) as u64
}

fn ffn_bytes(f: &Ffn<'_>) -> u64 {
    mat_bytes(&f.gate) + mat_bytes(&f.up) + mat_bytes(&f.down)
}

/// Bytes a one-token step at position `pos` reads, counted from the checkpoint's tensors.
fn bytes_by_hand(w: &Weights<'_>, pos: usize) -> u64 {
    let c = &w.config;
    let hid = c.hidden_size as u64;
    let k1 = c.conv_kernel_size as u64 - 1;
    assert_eq!(
        w.embed.data.len() as u64,
        c.vocab_size as u64 * hid * 4,
        "f32 table"
    );
    let head = w.lm_head.rows_view(0, c.logits_width());
    let mut b = 4 * hid // one embedding row
        + 4 * w.embed_norm.len() as u64
        + 4 * w.norm.len() as u64
        + mat_bytes(&head);
    for l in &w.layers {
        let a = &l.attn;
        let kvd = a.geom.kv_dim() as u64;
        b += 4 * (l.input_norm.len() + l.post_attn_norm.len()) as u64;
        b += [&a.q, &a.k, &a.v, &a.r, &a.o]
            .into_iter()
            .map(mat_bytes)
            .sum::<u64>();
        b += 4 * (a.q_norm.len() + a.k_norm.len() + a.rel_proj.len()) as u64;
        b += 4
            * (a.k_sconv.w.len() + a.v_sconv.w.len() + l.attn_sconv.w.len() + l.mlp_sconv.w.len())
                as u64;
        b += 4 * k1 * (2 * kvd + 2 * hid); // conv states
        b += match &l.mlp {
            Mlp::Dense(d) => ffn_bytes(&d.ffn),
            Mlp::Moe(m) => {
                mat_bytes(&m.router)
                    + 4 * m.router_bias.len() as u64
                    + m.top_k as u64 * ffn_bytes(&m.experts[0])
                    + m.shared.iter().map(ffn_bytes).sum::<u64>()
            }
        };
        let cap = a.geom.window.unwrap_or(usize::MAX) as u64;
        b += 2 * (pos as u64 + 1).min(cap) * kvd * 4; // K and V entries attended over
    }
    b
}

fn run_cli(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_inkling-wgpu"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: exit {:?}, stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?}: not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn bench_decode_json_has_every_key_and_bytes_match_a_count_by_hand() {
    let dir = fixture("tiny-causal-f32");
    let tokens = 9;
    for extra in [&["--peak-gbs", "100"][..], &["--copy-mib", "4"][..]] {
        let mut args = vec![
            "bench",
            "decode",
            "--model",
            dir.to_str().unwrap(),
            "--tokens",
            "9",
            "--json",
        ];
        args.extend_from_slice(extra);
        let v = run_cli(&args);
        for k in [
            "adapter",
            "model",
            "decode_tok_s",
            "roofline_tok_s",
            "frac_roofline",
            "bytes_per_token",
            "phases_ms",
            "copy_gbs",
        ] {
            assert!(v.get(k).is_some(), "bench decode --json lacks {k}: {v}");
        }
        assert_eq!(v["tokens_match"], true);
        assert_eq!(v["decode_steps"], tokens);
        // dispatches: the step is the fixed ones (embedding, head) plus the layers'
        let d = &v["dispatches"];
        let n = |k: &str| {
            d[k].as_u64()
                .unwrap_or_else(|| panic!("dispatches.{k}: {d}"))
        };
        let per_layer = d["per_layer"].as_f64().unwrap();
        let ck = Checkpoint::open(&dir).unwrap();
        assert_eq!(n("layers") as usize, ck.config.num_hidden_layers);
        assert!(n("fixed") >= 2 && per_layer >= 1.0, "{d}");
        let in_layers = (n("per_step") - n("fixed")) as f64;
        assert!(
            (in_layers - per_layer * n("layers") as f64).abs() < 1e-9,
            "{d}"
        );
        // host time per step = record + finish + submit, against the GPU's busy time per step
        let h = &v["host_ms_per_step"];
        let hf = |k: &str| h[k].as_f64().unwrap();
        let host = hf("record") + hf("finish") + hf("submit");
        assert!((hf("record_finish_submit") - host).abs() <= 1e-12 * host.max(1.0));
        match v["steps_gpu"]["busy_ms"].as_f64() {
            Some(busy) => {
                assert_eq!(v["gpu_busy_ms_per_step"].as_f64(), Some(busy));
                assert_eq!(v["host_below_gpu"], host < busy);
            }
            None => assert!(v["host_below_gpu"].is_null()),
        }
        let f = |k: &str| v[k].as_f64().unwrap();
        assert!(f("decode_tok_s") > 0.0 && f("copy_gbs") > 0.0);
        assert!(
            (f("roofline_tok_s") - f("copy_gbs") * 1e9 / f("bytes_per_token")).abs()
                < 1e-6 * f("roofline_tok_s")
        );
        assert!((f("frac_roofline") - f("decode_tok_s") / f("roofline_tok_s")).abs() < 1e-9);
        if extra[0] == "--peak-gbs" {
            assert_eq!(f("copy_gbs"), 100.0);
        }
        if v["timestamps"] == true {
            let ph = v["phases_ms"].as_object().unwrap();
            for k in [
                "attention",
                "router",
                "routed_experts",
                "shared_experts",
                "head",
                "other",
            ] {
                let x = ph[k].as_f64().unwrap();
                assert!(x >= 0.0, "{k}: {x}");
            }
            let sum: f64 = ph.values().map(|x| x.as_f64().unwrap()).sum();
            assert!(sum <= f("gpu_ms_per_token") * (1.0 + 1e-9));
        }

        // by hand: the probe prompt has 16 tokens, decode step k feeds position 16 + k
        let ck = Checkpoint::open(&dir).unwrap();
        let w = Weights::load(&ck).unwrap();
        let want: u64 = (0..tokens).map(|k| bytes_by_hand(&w, 16 + k)).sum();
        assert_eq!(
            f("bytes_per_token"),
            want as f64 / tokens as f64,
            "bytes_per_token"
        );
    }
}

#[test]
fn generate_profile_keeps_the_reference_tokens() {
    let name = "tiny-mm-bf16";
    let r = reference(name);
    let c = &r.cases[0];
    let arg = c
        .prompt_ids
        .iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let dir = fixture(name);
    let v = run_cli(&[
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        &arg,
        "--temperature",
        "0",
        "--json",
        "--profile",
        "--peak-gbs",
        "50",
    ]);
    assert_eq!(ids(&v["generated_ids"]), c.generated_ids);
    let p = &v["profile"];
    assert_eq!(p["copy_gbs"], 50.0);
    assert!(p["bytes_per_token"].as_f64().unwrap() > 0.0);
    assert_eq!(
        p["decode_steps"].as_u64().unwrap() as usize,
        c.generated_ids.len() - 1
    );
}

#[test]
fn host_times_count_the_one_token_steps() {
    let gpu = gpu();
    for name in FIXTURES {
        let ck = Checkpoint::open(&fixture(name)).unwrap();
        let w = Weights::load(&ck).unwrap();
        let mut m = GpuModel::new(&gpu, &w, GpuModelOptions::new(64)).unwrap();
        let prompt: Vec<u32> = (0..9).map(|i| (i * 53 + 11) % 300).collect();
        greedy_run(&mut m, &prompt, 10);
        m.reset_host_times();
        greedy_run(&mut m, &prompt, 10);
        let h = m.host_times();
        assert_eq!(h.steps, 10, "{name}: one-token steps counted");
        assert!(
            h.record_s > 0.0 && h.finish_s > 0.0 && h.submit_s > 0.0,
            "{name}: {h:?}"
        );
    }
    let v = run_cli(&[
        "bench",
        "decode",
        "--tokens",
        "6",
        "--peak-gbs",
        "100",
        "--json",
    ]);
    assert_eq!(v["tokens_match"], true);
    for k in ["record", "finish", "submit", "wait_for_id"] {
        let x = v["host_ms_per_step"][k].as_f64().unwrap_or(-1.0);
        assert!(x >= 0.0 && x.is_finite(), "{k}: {x}");
    }
}

#[test]
fn step_dispatches_count_the_recorded_one_token_step() {
    let gpu = gpu();
    let ck = Checkpoint::open(&fixture("tiny-mm-bf16")).unwrap();
    let w = Weights::load(&ck).unwrap();
    let mut m = GpuModel::new(&gpu, &w, GpuModelOptions::new(64)).unwrap();
    // the one-token steps are recorded with the model (their pipelines are built before a decode)
    let at_load = m
        .step_dispatches()
        .expect("the one-token step is recorded with the model");
    let id = m.forward_greedy(&[1, 2, 3]).unwrap();
    assert_eq!(
        m.step_dispatches(),
        Some(at_load),
        "a 3-token step changes nothing"
    );
    m.start_op_profile().unwrap();
    m.forward_greedy(&[id]).unwrap();
    let ops = m.take_op_profile();
    let d = m.step_dispatches().expect("a one-token step was recorded");
    assert_eq!(d.layers, ck.config.num_hidden_layers);
    // every recorded kernel is at least one dispatch; a GEMV over chunks is several
    let calls: u64 = ops.ops.iter().map(|o| o.2).sum();
    assert_eq!(ops.steps, 1);
    assert!(d.step as u64 >= calls && calls > 0, "{d:?}, {calls} calls");
    assert!(d.fixed >= 2 && d.fixed < d.step, "{d:?}");
    assert_eq!(d.per_layer(), (d.step - d.fixed) as f64 / d.layers as f64);
}
