//! `inkling-wgpu bench kernels|copy|compare`: GEMV time per dispatch and effective bandwidth, the
//! device-to-device copy bandwidth to compare it with, and ratio tables of two JSON runs.
//!
//! Kernel timing uses GPU timestamp queries around one compute pass of n back-to-back dispatches
//! (like CUDA events around back-to-back launches) when the adapter has TIMESTAMP_QUERY, else wall clock over many dispatches in one submit. A working set of
//! several copies of the weights (> 256 MiB on a real GPU) is rotated so that L2 does not flatter;
//! on a CPU adapter (lavapipe) or with `--quick` shapes are divided by 4 and one copy is used.
//! Times, bandwidths and ratios are printed with at least 3 significant figures ([`sig3`]): a CPU
//! adapter's 0.04 GB/s is not `0.0`.
use super::bench_calls::{progress, sig3, slab_bytes, time_calls};
use super::context::OrBadArgument;
use super::output::{errln, outln};
use crate::formats::Encoding;
use crate::gpu::linear::args::{GemvArgs, NO_GAMMA};
use crate::gpu::linear::format::kernel_encodings;
use crate::gpu::linear::slab::GpuWeights;
use crate::gpu::timing::{measure_copy, CopyMeasure};
use crate::gpu::Gpu;
use anyhow::Context;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
}

#[derive(clap::Subcommand, Debug)]
pub enum What {
    /// GEMV kernels per format and shape.
    Kernels(KernelArgs),
    /// Device-to-device copy bandwidth (copy_buffer_to_buffer).
    Copy(CopyArgs),
    /// Decode probe: tok/s, per-phase GPU time per token, bytes per token and roofline.
    Decode(crate::cli::bench_decode::DecodeArgs),
    /// Decode batches (continuous batching's step): aggregate and per-sequence tok/s per batch size.
    Batch(crate::cli::bench_batch::BatchArgs),
    /// Prefill GEMM against the GEMV at prefill shapes: µs per call, TFLOP/s.
    Gemm(crate::cli::bench_gemm::GemmArgs),
    /// Prefill probe: prefill tok/s and time to first token for prompts of random ids.
    Prefill(crate::cli::bench_prefill::PrefillArgs),
    /// Streamed decode (expert slots) beside its I/O bound, per slot count.
    Stream(crate::cli::bench_stream::StreamArgs),
    /// Ratio table of two `bench kernels --json` files (A/B GB/s), rows matched by format and shape.
    Compare(CompareArgs),
}

#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// JSON of `bench kernels --json` (or benches/native/*.py): the numerator.
    pub a: std::path::PathBuf,
    /// The denominator.
    pub b: std::path::PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct KernelArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Peak bandwidth in GB/s to report the fraction of (e.g. 4250 for an H200... or `bench copy`).
    #[arg(allow_negative_numbers = true, long, value_parser = super::parse_gbs)]
    pub peak_gbs: Option<f64>,
    /// Small shapes, one weight copy, few iterations (automatic on CPU adapters).
    #[arg(long)]
    pub quick: bool,
    /// Timed dispatches per format and shape (1 to 100000).
    #[arg(allow_negative_numbers = true, long, default_value_t = 50, value_parser = super::values::parse_iters)]
    pub iters: usize,
    /// Only these encodings (e.g. `int4-g64,bf16`); default all kernel formats.
    #[arg(long, value_delimiter = ',')]
    pub formats: Vec<String>,
    /// Kernel tuning sweep (benchmarking only): `TPR:RPT` pairs, e.g. `32:2,16:4`; each is timed
    /// on the same weights and printed with its tuning. Default: the built-in tuning per format.
    #[arg(long, value_delimiter = ',', hide = true)]
    pub tune: Vec<String>,
    /// Only the shapes whose printed name contains one of these (benchmarking only), e.g.
    /// `routed,moe-layer`. Default: every shape.
    #[arg(long, value_delimiter = ',', hide = true)]
    pub shapes: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct CopyArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Buffer size in MiB, 1 to 1048576 (default 1024, 64 on CPU adapters; at most the adapter's
    /// largest buffer).
    #[arg(allow_negative_numbers = true, long, value_parser = super::values::parse_mib)]
    pub mib: Option<u64>,
    /// Copies timed (1 to 100000).
    #[arg(allow_negative_numbers = true, long, default_value_t = 20, value_parser = super::values::parse_iters)]
    pub iters: usize,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.what {
        What::Kernels(a) => kernels(a),
        What::Copy(a) => copy(a),
        What::Decode(a) => crate::cli::bench_decode::run(a),
        What::Batch(a) => crate::cli::bench_batch::run(a),
        What::Compare(a) => compare(a),
        What::Gemm(a) => crate::cli::bench_gemm::run(a),
        What::Prefill(a) => crate::cli::bench_prefill::run(a),
        What::Stream(a) => crate::cli::bench_stream::run(a),
    }
}

