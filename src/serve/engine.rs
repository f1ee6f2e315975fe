//! The engine thread: owns a forward backend with `slots()` sequence slots ([`BatchForward`])
//! and decodes the running requests together (continuous batching):
//! 1. **admit**: while a slot is free, the next queued [`Job`] takes the free slot whose held
//!    sequence is the longest prefix of its prompt (only the rest is prefilled; a request that
//!    extends a previous conversation reuses its KV cache and conv states), else the least
//!    recently used one (reset first); its prompt is prefilled and its first id chosen;
//! 2. **step**: one [`BatchForward::decode_batch`] feeds every running job its last id, so the
//!    weights are read once per step for all of them; each job then chooses its next id with its
//!    own [`Sampler`] (sampling, penalties, logit bias, log-probabilities) and sends its events;
//! 3. a job that ends (an EOS id, `max_tokens`, a stop string, a tool call that ends the turn)
//!    leaves its slot, which keeps the sequence for a later request's prefix.
//!
//! A job whose event receiver is gone or closed (the client disconnected, or the server is
//! shutting down) is skipped when it comes up, or dropped before the next step when running.
//! A failed step fails the jobs it ran (their slots are reset); the engine goes on.
use super::output::Output;
use crate::chat::session::Halt;
use crate::chat::specials::Specials;
use crate::model::batch::BatchForward;
use crate::model::generate::{Sampler, StepLogprobs};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use tokenizers::Tokenizer;

pub use super::job::{Counters, Event, Job, JobKind, Shared};

/// A sequence slot's bookkeeping.
#[derive(Default)]
struct Slot {
    /// The ids whose KV and conv state the slot holds, in order.
    held: Vec<u32>,
    /// Step count when it was last used (least recently used: smallest).
    used: u64,
    busy: bool,
}

/// A job holding a slot.
struct Running<'a, 't> {
    job: Job,
    slot: usize,
    sampler: Sampler,
    out: Output<'a, 't>,
    /// Ids chosen so far (the last one not yet fed).
    generated: Vec<u32>,
    /// Prompt tokens whose state the slot already held.
    reused: usize,
}

/// What a step gives one job: the id its backend chose (argmax only), or the logits its own
/// sampler chooses from.
enum Pick {
    Id(u32),
    Logits(Vec<f32>),
}

/// How a job's last chosen id left it.
enum After {
    /// Feed the id and go on.
    Continue,
    /// Done: its last event (`None`: cancelled, nothing more to send).
    Done(Option<Event>),
    Failed(anyhow::Error),
}

/// Run jobs until every sender is gone and no job runs.
pub fn run(
    model: &mut dyn BatchForward,
    tok: &Tokenizer,
    sp: &Specials,
    jobs: Receiver<Job>,
    shared: &Shared,
) {
    let n = model.slots();
    let mut slots: Vec<Slot> = (0..n).map(|_| Slot::default()).collect();
    let t0 = std::time::Instant::now();
    if let Err(e) = warm_up(model) {
        eprintln!("inkling-wgpu serve: warning: the warm-up step failed: {e:#}");
    }
    for s in 0..n {
        model.select(s);
        model.reset();
    }
    note_experts(model, shared);
    let _ = shared.slots.set(n);
    shared.ready.store(true, Ordering::SeqCst);
    eprintln!(
        "inkling-wgpu serve: ready ({:.1} s of warm-up); /health answers ok",
        t0.elapsed().as_secs_f64()
    );
    let c = &shared.counters;
    let mut running: Vec<Running<'_, '_>> = Vec::new();
    let mut open = true;
    let mut step = 0u64;
    loop {
        // 1. admit queued jobs into free slots (block for one when nothing runs)
        while open && running.len() < n {
            let job = if running.is_empty() {
                match jobs.recv() {
                    Ok(j) => j,
                    Err(_) => {
                        open = false;
                        break;
                    }
                }
            } else {
                match jobs.try_recv() {
                    Ok(j) => j,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            };
            if job.events.is_closed() {
                c.cancelled.fetch_add(1, Ordering::Relaxed);
                shared.job_ended();
                continue;
            }
            let slot = choose_slot(&slots, &job.prompt);
            slots[slot].busy = true;
            slots[slot].used = step;
            shared.busy_slots.fetch_add(1, Ordering::Relaxed);
            let mut r = Running {
                sampler: Sampler::new(&job.params, &job.logit, &[], &job.prompt),
                out: Output::new(&job, tok, sp),
                job,
                slot,
                generated: Vec::new(),
                reused: 0,
            };
            let _ = r.job.events.send(Event::Started);
            let after = prefill(model, &mut slots[slot], &mut r);
            if let Some(r) = settle(model, &mut slots, r, after, shared) {
                running.push(r);
            }
        }
        if running.is_empty() {
            if open {
                continue;
            }
            break;
        }
        // 2. drop the jobs whose clients went away, then one decode step for the others
        running.retain(|r| {
            let gone = r.job.events.is_closed();
            if gone {
                c.cancelled.fetch_add(1, Ordering::Relaxed);
                release(&mut slots[r.slot], shared);
            }
            !gone
        });
        if running.is_empty() {
            continue;
        }
        step += 1;
        let batch: Vec<(usize, u32)> = running
            .iter()
            .map(|r| {
                (
                    r.slot,
                    *r.generated.last().expect("a running job has an id"),
                )
            })
            .collect();
        // one request alone that needs only the argmax: the backend picks it (the GPU reads back
        // 4 bytes, not the logits)
        let alone = match &running[..] {
            [r] if r.sampler.argmax_only() => Some(r.slot),
            _ => None,
        };
        let rows = match alone {
            Some(slot) => {
                model.select(slot);
                model
                    .forward_greedy(&[batch[0].1])
                    .map(|id| vec![Pick::Id(id)])
            }
            None => model
                .decode_batch(&batch)
                .map(|rows| rows.into_iter().map(Pick::Logits).collect()),
        };
        c.decode_steps.fetch_add(1, Ordering::Relaxed);
        c.decode_tokens
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => {
                for r in running.drain(..) {
                    fail(model, &mut slots, r.slot, &r.job, &e, shared);
                }
                continue;
            }
        };
        let mut next = Vec::with_capacity(running.len());
        for (mut r, pick) in running.drain(..).zip(rows) {
            let fed = *r.generated.last().expect("a running job has an id");
            r.sampler.fed(fed);
            let slot = &mut slots[r.slot];
            slot.held.push(fed);
            slot.used = step;
            let (id, lp) = match pick {
                Pick::Id(id) => (id, None),
                Pick::Logits(l) => r.sampler.pick(l),
            };
            let after = choose(&mut r, id, lp.as_ref());
            if let Some(r) = settle(model, &mut slots, r, after, shared) {
                next.push(r);
            }
        }
        running = next;
    }
}

