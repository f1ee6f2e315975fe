//! `inkling-wgpu bench decode`: a fixed synthetic decode probe on the GPU forward. A prompt of 16
//! fixed ids, then `--tokens` greedy decode steps (argmax on the GPU), repeated for [`WARMUP_S`]
//! seconds of warm-up, then timed by wall clock; then the same run with a GPU timestamp at each
//! step's beginning and end (GPU busy and idle time per step); then the
//! same run again in profile mode for the per-phase GPU time per token (timestamp queries), checked
//! to choose the same tokens. Prints decode tok/s, the phases, the bytes a step must read, the
//! roofline (those bytes at the copy bandwidth, measured like `bench copy` or `--peak-gbs`), the
//! fraction of it reached, the dispatches of the one-token step (per step and per layer) and the
//! host's record + finish + submit time per step against the GPU's busy time per step.
use super::output::outln;
use crate::gpu::Gpu;
use crate::model::profile::DecodeReport;
use crate::model::{Checkpoint, GpuModel, GpuModelOptions, Weights};
use anyhow::{ensure, Context};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Seconds of decode run (whole probes, at least one) before the timed run.
pub const WARMUP_S: f64 = 1.0;

/// Prompt length of the probe.
pub const PROBE_PROMPT: usize = 16;

#[derive(clap::Args, Debug)]
pub struct DecodeArgs {
    /// Checkpoint or container directory (default: the bundled demo model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Decode steps timed after the prompt (1 to 1048576; prompt + steps within the model's
    /// context).
    #[arg(allow_negative_numbers = true, long, default_value_t = 64, value_parser = super::values::parse_steps)]
    pub tokens: usize,
    /// Copy bandwidth in GB/s (read + write, as `bench copy` reports it) instead of measuring it.
    #[arg(allow_negative_numbers = true, long, value_parser = super::parse_gbs)]
    pub peak_gbs: Option<f64>,
    /// Size of the copy measured for the bandwidth, MiB (default 1024, 64 on CPU adapters).
    #[arg(allow_negative_numbers = true, long, value_parser = super::values::parse_mib)]
    pub copy_mib: Option<u64>,
    /// Print one JSON object on stdout (the text report goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// Also time every kernel of the step as its own pass (one more run, after the others) and
    /// print GPU µs per kernel name per token.
    #[arg(long)]
    pub per_op: bool,
    /// Run the timed (pipelined, untimed-on-GPU) probe this many times and print each run's tok/s
    /// (the last one is reported); an experiment knob.
    #[arg(allow_negative_numbers = true, long, default_value_t = 1, hide = true, value_parser = super::values::parse_iters)]
    pub repeat: usize,
    /// Run the step-timestamp probe before the timed probe (an experiment knob).
    #[arg(long, hide = true)]
    pub spans_first: bool,
}

/// The probe's prompt: 16 fixed ids below `width`.
pub fn probe_prompt(width: usize) -> Vec<u32> {
    (0..PROBE_PROMPT as u64)
        .map(|i| ((i * 2654435761 + 17) % width.max(1) as u64) as u32)
        .collect()
}

/// The copy bandwidth to divide by: `peak` when given, else measured once by `bench copy`'s
/// method ([`crate::gpu::timing::measure_copy`]: the faster of `copy_buffer_to_buffer` and a
/// compute-shader copy, bytes read + written, `mib` MiB, default 1024 or 64 on a CPU adapter).
pub fn copy_bandwidth(
    gpu: &Gpu,
    peak: Option<f64>,
    mib: Option<u64>,
) -> anyhow::Result<(f64, String)> {
    Ok(match peak {
        Some(p) => (p, "--peak-gbs".into()),
        None => {
            let mib = mib.unwrap_or(if gpu.is_cpu() { 64 } else { 1024 });
            let c = crate::gpu::timing::measure_copy(gpu, mib, 20)?;
            (
                c.ceiling,
                format!(
                    "bench copy: {} MiB × 20, copy_buffer_to_buffer {:.1} / shader copy {:.1} GB/s",
                    c.bytes >> 20,
                    c.gbs_cmd,
                    c.gbs_shader
                ),
            )
        }
    })
}

