//! The engine's continuous batching (`serve::engine::run` over a `BatchForward` with 4 slots):
//! seven requests queued at once (greedy, sampled with a seed, with penalties, with
//! log-probabilities; prompts and lengths of every size) are decoded in shared steps of up to 4
//! tokens, slots freed by finished requests are refilled, and every request's ids (and its
//! log-probabilities) equal the same request run alone through `generate` on a fresh model. A
//! request that extends a finished one's sequence reuses its slot's prefix. On the CPU
//! (`CpuSlots`, bit-identical) and on the GPU (`GpuModel` with 4 sequence slots against the GPU
//! alone).
use crate::chat_common::{chat_model, tokenizer_and_renderer};
use crate::ops_util::shared_gpu as gpu;
use inkling_wgpu::model::batch::{BatchForward, CpuSlots};
use inkling_wgpu::model::generate::{
    generate_continue_with, GenerateParams, LogitOptions, StepLogprobs,
};
use inkling_wgpu::model::sampling::SamplingParams;
use inkling_wgpu::model::{
    Checkpoint, CpuModel, Forward, GpuModel, GpuModelOptions, StreamStats, Weights,
};
use inkling_wgpu::serve::engine::{self, Event, Job, JobKind, Shared};
use std::sync::mpsc::sync_channel;

const SLOTS: usize = 4;
const MAX_SEQ: usize = 128;

/// Records the size of every decode step: a decode batch, or a one-token `forward_greedy` (the
/// engine's path for one request alone that needs only the argmax).
struct Counting<'m> {
    inner: &'m mut dyn BatchForward,
    sizes: Vec<usize>,
}

impl Forward for Counting<'_> {
    fn forward(&mut self, t: &[u32]) -> anyhow::Result<Vec<f32>> {
        self.inner.forward(t)
    }
    fn forward_all(&mut self, t: &[u32]) -> anyhow::Result<Vec<Vec<f32>>> {
        self.inner.forward_all(t)
    }
    fn forward_greedy(&mut self, t: &[u32]) -> anyhow::Result<u32> {
        // every prompt of these tests has at least two tokens
        if t.len() == 1 {
            self.sizes.push(1);
        }
        self.inner.forward_greedy(t)
    }
    fn reset(&mut self) {
        self.inner.reset()
    }
    fn position(&self) -> usize {
        self.inner.position()
    }
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn adapter(&self) -> String {
        self.inner.adapter()
    }
    fn stream_stats(&self) -> Option<StreamStats> {
        self.inner.stream_stats()
    }
}

impl BatchForward for Counting<'_> {
    fn slots(&self) -> usize {
        self.inner.slots()
    }
    fn select(&mut self, s: usize) {
        self.inner.select(s)
    }
    fn selected(&self) -> usize {
        self.inner.selected()
    }
    fn position_of(&self, s: usize) -> usize {
        self.inner.position_of(s)
    }
    fn decode_batch(&mut self, b: &[(usize, u32)]) -> anyhow::Result<Vec<Vec<f32>>> {
        self.sizes.push(b.len());
        self.inner.decode_batch(b)
    }
}

/// One request: prompt, parameters, logit options.
struct Case {
    prompt: Vec<u32>,
    params: GenerateParams,
    logit: LogitOptions,
}

/// Seven requests of different prompt lengths and answer lengths; no stop ids (each runs to its
/// length), so the batch shrinks and refills on schedule.
fn cases(vocab: u32) -> Vec<Case> {
    let sampling = |t: f32| SamplingParams {
        temperature: t,
        top_k: 20,
        ..SamplingParams::default()
    };
    (0..7)
        .map(|i| {
            let len = 2 + 7 * i;
            let prompt = (0..len as u32)
                .map(|j| (5 + 11 * j + 37 * i as u32) % vocab)
                .collect();
            let mut s = if i % 3 == 1 {
                sampling(0.9)
            } else {
                SamplingParams::default()
            };
            if i == 2 {
                s.repeat_penalty = 1.3;
                s.presence_penalty = 0.5;
            }
            Case {
                prompt,
                params: GenerateParams {
                    max_new_tokens: 6 + 5 * (i % 4),
                    sampling: s,
                    seed: 100 + i as u64,
                    eos_ids: vec![],
                },
                logit: LogitOptions {
                    bias: if i == 4 { vec![(3, 2.5)] } else { vec![] },
                    logprobs: (i == 3).then_some(3),
                },
            }
        })
        .collect()
}