/// Tokens of the warm-up's long prefill: past every format's GEMM threshold
/// (`format::max_gemm_min_pairs`), so the prefill GEMM runs.
const WARM_UP_PROMPT: usize = 2 * crate::gpu::linear::format::max_gemm_min_pairs() as usize;

/// Run every kind of step a request can meet once before the first request, so that none of
/// them waits for its pipelines to be compiled and its commands recorded (the GPU builds both on
/// first use): a 2-token prefill in every slot, a [`WARM_UP_PROMPT`]-token one (the GEMM), the
/// one-token step with and without the logits, and the decode batch of `slots()` and of 2
/// sequences. The slots are reset by the caller.
fn warm_up(model: &mut dyn BatchForward) -> anyhow::Result<()> {
    let n = model.slots();
    for s in 0..n {
        model.select(s);
        model.reset();
        model.forward(&[0, 0])?;
    }
    // a prompt long enough for the prefill GEMM (every format's threshold and more tokens)
    model.select(0);
    model.reset();
    model.forward(&[0; WARM_UP_PROMPT])?;
    model.forward(&[0])?;
    model.forward_greedy(&[0])?;
    // the batch kernels' pipelines (other sizes record their commands on first use)
    let mut sizes = vec![n, 2];
    sizes.dedup();
    for b in sizes.into_iter().filter(|b| (2..=n).contains(b)) {
        let batch: Vec<(usize, u32)> = (0..b).map(|s| (s, 0)).collect();
        model.decode_batch(&batch)?;
    }
    Ok(())
}

/// The free slot for `prompt`: the one holding the longest proper prefix of it, else the least
/// recently used. There is one: the caller admits only while a slot is free.
fn choose_slot(slots: &[Slot], prompt: &[u32]) -> usize {
    let free = || slots.iter().enumerate().filter(|(_, s)| !s.busy);
    let prefix = free()
        .filter(|(_, s)| !s.held.is_empty() && s.held.len() < prompt.len())
        .filter(|(_, s)| prompt[..s.held.len()] == s.held[..])
        .max_by_key(|(i, s)| (s.held.len(), std::cmp::Reverse(*i)));
    prefix
        .or_else(|| free().min_by_key(|(i, s)| (s.used, *i)))
        .map(|(i, _)| i)
        .expect("a free slot")
}

