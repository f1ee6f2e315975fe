//! `inkling-wgpu bench batch`: the decode batch (continuous batching's step) on the GPU forward.
//! For each batch size B of `--batch`, B sequence slots are filled with B different 16-token
//! probe prompts and decoded together for `--tokens` greedy steps (one
//! [`crate::model::BatchForward::decode_batch`] per step, logits read back, argmax on the host,
//! as `serve` does), after [`super::bench_decode::WARMUP_S`] seconds of warm-up; printed: step ms,
//! aggregate and per-sequence tok/s, the speedup over B = 1 of the same path, and the plain
//! one-sequence greedy decode (`bench decode`'s pipelined path) measured in the same process;
//! with `--expert-slots`, the distinct routed experts a step reads per MoE layer.
use super::bench_decode::{probe_prompt, PROBE_PROMPT, WARMUP_S};
use super::context::ensure_arg;
use super::output::outln;
use crate::gpu::Gpu;
use crate::model::sampling::argmax;
use crate::model::weights::Mlp;
use crate::model::{
    BatchForward, Checkpoint, Forward, GpuModel, GpuModelOptions, Placement, Weights,
};
use anyhow::{ensure, Context};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct BatchArgs {
    /// Checkpoint or container directory (default: the bundled demo model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Batch sizes to time, comma-separated (each from 1 to 256, as `serve --parallel`); the
    /// "× batch 1" column needs 1 among them.
    #[arg(allow_negative_numbers = true, long, value_delimiter = ',', value_parser = super::values::parse_slots, default_value = "1,2,4,8")]
    pub batch: Vec<usize>,
    /// Decode steps timed per sequence after its prompt (1 to 1048576; prompt + steps within the
    /// model's context).
    #[arg(allow_negative_numbers = true, long, default_value_t = 64, value_parser = super::values::parse_steps)]
    pub tokens: usize,
    /// Stream the routed experts through this many GPU slots (as `generate --expert-slots`):
    /// the report then also gives the distinct routed experts a step reads per MoE layer.
    #[arg(allow_negative_numbers = true, long, value_parser = super::values::parse_positive)]
    pub expert_slots: Option<u64>,
    /// Print one JSON object on stdout (the text report goes to stderr).
    #[arg(long)]
    pub json: bool,
}

/// Distinct (layer, expert) pairs the streamed model has looked up so far (`None`: resident).
fn lookups(m: &GpuModel<'_>) -> Option<u64> {
    Forward::stream_stats(m).map(|s| s.hits + s.misses)
}

/// The probe prompt of slot `s`: the 16 fixed ids of `bench decode`, shifted by `s`.
fn prompt_of(s: usize, width: usize) -> Vec<u32> {
    probe_prompt(width)
        .into_iter()
        .map(|id| ((id as usize + 7919 * s) % width.max(1)) as u32)
        .collect()
}

/// `tokens` batched greedy steps over slots `0..b` (each refilled with its prompt first);
/// seconds of the steps, every slot's ids, and the distinct (layer, expert) pairs the steps
/// looked up when the experts stream.
fn run_batch(
    m: &mut GpuModel<'_>,
    b: usize,
    tokens: usize,
    width: usize,
) -> anyhow::Result<(f64, Vec<Vec<u32>>, Option<u64>)> {
    let mut next = Vec::with_capacity(b);
    for s in 0..b {
        m.select(s);
        m.reset();
        next.push(argmax(&m.forward(&prompt_of(s, width))?));
    }
    m.select(0);
    let mut ids = vec![Vec::with_capacity(tokens); b];
    let before = lookups(m);
    let t0 = Instant::now();
    for _ in 0..tokens {
        let batch: Vec<(usize, u32)> = next.iter().copied().enumerate().collect();
        for (s, &(_, id)) in batch.iter().enumerate() {
            ids[s].push(id);
        }
        let rows = m.decode_batch(&batch)?;
        next = rows.iter().map(|r| argmax(r)).collect();
    }
    let secs = t0.elapsed().as_secs_f64();
    let looked = lookups(m).zip(before).map(|(a, b)| a - b);
    Ok((secs, ids, looked))
}