/// Prompt, then `steps` greedy decode steps; returns the ids and the decode seconds. Pipelined
/// ([`GpuModel::greedy_stream`]: one step in flight) except in profile mode, which times one step
/// per submission.
fn probe(m: &mut GpuModel, prompt: &[u32], steps: usize) -> anyhow::Result<(Vec<u32>, f64)> {
    m.reset();
    let mut ids = Vec::with_capacity(steps + 1);
    let mut t0 = None;
    if m.can_stream_greedy() {
        m.greedy_stream(prompt, steps + 1, &mut |id| {
            ids.push(id);
            t0.get_or_insert_with(Instant::now);
            Ok(true)
        })?;
        let secs = t0.map_or(0.0, |t| t.elapsed().as_secs_f64());
        return Ok((ids, secs));
    }
    let mut id = m.forward_greedy(prompt)?;
    let mut ids = vec![id];
    let t0 = Instant::now();
    for _ in 0..steps {
        id = m.forward_greedy(&[id])?;
        ids.push(id);
    }
    Ok((ids, t0.elapsed().as_secs_f64()))
}

/// The host side of the timed (pipelined) decode steps, one line.
fn host_line(h: &crate::model::HostTimes) -> String {
    let [r, f, s, w] = h.per_step_ms();
    format!(
        "  host per decode step ({}): record {r:.4} ms | finish {f:.4} ms | submit {s:.4} ms | waiting for the id {w:.4} ms",
        super::bench_calls::plural(h.steps as usize, "step", "steps")
    )
}

/// Host time per step (record + finish + submit) against GPU busy time per step: whether the
/// pipelined decode can keep the GPU fed (one line).
fn host_gpu_line(host_ms: f64, gpu_ms: f64) -> String {
    format!(
        "  host vs GPU per decode step: host {host_ms:.4} ms (record + finish + submit) | GPU {gpu_ms:.4} ms (busy) | {}",
        if host_ms < gpu_ms {
            "host below GPU: the GPU never waits on the host"
        } else {
            "HOST-BOUND: the host takes longer than the GPU"
        }
    )
}

/// [`probe`] with a GPU timestamp at each step's beginning and end: the ids, the GPU seconds of
/// each step, the GPU seconds idle before each step after the first, and the decode seconds.
#[allow(clippy::type_complexity)]
fn spans_run(
    m: &mut GpuModel,
    prompt: &[u32],
    steps: usize,
) -> anyhow::Result<(Vec<u32>, Vec<f64>, Vec<f64>, f64)> {
    m.reset();
    m.start_step_spans(steps as u32 + 1)?;
    let (ids, secs) = probe(m, prompt, steps)?;
    let (busy, idle) = m.take_step_spans()?;
    Ok((ids, busy, idle, secs))
}

fn mean_ms(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64 * 1e3
    }
}

/// GPU busy and idle time per decode step of the timestamped (pipelined) run, one line.
fn span_line(busy: &[f64], idle: &[f64], secs: f64, steps: usize) -> String {
    let max_idle = idle.iter().cloned().fold(0.0, f64::max) * 1e3;
    format!(
        "  GPU per decode step ({} timed): busy {:.4} ms | idle before a step {:.4} ms (max {max_idle:.4}) | wall {:.4} ms/token",
        super::bench_calls::plural(busy.len(), "step", "steps"),
        mean_ms(busy),
        mean_ms(idle),
        secs / steps as f64 * 1e3
    )
}

fn span_json(busy: &[f64], idle: &[f64], secs: f64, steps: usize) -> serde_json::Value {
    serde_json::json!({
        "steps": busy.len(),
        "busy_ms": mean_ms(busy),
        "idle_ms": mean_ms(idle),
        "max_idle_ms": idle.iter().cloned().fold(0.0, f64::max) * 1e3,
        "wall_ms_per_token": secs / steps as f64 * 1e3,
    })
}

