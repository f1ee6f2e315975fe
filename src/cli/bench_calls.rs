//! What `bench kernels` and `bench gemm` share: weight bytes that decode to finite values in every
//! format, the time per recording of a set of calls (GPU timestamps around back-to-back
//! dispatches when the adapter has them, else wall clock) and a progress bar; and the number
//! and count formatting of the benches, `smoke`, `info` and `shaders` ([`sig3`], [`plural`]).
use crate::formats::Encoding;
use crate::gpu::timing::TimestampPairs;
use crate::gpu::{Call, Gpu};
use std::time::Instant;

/// splitmix64 bytes that decode to finite values in every format.
pub fn slab_bytes(enc: Encoding, n_bytes: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    let mut out = Vec::with_capacity(n_bytes + 8);
    while out.len() < n_bytes {
        let z = crate::model::sampling::splitmix64(&mut s);
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

/// Time `n` recordings of `calls` (rotating); returns seconds per dispatch and how it was measured.
/// With GPU timestamps: the median of 5 passes of `n` dispatches (3 on a CPU adapter, which is
/// slow and steady).
pub fn time_calls(gpu: &Gpu, calls: &[Call], n: usize) -> anyhow::Result<(f64, &'static str)> {
    // warm-up: every copy once (first use), then keep the GPU busy for ≥ 0.3 s so that clocks
    // are up (after the host-side data generation the GPU idles and the first timings are slow);
    // the clock starts after the first round, which also waits for the queued weight uploads (a
    // routed slab's gigabytes would otherwise fill the 0.3 s and leave the GPU unwarmed)
    let mut t_warm = None;
    loop {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for c in calls {
            c.record(&mut enc);
        }
        gpu.queue.submit([enc.finish()]);
        gpu.device.poll(wgpu::PollType::wait_indefinitely())?;
        let t = *t_warm.get_or_insert_with(Instant::now);
        if t.elapsed().as_secs_f64() > 0.3 || gpu.is_cpu() {
            break;
        }
    }
    if gpu.has_timestamps() {
        // Like CUDA events around back-to-back launches: one compute pass of `n` dispatches
        // (rotating over the weight copies) between two GPU timestamps, time / n; median of 5.
        let reps = if gpu.is_cpu() { 3u32 } else { 5 };
        let ts = TimestampPairs::new(gpu, "bench", reps);
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for r in 0..reps {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("bench timed"),
                timestamp_writes: Some(ts.pass(r)),
            });
            for k in 0..n {
                calls[k % calls.len()].record_in_pass(&mut pass);
            }
        }
        let mut secs = ts.finish_and_read(gpu, enc, reps)?;
        secs.sort_by(f64::total_cmp);
        let per = secs[secs.len() / 2] / n as f64;
        Ok((
            per,
            if reps == 5 {
                "gpu timestamps around n back-to-back dispatches in one pass, median of 5"
            } else {
                "gpu timestamps around n back-to-back dispatches in one pass, median of 3"
            },
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

/// The `--json` document of `bench kernels` and `bench gemm`: the adapter, backend and driver, the
/// timing method, whether the shapes were the quick ones, and the result rows.
pub fn results_doc(
    gpu: &Gpu,
    method: &str,
    quick: bool,
    results: Vec<serde_json::Value>,
) -> serde_json::Value {
    serde_json::json!({
        "adapter": gpu.info.name, "backend": format!("{:?}", gpu.info.backend),
        "driver": format!("{} {}", gpu.info.driver, gpu.info.driver_info),
        "timing": method, "quick": quick, "results": results,
    })
}

/// `x` with at least 3 significant figures and no exponent in the range benches print
/// (1e-4 ≤ |x| < 1e15): `0.000151`, `0.0123`, `1.44`, `12.3`, `123`, `45678`; `0` for zero; with
/// an exponent (`1.51e-7`) outside that range; `inf`/`NaN` as Rust prints them. Fixed decimals
/// would print a CPU adapter's 0.0001 TFLOP/s as `0.00`.
pub fn sig3(x: f64) -> String {
    let a = x.abs();
    if x == 0.0 {
        "0".into()
    } else if !x.is_finite() {
        format!("{x}")
    } else if (1e-4..1e15).contains(&a) {
        let decimals = (2 - a.log10().floor() as i32).max(0) as usize;
        format!("{x:.decimals$}")
    } else {
        format!("{x:.2e}")
    }
}

/// `n` and the noun in its number: `1 module`, `2 modules`, `0 modules`.
pub fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A progress bar of `total` steps with the elapsed time and an ETA, on stderr when stderr is a
/// terminal; hidden (draws nothing) otherwise, so pipes and logs get only the results. Print
/// results through [`indicatif::ProgressBar::suspend`] so that the bar does not tear them.
pub fn progress(total: u64, what: &str) -> indicatif::ProgressBar {
    crate::progress::bar(
        true,
        total,
        &format!("{what} {{bar:30}} {{pos}}/{{len}} [{{elapsed_precise}}, eta {{eta}}] {{msg}}"),
    )
}