/// The ids and log-probabilities of `c` run alone on a fresh `model`.
fn alone(model: &mut dyn Forward, c: &Case) -> (Vec<u32>, Vec<StepLogprobs>) {
    model.reset();
    let mut lps = Vec::new();
    let out = generate_continue_with(model, &[], &c.prompt, &c.params, &c.logit, &mut |_, lp| {
        lps.extend(lp.cloned());
        Ok(())
    })
    .unwrap();
    (out.generated_ids, lps)
}

/// What one request got back: its ids, its log-probabilities (chosen id's), cached tokens.
struct Got {
    ids: Vec<u32>,
    lps: Vec<f32>,
    cached: usize,
}

fn job(c: &Case) -> (Job, tokio::sync::mpsc::UnboundedReceiver<Event>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let job = Job {
        prompt: c.prompt.clone(),
        params: c.params.clone(),
        stop: vec![],
        kind: JobKind::Completion,
        logit: c.logit.clone(),
        tools: None,
        events: tx,
    };
    (job, rx)
}

fn collect(mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>) -> Got {
    let mut lps = Vec::new();
    loop {
        match rx.blocking_recv().expect("the engine ends every job") {
            Event::Delta { logprobs, .. } => lps.extend(logprobs.iter().map(|e| e.logprob)),
            Event::Done {
                generated_ids,
                cached_tokens,
                ..
            } => {
                return Got {
                    ids: generated_ids,
                    lps,
                    cached: cached_tokens,
                }
            }
            Event::Error(e) => panic!("job failed: {e}"),
            _ => {}
        }
    }
}

/// Run the seven cases through the engine on `model` (all queued before it starts), then one
/// request extending case 6's sequence; return their results and the decode batch sizes.
fn through_engine(
    model: &mut dyn BatchForward,
    cs: &[Case],
    ext: &Case,
) -> (Vec<Got>, Got, Vec<usize>) {
    let (tok, r) = tokenizer_and_renderer();
    let sp = r.specials().clone();
    let shared = Shared::default();
    let mut counting = Counting {
        inner: model,
        sizes: vec![],
    };
    let (jobs_tx, jobs_rx) = sync_channel(16);
    let rxs: Vec<_> = cs
        .iter()
        .map(|c| {
            let (j, rx) = job(c);
            jobs_tx.send(j).unwrap();
            rx
        })
        .collect();
    let (ext_job, ext_rx) = job(ext);
    // the clients on another thread (the model stays on this one)
    let clients = std::thread::spawn(move || {
        let gots: Vec<Got> = rxs.into_iter().map(collect).collect();
        jobs_tx.send(ext_job).unwrap();
        (gots, collect(ext_rx))
    });
    engine::run(&mut counting, &tok, &sp, jobs_rx, &shared);
    let (gots, ext_got) = clients.join().unwrap();
    (gots, ext_got, counting.sizes)
}

/// A case's prompt, its answer but the last id (the ids its slot holds), then three more ids.
fn extension(c0: &Case, ids0: &[u32], vocab: u32) -> Case {
    let mut prompt = c0.prompt.clone();
    prompt.extend_from_slice(&ids0[..ids0.len() - 1]);
    prompt.extend([1 % vocab, 9 % vocab, 4 % vocab]);
    Case {
        prompt,
        params: c0.params.clone(),
        logit: LogitOptions::default(),
    }
}

