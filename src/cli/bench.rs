//! `inkling-wgpu bench kernels|copy|compare`: GEMV time per dispatch and effective bandwidth, the
//! device-to-device copy bandwidth to compare it with, and ratio tables of two JSON runs.
//!
//! Kernel timing uses GPU timestamp queries around one compute pass of n back-to-back dispatches
//! (like CUDA events around back-to-back launches) when the adapter has TIMESTAMP_QUERY, else wall clock over many dispatches in one submit. A working set of
//! several copies of the weights (> 256 MiB on a real GPU) is rotated so that L2 does not flatter;
//! on a CPU adapter (lavapipe) or with `--quick` shapes are divided by 4 and one copy is used.
use super::output::outln;
use crate::formats::Encoding;
use crate::gpu::gemv::{kernel_encodings, GemvArgs, GemvCall, GpuWeights, NO_GAMMA};
use crate::gpu::Gpu;
use anyhow::Context;
use std::process::ExitCode;
use std::time::Instant;

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
    /// Prefill GEMM against the GEMV at prefill shapes: µs per call, TFLOP/s.
    Gemm(crate::cli::bench_gemm::GemmArgs),
    /// Prefill probe: prefill tok/s and time to first token for prompts of random ids.
    Prefill(crate::cli::bench_prefill::PrefillArgs),
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
    #[arg(long, value_parser = super::parse_gbs)]
    pub peak_gbs: Option<f64>,
    /// Small shapes, one weight copy, few iterations (automatic on CPU adapters).
    #[arg(long)]
    pub quick: bool,
    /// Timed dispatches per format and shape (1 to 100000).
    #[arg(long, default_value_t = 50, value_parser = parse_iters)]
    pub iters: usize,
    /// Only these encodings (e.g. `int4-g64,bf16`); default all kernel formats.
    #[arg(long, value_delimiter = ',')]
    pub formats: Vec<String>,
    /// Kernel tuning sweep (benchmarking only): `TPR:RPT` pairs, e.g. `32:2,16:4`; each is timed
    /// on the same weights and printed with its tuning. Default: the built-in tuning per format.
    #[arg(long, value_delimiter = ',', hide = true)]
    pub tune: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct CopyArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Buffer size in MiB, 1 to 1048576 (default 1024, 64 on CPU adapters; at most the adapter's
    /// largest buffer).
    #[arg(long, value_parser = parse_mib)]
    pub mib: Option<u64>,
    /// Copies timed (1 to 100000).
    #[arg(long, default_value_t = 20, value_parser = parse_iters)]
    pub iters: usize,
}

/// A buffer size in MiB: a whole number from 1 to 2^20.
pub fn parse_mib(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(v) if (1..=1 << 20).contains(&v) => Ok(v),
        _ => Err(format!(
            "expected a size in MiB from 1 to 1048576, got {s:?}"
        )),
    }
}