/// One benchmark shape: label, experts per dispatch, [O, I]. The printed name is
/// `"{label} [OxI]"` for one expert and `"{label} Ex[OxI]"` for a layer, exactly the names of
/// benches/native/torch_gemv.py, so `bench compare` matches rows.
struct Shape {
    label: &'static str,
    experts: usize,
    o: usize,
    i: usize,
}

const SHAPES: &[Shape] = &[
    Shape {
        label: "inkling gate_up",
        experts: 1,
        o: 6144,
        i: 6144,
    },
    Shape {
        label: "inkling down",
        experts: 1,
        o: 6144,
        i: 3072,
    },
    Shape {
        label: "inkling-small gate_up",
        experts: 1,
        o: 4096,
        i: 4096,
    },
    Shape {
        label: "inkling-small down",
        experts: 1,
        o: 4096,
        i: 2048,
    },
    // the decode step's small single matrices: few rows, so `route::plan` picks small workgroups
    Shape {
        label: "inkling-small k_proj",
        experts: 1,
        o: 1024,
        i: 4096,
    },
    Shape {
        label: "inkling-small router",
        experts: 1,
        o: 256,
        i: 4096,
    },
    Shape {
        label: "inkling-small shared gate_up",
        experts: 2,
        o: 4096,
        i: 4096,
    },
    Shape {
        label: "inkling moe-layer gate_up",
        experts: 8,
        o: 6144,
        i: 6144,
    },
    Shape {
        label: "inkling moe-layer down",
        experts: 8,
        o: 6144,
        i: 3072,
    },
    // one token's 6 routed experts alone (the shared ones are bf16 in a converted model)
    Shape {
        label: "inkling-small routed gate_up",
        experts: 6,
        o: 4096,
        i: 4096,
    },
    Shape {
        label: "inkling-small routed down",
        experts: 6,
        o: 4096,
        i: 2048,
    },
    Shape {
        label: "inkling-small moe-layer gate_up",
        experts: 8,
        o: 4096,
        i: 4096,
    },
    Shape {
        label: "inkling-small moe-layer down",
        experts: 8,
        o: 4096,
        i: 2048,
    },
];

impl Shape {
    /// The printed name with the dimensions divided by `div` (`--quick`: 4).
    fn name(&self, div: usize) -> String {
        let (o, i) = (self.o / div, self.i / div);
        if self.experts == 1 {
            format!("{} [{o}x{i}]", self.label)
        } else {
            format!("{} {}x[{o}x{i}]", self.label, self.experts)
        }
    }
}

/// The names of `bench kernels`' shapes with the dimensions divided by `div`, in order (the
/// native scripts in benches/native/ print the same names).
pub fn shape_names(div: usize) -> Vec<String> {
    SHAPES.iter().map(|s| s.name(div)).collect()
}

