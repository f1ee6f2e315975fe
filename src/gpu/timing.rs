//! GPU timestamps and the copy-bandwidth measurement that profilers and benchmarks share.
//!
//! [`TimestampPairs`] is a query set of (begin, end) pairs with its resolve buffer: passes write
//! pair k at their beginning and end ([`TimestampPairs::pass`]), the encoder resolves them, the
//! host reads ticks back and turns them into seconds ([`seconds_per_tick`], [`ticks`]).
//! [`measure_copy`] times device-to-device copies (`bench copy`, the roofline of `bench decode`
//! and `generate --profile`). Timestamps need the `TIMESTAMP_QUERY` feature
//! ([`Gpu::has_timestamps`]).

use crate::gpu::call::{self, Dispatch};
use crate::gpu::kernel::{Bind, Kernel};
use crate::gpu::{Gpu, GpuError};
use std::time::Instant;

/// Seconds per timestamp tick of `gpu`'s queue.
pub fn seconds_per_tick(gpu: &Gpu) -> f64 {
    gpu.queue.get_timestamp_period() as f64 * 1e-9
}

/// The timestamps (little-endian u64 ticks) in resolved query bytes, in query order.
pub fn ticks(raw: &[u8]) -> Vec<u64> {
    raw.chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect()
}

/// A timestamp query set of `queries` queries.
pub fn query_set(gpu: &Gpu, label: &str, queries: u32) -> wgpu::QuerySet {
    gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
        label: Some(label),
        ty: wgpu::QueryType::Timestamp,
        count: queries,
    })
}

/// A buffer of `bytes` that query sets resolve into and that can be read back.
pub fn resolve_buffer(gpu: &Gpu, label: &str, bytes: u64) -> wgpu::Buffer {
    gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: bytes.max(8),
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    })
}

/// `pairs` (begin, end) timestamp pairs in one query set, resolved together into 16 bytes per
/// pair (pair k at byte 16·k).
pub struct TimestampPairs {
    qs: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    pairs: u32,
}

impl TimestampPairs {
    /// Most pairs one set holds.
    pub const MAX_PAIRS: u32 = wgpu::QUERY_SET_MAX_QUERIES / 2;

    /// Room for `pairs` pairs (1 to [`TimestampPairs::MAX_PAIRS`]).
    pub fn new(gpu: &Gpu, label: &str, pairs: u32) -> TimestampPairs {
        assert!(
            (1..=Self::MAX_PAIRS).contains(&pairs),
            "{pairs} timestamp pairs: a query set holds 1 to {}",
            Self::MAX_PAIRS
        );
        TimestampPairs {
            qs: query_set(gpu, label, 2 * pairs),
            resolve: resolve_buffer(gpu, label, 16 * pairs as u64),
            pairs,
        }
    }

    /// Writes for a pass timed as pair `k` (its beginning and its end).
    pub fn pass(&self, k: u32) -> wgpu::ComputePassTimestampWrites<'_> {
        self.writes(k, true, true)
    }

    /// Writes of pair `k`'s beginning only (`begin`) and/or its end only (`end`): an empty pass
    /// with the beginning before a run of commands and one with the end after it time the run.
    pub fn writes(&self, k: u32, begin: bool, end: bool) -> wgpu::ComputePassTimestampWrites<'_> {
        assert!(k < self.pairs, "pair {k} of {}", self.pairs);
        wgpu::ComputePassTimestampWrites {
            query_set: &self.qs,
            beginning_of_pass_write_index: begin.then_some(2 * k),
            end_of_pass_write_index: end.then_some(2 * k + 1),
        }
    }

    /// Resolve pairs `0..n` at the end of `enc`.
    pub fn resolve(&self, enc: &mut wgpu::CommandEncoder, n: u32) {
        enc.resolve_query_set(&self.qs, 0..2 * n.min(self.pairs), &self.resolve, 0);
    }

    /// Wait for the queue and read the (begin, end) ticks of resolved pairs `0..n`.
    pub fn read_ticks(&self, gpu: &Gpu, n: u32) -> Result<Vec<[u64; 2]>, GpuError> {
        let raw = gpu.read_bytes(&self.resolve, 0, 16 * n.min(self.pairs) as u64)?;
        Ok(ticks(&raw).chunks_exact(2).map(|p| [p[0], p[1]]).collect())
    }

    /// [`TimestampPairs::read_ticks`] as seconds from begin to end of each pair.
    pub fn read_seconds(&self, gpu: &Gpu, n: u32) -> Result<Vec<f64>, GpuError> {
        let per = seconds_per_tick(gpu);
        Ok(self
            .read_ticks(gpu, n)?
            .iter()
            .map(|[b, e]| e.saturating_sub(*b) as f64 * per)
            .collect())
    }

    /// Resolve pairs `0..n` at the end of `enc`, submit it, and return each pair's seconds.
    pub fn finish_and_read(
        &self,
        gpu: &Gpu,
        mut enc: wgpu::CommandEncoder,
        n: u32,
    ) -> Result<Vec<f64>, GpuError> {
        self.resolve(&mut enc, n);
        gpu.queue.submit([enc.finish()]);
        self.read_seconds(gpu, n)
    }
}

