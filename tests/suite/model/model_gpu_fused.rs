//! The GPU forward with the fused attention block (`Fusions::attention`, the default: one dispatch
//! per layer for the k/v convs, q/k norms, attention and KV write of a one-token step; a prologue
//! plus the attention for prompt chunks) and with the separate kernels, its test oracle:
//! transformers' greedy tokens on every fixture, and teacher-forced logits of prompt + one-token
//! steps within the bounds of `model_gpu_reference` (1e-4 to transformers, 1e-5 to the CPU).
use crate::model_common;
use crate::ops_util::shared_gpu as gpu;
use inkling_wgpu::model::gpu::Fusions;
use inkling_wgpu::model::{Checkpoint, CpuModel, GpuModel, GpuModelOptions, Weights};
use model_common::*;

const MAX_SEQ: usize = 128;

/// Worst relative error of the rows of `a` against `b`, asserting each is below `tol`.
fn assert_rows(a: &[Vec<f32>], b: &[Vec<f32>], tol: f64, what: &str) -> f64 {
    assert_eq!(a.len(), b.len(), "{what}: rows");
    let mut worst = 0f64;
    for (t, (x, y)) in a.iter().zip(b).enumerate() {
        let e = rel_err(x, y);
        worst = worst.max(e);
        assert!(
            e < tol,
            "{what}: position {t} relative error {e:.3e} ≥ {tol:.0e}"
        );
    }
    worst
}

/// A GPU model of `w` with the fused attention (`attention`) or its separate kernels.
fn model<'a>(w: &'a Weights<'a>, attention: bool) -> GpuModel<'a> {
    let opts = GpuModelOptions {
        fusions: Fusions { attention },
        ..GpuModelOptions::new(MAX_SEQ)
    };
    GpuModel::new(&gpu(), w, opts).unwrap()
}

#[test]
fn fused_attention_keeps_the_reference_tokens_and_logits() {
    for name in FIXTURES {
        let ck = Checkpoint::open(&fixture(name)).unwrap();
        let w = Weights::load(&ck).unwrap();
        let r = reference(name);
        let eos = ck.generation.clone().unwrap().eos_token_ids;
        for attention in [true, false] {
            let mut m = model(&w, attention);
            let tag = format!("{name} (fused attention {attention})");
            for (ci, c) in r.cases.iter().enumerate() {
                m.reset();
                check_greedy_case(&mut m, &tag, ci, c, &eos);
                // the argmax-only path, one token per step
                m.reset();
                let mut id = m.forward_greedy(&c.prompt_ids).unwrap();
                let mut ids = vec![id];
                while ids.len() < c.generated_ids.len() {
                    id = m.forward_greedy(&[id]).unwrap();
                    ids.push(id);
                }
                assert_eq!(ids, c.generated_ids, "{tag} case {ci}: forward_greedy");
                // teacher forced: the prompt as one chunk, then one-token steps
                let mut seq = c.prompt_ids.clone();
                seq.extend_from_slice(&c.generated_ids[..c.generated_ids.len() - 1]);
                m.reset();
                let mut got = m.forward_all(&c.prompt_ids).unwrap();
                for &t in &seq[c.prompt_ids.len()..] {
                    got.push(m.forward(&[t]).unwrap());
                }
                let want = reference_logits(name, &c.logits_key);
                let ref_err = assert_rows(&got, &want, 1e-4, &format!("{tag} vs transformers"));
                let cpu = CpuModel::new(&w).forward_all(&seq).unwrap();
                let cpu_err = assert_rows(&got, &cpu, 1e-5, &format!("{tag} vs CPU"));
                eprintln!(
                    "{tag} {} ({} positions): worst rel error vs transformers {ref_err:.3e}, \
                     vs CPU {cpu_err:.3e}",
                    c.logits_key,
                    seq.len()
                );
            }
        }
    }
}

