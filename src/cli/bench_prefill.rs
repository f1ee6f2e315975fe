//! `inkling-wgpu bench prefill`: prefill tok/s and time to first token on the GPU forward. For
//! each prompt length N, N fixed pseudo-random ids below the vocabulary are fed from position
//! 0 and the first greedy token is read back (`GpuModel::forward_greedy`): once untimed (pipelines
//! and recorded steps of its chunk shapes), then `--repeat` timed runs by wall clock, median
//! reported. Time to first token = that time; prefill tok/s = N / time.
//!
//! The model is built for chunks of the largest `--chunk` (default: the engine's
//! [`DEFAULT_MAX_CHUNK`]); that chunk runs exactly as `generate` does (inner chunks without a
//! head). A smaller `--chunk` C feeds the prompt as consecutive `forward_greedy` calls of C ids,
//! so each piece also runs the head and waits for its id. `--compare` times every length twice,
//! on two models built the same way: GEMV only (the engine before the prefill GEMM) and with
//! the GEMM ([`crate::gpu::gemm`]).
//!
//! A prompt of N tokens takes positions 0..N, so it fits a model of N positions
//! (`max_position_embeddings`); the default lengths are [`default_prompts`] of the model's context.
use super::context::{ensure_arg, OrBadArgument};
use super::output::outln;
use crate::gpu::linear::args::Tile;
use crate::gpu::linear::route::{GemmTiles, LinearOptions};
use crate::gpu::Gpu;
use crate::model::gpu::DEFAULT_MAX_CHUNK;
use crate::model::{Checkpoint, GpuModel, GpuModelOptions, Weights};
use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct PrefillArgs {
    /// Checkpoint or container directory (default: the bundled demo model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Prompt lengths in tokens, comma-separated, each at most the model's context (default:
    /// 128,512,2048, those within the context, plus the context itself when it is shorter than
    /// 2048).
    #[arg(allow_negative_numbers = true, long, value_delimiter = ',')]
    pub prompt: Vec<usize>,
    /// Tokens per submission, comma-separated (default: the engine's default chunk).
    #[arg(allow_negative_numbers = true, long, value_delimiter = ',')]
    pub chunk: Vec<usize>,
    /// Timed runs per prompt length (the median is reported).
    #[arg(allow_negative_numbers = true, long, default_value_t = 3, value_parser = super::values::parse_iters)]
    pub repeat: usize,
    /// Also time every length with the GEMV only (a second model), for a before/after table.
    #[arg(long)]
    pub compare: bool,
    /// GEMM tiles RMxBN for the automatic choice, comma-separated, one model each (default: the
    /// selection's own; RM in 1, 2, 4, 8 and BN in 8, 16, 32).
    #[arg(long, value_delimiter = ',')]
    pub tiles: Vec<String>,
    /// Print one JSON object on stdout (the table goes to stderr).
    #[arg(long)]
    pub json: bool,
}

/// The prompt lengths without `--prompt`.
pub const DEFAULT_PROMPTS: [usize; 3] = [128, 512, 2048];

/// The default prompt lengths for a model of `ctx` positions (`None`: unknown, no limit): those of
/// [`DEFAULT_PROMPTS`] within `ctx`, and `ctx` itself when it is shorter than the longest, so that
/// the longest prompt the model takes is timed. `Some(512)` gives 128, 512; `Some(1000)` gives
/// 128, 512, 1000; `Some(100)` gives 100.
pub fn default_prompts(ctx: Option<usize>) -> Vec<usize> {
    let Some(ctx) = ctx else {
        return DEFAULT_PROMPTS.to_vec();
    };
    let mut v: Vec<usize> = DEFAULT_PROMPTS.into_iter().filter(|&n| n <= ctx).collect();
    if ctx >= 1 && v.last() != Some(&ctx) && ctx < DEFAULT_PROMPTS[DEFAULT_PROMPTS.len() - 1] {
        v.push(ctx);
    }
    v
}

/// `n` fixed pseudo-random ids below `width`.
pub fn prompt_ids(n: usize, width: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| ((i * 2654435761 + 12345) % width.max(1) as u64) as u32)
        .collect()
}

