//! `inkling-wgpu bench stream`: streamed decode beside its I/O bound. For each slot count (a
//! number, or a percentage of the model's routed experts; 100% is the resident model), one model
//! is built, a prompt of `--prompt` fixed pseudo-random ids is fed and `--tokens` greedy ids are
//! decoded; the decode's misses give the bytes a token reads from the container. The read
//! bandwidth is measured in the same run, on the same number of threads as the uploads
//! ([`crate::model::stream::upload_threads`]): whole experts copied from the mapped container
//! into host memory, from the page cache (read once untimed first) or, with `--cold`, from the
//! disk (pages dropped first). Then
//!
//! * I/O bound (tok/s) = read GB/s ÷ (decode misses per token × bytes per expert), and
//! * reached = decode tok/s ÷ I/O bound.
//!
//! With `--cold` every row starts with the container's pages dropped
//! ([`crate::model::page_cache::drop_cached_pages`]). Two checks end the table: every row's
//! ids equal the first row's (streaming is exact), and more slots never decode slower than
//! fewer.
use super::context::{ensure_arg, BadArgument};
use super::output::outln;
use crate::gpu::Gpu;
use crate::model::stream::{expert_pieces, upload_threads};
use crate::model::weights::{Ffn, Mlp};
use crate::model::{Checkpoint, GpuModel, GpuModelOptions, Placement, Weights};
use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct StreamArgs {
    /// Checkpoint or container directory with routed experts.
    #[arg(long)]
    pub model: PathBuf,
    /// Expert slots of each row, comma-separated: a count, or a percentage of the model's
    /// routed experts (100% = resident).
    #[arg(
        allow_hyphen_values = true,
        long,
        value_delimiter = ',',
        default_value = "100%,50%,25%"
    )]
    pub slots: Vec<String>,
    /// Prompt length in tokens.
    #[arg(allow_negative_numbers = true, long, default_value_t = 16, value_parser = super::values::parse_tokens)]
    pub prompt: usize,
    /// Greedy tokens decoded per row (the first comes from the prompt; the rest are timed).
    #[arg(allow_negative_numbers = true, long, default_value_t = 32, value_parser = super::values::parse_tokens)]
    pub tokens: usize,
    /// Read from the disk: drop the container's pages before the bandwidth measurement and
    /// before every row (Linux).
    #[arg(long)]
    pub cold: bool,
    /// Print one JSON object on stdout (the table goes to stderr).
    #[arg(long)]
    pub json: bool,
}

/// One row of the table.
struct Row {
    slots: usize,
    resident: bool,
    ids: Vec<u32>,
    decode_tok_s: f64,
    /// Misses and bytes read per decode token.
    misses_per_token: f64,
    bytes_per_token: f64,
    hit_rate: Option<f64>,
    host_copy_gbs: f64,
    upload_s: f64,
    routing_wait_s: f64,
    /// Pipelines built during the decode, and their seconds.
    compiles: crate::gpu::kernel::Compiles,
    /// With `--cold`: the fraction of the container still cached after the row's drop.
    cached: Option<f64>,
}

/// The slot count `s` names for a model of `total` routed experts: `N` or `P%` (rounded down,
/// at least 1).
fn parse_slots(s: &str, total: usize) -> Result<usize, BadArgument> {
    let bad = || {
        BadArgument(format!(
            "--slots: expected a count of at least 1 or a percentage in (0, 100], got {s:?}"
        ))
    };
    match s.trim().strip_suffix('%') {
        Some(p) => {
            let p: f64 = p.trim().parse().map_err(|_| bad())?;
            if !(p > 0.0 && p <= 100.0) {
                return Err(bad());
            }
            Ok(((total as f64 * p / 100.0).floor() as usize).max(1))
        }
        None => match s.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(bad()),
        },
    }
}

