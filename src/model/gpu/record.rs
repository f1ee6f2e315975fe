//! The recorder: a [`Step`] into compute passes (one, one per phase run, or one per call), the
//! copies the host reads back (logits, the greedy id, the pipelined decode's ring of ids), the
//! submission, and the host's time per phase of it.
use super::graph::{Node, PassLayout, Step};
use super::resident::Activations;
use super::timing::StepTimer;
use crate::gpu::Gpu;
use crate::model::status;
use anyhow::{ensure, Result};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Readback buffers of the pipelined greedy decode (a ring: step k copies its id into slot k % 2).
pub(super) const RING: usize = 2;
/// Bytes of the status words (model::status) read back with every result.
pub(super) const STATUS_BYTES: u64 = 4 * status::WORDS as u64;

/// What a step copies for the host.
#[derive(Clone, Copy, Debug)]
pub(super) enum Readback {
    None,
    /// The first `n` bytes of the logits buffer, then the status words.
    Logits(u64),
    /// The status words (the greedy id first).
    Argmax,
    /// The status words into ring slot `n` of the pipelined decode.
    Ring(usize),
}

/// Host seconds spent per phase of the one-token steps (see [`super::GpuModel::host_times`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostTimes {
    /// One-token steps counted.
    pub steps: u64,
    /// Writing ids/position and recording the compute pass(es).
    pub record_s: f64,
    /// `CommandEncoder::finish` (wgpu encodes the recorded pass into a backend command buffer).
    pub finish_s: f64,
    /// `Queue::submit`.
    pub submit_s: f64,
    /// Waiting for the greedy id of a pipelined step (map + poll).
    pub wait_s: f64,
}

impl HostTimes {
    /// Milliseconds per step: (record, finish, submit, wait).
    pub fn per_step_ms(&self) -> [f64; 4] {
        let n = self.steps.max(1) as f64;
        [self.record_s, self.finish_s, self.submit_s, self.wait_s].map(|x| 1e3 * x / n)
    }
}

/// A streaming cut: gets the encoder holding the step so far and the layer whose routed experts
/// go here, returns the encoder the rest of the step is recorded into.
pub(super) type Cut<'c> =
    dyn FnMut(usize, wgpu::CommandEncoder) -> Result<wgpu::CommandEncoder> + 'c;

/// Records steps and reads their results back.
pub(super) struct Recorder {
    /// The logits (up to a chunk of rows), then the status words.
    readback: wgpu::Buffer,
    /// The pipelined greedy decode's ring of readback buffers for the status words.
    ring: [wgpu::Buffer; RING],
    /// Set by a ring buffer's `map_async` callback: 1 = mapped, 2 = failed.
    map_flag: Arc<AtomicU8>,
    pub host: HostTimes,
}