/// A repetition count: a whole number from 1 to 100000.
pub fn parse_iters(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if (1..=100_000).contains(&v) => Ok(v),
        _ => Err(format!("expected a count from 1 to 100000, got {s:?}")),
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.what {
        What::Kernels(a) => kernels(a),
        What::Copy(a) => copy(a),
        What::Decode(a) => crate::cli::bench_decode::run(a),
        What::Compare(a) => compare(a),
        What::Gemm(a) => crate::cli::bench_gemm::run(a),
        What::Prefill(a) => crate::cli::bench_prefill::run(a),
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
    // the decode step's small single matrices: few rows, so `gemv::plan` picks small workgroups
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

/// splitmix64 bytes that decode to finite values in every format.
pub(super) fn slab_bytes(enc: Encoding, n_bytes: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    let mut out = Vec::with_capacity(n_bytes + 8);
    while out.len() < n_bytes {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // clear the top exponent bit of every f32 / bf16 value so none is inf/NaN
        let z = match enc.format {
            crate::formats::Format::F32 => z & 0xBFFF_FFFF_BFFF_FFFF,
            crate::formats::Format::Bf16 => z & 0xBFFF_BFFF_BFFF_BFFF,
            _ => z,
        };
        out.extend_from_slice(&z.to_le_bytes());
    }
    out.truncate(n_bytes);
    out
}

fn is_cpu(gpu: &Gpu) -> bool {
    gpu.info.device_type == wgpu::DeviceType::Cpu
}

/// Time `n` recordings of `calls` (rotating); returns seconds per dispatch and how it was measured.
pub(super) fn time_calls(
    gpu: &Gpu,
    calls: &[GemvCall],
    n: usize,
) -> anyhow::Result<(f64, &'static str)> {
    // warm-up: every copy once (first use), then keep the GPU busy for ≥ 0.3 s so that clocks
    // are up (after the host-side data generation the GPU idles and the first timings are slow)
    let t_warm = Instant::now();
    loop {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for c in calls {
            c.record(&mut enc);
        }
        gpu.queue.submit([enc.finish()]);
        gpu.device.poll(wgpu::PollType::wait_indefinitely())?;
        if t_warm.elapsed().as_secs_f64() > 0.3 || is_cpu(gpu) {
            break;
        }
    }
    if gpu.has_timestamps() {
        // Like CUDA events around back-to-back launches: one compute pass of `n` dispatches
        // (rotating over the weight copies) between two GPU timestamps, time / n; median of 5.
        let reps = 5u32;
        let (qs, resolve) = timestamp_pairs(gpu, "bench", reps);
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for r in 0..reps {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("bench timed"),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: &qs,
                    beginning_of_pass_write_index: Some(2 * r),
                    end_of_pass_write_index: Some(2 * r + 1),
                }),
            });
            for k in 0..n {
                calls[k % calls.len()].record_in_pass(&mut pass);
            }
        }
        let mut secs = read_timestamp_pairs(gpu, enc, &qs, &resolve, reps)?;
        secs.sort_by(f64::total_cmp);
        let per = secs[secs.len() / 2] / n as f64;
        Ok((
            per,
            "gpu timestamps around n back-to-back dispatches in one pass, median of 5",
        ))
    } else {
        let t0 = Instant::now();
        for k in 0..n {
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            calls[k % calls.len()].record(&mut enc);
            gpu.queue.submit([enc.finish()]);
        }
        gpu.device.poll(wgpu::PollType::wait_indefinitely())?;
        Ok((
            t0.elapsed().as_secs_f64() / n as f64,
            "wall clock, mean over submits",
        ))
    }
}