pub fn run(a: BatchArgs) -> anyhow::Result<ExitCode> {
    let slots = a.batch.iter().copied().max().context("--batch is empty")?;
    if let Some((i, &b)) = a
        .batch
        .iter()
        .enumerate()
        .find(|(i, b)| a.batch[..*i].contains(b))
    {
        let list: Vec<String> = a.batch.iter().map(|b| b.to_string()).collect();
        ensure_arg!(
            false,
            "--batch {}: the batch of {b} is listed twice (entry {}); list each size once",
            list.join(","),
            i + 1
        );
    }
    let dir = match &a.model {
        Some(d) => d.clone(),
        None => crate::bundled::materialize()?,
    };
    let ck = Checkpoint::open(&dir)?;
    if let Some(max) = ck.config.max_position_embeddings {
        super::context::ensure_arg!(
            PROBE_PROMPT + a.tokens < max,
            "--tokens {}: the probe's {PROBE_PROMPT}-token prompt and {} steps pass the model's \
             context of {max} positions; use --tokens {} or fewer",
            a.tokens,
            a.tokens,
            max.saturating_sub(PROBE_PROMPT + 1)
        );
    }
    let w = Weights::load(&ck)?;
    let gpu = Gpu::new()?;
    let width = w.config.logits_width();
    let opts = GpuModelOptions {
        seq_slots: slots,
        placement: a
            .expert_slots
            .map_or(Placement::Resident, |n| Placement::Slots(n as usize)),
        // a decode batch of B sequences is one B-token chunk: the chunk (at most max_seq) holds
        // the largest batch
        ..GpuModelOptions::new((PROBE_PROMPT + a.tokens + 1).max(slots))
    };
    let moe_layers = w
        .layers
        .iter()
        .filter(|l| matches!(l.mlp, Mlp::Moe(_)))
        .count()
        .max(1);
    let mut m = GpuModel::new(&gpu, &w, opts).with_context(|| {
        format!(
            "building the GPU model with {slots} sequence slots (the largest --batch) on {}",
            gpu.describe()
        )
    })?;
    // warm-up: every batch size once, then the largest until WARMUP_S has passed
    let warm = Instant::now();
    for &b in &a.batch {
        run_batch(&mut m, b, a.tokens.min(8), width)?;
    }
    while warm.elapsed().as_secs_f64() < WARMUP_S {
        run_batch(&mut m, slots, a.tokens.min(8), width)?;
    }
    // the pipelined one-sequence greedy decode of slot 0 (`bench decode`'s timed path)
    m.select(0);
    m.reset();
    let p0 = prompt_of(0, width);
    let first = m.forward_greedy(&p0)?;
    let mut solo = Vec::new();
    let t1 = Instant::now();
    match Forward::greedy_pipeline(&mut m) {
        Some(p) => p.greedy_stream(&[first], a.tokens, &mut |id| {
            solo.push(id);
            Ok(true)
        })?,
        None => {
            let mut id = first;
            for _ in 0..a.tokens {
                id = m.forward_greedy(&[id])?;
                solo.push(id);
            }
        }
    }
    let solo_s = t1.elapsed().as_secs_f64();
    let solo_tok_s = a.tokens as f64 / solo_s;
    eprintln!(
        "bench batch: {} on {}; {PROBE_PROMPT}-token prompts, {} greedy steps per sequence",
        dir.display(),
        gpu.describe(),
        a.tokens
    );
    eprintln!("  one sequence, pipelined greedy (bench decode's path): {solo_tok_s:.1} tok/s");
    let streams = lookups(&m).is_some();
    eprintln!(
        "  batch   step ms   aggregate tok/s   per-sequence tok/s   × batch 1{}",
        if streams { "   experts/layer/step" } else { "" }
    );
    // (batch, seconds, experts per layer and step) of every size, then the table
    let mut timed = Vec::new();
    for &b in &a.batch {
        let (secs, ids, looked) = run_batch(&mut m, b, a.tokens, width)?;
        // distinct routed experts one step reads per MoE layer (all slots together)
        let experts = looked.map(|n| n as f64 / (a.tokens * moe_layers) as f64);
        // every slot's tokens equal its prompt decoded alone in slot 0 of this model
        if b > 1 {
            let (_, alone, _) = run_batch(&mut m, 1, a.tokens, width)?;
            ensure!(
                ids[0] == alone[0],
                "batch {b}: slot 0 chose different tokens than alone"
            );
        }
        timed.push((b, secs, experts));
    }
    let agg_of = |b: usize, secs: f64| (b * a.tokens) as f64 / secs;
    // the ratio's base: the batch of 1, wherever it is in the list
    let base = timed.iter().find(|t| t.0 == 1).map(|t| agg_of(1, t.1));
    let mut rows = Vec::new();
    for &(b, secs, experts) in &timed {
        let agg = agg_of(b, secs);
        let step_ms = 1e3 * secs / a.tokens as f64;
        let x = base.map_or(f64::NAN, |base| agg / base);
        // no batch of 1 timed: no ratio
        let x_text = if x.is_finite() {
            format!("{x:.2}")
        } else {
            "-".to_string()
        };
        eprintln!(
            "  {b:>5}   {step_ms:>7.3}   {agg:>15.1}   {:>18.1}   {x_text:>9}{}",
            agg / b as f64,
            experts.map_or(String::new(), |e| format!("   {e:>18.2}"))
        );
        rows.push(serde_json::json!({
            "batch": b,
            "step_ms": step_ms,
            "aggregate_tok_s": agg,
            "per_sequence_tok_s": agg / b as f64,
            "vs_batch_1": if x.is_finite() { serde_json::json!(x) } else { serde_json::Value::Null },
            "experts_per_layer_step": experts,
        }));
    }
    if a.json {
        let v = serde_json::json!({
            "model": dir.display().to_string(),
            "adapter": gpu.describe(),
            "tokens": a.tokens,
            "solo_pipelined_tok_s": solo_tok_s,
            "batches": rows,
        });
        outln!("{}", serde_json::to_string_pretty(&v)?)?;
    }
    Ok(ExitCode::SUCCESS)
}
