//! Sequence slots and the decode batch (`BatchForward`): several sequences held at once, one
//! token of each decoded in one step. Each slot's greedy tokens equal the same prompt run alone,
//! its logits stay within the bounds of `model_gpu_reference` (1e-5 to the CPU), on the GPU
//! (resident and with streamed experts) and on the CPU (`CpuSlots`); slots are isolated (a reset
//! or a refill of one leaves the others as they were); bad batches are refused by name.
use crate::model_common;
use crate::ops_util::shared_gpu as gpu;
use inkling_wgpu::model::{
    BatchForward, Checkpoint, CpuModel, CpuSlots, Forward, GpuModel, GpuModelOptions, Placement,
    Weights,
};
use model_common::*;

const MAX_SEQ: usize = 96;

/// The fixtures: the reference ones and the bundled demo model.
fn names() -> Vec<&'static str> {
    let mut v = FIXTURES.to_vec();
    v.push("austen-demo");
    v
}

fn gpu_slots<'a>(w: &'a Weights<'a>, slots: usize, placement: Placement) -> GpuModel<'a> {
    let opts = GpuModelOptions {
        seq_slots: slots,
        placement,
        ..GpuModelOptions::new(MAX_SEQ)
    };
    GpuModel::new(&gpu(), w, opts).unwrap()
}

/// Prompts of different lengths (ids below `vocab`), one per slot.
fn prompts(vocab: u32, n: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            let len = 3 + 5 * i;
            (0..len as u32)
                .map(|j| (7 + 13 * j + 31 * i as u32) % vocab)
                .collect()
        })
        .collect()
}

fn argmax(v: &[f32]) -> u32 {
    inkling_wgpu::model::sampling::argmax(v)
}

/// `steps` greedy tokens after `prompt` fed alone (one token per step), with the logits of each.
fn alone(m: &mut dyn Forward, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    m.reset();
    let mut l = m.forward(prompt).unwrap();
    let (mut ids, mut logits) = (vec![], vec![]);
    for _ in 0..steps {
        let id = argmax(&l);
        ids.push(id);
        l = m.forward(&[id]).unwrap();
        logits.push(l.clone());
    }
    (ids, logits)
}

/// The prompts in slots, decoded together: at step k every slot whose sequence started by then
/// is in the batch (slot i joins at step i, so batches grow from one to all slots and mix
/// positions), `steps` tokens per slot; per slot its greedy ids and logits.
fn batched(
    m: &mut dyn BatchForward,
    prompts: &[Vec<u32>],
    steps: usize,
) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    let n = prompts.len();
    let mut out: Vec<(Vec<u32>, Vec<Vec<f32>>)> = vec![(vec![], vec![]); n];
    let mut last: Vec<Option<Vec<f32>>> = vec![None; n];
    for k in 0..n + steps {
        if k < n {
            m.select(k);
            m.reset();
            last[k] = Some(m.forward(&prompts[k]).unwrap());
        }
        let mut batch = vec![];
        for (s, l) in last.iter().enumerate() {
            if let Some(l) = l {
                if out[s].0.len() < steps {
                    batch.push((s, argmax(l)));
                }
            }
        }
        if batch.is_empty() {
            continue;
        }
        // a different slot order each step
        let r = k % batch.len();
        batch.rotate_left(r);
        let rows = m.decode_batch(&batch).unwrap();
        assert_eq!(rows.len(), batch.len());
        for (&(s, id), row) in batch.iter().zip(rows) {
            out[s].0.push(id);
            out[s].1.push(row.clone());
            last[s] = Some(row);
        }
    }
    for (s, p) in prompts.iter().enumerate() {
        assert_eq!(m.position_of(s), p.len() + steps, "slot {s} position");
    }
    out
}

fn compare(
    tag: &str,
    got: &[(Vec<u32>, Vec<Vec<f32>>)],
    want: &[(Vec<u32>, Vec<Vec<f32>>)],
    tol: f64,
) {
    for (s, ((gi, gl), (wi, wl))) in got.iter().zip(want).enumerate() {
        assert_eq!(gi, wi, "{tag}: slot {s} greedy ids");
        for (k, (a, b)) in gl.iter().zip(wl).enumerate() {
            let e = rel_err(a, b);
            assert!(
                e < tol,
                "{tag}: slot {s} step {k}: relative error {e:.3e} ≥ {tol:.0e}"
            );
        }
    }
}

#[test]
fn gpu_decode_batch_equals_each_sequence_alone() {
    const STEPS: usize = 6;
    for name in names() {
        let ck = Checkpoint::open(&fixture(name)).unwrap();
        let w = Weights::load(&ck).unwrap();
        let ps = prompts(w.config.vocab_size as u32, 4);
        let mut cpu = CpuModel::new(&w);
        let want: Vec<_> = ps.iter().map(|p| alone(&mut cpu, p, STEPS)).collect();
        let mut single = gpu_slots(&w, 1, Placement::Resident);
        let alone_gpu: Vec<_> = ps.iter().map(|p| alone(&mut single, p, STEPS)).collect();
        compare(
            &format!("{name}: GPU alone vs CPU"),
            &alone_gpu,
            &want,
            1e-5,
        );
        let mut m = gpu_slots(&w, 4, Placement::Resident);
        let got = batched(&mut m, &ps, STEPS);
        compare(&format!("{name}: GPU batch vs CPU"), &got, &want, 1e-5);
        // a second round over the same slots: refilled slots start clean
        let ps2: Vec<Vec<u32>> = ps.iter().rev().cloned().collect();
        let want2: Vec<_> = want.iter().rev().cloned().collect();
        let got2 = batched(&mut m, &ps2, STEPS);
        compare(
            &format!("{name}: GPU batch, slots refilled"),
            &got2,
            &want2,
            1e-5,
        );
    }
}