pub fn run(a: DecodeArgs) -> anyhow::Result<ExitCode> {
    super::context::ensure_arg!(a.tokens >= 1, "--tokens must be at least 1");
    let dir = match &a.model {
        Some(d) => d.clone(),
        None => crate::bundled::materialize()?,
    };
    let ck = Checkpoint::open(&dir)?;
    if let Some(max) = ck.config.max_position_embeddings {
        super::context::ensure_arg!(
            PROBE_PROMPT + a.tokens < max,
            "--tokens {}: the probe's {PROBE_PROMPT}-token prompt and {} steps pass the model's \
             context of {max} positions (max_position_embeddings); use --tokens {} or fewer",
            a.tokens,
            a.tokens,
            max.saturating_sub(PROBE_PROMPT + 1)
        );
    }
    let w = Weights::load(&ck)?;
    let gpu = Gpu::new()?;
    let prompt = probe_prompt(w.config.logits_width());
    let mut m = GpuModel::new(&gpu, &w, GpuModelOptions::new(PROBE_PROMPT + a.tokens + 1))
        .with_context(|| format!("building the GPU model on {}", gpu.describe()))?;

    // Warm-up (pipelines, recorded steps, and the GPU's clocks: BENCHMARKS.md#decision-warm-up),
    // then the timed run, then the profiled run.
    let warm = Instant::now();
    while warm.elapsed().as_secs_f64() < WARMUP_S {
        probe(&mut m, &prompt, a.tokens)?;
    }
    if a.spans_first && m.has_timestamps() {
        let (_, busy, idle, secs_sp) = spans_run(&mut m, &prompt, a.tokens)?;
        eprintln!(
            "(spans first) {}",
            span_line(&busy, &idle, secs_sp, a.tokens)
        );
    }
    let mut run = None;
    for k in 0..a.repeat.max(1) {
        m.reset_host_times();
        let (ids, secs) = probe(&mut m, &prompt, a.tokens)?;
        if a.repeat > 1 {
            eprintln!("  timed run {k}: {:.1} tok/s", a.tokens as f64 / secs);
        }
        run = Some((ids, secs));
    }
    let (ids, secs) = run.expect("at least one run");
    let host = m.host_times();
    // the same run again with a timestamp at each step's beginning and end: GPU time per step
    // and GPU idle time between steps (a second run, so the timed run above carries no queries)
    let spans = if m.has_timestamps() {
        let (ids_sp, busy, idle, secs_sp) = spans_run(&mut m, &prompt, a.tokens)?;
        ensure!(
            ids == ids_sp,
            "the step-timestamp run chose different tokens"
        );
        Some((busy, idle, secs_sp))
    } else {
        None
    };
    m.reset();
    m.start_profile();
    let (ids_prof, _) = probe(&mut m, &prompt, a.tokens)?;
    let profile = m.take_profile()?;
    let tokens_match = ids == ids_prof;
    ensure!(
        tokens_match,
        "profile mode chose different tokens: {ids:?} vs {ids_prof:?}"
    );

    let per_op = if a.per_op {
        m.reset();
        m.start_op_profile()?;
        let (ids_op, _) = probe(&mut m, &prompt, a.tokens)?;
        let ops = m.take_op_profile();
        ensure!(
            ids == ids_op,
            "the per-op profile chose different tokens: {ids:?} vs {ids_op:?}"
        );
        Some(ops)
    } else {
        None
    };

    let dispatches = m.step_dispatches();
    let [rec_ms, fin_ms, sub_ms, _] = host.per_step_ms();
    let host_ms = rec_ms + fin_ms + sub_ms;
    let gpu_ms = spans.as_ref().map(|(busy, _, _)| mean_ms(busy));
    let (copy_gbs, copy_source) = copy_bandwidth(&gpu, a.peak_gbs, a.copy_mib)?;
    let report = DecodeReport {
        adapter: gpu.describe(),
        model: dir.display().to_string(),
        decode_tok_s: a.tokens as f64 / secs,
        tok_s_profiled: false,
        profile,
        copy_gbs,
        copy_source,
        stream: None,
    };
    if a.json {
        let mut v = report.to_json();
        v["prompt_tokens"] = PROBE_PROMPT.into();
        v["tokens_match"] = tokens_match.into();
        v["timestamps"] = gpu.has_timestamps().into();
        if let Some((busy, idle, secs_sp)) = &spans {
            v["steps_gpu"] = span_json(busy, idle, *secs_sp, a.tokens);
            eprintln!("{}", span_line(busy, idle, *secs_sp, a.tokens));
        }
        if let Some(ops) = &per_op {
            v["per_op"] = ops.to_json();
            eprintln!("{}", ops.text());
        }
        let [r, f, sub, wait] = host.per_step_ms();
        v["host_ms_per_step"] = serde_json::json!({
            "record": r, "finish": f, "submit": sub, "wait_for_id": wait,
            "record_finish_submit": host_ms,
        });
        v["gpu_busy_ms_per_step"] = gpu_ms.into();
        v["host_below_gpu"] = gpu_ms.map(|g| host_ms < g).into();
        v["dispatches"] = dispatches.map(|d| d.to_json()).into();
        eprintln!("{}", report.text());
        eprintln!("{}", host_line(&host));
        if let Some(d) = &dispatches {
            eprintln!("{}", d.text());
        }
        if let Some(g) = gpu_ms {
            eprintln!("{}", host_gpu_line(host_ms, g));
        }
        outln!("{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        outln!("{}", report.text())?;
        outln!("{}", host_line(&host))?;
        if let Some((busy, idle, secs_sp)) = &spans {
            outln!("{}", span_line(busy, idle, *secs_sp, a.tokens))?;
        }
        if let Some(d) = &dispatches {
            outln!("{}", d.text())?;
        }
        if let Some(g) = gpu_ms {
            outln!("{}", host_gpu_line(host_ms, g))?;
        }
        if let Some(ops) = &per_op {
            outln!("{}", ops.text())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
