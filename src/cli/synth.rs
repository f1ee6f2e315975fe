//! `inkling-wgpu synth`: a stamped container with random weights at the real Inkling shapes
//! (see [`crate::container::synth`]).
use super::context::OrBadArgument;
use super::convert::parse_encoding;
use super::info::human;
use crate::container::synth::{file_sizes, plan, synth, SynthOptions, SynthSpec};
use crate::formats::Encoding;
use anyhow::bail;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Write a container of random weights at real shapes, for benchmarks (the help text is
/// [`AFTER_HELP`]).
#[derive(clap::Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct Args {
    /// inkling, inkling-small or tiny.
    #[arg(long)]
    pub preset: String,
    /// Number of layers (num_hidden_layers), 1 to 1024.
    #[arg(allow_negative_numbers = true, long)]
    pub layers: usize,
    /// Routed experts: int4, int4-g32, int4-g64, int4-g128, int3-g64, bf16 or f32.
    #[arg(long)]
    pub experts: String,
    /// Shared experts (same spellings).
    #[arg(long, default_value = "bf16")]
    pub shared: String,
    /// Attention projections and dense MLPs (same spellings).
    #[arg(long, default_value = "bf16")]
    pub dense: String,
    /// The output head lm_head (same spellings).
    #[arg(long, default_value = "bf16")]
    pub head: String,
    /// Make the first N layers (at most --layers) dense MLPs (width 24576 for inkling) instead of
    /// sparse.
    #[arg(allow_negative_numbers = true, long, default_value_t = 0)]
    pub dense_layers: usize,
    /// Random seed; the same seed writes the same bytes.
    #[arg(allow_negative_numbers = true, long, default_value_t = 0)]
    pub seed: u64,
    /// Vocabulary size (default: the preset's; smaller for quick tests, down to the bundled
    /// tokenizer's vocabulary).
    #[arg(allow_negative_numbers = true, long)]
    pub vocab: Option<usize>,
    /// Routed experts per sparse layer instead of the preset's count, at least its top-k: the same
    /// shapes and top-k, so a decode token reads the same expert bytes, in a container small
    /// enough for full depth (the full-depth decode probe).
    #[arg(allow_negative_numbers = true, long)]
    pub routed_experts: Option<usize>,
    /// Destination directory, new or empty (not needed with --dry-run).
    #[arg(long, required_unless_present = "dry_run")]
    pub out: Option<PathBuf>,
    /// Replace a previous container in the destination.
    #[arg(long)]
    pub force: bool,
    /// Largest shard size in MiB, at least 1 (a layer's expert slab is never split).
    #[arg(allow_negative_numbers = true, long, default_value_t = 4096, value_parser = super::convert::parse_shard_mib)]
    pub max_shard_mib: usize,
    /// Generator threads (0: all cores).
    #[arg(allow_negative_numbers = true, long, default_value_t = 0)]
    pub threads: usize,
    /// Only print the planned size; write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Presets, assumptions and the tokenizer, printed after the options by `synth --help`.
pub const AFTER_HELP: &str = "\
Presets:
  inkling        hidden 6144; full layers 64 heads / 8 KV heads, sliding layers 64 / 16, head_dim 128;
                 256 routed experts of width 3072, top-6, 2 shared; vocab 201024 (unpadded 200058);
                 dense width 24576 (only with --dense-layers); window 512, rel_extent 1024, d_rel 16.
  inkling-small  hidden 4096, 32 heads / 8 KV heads, head_dim 128, 256 routed experts of width 2048,
                 top-6, 2 shared, the same vocab. The expert width 2048 is OUR ASSUMPTION, as are its
                 sliding-layer head counts (32 / 8) and dense width 16384.
  tiny           hidden 64, 8 experts of width 32: for tests.
--routed-experts N (N >= top-k) keeps top-k and every shape with N routed experts per layer: a decode
token reads the same expert bytes as with the preset's count, from a far smaller container.
Layer i is sliding unless (i+1) % 6 == 0. Weights are random, drawn directly in their stored format
(values about N(0, 0.02), positive scales, norms about 1, router spread over all experts); the same
seed writes the same bytes. The written container is laid out exactly like `convert` output.
The tokenizer is the bundled tiny BPE (a few hundred tokens, with Inkling's chat specials, so
`serve` and `chat` run on the container): ids beyond its vocabulary have no text. That is fine
for benchmarks, not for reading output.";

/// The vocabulary of the tokenizer every synthetic container gets (special tokens included).
fn tokenizer_vocab() -> anyhow::Result<usize> {
    let t = tokenizers::Tokenizer::from_bytes(crate::container::synth::TOKENIZER_JSON)
        .map_err(|e| anyhow::anyhow!("the bundled tokenizer: {e}"))?;
    Ok(t.get_vocab_size(true))
}

fn enc(s: &str, what: &str) -> anyhow::Result<Encoding> {
    parse_encoding(what, s)?.ok_or_else(|| {
        super::context::BadArgument(format!("--{what}: `keep` has no meaning for synth")).into()
    })
}

/// Free bytes on the file system holding `dir` (its nearest existing ancestor), from `df -Pk`;
/// `None` when that cannot be told.
fn free_bytes(dir: &Path) -> Option<u64> {
    let mut d = dir.to_path_buf();
    while !d.exists() {
        d = d.parent()?.to_path_buf();
        if d.as_os_str().is_empty() {
            d = PathBuf::from(".");
        }
    }
    let out = std::process::Command::new("df")
        .arg("-Pk")
        .arg(&d)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let kb: u64 = text
        .lines()
        .nth(1)?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Most layers `synth` writes: about 16 times Inkling's 66, well past any probe; the plan of a
/// container grows with its layers (about 0.6 MB of memory per inkling-small layer).
pub const MAX_LAYERS: usize = 1024;

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    super::context::ensure_arg!(
        (1..=MAX_LAYERS).contains(&a.layers),
        "--layers {}: want 1 to {MAX_LAYERS} layers",
        a.layers
    );
    super::context::ensure_arg!(
        a.dense_layers <= a.layers,
        "--dense-layers {}: at most --layers ({}), the layers there are",
        a.dense_layers,
        a.layers
    );
    let mut spec = SynthSpec::preset(&a.preset, a.layers).or_bad_argument()?;
    if let Some(v) = a.vocab {
        let min = tokenizer_vocab()?;
        super::context::ensure_arg!(
            v >= min,
            "--vocab {v}: at least {min}, the bundled tokenizer's vocabulary (its chat specials, \
             which chat and serve use, end at id {})",
            min - 1
        );
        let max = crate::model::config::MAX_LENGTH;
        super::context::ensure_arg!(
            v <= max,
            "--vocab {v}: at most {max}, the loader's limit for vocab_size"
        );
        spec = spec.with_vocab(v);
    }
    if let Some(n) = a.routed_experts {
        spec = spec
            .with_routed_experts(n, "--routed-experts")
            .or_bad_argument()?;
    }
    spec.experts = enc(&a.experts, "experts")?;
    spec.shared = enc(&a.shared, "shared")?;
    spec.dense = enc(&a.dense, "dense")?;
    spec.head = enc(&a.head, "head")?;
    spec.dense_layers = a.dense_layers;
    spec.seed = a.seed;
    if let Some(out) = a.out.as_deref().filter(|_| !a.dry_run) {
        super::convert::check_out(out)?;
    }
    let max_shard_bytes = a.max_shard_mib << 20;
    let sizes = file_sizes(&spec, max_shard_bytes)?;
    let total: u64 = sizes.iter().sum();
    let token_bytes = plan(&spec)?.token_bytes();
    eprintln!(
        "synth {} · {} · {} routed experts, top-{} · experts {} · shared {} · dense {} · head {}: {} ({total} bytes) in {}; a decode token reads {} ({token_bytes} bytes) of weights",
        a.preset,
        super::bench_calls::plural(spec.layers, "layer", "layers"),
        spec.n_experts,
        spec.top_k,
        spec.experts.spelling(),
        spec.shared.spelling(),
        spec.dense.spelling(),
        spec.head.spelling(),
        human(total),
        super::bench_calls::plural(sizes.len(), "shard", "shards"),
        human(token_bytes)
    );
    if a.dry_run {
        return Ok(ExitCode::SUCCESS);
    }
    let Some(out) = a.out.as_deref() else {
        bail!("--out DIR is required (only --dry-run writes nothing)");
    };
    if let Some(free) = free_bytes(out) {
        if free < total {
            bail!(
                "{} has {} free, the container needs {}",
                out.display(),
                human(free),
                human(total)
            );
        }
    }
    let t0 = Instant::now();
    let opts = SynthOptions {
        force: a.force,
        max_shard_bytes,
        fail: Default::default(),
        progress: true,
        threads: a.threads,
    };
    let s = super::convert::writing_into(out, || synth(&spec, out, &opts))?;
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "wrote {} tensors, {} ({} bytes) in {} into {} in {secs:.1} s ({:.2} GB/s)",
        s.tensors,
        human(s.bytes),
        s.bytes,
        super::bench_calls::plural(s.shards.len(), "shard", "shards"),
        out.display(),
        s.bytes as f64 / secs / 1e9
    );
    Ok(ExitCode::SUCCESS)
}