#[test]
fn fused_attention_chunks_and_window_edges_equal_the_cpu() {
    for name in FIXTURES {
        let ck = Checkpoint::open(&fixture(name)).unwrap();
        let w = Weights::load(&ck).unwrap();
        let win = w.config.sliding_window_size;
        let v = w.config.logits_width() as u64;
        let seq: Vec<u32> = (0..3 * win as u64 + 5)
            .map(|i| ((i * 2654435761 + 17) % v) as u32)
            .collect();
        let full = CpuModel::new(&w).forward_all(&seq).unwrap();
        for (attention, sizes) in [
            (true, vec![1]),
            (true, vec![3]),
            (true, vec![win + 1, 1, 2]),
            (true, vec![win - 1, 1]),
            (false, vec![win + 1, 1, 2]),
        ] {
            let mut m = model(&w, attention);
            let mut got = Vec::new();
            let (mut i, mut k) = (0, 0);
            while i < seq.len() {
                let n = sizes[k % sizes.len()].min(seq.len() - i);
                got.extend(m.forward_all(&seq[i..i + n]).unwrap());
                i += n;
                k += 1;
            }
            let tag = format!("{name} chunks {sizes:?} (fused attention {attention})");
            let e = assert_rows(&got, &full, 1e-5, &tag);
            eprintln!("{tag}: worst rel error vs CPU {e:.3e}");
        }
    }
}

#[test]
fn fused_attention_saves_four_dispatches_per_layer() {
    let ck = Checkpoint::open(&fixture(FIXTURES[0])).unwrap();
    let w = Weights::load(&ck).unwrap();
    let mut m = model(&w, true);
    m.forward(&[1, 2]).unwrap();
    // a one-token step records the decode step whose dispatches are counted
    m.forward(&[3]).unwrap();
    let (fused, fused_layers) = m.dispatches_per_step().unwrap();
    let mut m = model(&w, false);
    assert_eq!(m.forward(&[1, 2]).unwrap().len(), w.config.logits_width());
    m.forward(&[3]).unwrap();
    // conv pair, q norm, k norm, attention and KV append become one dispatch per layer
    let layers = w.config.num_hidden_layers;
    let (plain, plain_layers) = m.dispatches_per_step().unwrap();
    eprintln!("{layers} layers: {plain} dispatches per decode step, {fused} fused");
    assert_eq!(fused, plain - 4 * layers);
    for (l, (p, f)) in plain_layers.iter().zip(&fused_layers).enumerate() {
        assert_eq!(*f, p - 4, "layer {l}: dispatches {p} plain, {f} fused");
    }
}

/// The exact dispatches of each layer of a one-token step with the fused attention: the input
/// norm, ONE GEMV for the q, k, v and r projections (row segments into four outputs), the fused
/// attention, o_proj with the residual short conv as its epilogue, the post-attention norm; then
/// a dense MLP
/// (gate_up with the silu·up epilogue, down, × global_scale and conv) or a MoE: with shared
/// experts the router beside the shared gate_up (one dispatch), top-k, the shared down beside the
/// routed GEMV the routed format names (`KernelFormat::shared_down_beside`: the routed gate_up,
/// then the routed down; or the routed gate_up, then the shared down beside the routed down),
/// and the conv of the combine; without them the
/// router, top-k, the routed gate_up and down and the conv.
#[test]
fn decode_step_dispatches_per_layer_are_exact() {
    use inkling_wgpu::model::weights::Mlp;
    for name in FIXTURES {
        let ck = Checkpoint::open(&fixture(name)).unwrap();
        let w = Weights::load(&ck).unwrap();
        let mut m = model(&w, true);
        m.forward(&[1, 2]).unwrap();
        m.forward(&[3]).unwrap();
        let (_, per_layer) = m.dispatches_per_step().unwrap();
        for (li, (l, &got)) in w.layers.iter().zip(&per_layer).enumerate() {
            let attention = 1 + 1 + 1 + 1 + 1;
            let mlp = match &l.mlp {
                // gate_up with silu·up, down, × global_scale, the conv
                Mlp::Dense(_) => 4,
                // the combine is the conv's input
                Mlp::Moe(_) => 5,
            };
            eprintln!("{name} layer {li}: {got} dispatches");
            assert_eq!(got, attention + mlp, "{name} layer {li}");
        }
    }
}