#[test]
fn gpu_decode_batch_with_streamed_experts_equals_resident() {
    const STEPS: usize = 5;
    for name in ["tiny-causal-f32", "austen-demo"] {
        let ck = Checkpoint::open(&fixture(name)).unwrap();
        let w = Weights::load(&ck).unwrap();
        if w.config.n_routed_experts == 0 {
            continue;
        }
        let ps = prompts(w.config.vocab_size as u32, 3);
        let mut cpu = CpuModel::new(&w);
        let want: Vec<_> = ps.iter().map(|p| alone(&mut cpu, p, STEPS)).collect();
        // as few expert slots as a layer's top-k: every batch step streams
        let top_k = w.config.num_experts_per_tok;
        let mut m = gpu_slots(&w, 3, Placement::Slots(top_k * 3));
        assert!(m.stream_stats().is_some(), "{name}: streams");
        let got = batched(&mut m, &ps, STEPS);
        compare(
            &format!("{name}: streamed GPU batch vs CPU"),
            &got,
            &want,
            1e-5,
        );
    }
}

#[test]
fn cpu_slots_decode_batch_equals_each_sequence_alone() {
    const STEPS: usize = 4;
    let ck = Checkpoint::open(&fixture("tiny-causal-f32")).unwrap();
    let w = Weights::load(&ck).unwrap();
    let ps = prompts(w.config.vocab_size as u32, 3);
    let mut cpu = CpuModel::new(&w);
    let want: Vec<_> = ps.iter().map(|p| alone(&mut cpu, p, STEPS)).collect();
    let mut m = CpuSlots::new(CpuModel::new(&w), 3).unwrap();
    let got = batched(&mut m, &ps, STEPS);
    // the CPU decodes a batch one sequence after the other: bit-identical
    compare("CpuSlots", &got, &want, 1e-12);
}

#[test]
fn a_slot_reset_or_refill_leaves_the_other_slots_alone() {
    let ck = Checkpoint::open(&fixture("tiny-causal-f32")).unwrap();
    let w = Weights::load(&ck).unwrap();
    let ps = prompts(w.config.vocab_size as u32, 2);
    let mut cpu = CpuModel::new(&w);
    let (want_ids, want_logits) = alone(&mut cpu, &ps[0], 4);
    let mut m = gpu_slots(&w, 2, Placement::Resident);
    m.select(0);
    let l0 = m.forward(&ps[0]).unwrap();
    let mut id = argmax(&l0);
    let mut ids = vec![];
    for k in 0..4 {
        ids.push(id);
        // slot 1 is refilled with another prompt between every step of slot 0
        m.select(1);
        m.reset();
        m.forward(&ps[1][..2 + k]).unwrap();
        m.select(0);
        let row = m.forward(&[id]).unwrap();
        let e = rel_err(&row, &want_logits[k]);
        assert!(e < 1e-5, "step {k}: relative error {e:.3e}");
        id = argmax(&row);
    }
    assert_eq!(ids, want_ids);
    assert_eq!(m.position_of(1), 2 + 3);
}

#[test]
fn bad_decode_batches_are_refused_by_name() {
    let ck = Checkpoint::open(&fixture("tiny-causal-f32")).unwrap();
    let w = Weights::load(&ck).unwrap();
    let mut m = gpu_slots(&w, 2, Placement::Resident);
    let err =
        |m: &mut GpuModel<'_>, b: &[(usize, u32)]| format!("{:#}", m.decode_batch(b).unwrap_err());
    assert!(err(&mut m, &[]).contains("no tokens"));
    assert!(err(&mut m, &[(0, 1)]).contains("slot 0 holds no sequence"));
    m.select(0);
    m.forward(&[1, 2]).unwrap();
    m.select(1);
    m.forward(&[3]).unwrap();
    assert!(err(&mut m, &[(0, 1), (0, 2)]).contains("slot 0 given twice"));
    assert!(err(&mut m, &[(0, 1), (2, 2)]).contains("slot 2 of a model with 2 slots"));
    let vocab = w.config.vocab_size as u32;
    assert!(err(&mut m, &[(0, 1), (1, vocab)]).contains(&format!("{vocab}")));
    // nothing was fed by the refused batches
    assert_eq!((m.position_of(0), m.position_of(1)), (2, 1));
    let opts = GpuModelOptions {
        seq_slots: 0,
        ..GpuModelOptions::new(MAX_SEQ)
    };
    let e = GpuModel::new(&gpu(), &w, opts)
        .err()
        .expect("zero slots refused");
    assert!(
        format!("{e:#}").contains("at least one sequence slot"),
        "{e:#}"
    );
}
