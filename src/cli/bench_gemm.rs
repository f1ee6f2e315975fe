//! `inkling-wgpu bench gemm`: the prefill GEMM ([`crate::gpu::gemm`]) against the GEMV on the
//! projections of one Inkling-Small prefill chunk of T tokens: a dense [4096 x 4096] linear
//! (pairs (0, t)), and the routed gate_up 256x[4096 x 4096] and down 256x[4096 x 2048] with
//! 6 random distinct experts per token (the down reading x per pair). Prints µs per call (the
//! grouping pass included), µs per token and the useful TFLOP/s, 2·O·I·P / time, each with at
//! least 3 significant figures ([`sig3`]); a progress bar with an ETA on a terminal.
//!
//! Quick mode (`--quick`, always on a CPU adapter such as lavapipe, which runs a [1024 x 1024]
//! GEMV over 16 tokens in about 0.2 s): dimensions / [`QUICK_DIV`], [`QUICK_EXPERTS`] routed
//! experts, chunks of [`QUICK_TOKENS`] unless `--tokens` is given, at most [`QUICK_ITERS`] calls
//! per timing; the default run then ends in seconds on lavapipe.
use super::bench_calls::{progress, sig3, slab_bytes, time_calls};
use super::context::OrBadArgument;
use super::output::outln;
use crate::formats::Encoding;
use crate::gpu::linear::format::supported;
use crate::gpu::linear::gemm::workgroup_bytes;
use crate::gpu::linear::route::{self, LinearOptions, TILES};
use crate::gpu::linear::{GemmChoice, GemvArgs, GpuWeights, Tile, NO_GAMMA};
use crate::gpu::Gpu;
use anyhow::Context;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct GemmArgs {
    /// Kernel encodings, comma-separated (default: bf16, int4-g64, int3-g64).
    #[arg(long, value_delimiter = ',')]
    pub formats: Vec<String>,
    /// Tokens of the chunk, comma-separated (default: 64,512,2048; 8,32 in quick mode).
    #[arg(allow_negative_numbers = true, long, value_delimiter = ',')]
    pub tokens: Vec<u32>,
    /// GEMM tiles RMxBN to time besides the GEMV and the automatic choice, comma-separated, RM
    /// in 1, 2, 4, 8 and BN in 8, 16, 32 (default: every tile the selection can pick).
    #[arg(long, value_delimiter = ',')]
    pub tiles: Vec<String>,
    /// Calls per timing (at most 2 in quick mode).
    #[arg(allow_negative_numbers = true, long, default_value_t = 10, value_parser = super::values::parse_iters)]
    pub iters: usize,
    /// Quick mode: dimensions / 16, 8 routed experts, chunks of 8 and 32 tokens unless --tokens
    /// is given, at most 2 calls per timing (always on CPU adapters).
    #[arg(long)]
    pub quick: bool,
    /// Only the dense linear (no routed slabs).
    #[arg(long)]
    pub dense_only: bool,
    /// Print one JSON object on stdout (the table goes to stderr).
    #[arg(long)]
    pub json: bool,
}

/// Quick mode's divisor of the dimensions: the dense linear is [256 x 256].
pub const QUICK_DIV: usize = 16;
/// Quick mode's routed experts (6 of them per token).
pub const QUICK_EXPERTS: usize = 8;
/// Quick mode's chunk lengths in tokens when `--tokens` is not given.
pub const QUICK_TOKENS: [u32; 2] = [8, 32];
/// Quick mode's most calls per timing.
pub const QUICK_ITERS: usize = 2;
/// Chunk lengths in tokens when `--tokens` is not given, out of quick mode.
pub const DEFAULT_TOKENS: [u32; 3] = [64, 512, 2048];