/// Feed `ids` from position 0 in pieces of `chunk` (one piece when it is the model's chunk);
/// returns the seconds to the first token.
fn prefill(m: &mut GpuModel, ids: &[u32], chunk: usize) -> anyhow::Result<f64> {
    m.reset();
    let t0 = Instant::now();
    if chunk == m.max_chunk() {
        m.forward_greedy(ids)?;
    } else {
        for piece in ids.chunks(chunk) {
            m.forward_greedy(piece)?;
        }
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// Time the prefill of every `--prompt` length (see the module docs).
///
/// Errors: a `--prompt` length of 0 or past the model's context (naming the length and the
/// context), `--chunk` 0, a bad `--tiles`, a model that does not load or build on the adapter.
pub fn run(a: PrefillArgs) -> anyhow::Result<ExitCode> {
    ensure_arg!(
        a.prompt.iter().all(|&n| n >= 1),
        "--prompt: every length must be at least 1"
    );
    let chunks = if a.chunk.is_empty() {
        vec![DEFAULT_MAX_CHUNK]
    } else {
        a.chunk.clone()
    };
    ensure_arg!(chunks.iter().all(|&c| c >= 1), "--chunk must be at least 1");
    let tiles: Vec<Option<Tile>> = super::bench_gemm::parse_tiles(&a.tiles)
        .or_bad_argument()?
        .into_iter()
        .map(Some)
        .collect();
    let tiles = if tiles.is_empty() { vec![None] } else { tiles };
    let dir = match &a.model {
        Some(d) => d.clone(),
        None => crate::bundled::materialize()?,
    };
    let ck = Checkpoint::open(&dir)?;
    let ctx = ck.config.max_position_embeddings;
    let prompts = if a.prompt.is_empty() {
        default_prompts(ctx)
    } else {
        a.prompt.clone()
    };
    let Some(&max_n) = prompts.iter().max() else {
        anyhow::bail!("the model's context of 0 positions takes no prompt");
    };
    if let Some(max) = ctx {
        ensure_arg!(
            max_n <= max,
            "--prompt {max_n}: a prompt of {max_n} tokens needs {max_n} positions, more than the \
             model's context of {max} (max_position_embeddings); use lengths of at most {max}"
        );
    }
    let w = Weights::load(&ck)?;
    let gpu = Gpu::new()?;
    super::bench_gemm::check_tiles_fit(&gpu, &tiles.iter().flatten().copied().collect::<Vec<_>>())?;
    let width = w.config.logits_width().min(w.config.vocab_size);
    let max_chunk = *chunks.iter().max().expect("a chunk");
    let say = |line: String| super::output::report_line(a.json, &line);
    say(format!("adapter: {}", gpu.describe()))?;
    say(format!("model: {}", dir.display()))?;
    say(format!(
        "{:<6} {:>6} {:>6} {:>10} {:>12}",
        "kernel", "chunk", "prompt", "TTFT ms", "prefill tok/s"
    ))?;
    // (GEMM on, tile override)
    let mut modes: Vec<(bool, Option<Tile>)> = Vec::new();
    if a.compare {
        modes.push((false, None));
    }
    modes.extend(tiles.iter().map(|&t| (true, t)));
    let mut results = Vec::new();
    for &(gemm, tile) in &modes {
        let linear = LinearOptions {
            gemm: match (gemm, tile) {
                (false, _) => GemmTiles::Off,
                (true, None) => GemmTiles::Auto,
                (true, Some(t)) => GemmTiles::Fixed(t),
            },
            ..LinearOptions::default()
        };
        let opts = GpuModelOptions {
            max_chunk,
            linear,
            ..GpuModelOptions::new(max_n)
        };
        let mut m = GpuModel::new(&gpu, &w, opts)
            .with_context(|| format!("building the GPU model on {}", gpu.describe()))?;
        let kernel = match (gemm, tile) {
            (false, _) => "gemv".to_string(),
            (true, None) => "gemm".to_string(),
            (true, Some(t)) => format!("{}x{}", t.rm, t.pairs()),
        };
        for &c in &chunks {
            for &n in &prompts {
                let ids = prompt_ids(n, width);
                prefill(&mut m, &ids, c)?;
                let mut secs: Vec<f64> = (0..a.repeat)
                    .map(|_| prefill(&mut m, &ids, c))
                    .collect::<anyhow::Result<_>>()?;
                secs.sort_by(f64::total_cmp);
                let s = secs[secs.len() / 2];
                say(format!(
                    "{kernel:<6} {c:>6} {n:>6} {:>10.1} {:>12.1}",
                    s * 1e3,
                    n as f64 / s
                ))?;
                results.push(serde_json::json!({
                    "kernel": kernel, "chunk": c, "prompt_tokens": n, "ttft_s": s,
                    "prefill_tok_s": n as f64 / s, "runs_s": secs,
                }));
            }
        }
    }
    if a.json {
        let doc = serde_json::json!({
            "adapter": gpu.describe(), "model": dir.display().to_string(),
            "repeat": a.repeat, "results": results,
        });
        outln!("{}", serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(ExitCode::SUCCESS)
}