/// Every routed expert of `w`, layer by layer.
fn routed_experts<'a>(w: &'a Weights<'a>) -> Vec<&'a Ffn<'a>> {
    w.layers
        .iter()
        .flat_map(|l| match &l.mlp {
            Mlp::Moe(m) => m.experts.iter().collect::<Vec<_>>(),
            Mlp::Dense(_) => Vec::new(),
        })
        .collect()
}

/// Read GB/s of whole experts from the mapped container into host memory on `threads` threads:
/// up to 64 experts spread over the model, copied in 4 MiB pieces. From the page cache (a first
/// untimed read brings them in) or, when `cold`, from the disk (`ck`'s pages dropped first).
fn read_gbs(
    ck: &Checkpoint,
    experts: &[&Ffn<'_>],
    threads: usize,
    cold: bool,
) -> anyhow::Result<f64> {
    let n = experts.len().min(64);
    let step = (experts.len() / n.max(1)).max(1);
    let pieces: Vec<&[u8]> = (0..n)
        .flat_map(|k| {
            let (gu, gus, dn, dns) = expert_pieces(experts[k * step]);
            [gu[0], gu[1], gus[0], gus[1], dn, dns]
        })
        .flat_map(|p| p.chunks(4 << 20))
        .filter(|p| !p.is_empty())
        .collect();
    let copy_all = || -> (u64, f64) {
        let t0 = Instant::now();
        let per = pieces.len().div_ceil(threads.max(1)).max(1);
        let bytes: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = pieces
                .chunks(per)
                .map(|mine| {
                    s.spawn(move || {
                        let mut buf = vec![0u8; 4 << 20];
                        let mut n = 0u64;
                        for p in mine {
                            buf[..p.len()].copy_from_slice(p);
                            n += std::hint::black_box(&buf[..p.len()]).len() as u64;
                        }
                        n
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a read thread panicked"))
                .sum()
        });
        (bytes, t0.elapsed().as_secs_f64())
    };
    if cold {
        if let Some(f) = drop_pages(ck)? {
            eprintln!(
                "bench stream: {:.1}% of the container still cached after dropping its pages",
                100.0 * f
            );
        }
    } else {
        copy_all();
    }
    let (bytes, s) = copy_all();
    Ok(bytes as f64 / s / 1e9)
}

/// Drop `ck`'s pages from the page cache; returns the fraction still cached after the drop (the
/// kernel keeps pages it cannot drop, e.g. dirty ones not yet written back), when it can tell.
fn drop_pages(ck: &Checkpoint) -> anyhow::Result<Option<f64>> {
    let (mut cached, mut total) = (0.0, 0.0);
    for s in &ck.shards {
        crate::model::page_cache::drop_cached_pages(s).context("--cold")?;
        let len = std::fs::metadata(&s.path).map_or(0, |m| m.len()) as f64;
        match crate::model::page_cache::cached_fraction(s) {
            Some(f) => cached += f * len,
            None => return Ok(None),
        }
        total += len;
    }
    Ok((total > 0.0).then(|| cached / total))
}

pub fn run(a: StreamArgs) -> anyhow::Result<ExitCode> {
    let ck = Checkpoint::open(&a.model)?;
    let w = Weights::load(&ck)?;
    let experts = routed_experts(&w);
    ensure_arg!(
        !experts.is_empty(),
        "{}: the model has no routed experts to stream",
        a.model.display()
    );
    ensure_arg!(
        a.tokens >= 2,
        "--tokens {}: the first token comes from the prompt, so at least 2 are needed to time a decode",
        a.tokens
    );
    let total = experts.len();
    let mut slots = Vec::new();
    for s in &a.slots {
        slots.push(parse_slots(s, total)?);
    }
    let gpu = Gpu::new()?;
    let threads = upload_threads();
    let expert_bytes = {
        let (gu, gus, dn, dns) = expert_pieces(experts[0]);
        (gu[0].len() + gu[1].len() + gus[0].len() + gus[1].len() + dn.len() + dns.len()) as u64
    };
    let gbs = read_gbs(&ck, &experts, threads, a.cold)?;
    let width = w.config.logits_width();
    let prompt = super::bench_prefill::prompt_ids(a.prompt, width);
    let max_seq = a.prompt + a.tokens;
    if let Some(ctx) = w.config.max_position_embeddings {
        ensure_arg!(
            max_seq <= ctx,
            "--prompt + --tokens ({max_seq}) is more than the model's context of {ctx}"
        );
    }
    let mut rows: Vec<Row> = Vec::new();
    for &n in &slots {
        let cached = if a.cold { drop_pages(&ck)? } else { None };
        let opts = GpuModelOptions {
            placement: Placement::Slots(n),
            ..GpuModelOptions::new(max_seq)
        };
        let mut m = GpuModel::new(&gpu, &w, opts)
            .with_context(|| format!("building the model with {n} expert slots"))?;
        let resident = m.stream_stats().is_none();
        let mut ids = vec![m.forward_greedy(&prompt)?];
        let before = m.stream_stats().unwrap_or_default();
        let compiles = gpu.compiles.read();
        let t0 = Instant::now();
        while ids.len() < a.tokens {
            let last = *ids.last().expect("one id");
            ids.push(m.forward_greedy(&[last])?);
        }
        let dt = t0.elapsed().as_secs_f64();
        let compiles = gpu.compiles.read().since(compiles);
        let d = m
            .stream_stats()
            .map(|s| s.since(&before))
            .unwrap_or_default();
        let steps = (a.tokens - 1).max(1) as f64;
        rows.push(Row {
            slots: n,
            resident,
            ids,
            decode_tok_s: if a.tokens > 1 { steps / dt } else { 0.0 },
            misses_per_token: d.misses as f64 / steps,
            bytes_per_token: d.bytes_read as f64 / steps,
            hit_rate: d.hit_rate(),
            host_copy_gbs: d.upload_gbs(),
            upload_s: d.upload_s,
            routing_wait_s: d.routing_wait_s,
            compiles,
            cached,
        });
    }
    report(&a, &gpu, &rows, gbs, expert_bytes, threads)
}

/// Tokens per second the reads alone allow: `gbs` over the bytes a token reads (`None` when a
/// token reads nothing).
fn io_bound(gbs: f64, misses_per_token: f64, expert_bytes: u64) -> Option<f64> {
    let per_token = misses_per_token * expert_bytes as f64;
    (per_token > 0.0).then(|| gbs * 1e9 / per_token)
}

fn report(
    a: &StreamArgs,
    gpu: &Gpu,
    rows: &[Row],
    gbs: f64,
    expert_bytes: u64,
    threads: usize,
) -> anyhow::Result<ExitCode> {
    let source = if a.cold {
        "disk (pages dropped)"
    } else {
        "page cache"
    };
    let exact = rows.iter().all(|r| r.ids == rows[0].ids);
    // more slots never slower: every row against every row with fewer slots
    let mut slower = Vec::new();
    for x in rows {
        for y in rows.iter().filter(|y| y.slots < x.slots) {
            if x.decode_tok_s < y.decode_tok_s {
                slower.push(format!(
                    "{} slots {:.1} tok/s < {} slots {:.1} tok/s",
                    x.slots, x.decode_tok_s, y.slots, y.decode_tok_s
                ));
            }
        }
    }
    let mut table = format!(
        "bench stream: {} | {} | read {gbs:.2} GB/s from the {source} on {threads} threads | {:.2} MB per expert | prompt {} tok, {} decoded\n\
         | slots | decode tok/s | hit rate | misses/token | MB/token | I/O bound tok/s | reached | host copy GB/s | upload s | routing wait s | pipelines built (s) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
        a.model.display(),
        gpu.describe(),
        expert_bytes as f64 / 1e6,
        a.prompt,
        a.tokens,
    );
    let mut json_rows = Vec::new();
    for r in rows {
        let bound = io_bound(gbs, r.misses_per_token, expert_bytes);
        let reached = bound.map(|b| r.decode_tok_s / b);
        let mut label = if r.resident {
            format!("{} (resident)", r.slots)
        } else {
            r.slots.to_string()
        };
        if let Some(f) = r.cached {
            label += &format!(" ({:.0}% cached at start)", 100.0 * f);
        }
        table += &format!(
            "| {label} | {:.1} | {} | {:.1} | {:.1} | {} | {} | {:.2} | {:.3} | {:.3} | {} ({:.3}) |\n",
            r.decode_tok_s,
            r.hit_rate
                .map_or("—".into(), |h| format!("{:.1}%", 100.0 * h)),
            r.misses_per_token,
            r.bytes_per_token / 1e6,
            bound.map_or("—".into(), |b| format!("{b:.1}")),
            reached.map_or("—".into(), |x| format!("{:.0}%", 100.0 * x)),
            r.host_copy_gbs,
            r.upload_s,
            r.routing_wait_s,
            r.compiles.count,
            r.compiles.seconds,
        );
        json_rows.push(serde_json::json!({
            "slots": r.slots,
            "resident": r.resident,
            "decode_tok_s": r.decode_tok_s,
            "hit_rate": r.hit_rate,
            "misses_per_token": r.misses_per_token,
            "bytes_per_token": r.bytes_per_token,
            "io_bound_tok_s": bound,
            "reached": reached,
            "host_copy_gbs": r.host_copy_gbs,
            "upload_s": r.upload_s,
            "routing_wait_s": r.routing_wait_s,
            "decode_pipelines_built": r.compiles.count,
            "decode_pipelines_s": r.compiles.seconds,
            "cached_after_drop": r.cached,
        }));
    }
    table += &format!(
        "ids identical in every row: {}\nmore slots never decode slower than fewer: {}\n",
        if exact { "yes" } else { "NO" },
        if slower.is_empty() {
            "yes".to_string()
        } else {
            format!("NO ({})", slower.join("; "))
        }
    );
    if a.json {
        eprint!("{table}");
        let v = serde_json::json!({
            "model": a.model.display().to_string(),
            "adapter": gpu.describe(),
            "read_gbs": gbs,
            "read_from": source,
            "threads": threads,
            "expert_bytes": expert_bytes,
            "prompt_tokens": a.prompt,
            "tokens": a.tokens,
            "rows": json_rows,
            "ids_identical": exact,
            "more_slots_never_slower": slower.is_empty(),
        });
        outln!("{v}")?;
    } else {
        outln!("{table}")?;
    }
    // a streamed run that changed the tokens is a failure, whatever the speed
    Ok(if exact {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_counts_or_percentages_of_the_routed_experts() {
        assert_eq!(parse_slots("1024", 2048).unwrap(), 1024);
        assert_eq!(parse_slots("50%", 2048).unwrap(), 1024);
        assert_eq!(parse_slots("25%", 2047).unwrap(), 511);
        assert_eq!(parse_slots("0.01%", 100).unwrap(), 1);
        assert_eq!(parse_slots("100%", 16).unwrap(), 16);
        for bad in ["0", "0%", "101%", "-5", "x", "%", ""] {
            let e = parse_slots(bad, 64).unwrap_err().to_string();
            assert!(
                e.contains("--slots") && e.contains(&format!("{bad:?}")),
                "{e}"
            );
        }
    }

    #[test]
    fn the_io_bound_is_the_read_rate_over_the_bytes_a_token_reads() {
        // 2 misses of 10 MB per token at 20 GB/s: 1000 tok/s
        let b = io_bound(20.0, 2.0, 10_000_000).unwrap();
        assert!((b - 1000.0).abs() < 1e-9, "{b}");
        assert_eq!(io_bound(20.0, 0.0, 10_000_000), None);
    }
}