/// Prefill `r`'s prompt into its slot (after the prefix the slot holds) and choose its first id.
fn prefill(model: &mut dyn BatchForward, slot: &mut Slot, r: &mut Running<'_, '_>) -> After {
    let prompt = &r.job.prompt;
    if prompt.is_empty() {
        return After::Failed(anyhow::anyhow!("the prompt has no tokens"));
    }
    model.select(r.slot);
    let k = slot.held.len();
    let reuse = k > 0 && model.position() == k && k < prompt.len() && prompt[..k] == slot.held[..];
    if !reuse {
        model.reset();
        slot.held.clear();
    }
    r.reused = slot.held.len();
    if r.job.params.max_new_tokens == 0 {
        return After::Done(Some(done(r, "length")));
    }
    let rest = &prompt[r.reused..];
    let picked = if r.sampler.argmax_only() {
        model.forward_greedy(rest).map(|id| (id, None))
    } else {
        model.forward(rest).map(|logits| r.sampler.pick(logits))
    };
    match picked {
        Ok((id, lp)) => {
            slot.held = prompt.clone();
            choose(r, id, lp.as_ref())
        }
        Err(e) => After::Failed(e),
    }
}

/// Take `id` (with its log-probabilities) as `r`'s next id: send its text, and say whether the
/// job goes on.
fn choose(r: &mut Running<'_, '_>, id: u32, lp: Option<&StepLogprobs>) -> After {
    r.generated.push(id);
    if r.job.params.eos_ids.contains(&id) {
        return end(r, "stop");
    }
    if r.job.events.is_closed() {
        return After::Done(None);
    }
    match r.out.push(id, lp) {
        Ok(()) => {}
        Err(e) => match e.downcast_ref::<Halt>() {
            Some(Halt::Stop) => return After::Done(Some(finish(r, "stop"))),
            Some(Halt::Cancelled) => return After::Done(None),
            None => return After::Failed(e),
        },
    }
    if r.generated.len() >= r.job.params.max_new_tokens {
        return end(r, "length");
    }
    After::Continue
}

/// The end of a job that stopped on an EOS id or at its length: the text held back is sent.
fn end(r: &mut Running<'_, '_>, reason: &'static str) -> After {
    if let Err(e) = r.out.finish() {
        return After::Failed(e);
    }
    r.out.flush_logprobs();
    After::Done(Some(finish(r, reason)))
}

/// The job's `Done` event ("tool_calls" when it made calls and stopped).
fn finish(r: &Running<'_, '_>, reason: &'static str) -> Event {
    let reason = if r.out.made_calls() > 0 && reason == "stop" {
        "tool_calls"
    } else {
        reason
    };
    if r.out.strayed() {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            eprintln!(
                "inkling-wgpu serve: warning: the model wrote text outside any content block (it \
                 does not follow Inkling's chat format); that text is sent as the answer's content"
            )
        });
    }
    done(r, reason)
}

fn done(r: &Running<'_, '_>, reason: &'static str) -> Event {
    Event::Done {
        finish: reason,
        prompt_tokens: r.job.prompt.len(),
        cached_tokens: r.reused,
        generated_ids: r.generated.clone(),
    }
}

/// Act on how `r` came out of a step: keep it running (returned), or end it and free its slot.
fn settle<'a, 't>(
    model: &mut dyn BatchForward,
    slots: &mut [Slot],
    r: Running<'a, 't>,
    after: After,
    shared: &Shared,
) -> Option<Running<'a, 't>> {
    let c = &shared.counters;
    match after {
        After::Continue => return Some(r),
        After::Done(Some(ev)) => {
            c.cached_tokens
                .fetch_add(r.reused as u64, Ordering::Relaxed);
            c.completed.fetch_add(1, Ordering::Relaxed);
            // the slot is free before the client hears of the end (`/health` agrees with it)
            release(&mut slots[r.slot], shared);
            let _ = r.job.events.send(ev);
        }
        After::Done(None) => {
            c.cancelled.fetch_add(1, Ordering::Relaxed);
            release(&mut slots[r.slot], shared);
        }
        After::Failed(e) => fail(model, slots, r.slot, &r.job, &e, shared),
    }
    note_experts(model, shared);
    None
}

/// How expert streaming went so far, for `/health` (after start-up and after each ended job).
fn note_experts(model: &dyn BatchForward, shared: &Shared) {
    *shared.experts.lock().unwrap_or_else(|e| e.into_inner()) = model.stream_stats();
}

/// The slot's job ended: the slot is free, and the job no longer counts against the capacity.
fn release(slot: &mut Slot, shared: &Shared) {
    slot.busy = false;
    shared.busy_slots.fetch_sub(1, Ordering::Relaxed);
    shared.job_ended();
}

/// `job` failed with `e`: its client gets the error; slot `s` is reset and freed.
fn fail(
    model: &mut dyn BatchForward,
    slots: &mut [Slot],
    s: usize,
    job: &Job,
    e: &anyhow::Error,
    shared: &Shared,
) {
    shared.counters.failed.fetch_add(1, Ordering::Relaxed);
    model.select(s);
    model.reset();
    slots[s].held.clear();
    release(&mut slots[s], shared);
    let _ = job.events.send(Event::Error(format!("{e:#}")));
}