fn check(
    name: &str,
    engine_model: &mut dyn BatchForward,
    solo: &mut dyn Forward,
    vocab: u32,
    exact: bool,
) {
    let cs = cases(vocab);
    let (_, r) = tokenizer_and_renderer();
    let sp = r.specials();
    let want: Vec<_> = cs.iter().map(|c| alone(solo, c)).collect();
    // the last request's slot is never taken by a later one
    let ext = extension(&cs[6], &want[6].0, vocab);
    let want_ext = alone(solo, &ext);
    let (got, got_ext, sizes) = through_engine(engine_model, &cs, &ext);
    for (i, ((g, w), c)) in got.iter().zip(&want).zip(&cs).enumerate() {
        assert_eq!(g.ids, w.0, "{name}: request {i} batched vs alone");
        assert_eq!(g.ids.len(), c.params.max_new_tokens, "{name}: request {i}");
        assert_eq!(g.cached, 0, "{name}: request {i} shares no prefix");
        // a completion's log-probabilities: of its ordinary (non-special) ids
        let wl: Vec<f32> =
            w.0.iter()
                .zip(&w.1)
                .filter(|(&id, _)| !sp.is_special(id))
                .map(|(_, l)| l.logprob)
                .collect();
        assert_eq!(g.lps.len(), wl.len(), "{name}: request {i} logprobs");
        for (a, b) in g.lps.iter().zip(&wl) {
            let tol = if exact { 0.0 } else { 1e-4 };
            assert!(
                (a - b).abs() <= tol,
                "{name}: request {i} logprob {a} vs {b}"
            );
        }
    }
    assert!(
        !got[3].lps.is_empty(),
        "{name}: request 3 asked for log-probabilities"
    );
    assert_eq!(got_ext.ids, want_ext.0, "{name}: the extending request");
    assert_eq!(
        got_ext.cached,
        cs[6].prompt.len() + want[6].0.len() - 1,
        "{name}: the extending request reuses its prefix"
    );
    // four requests decode together; each finished one is replaced by the next queued one
    // before the next step; the extending request then decodes alone
    // after the warm-up (a one-token greedy step, then batches of SLOTS and of 2)
    let mut want_sizes: Vec<usize> = vec![1, SLOTS, 2];
    want_sizes.extend(schedule(
        cs.iter().map(|c| c.params.max_new_tokens - 1),
        SLOTS,
    ));
    want_sizes.extend(std::iter::repeat_n(1, want_ext.0.len() - 1));
    assert_eq!(sizes, want_sizes, "{name}: decode batch sizes");
    assert_eq!(sizes.iter().max(), Some(&SLOTS), "{name}");
}

/// The batch sizes of a continuous-batching schedule over `slots` slots: requests admitted in
/// order whenever a slot is free, the k-th needing `steps[k]` decode steps.
fn schedule(steps: impl Iterator<Item = usize>, slots: usize) -> Vec<usize> {
    let mut queue: std::collections::VecDeque<usize> = steps.collect();
    let mut running: Vec<usize> = Vec::new();
    let mut sizes = Vec::new();
    loop {
        while running.len() < slots {
            match queue.pop_front() {
                Some(0) => {}
                Some(n) => running.push(n),
                None => break,
            }
        }
        if running.is_empty() {
            return sizes;
        }
        sizes.push(running.len());
        running.iter_mut().for_each(|n| *n -= 1);
        running.retain(|&n| n > 0);
    }
}

#[test]
fn cpu_requests_batched_equal_each_alone() {
    let ck = Checkpoint::open(&chat_model()).unwrap();
    let w = Weights::load(&ck).unwrap();
    let vocab = w.config.vocab_size as u32;
    let mut slots = CpuSlots::new(CpuModel::new(&w), SLOTS).unwrap();
    let mut solo = CpuModel::new(&w);
    check("cpu", &mut slots, &mut solo, vocab, true);
}

#[test]
fn gpu_requests_batched_equal_each_alone() {
    let ck = Checkpoint::open(&chat_model()).unwrap();
    let w = Weights::load(&ck).unwrap();
    let vocab = w.config.vocab_size as u32;
    let opts = |n| GpuModelOptions {
        seq_slots: n,
        ..GpuModelOptions::new(MAX_SEQ)
    };
    let mut slots = GpuModel::new(&gpu(), &w, opts(SLOTS)).unwrap();
    let mut solo = GpuModel::new(&gpu(), &w, opts(1)).unwrap();
    check("gpu", &mut slots, &mut solo, vocab, false);
}