/// Time `n` repetitions of `record` (median of 5): GPU timestamps around them when the adapter
/// has them (an empty pass writes the start, an empty pass the end), else the wall clock around
/// one submit. Untimed first: at least 0.5 s of repetitions (first use of the buffers, clocks up;
/// one round on a CPU adapter). Returns (seconds for n, how it was timed).
pub fn time_reps(
    gpu: &Gpu,
    n: usize,
    record: &dyn Fn(&mut wgpu::CommandEncoder),
) -> Result<(f64, &'static str), GpuError> {
    let reps = 5u32;
    let wait = || {
        gpu.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| GpuError::Device(e.to_string()))
    };
    let t_warm = Instant::now();
    loop {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for _ in 0..3 {
            record(&mut enc);
        }
        gpu.queue.submit([enc.finish()]);
        wait()?;
        if t_warm.elapsed().as_secs_f64() > 0.5 || gpu.is_cpu() {
            break;
        }
    }
    let mut secs = Vec::new();
    let how;
    if gpu.has_timestamps() {
        how = "gpu timestamps around n repetitions, median of 5";
        let ts = TimestampPairs::new(gpu, "timed repetitions", reps);
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for r in 0..reps {
            enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("repetitions start"),
                timestamp_writes: Some(ts.writes(r, true, false)),
            });
            for _ in 0..n {
                record(&mut enc);
            }
            enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("repetitions end"),
                timestamp_writes: Some(ts.writes(r, false, true)),
            });
        }
        secs = ts.finish_and_read(gpu, enc, reps)?;
    } else {
        how = "wall clock around one submit of n repetitions, median of 5";
        for _ in 0..reps {
            let t0 = Instant::now();
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            for _ in 0..n {
                record(&mut enc);
            }
            gpu.queue.submit([enc.finish()]);
            wait()?;
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

/// Why a copy could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("a copy of {mib} MiB timed {n} times: want 1 to 1048576 MiB, at least once")]
    Size { mib: u64, n: usize },
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

/// Time `n` copies of `mib` MiB (capped at the adapter's largest buffer and binding) two ways:
/// `copy_buffer_to_buffer` and the compute-shader copy of `wgsl/copy.wgsl` (`vec4<u32>` loads and
/// stores), each as [`time_reps`]. Both count bytes read + written (2× the bytes copied), as
/// PyTorch reports a copy.
pub fn measure_copy(gpu: &Gpu, mib: u64, n: usize) -> Result<CopyMeasure, CopyError> {
    if !(1..=1 << 20).contains(&mib) || n == 0 {
        return Err(CopyError::Size { mib, n });
    }
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
    let groups = words.div_ceil(256).clamp(1, call::MAX_GROUPS_PER_DIM);
    let params = CopyParams {
        n: words,
        stride: groups * 256,
        _p: [0; 2],
    };
    let copy = Dispatch::new(
        gpu,
        &CopyKey,
        &params,
        &[(1, &src), (2, &dst)],
        [groups, 1, 1],
    );
    let copy = call::Call::new(call::Label::op("copy"), vec![copy]);
    let (t_shader, _) = time_reps(gpu, n, &|enc| copy.record(enc))?;

    let bytes = 2.0 * size as f64 * n as f64;
    let gbs_cmd = bytes / t_cmd / 1e9;
    let gbs_shader = bytes / t_shader / 1e9;
    Ok(CopyMeasure {
        bytes: size,
        gbs_cmd,
        gbs_shader,
        ceiling: gbs_cmd.max(gbs_shader),
        how,
    })
}

/// WGSL of the compute-shader copy.
const COPY_WGSL: &str = include_str!("../../wgsl/copy.wgsl");

/// The pipeline of `bench copy`'s compute-shader copy. Label `bench/copy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CopyKey;

/// The `Params` of copy.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct CopyParams {
    /// `vec4<u32>` words to copy.
    pub n: u32,
    /// Threads in the whole dispatch.
    pub stride: u32,
    pub _p: [u32; 2],
}

impl std::fmt::Display for CopyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("bench/copy")
    }
}

impl Kernel for CopyKey {
    type Params = CopyParams;
    fn entry(&self) -> &'static str {
        "main"
    }
    fn bindings(&self) -> Vec<(u32, Bind)> {
        vec![(0, Bind::Uniform), (1, Bind::Read), (2, Bind::Write)]
    }
    fn source(&self) -> String {
        COPY_WGSL.to_string()
    }
}