/// A tile spelled RMxBN (`--tiles` of `bench gemm` and `bench prefill`).
fn parse_tile(s: &str) -> anyhow::Result<Tile> {
    let bad =
        || anyhow::anyhow!("--tiles {s}: want RMxBN with RM in 1, 2, 4, 8 and BN in 8, 16, 32");
    let (r, b) = s.split_once('x').ok_or_else(bad)?;
    let (rm, bn): (u32, u32) = (r.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
    anyhow::ensure!(
        matches!(rm, 1 | 2 | 4 | 8) && matches!(bn, 8 | 16 | 32),
        bad()
    );
    Ok(Tile { rm, nq: bn / 4 })
}

/// The tiles of a `--tiles` list, in order (errors: a spelling [`parse_tile`] refuses, a tile
/// listed twice, which would be timed twice).
pub(super) fn parse_tiles(list: &[String]) -> anyhow::Result<Vec<Tile>> {
    let mut tiles: Vec<Tile> = Vec::with_capacity(list.len());
    for (i, s) in list.iter().enumerate() {
        anyhow::ensure!(
            !s.is_empty(),
            "--tiles {}: entry {} is empty; list tiles as RMxBN,RMxBN",
            list.join(","),
            i + 1
        );
        let t = parse_tile(s)?;
        anyhow::ensure!(
            !tiles.contains(&t),
            "--tiles {}: the tile {s} is listed twice (entry {}); list each tile once",
            list.join(","),
            i + 1
        );
        tiles.push(t);
    }
    Ok(tiles)
}

/// Refuses (a usage error) a `--tiles` tile whose workgroup memory is past the device's
/// `max_compute_workgroup_storage_size`, before anything is timed.
pub(super) fn check_tiles_fit(gpu: &Gpu, tiles: &[Tile]) -> anyhow::Result<()> {
    let limit = gpu.limits.max_compute_workgroup_storage_size as u64;
    if let Some(t) = tiles.iter().find(|&&t| workgroup_bytes(t) > limit) {
        return Err(super::context::BadArgument(format!(
            "--tiles {}x{}: the GEMM tile needs {} bytes of workgroup memory, past this device's \
             max_compute_workgroup_storage_size of {limit}; use a tile of BN 8 or 16",
            t.rm,
            t.pairs(),
            workgroup_bytes(*t)
        ))
        .into());
    }
    Ok(())
}

/// splitmix64 step.
fn mix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `top_k` distinct random experts below `experts` per token, 16-byte pairs.
fn routed_pairs(tokens: u32, experts: u32, top_k: u32, seed: u64) -> Vec<u32> {
    let mut s = seed;
    let mut out = Vec::new();
    for t in 0..tokens {
        let mut chosen: Vec<u32> = Vec::new();
        while chosen.len() < top_k as usize {
            let e = (mix(&mut s) % experts as u64) as u32;
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        for e in chosen {
            out.extend_from_slice(&[e, t, NO_GAMMA, 0]);
        }
    }
    out
}

pub fn run(a: GemmArgs) -> anyhow::Result<ExitCode> {
    let gpu = Gpu::new()?;
    let quick = a.quick || gpu.is_cpu();
    let div = if quick { QUICK_DIV } else { 1 };
    let n_experts = if quick { QUICK_EXPERTS } else { 256 };
    let iters = if quick {
        a.iters.min(QUICK_ITERS)
    } else {
        a.iters
    };
    let tokens: Vec<u32> = match (a.tokens.is_empty(), quick) {
        (false, _) => a.tokens.clone(),
        (true, true) => QUICK_TOKENS.to_vec(),
        (true, false) => DEFAULT_TOKENS.to_vec(),
    };
    anyhow::ensure!(
        tokens.iter().all(|&t| t >= 1),
        "--tokens: every chunk must be at least 1 token"
    );
    let top_k = 6;
    let encs: Vec<Encoding> = if a.formats.is_empty() {
        vec![
            Encoding::BF16,
            Encoding::parse("int4-g64")?,
            Encoding::parse("int3-g64")?,
        ]
    } else {
        a.formats
            .iter()
            .map(|s| Encoding::parse(s).with_context(|| format!("--formats {s}")))
            .collect::<anyhow::Result<_>>()?
    };
    if let Some(e) = encs.iter().find(|&&e| !supported(e)) {
        return Err(super::context::BadArgument(format!(
            "--formats {}: no GEMM kernel for this format",
            e.spelling()
        ))
        .into());
    }
    let tiles: Vec<Tile> = if a.tiles.is_empty() {
        TILES.to_vec()
    } else {
        parse_tiles(&a.tiles).or_bad_argument()?
    };
    check_tiles_fit(&gpu, &tiles)?;
    let say = |line: String| super::output::report_line(a.json, &line);
    say(format!("adapter: {}", gpu.describe()))?;
    say(format!(
        "cooperative matrices the adapter reports (no kernel uses them): {}",
        gpu.describe_matrix_units()
    ))?;
    say(format!(
        "{:<9} {:<34} {:>5} {:>6} {:<14} {:>10} {:>9} {:>8} {:>7}",
        "format", "shape", "T", "pairs", "kernel", "us/call", "us/token", "TFLOP/s", "vs GEMV"
    ))?;
    // (label, experts, O, I, x per pair)
    let mut shapes = vec![("dense", 1usize, 4096 / div, 4096 / div, false)];
    if !a.dense_only {
        shapes.push(("routed gate_up", n_experts, 4096 / div, 4096 / div, false));
        shapes.push(("routed down", n_experts, 4096 / div, 2048 / div, true));
    }
    let mut results = Vec::new();
    let mut method = "";
    // one step per timing: the GEMV, the automatic choice and every tile
    let steps = encs.len() * shapes.len() * tokens.len() * (2 + tiles.len());
    let bar = progress(steps as u64, "bench gemm");
    for enc in &encs {
        for &(label, experts, o, i, per_pair) in &shapes {
            let eb = experts * o * enc.bytes_per_row(i);
            let sb = experts * 4 * enc.scale_count(o, i);
            // rotate copies of a dense matrix so the working set exceeds 256 MiB
            let copies = if experts > 1 || quick {
                1
            } else {
                ((256u64 << 20) / (eb + sb) as u64 + 1).min(16) as usize
            };
            let scales: Vec<u8> = (0..sb / 4).flat_map(|_| 0.01f32.to_le_bytes()).collect();
            let weights = (0..copies)
                .map(|c| {
                    let data = slab_bytes(*enc, eb, c as u64 + 1);
                    GpuWeights::from_slab_bytes(&gpu, *enc, experts, o, i, &data, &scales)
                })
                .collect::<Result<Vec<_>, _>>()?;
            let shape = if experts == 1 {
                format!("{label} [{o}x{i}]")
            } else {
                format!("{label} {experts}x[{o}x{i}]")
            };
            for &t in &tokens {
                let pairs: Vec<u32> = if experts == 1 {
                    (0..t).flat_map(|k| [0, k, NO_GAMMA, 0]).collect()
                } else {
                    routed_pairs(t, experts as u32, top_k, 7 + t as u64)
                };
                let np = (pairs.len() / 4) as u32;
                let x_rows = if per_pair { np } else { t };
                let x = gpu.storage_init(
                    "x",
                    bytemuck::cast_slice(&vec![0.25f32; x_rows as usize * i]),
                );
                let pb = gpu.storage_init("pairs", bytemuck::cast_slice(&pairs));
                let y = gpu.storage("y", 4 * (np as usize * o) as u64);
                let mut kinds = vec![("gemv".to_string(), GemmChoice::Never)];
                kinds.push(("auto".to_string(), GemmChoice::Auto));
                for &tl in &tiles {
                    kinds.push((
                        format!("gemm {}x{}", tl.rm, tl.pairs()),
                        GemmChoice::Always(tl),
                    ));
                }
                let mut gemv_t = None;
                for (kind, choice) in kinds {
                    let args = GemvArgs::new(&x, x_rows, &pb, np, &y)
                        .x_per_pair(per_pair)
                        .gemm(choice);
                    let calls = weights
                        .iter()
                        .map(|w| w.bind(&gpu, enc.format.ordinal(), args))
                        .collect::<Result<Vec<_>, _>>()?;
                    let picked = match route::route(&weights[0], &args, &LinearOptions::default())
                        .gemm_tile()
                    {
                        Some(t) => format!("gemm {}x{}", t.rm, t.pairs()),
                        None => "gemv".into(),
                    };
                    let kind = if kind == "auto" {
                        format!("auto={picked}")
                    } else {
                        kind
                    };
                    bar.set_message(format!("{} {shape} T={t} {kind}", enc.spelling()));
                    let (secs, how) = time_calls(&gpu, &calls, iters)?;
                    bar.inc(1);
                    method = how;
                    let flops = 2.0 * o as f64 * i as f64 * np as f64;
                    let base = *gemv_t.get_or_insert(secs);
                    bar.suspend(|| {
                        say(format!(
                            "{:<9} {:<34} {:>5} {:>6} {:<14} {:>10} {:>9} {:>8} {:>6}x",
                            enc.spelling(),
                            shape,
                            t,
                            np,
                            kind,
                            sig3(secs * 1e6),
                            sig3(secs * 1e6 / t as f64),
                            sig3(flops / secs / 1e12),
                            sig3(base / secs)
                        ))
                    })?;
                    results.push(serde_json::json!({
                        "format": enc.spelling(), "shape": shape, "tokens": t, "pairs": np,
                        "kernel": kind, "us_per_call": secs * 1e6,
                        "tflops": flops / secs / 1e12, "speedup_vs_gemv": base / secs,
                    }));
                }
            }
        }
    }
    bar.finish_and_clear();
    if a.json {
        let doc = super::bench_calls::results_doc(&gpu, method, quick, results);
        outln!("{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        outln!(
            "timing: {method}; TFLOP/s = 2·O·I·pairs / time{}",
            if quick {
                format!(
                    "; quick (shapes / {QUICK_DIV}, {QUICK_EXPERTS} experts, at most {} per timing)",
                    super::bench_calls::plural(QUICK_ITERS, "call", "calls")
                )
            } else {
                String::new()
            }
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