fn kernels(a: KernelArgs) -> anyhow::Result<ExitCode> {
    let gpu = Gpu::new()?;
    let quick = a.quick || is_cpu(&gpu);
    let div = if quick { 4 } else { 1 };
    let iters = if quick { a.iters.min(5) } else { a.iters }.max(1);
    let encs: Vec<Encoding> = if a.formats.is_empty() {
        kernel_encodings()
    } else {
        a.formats
            .iter()
            .map(|s| Encoding::parse(s).with_context(|| format!("--formats {s}")))
            .collect::<anyhow::Result<_>>()?
    };
    let tunes: Vec<Option<crate::gpu::gemv::Tuning>> = if a.tune.is_empty() {
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
                Ok(Some(crate::gpu::gemv::Tuning { tpr, rpt }))
            })
            .collect::<anyhow::Result<_>>()?
    };
    // the text table goes to stdout, or to stderr beside `--json`'s document
    let say = |line: String| -> Result<(), super::output::StdoutError> {
        if a.json {
            eprintln!("{line}");
            Ok(())
        } else {
            outln!("{line}")
        }
    };
    say(format!("adapter: {}", gpu.describe()))?;
    say(format!(
        "{:<16} {:<47} {:>3} {:>12} {:>10} {:>9} {:>7}",
        "format", "shape", "E", "bytes", "us/disp", "GB/s", "peak"
    ))?;
    let mut results = Vec::new();
    let mut method = "";
    for enc in &encs {
        for s in SHAPES {
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
                crate::gpu::gemv::set_tuning_override(*tune);
                let calls = weights
                    .iter()
                    .map(|w| {
                        GemvCall::new(
                            &gpu,
                            enc.format.ordinal(),
                            w,
                            GemvArgs::new(&x, 1, &pb, s.experts as u32, &y),
                        )
                    })
                    .collect::<Result<Vec<_>, _>>();
                crate::gpu::gemv::set_tuning_override(None);
                let calls = calls?;
                let (t, how) = time_calls(&gpu, &calls, iters)?;
                method = how;
                let tl = crate::gpu::gemv::tuning(enc.format);
                let tl = tune.unwrap_or(tl);
                let label = if a.tune.is_empty() {
                    enc.spelling()
                } else {
                    format!("{}@{}:{}", enc.spelling(), tl.tpr, tl.rpt)
                };
                let gbs = bytes as f64 / t / 1e9;
                let frac = a.peak_gbs.map(|p| gbs / p);
                let shape = s.name(div);
                say(format!(
                    "{:<16} {:<47} {:>3} {:>12} {:>10.1} {:>9.1} {:>7}",
                    label,
                    shape,
                    s.experts,
                    bytes,
                    t * 1e6,
                    gbs,
                    frac.map(|f| format!("{:.1}%", 100.0 * f))
                        .unwrap_or_else(|| "-".into())
                ))?;
                results.push(serde_json::json!({
                    "format": label, "shape": shape, "experts": s.experts, "bytes": bytes,
                    "us_per_dispatch": t * 1e6, "gbs": gbs, "frac_peak": frac,
                }));
            }
        }
    }
    if a.json {
        let doc = serde_json::json!({
            "adapter": gpu.info.name, "backend": format!("{:?}", gpu.info.backend),
            "driver": format!("{} {}", gpu.info.driver, gpu.info.driver_info),
            "timing": method, "quick": quick, "results": results,
        });
        outln!("{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        outln!(
            "timing: {method}; bytes = weights + scales read per dispatch{}",
            if quick { "; quick (shapes / 4)" } else { "" }
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Time `n` repetitions of `record` (median of 5): GPU timestamps around them when the adapter has
/// them, else the wall clock around one submit. Returns (seconds for n, method).
fn time_reps(
    gpu: &Gpu,
    n: usize,
    record: &dyn Fn(&mut wgpu::CommandEncoder),
) -> anyhow::Result<(f64, &'static str)> {
    let reps = 5usize;
    // first use of the buffers (wgpu's lazy zero-fill) and clocks up: ≥ 0.5 s untimed
    let t_warm = Instant::now();
    loop {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for _ in 0..3 {
            record(&mut enc);
        }
        gpu.queue.submit([enc.finish()]);
        gpu.device.poll(wgpu::PollType::wait_indefinitely())?;
        if t_warm.elapsed().as_secs_f64() > 0.5 || is_cpu(gpu) {
            break;
        }
    }
    let mut secs = Vec::new();
    let how;
    if gpu.has_timestamps() {
        // an empty compute pass writes the start, `n` repetitions, an empty pass the end
        how = "gpu timestamps around n repetitions, median of 5";
        let (qs, resolve) = timestamp_pairs(gpu, "copy bench", reps as u32);
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for r in 0..reps as u32 {
            enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("copy start"),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: &qs,
                    beginning_of_pass_write_index: Some(2 * r),
                    end_of_pass_write_index: None,
                }),
            });
            for _ in 0..n {
                record(&mut enc);
            }
            enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("copy end"),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: &qs,
                    beginning_of_pass_write_index: None,
                    end_of_pass_write_index: Some(2 * r + 1),
                }),
            });
        }
        secs = read_timestamp_pairs(gpu, enc, &qs, &resolve, reps as u32)?;
    } else {
        how = "wall clock around one submit of n repetitions, median of 5";
        for _ in 0..reps {
            let t0 = Instant::now();
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            for _ in 0..n {
                record(&mut enc);
            }
            gpu.queue.submit([enc.finish()]);
            gpu.device.poll(wgpu::PollType::wait_indefinitely())?;
            secs.push(t0.elapsed().as_secs_f64());
        }
    }
    secs.sort_by(|a, b| a.total_cmp(b));
    Ok((secs[secs.len() / 2].max(1e-12), how))
}

/// What [`measure_copy`] found.
pub struct CopyMeasure {
    /// Bytes per copy.
    pub bytes: u64,
    /// GB/s (read + write) of `copy_buffer_to_buffer`.
    pub gbs_cmd: f64,
    /// GB/s (read + write) of the compute-shader copy.
    pub gbs_shader: f64,
    /// The faster of the two: the ceiling other figures are compared with.
    pub ceiling: f64,
    /// How it was timed.
    pub how: &'static str,
}

