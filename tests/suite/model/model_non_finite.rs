//! Numbers that would turn into plausible garbage: router logits that underflow or saturate give
//! transformers' tokens (`tiny-router-extremes`), and a NaN that enters the forward pass stops
//! generation with an error naming the position (and the router's layer), on CPU and GPU, in the
//! prefill and in the pipelined decode. Damaged copies live in scratch directories.
use crate::model_common;
use crate::ops_util::shared_gpu as gpu;
use inkling_wgpu::model::generate::generate;
use inkling_wgpu::model::{Checkpoint, CpuModel, Forward, GpuModel, GpuModelOptions, Weights};
use model_common::*;
use std::path::Path;

const EXTREMES: &str = "tiny-router-extremes";

#[test]
fn router_logits_that_underflow_and_saturate_give_transformers_tokens() {
    // layer 0: every router sigmoid is 0 in f32 (sigmoid / sum would be 0/0); layer 1: every one is 1
    let ck = Checkpoint::open(&fixture(EXTREMES)).unwrap();
    let w = Weights::load(&ck).unwrap();
    let r = reference(EXTREMES);
    let gpu = gpu();
    let mut cpu = CpuModel::new(&w);
    let mut g = GpuModel::new(&gpu, &w, GpuModelOptions::new(64)).unwrap();
    for (ci, c) in r.cases.iter().enumerate() {
        check_greedy_case(&mut cpu, EXTREMES, ci, c, &r.eos);
        check_greedy_case(&mut g, EXTREMES, ci, c, &r.eos);
        g.reset();
        let mut id = g.forward_greedy(&c.prompt_ids).unwrap();
        let mut ids = vec![id];
        while ids.len() < c.generated_ids.len() {
            id = g.forward_greedy(&[id]).unwrap();
            ids.push(id);
        }
        assert_eq!(ids, c.generated_ids, "{EXTREMES} case {ci}: forward_greedy");
    }
}

/// The error of a greedy generation of `prompt` on `m` (panics if it succeeds).
fn gen_err(m: &mut dyn Forward, prompt: &[u32], max: usize) -> String {
    match generate(m, prompt, &greedy(vec![], max), &mut |_| Ok(())) {
        Ok(o) => panic!(
            "{}: generated {:?} from a damaged model",
            m.backend(),
            o.generated_ids
        ),
        Err(e) => e.to_string(),
    }
}

/// The error of the logits-returning path (`forward`) on `prompt`.
fn forward_err(m: &mut dyn Forward, prompt: &[u32]) -> String {
    m.reset();
    match m.forward(prompt) {
        Ok(_) => panic!("{}: logits from a damaged model", m.backend()),
        Err(e) => e.to_string(),
    }
}

/// Run `check` on the CPU and on the GPU model of `dir`.
fn on_both(dir: &Path, check: impl Fn(&mut dyn Forward)) {
    let ck = Checkpoint::open(dir).unwrap();
    let w = Weights::load(&ck).unwrap();
    check(&mut CpuModel::new(&w));
    let gpu = gpu();
    check(&mut GpuModel::new(&gpu, &w, GpuModelOptions::new(64)).unwrap());
}

fn router_msg(position: usize, layer: usize) -> String {
    format!(
        "non-finite value in the forward pass at position {position}: the router logits of layer \
         {layer} hold a NaN or an Inf (damaged weights or activations; `inkling-wgpu info --verify` \
         scans every tensor of the model)"
    )
}

fn logit_msg(position: usize) -> String {
    format!(
        "non-finite logit at position {position}: the output logits hold a NaN or an Inf (damaged \
         weights or activations; `inkling-wgpu info --verify` scans every tensor of the model)"
    )
}

#[test]
fn nan_in_an_embedding_row_stops_at_its_position_and_first_sparse_layer() {
    // tiny-causal-f32: layer 0 dense, layers 1..3 sparse; token 99's embedding row holds a NaN, so
    // position 3 of the prompt (and every later one, through attention) is NaN from layer 0 on and
    // the first router to see it is layer 1's
    let dir = copy_fixture("tiny-causal-f32", "nan-embed");
    poke_f32(
        &dir.join("model.safetensors"),
        "model.embed_tokens.weight",
        99 * 64 + 5,
        f32::NAN,
    );
    let prompt = [5u32, 6, 7, 99, 8, 9];
    on_both(&dir, |m| {
        let want = router_msg(3, 1);
        assert_eq!(gen_err(m, &prompt, 4), want, "{}: generate", m.backend());
        assert_eq!(forward_err(m, &prompt), want, "{}: forward", m.backend());
        // one token per call: the call that feeds position 3 reports it
        m.reset();
        let mut err = None;
        for &t in &prompt {
            if let Err(e) = m.forward(&[t]) {
                err = Some(e.to_string());
                break;
            }
        }
        assert_eq!(
            err.as_deref(),
            Some(&want[..]),
            "{}: one by one",
            m.backend()
        );
    });
    // a generated token whose row is damaged: the pipelined GPU decode names its position
    let r = reference("tiny-causal-f32");
    let c = &r.cases[1];
    let bad = c.generated_ids[3];
    assert!(!c.prompt_ids.contains(&bad) && !c.generated_ids[..3].contains(&bad));
    let dir = copy_fixture("tiny-causal-f32", "nan-embed-decode");
    poke_f32(
        &dir.join("model.safetensors"),
        "model.embed_tokens.weight",
        bad as usize * 64,
        f32::INFINITY,
    );
    on_both(&dir, |m| {
        assert_eq!(
            gen_err(m, &c.prompt_ids, 16),
            router_msg(c.prompt_ids.len() + 3, 1),
            "{}: decode",
            m.backend()
        );
    });
}

#[test]
fn nan_in_the_head_stops_at_the_logits() {
    // a NaN in lm_head row 17: routers are clean, logit 17 of every position is NaN
    let dir = copy_fixture("tiny-causal-f32", "nan-head");
    poke_f32(
        &dir.join("model.safetensors"),
        "lm_head.weight",
        17 * 64 + 3,
        f32::NAN,
    );
    let prompt = [5u32, 6, 7, 8];
    on_both(&dir, |m| {
        assert_eq!(
            gen_err(m, &prompt, 4),
            logit_msg(3),
            "{}: generate",
            m.backend()
        );
        assert_eq!(
            forward_err(m, &prompt),
            logit_msg(3),
            "{}: forward",
            m.backend()
        );
    });
}