impl Recorder {
    /// Readbacks for up to `logits_floats` logits.
    pub fn new(gpu: &Gpu, logits_floats: usize) -> Recorder {
        let map_buffer = |label, size| {
            gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        Recorder {
            readback: map_buffer("logits readback", 4 * logits_floats as u64 + STATUS_BYTES),
            ring: std::array::from_fn(|_| map_buffer("greedy id ring", STATUS_BYTES)),
            map_flag: Default::default(),
            host: HostTimes::default(),
        }
    }

    /// Record `step` into `enc` as the passes of `layout`, each with the timestamp writes `timer`
    /// gives it; at every [`Node::Routed`] the pass ends and `cut` takes the encoder. Returns the
    /// encoder holding the rest of the step.
    pub fn record(
        &self,
        mut enc: wgpu::CommandEncoder,
        step: &Step,
        layout: PassLayout,
        timer: Option<&dyn StepTimer>,
        cut: &mut Cut<'_>,
    ) -> Result<wgpu::CommandEncoder> {
        for (i, (label, range)) in step.passes(layout).into_iter().enumerate() {
            let mut writes = timer.and_then(|t| t.writes(i));
            let mut start = range.start;
            loop {
                let end = step.nodes[start..range.end]
                    .iter()
                    .position(|n| matches!(n, Node::Routed { .. }))
                    .map_or(range.end, |k| start + k);
                {
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some(label),
                        timestamp_writes: writes.take(),
                    });
                    for n in &step.nodes[start..end] {
                        if let Node::Call(c) = n {
                            c.record_in_pass(&mut pass);
                        }
                    }
                }
                if end == range.end {
                    break;
                }
                let Node::Routed { layer } = step.nodes[end] else {
                    unreachable!("a routed cut")
                };
                enc = cut(layer, enc)?;
                start = end + 1;
            }
        }
        Ok(enc)
    }

    /// Copy what `copy` asks for into the readback buffers.
    pub fn copy_readback(&self, enc: &mut wgpu::CommandEncoder, a: &Activations, copy: Readback) {
        match copy {
            Readback::None => {}
            Readback::Logits(n) => {
                enc.copy_buffer_to_buffer(&a.logits, 0, &self.readback, 0, n);
                enc.copy_buffer_to_buffer(&a.argmax, 0, &self.readback, n, STATUS_BYTES);
            }
            Readback::Argmax => {
                enc.copy_buffer_to_buffer(&a.argmax, 0, &self.readback, 0, STATUS_BYTES)
            }
            Readback::Ring(slot) => {
                enc.copy_buffer_to_buffer(&a.argmax, 0, &self.ring[slot], 0, STATUS_BYTES)
            }
        }
    }

    /// Finish and submit `enc`; a one-token step's host times (recording since `t_record`) are
    /// counted.
    pub fn submit(
        &mut self,
        gpu: &Gpu,
        enc: wgpu::CommandEncoder,
        t_record: Instant,
        one_token: bool,
    ) -> wgpu::SubmissionIndex {
        let t_fin = Instant::now();
        let cb = enc.finish();
        let t_sub = Instant::now();
        let idx = gpu.queue.submit([cb]);
        if one_token {
            let h = &mut self.host;
            h.steps += 1;
            h.record_s += (t_fin - t_record).as_secs_f64();
            h.finish_s += (t_sub - t_fin).as_secs_f64();
            h.submit_s += t_sub.elapsed().as_secs_f64();
        }
        idx
    }

    /// Map the first `bytes` of the readback buffer (after the last submission) and copy them out.
    pub fn read_back(&self, gpu: &Gpu, bytes: u64) -> Result<Vec<u8>> {
        Ok(gpu.map_read(&self.readback, bytes)?)
    }

    /// Wait for submission `idx` only (later ones keep running), then read the id in ring `slot`
    /// (its step's last token at position `last`; an error when its status words report a
    /// non-finite value).
    pub fn read_ring(
        &mut self,
        gpu: &Gpu,
        slot: usize,
        idx: wgpu::SubmissionIndex,
        last: usize,
    ) -> Result<u32> {
        let t0 = Instant::now();
        let r = self.map_ring(gpu, slot, idx);
        self.host.wait_s += t0.elapsed().as_secs_f64();
        let w = r?;
        status::check(&w, last)?;
        Ok(w[status::ID])
    }

    fn map_ring(&self, gpu: &Gpu, slot: usize, idx: wgpu::SubmissionIndex) -> Result<Vec<u32>> {
        let buf = &self.ring[slot];
        let slice = buf.slice(0..STATUS_BYTES);
        self.map_flag.store(0, Ordering::Release);
        let flag = self.map_flag.clone();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            flag.store(if r.is_ok() { 1 } else { 2 }, Ordering::Release);
        });
        gpu.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(idx),
                timeout: None,
            })
            .map_err(|e| anyhow::anyhow!("GPU poll failed: {e}"))?;
        // the callback fires during the poll that sees the submission done; poll again if not
        while self.map_flag.load(Ordering::Acquire) == 0 {
            gpu.device
                .poll(wgpu::PollType::Poll)
                .map_err(|e| anyhow::anyhow!("GPU poll failed: {e}"))?;
            std::thread::yield_now();
        }
        ensure!(
            self.map_flag.load(Ordering::Acquire) == 1,
            "GPU readback of the greedy id failed"
        );
        let w = {
            let m = slice
                .get_mapped_range()
                .map_err(|e| anyhow::anyhow!("GPU readback failed: {e:?}"))?;
            words(&m)
        };
        buf.unmap();
        Ok(w)
    }
}

/// Little-endian u32 words of `b`.
pub(super) fn words(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
        .collect()
}