/// Time `n` copies of `mib` MiB both ways (see [`copy`]); `bench decode` and `generate --profile`
/// take their roofline's bandwidth from it.
pub fn measure_copy(gpu: &Gpu, mib: u64, n: usize) -> anyhow::Result<CopyMeasure> {
    anyhow::ensure!(
        (1..=1 << 20).contains(&mib) && n >= 1,
        "a copy of {mib} MiB timed {n} times: want 1 to 1048576 MiB, at least once"
    );
    let size = (mib << 20)
        .min(gpu.limits.max_buffer_size)
        .min(gpu.max_binding())
        & !255;
    let src = gpu.storage("copy src", size);
    let dst = gpu.storage("copy dst", size);

    let (t_cmd, how) = time_reps(gpu, n, &|enc| {
        enc.copy_buffer_to_buffer(&src, 0, &dst, 0, size)
    })?;

    let words = (size / 16) as u32;
    let groups = words.div_ceil(256).clamp(1, 65535);
    let params = gpu.uniform_init(
        "copy params",
        bytemuck::cast_slice(&[words, groups * 256, 0u32, 0u32]),
    );
    let module = gpu.shader("copy", include_str!("../../wgsl/copy.wgsl"));
    let pipeline = gpu
        .device
        .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("copy"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
    let bind = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("copy"),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: params.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: src.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: dst.as_entire_binding(),
            },
        ],
    });
    let (t_shader, _) = time_reps(gpu, n, &|enc| {
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(groups, 1, 1);
    })?;

    let bytes = 2.0 * size as f64 * n as f64;
    let gbs_cmd = bytes / t_cmd / 1e9;
    let gbs_shader = bytes / t_shader / 1e9;
    let ceiling = gbs_cmd.max(gbs_shader);
    Ok(CopyMeasure {
        bytes: size,
        gbs_cmd,
        gbs_shader,
        ceiling,
        how,
    })
}

/// Device-to-device copy bandwidth, two ways: `copy_buffer_to_buffer` and a compute-shader copy
/// (`wgsl/copy.wgsl`, vec4<u32> loads and stores). Both count bytes read + written (2× the bytes
/// copied), as PyTorch reports a copy. The ceiling other figures are compared with is the higher
/// of the two: on NVIDIA's Vulkan driver `copy_buffer_to_buffer` runs far below the memory's speed
/// (measured on an H200: about 850 GB/s against about 4200 GB/s for the shader copy).
fn copy(a: CopyArgs) -> anyhow::Result<ExitCode> {
    let gpu = Gpu::new()?;
    let mib = a.mib.unwrap_or(if is_cpu(&gpu) { 64 } else { 1024 });
    let n = a.iters.max(1);
    let CopyMeasure {
        bytes: size,
        gbs_cmd,
        gbs_shader,
        ceiling,
        how,
    } = measure_copy(&gpu, mib, n)?;
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
        outln!("  copy_buffer_to_buffer  {gbs_cmd:8.1} GB/s")?;
        outln!("  compute-shader copy    {gbs_shader:8.1} GB/s")?;
        outln!("ceiling: {ceiling:.1} GB/s")?;
    }
    Ok(ExitCode::SUCCESS)
}

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
        outln!(
            "{:<10} {:<42} {:>10} {:>10} {:>7}",
            "format",
            "shape",
            "A GB/s",
            "B GB/s",
            "A/B"
        )?;
        for (f, s, ga, gb, r) in &out {
            outln!("{f:<10} {s:<42} {ga:>10.1} {gb:>10.1} {r:>6.2}x")?;
        }
        if out.is_empty() {
            outln!("(no rows match by format and shape)")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A timestamp query set of `reps` (begin, end) pairs and the buffer it resolves into.
fn timestamp_pairs(gpu: &Gpu, label: &str, reps: u32) -> (wgpu::QuerySet, wgpu::Buffer) {
    let qs = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
        label: Some(label),
        ty: wgpu::QueryType::Timestamp,
        count: 2 * reps,
    });
    let resolve = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: 16 * reps as u64,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    (qs, resolve)
}

/// Resolve the `reps` (begin, end) pairs of `qs` at the end of `enc`, submit it, wait, and return
/// each pair's duration in seconds.
fn read_timestamp_pairs(
    gpu: &Gpu,
    mut enc: wgpu::CommandEncoder,
    qs: &wgpu::QuerySet,
    resolve: &wgpu::Buffer,
    reps: u32,
) -> anyhow::Result<Vec<f64>> {
    enc.resolve_query_set(qs, 0..2 * reps, resolve, 0);
    gpu.queue.submit([enc.finish()]);
    let raw = gpu.read_bytes(resolve, 0, 16 * reps as u64)?;
    let period = gpu.queue.get_timestamp_period() as f64 * 1e-9; // seconds per tick
    Ok(raw
        .chunks_exact(16)
        .map(|p| {
            let t = |o: usize| u64::from_le_bytes(p[o..o + 8].try_into().expect("8 bytes"));
            t(8).saturating_sub(t(0)) as f64 * period
        })
        .collect())
}