fn kernels(a: KernelArgs) -> anyhow::Result<ExitCode> {
    let gpu = Gpu::new()?;
    let quick = a.quick || gpu.is_cpu();
    let div = if quick { 4 } else { 1 };
    let iters = if quick { a.iters.min(5) } else { a.iters }.max(1);
    let encs: Vec<Encoding> = if a.formats.is_empty() {
        kernel_encodings()
    } else {
        a.formats
            .iter()
            .map(|s| Encoding::parse(s).with_context(|| format!("--formats {s}")))
            .collect::<anyhow::Result<_>>()
            .or_bad_argument()?
    };
    let tunes: Vec<Option<crate::gpu::linear::format::Tuning>> = if a.tune.is_empty() {
        vec![None]
    } else {
        a.tune
            .iter()
            .map(|t| {
                let bad = || {
                    anyhow::anyhow!(
                        "--tune {t}: want TPR:RPT with TPR a power of two ≤ 256 and RPT in 1..=8"
                    )
                };
                let (p, r) = t.split_once(':').ok_or_else(bad)?;
                let (tpr, rpt): (u32, u32) =
                    (p.parse().map_err(|_| bad())?, r.parse().map_err(|_| bad())?);
                anyhow::ensure!(
                    tpr.is_power_of_two() && tpr <= 256 && (1..=8).contains(&rpt),
                    bad()
                );
                Ok(Some(crate::gpu::linear::format::Tuning { tpr, rpt }))
            })
            .collect::<anyhow::Result<_>>()
            .or_bad_argument()?
    };
    // the text table goes to stdout, or to stderr beside `--json`'s document
    let say = |line: String| super::output::report_line(a.json, &line);
    say(format!("adapter: {}", gpu.describe()))?;
    say(format!(
        "{:<16} {:<47} {:>3} {:>12} {:>10} {:>9} {:>7}",
        "format", "shape", "E", "bytes", "us/disp", "GB/s", "peak"
    ))?;
    let mut results = Vec::new();
    let mut method = "";
    let picked = |s: &Shape| {
        a.shapes.is_empty() || a.shapes.iter().any(|f| s.name(div).contains(f.as_str()))
    };
    let steps = encs.len() * SHAPES.iter().filter(|s| picked(s)).count() * tunes.len();
    let bar = progress(steps as u64, "bench kernels");
    for enc in &encs {
        for s in SHAPES {
            if !picked(s) {
                continue;
            }
            let (o, i) = (s.o / div, s.i / div);
            let eb = s.experts * o * enc.bytes_per_row(i);
            let sb = s.experts * 4 * enc.scale_count(o, i);
            let bytes = (eb + sb) as u64;
            // rotate copies so the working set exceeds 256 MiB (one copy when quick)
            let copies = if quick {
                1
            } else {
                ((256u64 << 20) / bytes + 1).min(128) as usize
            };
            let scales: Vec<u8> = (0..sb / 4).flat_map(|_| 0.01f32.to_le_bytes()).collect();
            let mut weights = Vec::new();
            for c in 0..copies {
                let data = slab_bytes(*enc, eb, c as u64 + 1);
                weights.push(GpuWeights::from_slab_bytes(
                    &gpu, *enc, s.experts, o, i, &data, &scales,
                )?);
            }
            let x = gpu.storage_init("x", bytemuck::cast_slice(&vec![0.25f32; i]));
            let pairs: Vec<u32> = (0..s.experts as u32)
                .flat_map(|e| [e, 0, NO_GAMMA, 0])
                .collect();
            let pb = gpu.storage_init("pairs", bytemuck::cast_slice(&pairs));
            let y = gpu.storage("y", 4 * (s.experts * o) as u64);
            for tune in &tunes {
                let opts = crate::gpu::linear::LinearOptions {
                    tuning: *tune,
                    ..Default::default()
                };
                let calls = weights
                    .iter()
                    .map(|w| {
                        w.bind_with(
                            &gpu,
                            enc.format.ordinal(),
                            GemvArgs::new(&x, 1, &pb, s.experts as u32, &y),
                            &opts,
                        )
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                bar.set_message(format!("{} {}", enc.spelling(), s.name(div)));
                let (t, how) = time_calls(&gpu, &calls, iters)?;
                bar.inc(1);
                method = how;
                let tl = crate::gpu::linear::route::tuning(enc.format);
                let tl = tune.unwrap_or(tl);
                let label = if a.tune.is_empty() {
                    enc.spelling()
                } else {
                    format!("{}@{}:{}", enc.spelling(), tl.tpr, tl.rpt)
                };
                let gbs = bytes as f64 / t / 1e9;
                let frac = a.peak_gbs.map(|p| gbs / p);
                let shape = s.name(div);
                bar.suspend(|| {
                    say(format!(
                        "{:<16} {:<47} {:>3} {:>12} {:>10} {:>9} {:>7}",
                        label,
                        shape,
                        s.experts,
                        bytes,
                        sig3(t * 1e6),
                        sig3(gbs),
                        frac.map(|f| format!("{}%", sig3(100.0 * f)))
                            .unwrap_or_else(|| "-".into())
                    ))
                })?;
                results.push(serde_json::json!({
                    "format": label, "shape": shape, "experts": s.experts, "bytes": bytes,
                    "us_per_dispatch": t * 1e6, "gbs": gbs, "frac_peak": frac,
                }));
            }
        }
    }
    bar.finish_and_clear();
    if a.json {
        let doc = super::bench_calls::results_doc(&gpu, method, quick, results);
        outln!("{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        outln!(
            "timing: {method}; bytes = weights + scales read per dispatch{}",
            if quick { "; quick (shapes / 4)" } else { "" }
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Device-to-device copy bandwidth, two ways: `copy_buffer_to_buffer` and a compute-shader copy
/// (`wgsl/copy.wgsl`, vec4<u32> loads and stores). Both count bytes read + written (2× the bytes
/// copied), as PyTorch reports a copy. The ceiling other figures are compared with is the higher
/// of the two: on NVIDIA's Vulkan driver `copy_buffer_to_buffer` runs far below the memory's speed
/// (BENCHMARKS.md#copy-ceiling).
fn copy(a: CopyArgs) -> anyhow::Result<ExitCode> {
    let gpu = Gpu::new()?;
    let mib = a.mib.unwrap_or(if gpu.is_cpu() { 64 } else { 1024 });
    let n = a.iters.max(1);
    let CopyMeasure {
        bytes: size,
        gbs_cmd,
        gbs_shader,
        ceiling,
        how,
    } = measure_copy(&gpu, mib, n)?;
    if a.mib.is_some_and(|m| size < m << 20) {
        errln!(
            "note: --mib {mib} is past this adapter's largest buffer binding; copying {} MiB",
            size >> 20
        );
    }
    if a.json {
        let doc = serde_json::json!({
            "adapter": gpu.info.name, "backend": format!("{:?}", gpu.info.backend),
            "bytes_per_copy": size, "copies": n,
            "gbs_copy_buffer_to_buffer": gbs_cmd, "gbs_shader_copy": gbs_shader,
            "gbs_read_plus_write": ceiling, "timing": how,
        });
        outln!("{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        outln!("adapter: {}", gpu.describe())?;
        outln!(
            "copy {} MiB x {n}, GB/s counting read + write (2x bytes copied, as PyTorch reports a copy); {how}",
            size >> 20
        )?;
        outln!("  copy_buffer_to_buffer  {:>8} GB/s", sig3(gbs_cmd))?;
        outln!("  compute-shader copy    {:>8} GB/s", sig3(gbs_shader))?;
        outln!("ceiling: {} GB/s", sig3(ceiling))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `bench compare`: the rows of A and B with the same format and shape, their GB/s and A/B.
///
/// Errors: a file that cannot be read or parsed, or holds no `"results"` array (named by path).
fn compare(a: CompareArgs) -> anyhow::Result<ExitCode> {
    let load = |p: &std::path::Path| -> anyhow::Result<serde_json::Value> {
        let text = std::fs::read_to_string(p)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", p.display()))?;
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("parsing {}: {e}", p.display()))
    };
    let (ja, jb) = (load(&a.a)?, load(&a.b)?);
    for (j, p) in [(&ja, &a.a), (&jb, &a.b)] {
        anyhow::ensure!(
            j["results"].is_array(),
            "{} is not a `bench kernels --json` file (no \"results\" array)",
            p.display()
        );
    }
    let rows = |j: &serde_json::Value| -> Vec<(String, String, f64)> {
        j["results"]
            .as_array()
            .map(|v| {
                v.iter()
                    .filter_map(|r| {
                        Some((
                            r["format"].as_str()?.to_string(),
                            r["shape"].as_str()?.to_string(),
                            r["gbs"].as_f64()?,
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let (ra, rb) = (rows(&ja), rows(&jb));
    let name = |j: &serde_json::Value| {
        format!(
            "{} ({})",
            j["adapter"].as_str().unwrap_or("?"),
            j["backend"].as_str().unwrap_or("?")
        )
    };
    let mut out = Vec::new();
    for (f, sh, ga) in &ra {
        if let Some((_, _, gb)) = rb.iter().find(|(g, s, _)| g == f && s == sh) {
            out.push((f.clone(), sh.clone(), *ga, *gb, ga / gb));
        }
    }
    if a.json {
        let v: Vec<_> = out
            .iter()
            .map(|(f, s, ga, gb, r)| {
                serde_json::json!({"format": f, "shape": s, "gbs_a": ga, "gbs_b": gb, "ratio": r})
            })
            .collect();
        let doc = serde_json::json!({"a": name(&ja), "b": name(&jb), "rows": v});
        outln!("{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        outln!("A: {} = {}", a.a.display(), name(&ja))?;
        outln!("B: {} = {}", a.b.display(), name(&jb))?;
        // the columns line up whatever the longest shape
        let w = out
            .iter()
            .map(|o| o.1.chars().count())
            .max()
            .unwrap_or(0)
            .max(42);
        outln!(
            "{:<10} {:<w$} {:>10} {:>10} {:>7}",
            "format",
            "shape",
            "A GB/s",
            "B GB/s",
            "A/B"
        )?;
        for (f, s, ga, gb, r) in &out {
            outln!(
                "{f:<10} {s:<w$} {:>10} {:>10} {:>6}x",
                sig3(*ga),
                sig3(*gb),
                sig3(*r)
            )?;
        }
        if out.is_empty() {
            outln!("(no rows match by format and shape)")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
