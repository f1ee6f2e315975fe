//! What `bench kernels` and `bench gemm` share: weight bytes that decode to finite values in every
//! format, and the time per recording of a set of calls (GPU timestamps around back-to-back
//! dispatches when the adapter has them, else wall clock).
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
pub fn time_calls(gpu: &Gpu, calls: &[Call], n: usize) -> anyhow::Result<(f64, &'static str)> {
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
        if t_warm.elapsed().as_secs_f64() > 0.3 || gpu.is_cpu() {
            break;
        }
    }
    if gpu.has_timestamps() {
        // Like CUDA events around back-to-back launches: one compute pass of `n` dispatches
        // (rotating over the weight copies) between two GPU timestamps, time / n; median of 5.
        let reps = 5u32;
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
