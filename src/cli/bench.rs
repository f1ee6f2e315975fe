//! `inkling-wgpu bench kernels|copy`: GEMV time per dispatch and effective bandwidth, and the
//! device-to-device copy bandwidth to compare it with.
//!
//! Kernel timing uses GPU timestamp queries (one timed compute pass per dispatch) when the adapter
//! has TIMESTAMP_QUERY, else wall clock over many dispatches in one submit. A working set of
//! several copies of the weights (> 256 MiB on a real GPU) is rotated so that L2 does not flatter;
//! on a CPU adapter (lavapipe) or with `--quick` shapes are divided by 4 and one copy is used.
use crate::formats::Encoding;
use crate::gpu::gemv::{kernel_encodings, GemvArgs, GemvCall, GpuWeights, NO_GAMMA};
use crate::gpu::Gpu;
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
}

#[derive(clap::Args, Debug)]
pub struct KernelArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Peak bandwidth in GB/s to report the fraction of (e.g. 4250 for an H200... or `bench copy`).
    #[arg(long)]
    pub peak_gbs: Option<f64>,
    /// Small shapes, one weight copy, few iterations (automatic on CPU adapters).
    #[arg(long)]
    pub quick: bool,
    /// Timed dispatches per format and shape.
    #[arg(long, default_value_t = 50)]
    pub iters: usize,
    /// Only these encodings (e.g. `int4-g64,bf16`); default all kernel formats.
    #[arg(long, value_delimiter = ',')]
    pub formats: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct CopyArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Buffer size in MiB (default 1024, 64 on CPU adapters).
    #[arg(long)]
    pub mib: Option<u64>,
    /// Copies timed.
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.what {
        What::Kernels(a) => kernels(a),
        What::Copy(a) => copy(a),
        What::Decode(a) => crate::cli::bench_decode::run(a),
    }
}

/// One benchmark shape: label, experts per dispatch, [O, I].
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
        label: "small gate_up",
        experts: 1,
        o: 4096,
        i: 4096,
    },
    Shape {
        label: "small down",
        experts: 1,
        o: 4096,
        i: 2048,
    },
    Shape {
        label: "inkling layer gate_up (6 routed + 2 shared)",
        experts: 8,
        o: 6144,
        i: 6144,
    },
    Shape {
        label: "inkling layer down (6 routed + 2 shared)",
        experts: 8,
        o: 6144,
        i: 3072,
    },
];

/// splitmix64 bytes that decode to finite values in every format.
fn slab_bytes(enc: Encoding, n_bytes: usize, seed: u64) -> Vec<u8> {
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
fn time_calls(gpu: &Gpu, calls: &[GemvCall], n: usize) -> anyhow::Result<(f64, &'static str)> {
    // warm-up
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    for c in calls {
        c.record(&mut enc);
    }
    gpu.queue.submit([enc.finish()]);
    gpu.device.poll(wgpu::PollType::wait_indefinitely())?;
    if gpu.has_timestamps() {
        let qs = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("bench"),
            ty: wgpu::QueryType::Timestamp,
            count: 2 * n as u32,
        });
        let resolve = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("bench timestamps"),
            size: 16 * n as u64,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for k in 0..n {
            calls[k % calls.len()].record_timed(&mut enc, &qs, 2 * k as u32, 2 * k as u32 + 1);
        }
        enc.resolve_query_set(&qs, 0..2 * n as u32, &resolve, 0);
        gpu.queue.submit([enc.finish()]);
        let raw = gpu.read_bytes(&resolve, 0, 16 * n as u64)?;
        let ts: Vec<u64> = raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let period = gpu.queue.get_timestamp_period() as f64; // ns per tick
        let mut ticks: Vec<u64> = ts
            .chunks_exact(2)
            .map(|p| p[1].saturating_sub(p[0]))
            .collect();
        ticks.sort_unstable();
        let median = ticks[ticks.len() / 2] as f64 * period * 1e-9;
        Ok((median, "gpu timestamps, median"))
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
            .map(|s| Encoding::parse(s))
            .collect::<Result<_, _>>()?
    };
    if !a.json {
        println!("adapter: {}", gpu.describe());
        println!(
            "{:<10} {:<55} {:>3} {:>12} {:>10} {:>9} {:>7}",
            "format", "shape", "E", "bytes", "us/disp", "GB/s", "peak"
        );
    }
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
                .flat_map(|e| [e, 0, NO_GAMMA])
                .collect();
            let pb = gpu.storage_init("pairs", bytemuck::cast_slice(&pairs));
            let y = gpu.storage("y", 4 * (s.experts * o) as u64);
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
                .collect::<Result<Vec<_>, _>>()?;
            let (t, how) = time_calls(&gpu, &calls, iters)?;
            method = how;
            let gbs = bytes as f64 / t / 1e9;
            let frac = a.peak_gbs.map(|p| gbs / p);
            let shape = format!("{} [{o}x{i}]", s.label);
            if !a.json {
                println!(
                    "{:<10} {:<55} {:>3} {:>12} {:>10.1} {:>9.1} {:>7}",
                    enc.spelling(),
                    shape,
                    s.experts,
                    bytes,
                    t * 1e6,
                    gbs,
                    frac.map(|f| format!("{:.1}%", 100.0 * f))
                        .unwrap_or_else(|| "-".into())
                );
            }
            results.push(serde_json::json!({
                "format": enc.spelling(), "shape": shape, "experts": s.experts, "bytes": bytes,
                "us_per_dispatch": t * 1e6, "gbs": gbs, "frac_peak": frac,
            }));
        }
    }
    if a.json {
        let doc = serde_json::json!({
            "adapter": gpu.info.name, "backend": format!("{:?}", gpu.info.backend),
            "driver": format!("{} {}", gpu.info.driver, gpu.info.driver_info),
            "timing": method, "quick": quick, "results": results,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!(
            "timing: {method}; bytes = weights + scales read per dispatch{}",
            if quick { "; quick (shapes / 4)" } else { "" }
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn copy(a: CopyArgs) -> anyhow::Result<ExitCode> {
    let gpu = Gpu::new()?;
    let mib = a.mib.unwrap_or(if is_cpu(&gpu) { 64 } else { 1024 });
    let size = (mib << 20).min(gpu.limits.max_buffer_size) & !3;
    let src = gpu.storage("copy src", size);
    let dst = gpu.storage("copy dst", size);
    let run = |n: usize| -> anyhow::Result<f64> {
        let t0 = Instant::now();
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for _ in 0..n {
            enc.copy_buffer_to_buffer(&src, 0, &dst, 0, size);
        }
        gpu.queue.submit([enc.finish()]);
        gpu.device.poll(wgpu::PollType::wait_indefinitely())?;
        Ok(t0.elapsed().as_secs_f64())
    };
    run(1)?;
    let n = a.iters.max(1);
    let t = run(n)?;
    let gbs = 2.0 * size as f64 * n as f64 / t / 1e9;
    if a.json {
        let doc = serde_json::json!({
            "adapter": gpu.info.name, "backend": format!("{:?}", gpu.info.backend),
            "bytes_per_copy": size, "copies": n, "gbs_read_plus_write": gbs, "gbs_read_only": gbs / 2.0,
            "timing": "wall clock, one submit",
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!("adapter: {}", gpu.describe());
        println!(
            "copy_buffer_to_buffer {} MiB × {n}: {:.1} GB/s counting read + write (2× size); {:.1} GB/s read only",
            size >> 20,
            gbs,
            gbs / 2.0
        );
    }
    Ok(ExitCode::SUCCESS)
}
