//! The GPU timers of one-token steps, each a [`StepTimer`] the recorder asks for the pass layout
//! and the timestamp writes of each pass: [`PhaseTimer`] (profile mode: one timed pass per phase
//! run), [`OpTimer`] (the per-op profile: one timed pass per call) and [`SpanTimer`] (the
//! beginning and end of the normal single pass). The kernels and their order are the same under
//! every timer, so the tokens are too.
use super::graph::{PassLayout, Step};
use crate::gpu::timing::{query_set, resolve_buffer, seconds_per_tick, ticks};
use crate::gpu::Gpu;
use crate::model::profile::{OpTimes, Phase};
use anyhow::{ensure, Result};

/// A timer of the passes of one-token steps.
pub(super) trait StepTimer {
    /// How the timed step is cut into passes.
    fn layout(&self) -> PassLayout;
    /// Get ready to time `step` (allocate queries, read back what is full).
    fn prepare(&mut self, gpu: &Gpu, step: &Step) -> Result<()>;
    /// The timestamp writes of pass `pass` of the step being recorded.
    fn writes(&self, pass: usize) -> Option<wgpu::ComputePassTimestampWrites<'_>>;
    /// After the passes: resolve the step's queries in `enc`.
    fn resolve(&mut self, enc: &mut wgpu::CommandEncoder, step: &Step);
    /// After the submission (a timer that reads back per step waits here).
    fn after_submit(&mut self, _gpu: &Gpu, _step: &Step) -> Result<()> {
        Ok(())
    }
}

/// The timestamp writes at the beginning (`2 i`) and end (`2 i + 1`) of a pass.
fn pair_writes(qs: &wgpu::QuerySet, i: u32) -> wgpu::ComputePassTimestampWrites<'_> {
    wgpu::ComputePassTimestampWrites {
        query_set: qs,
        beginning_of_pass_write_index: Some(2 * i),
        end_of_pass_write_index: Some(2 * i + 1),
    }
}

/// Profile mode's query set for one step, resolved into slots of a GPU buffer that is read back
/// when full and at the end.
struct PhaseStamps {
    qs: wgpu::QuerySet,
    /// Queries the set holds (2 per phase run).
    queries: u32,
    resolve: wgpu::Buffer,
    /// Bytes per slot (a multiple of the resolve alignment).
    stride: u64,
    slots: u64,
    /// The phase runs of each filled slot's step.
    pending: Vec<Vec<Phase>>,
}

/// Profile mode (see [`crate::model::profile`]): counts one-token steps and their bytes and, with
/// `TIMESTAMP_QUERY`, times each phase run as its own pass.
#[derive(Default)]
pub(super) struct PhaseTimer {
    pub steps: usize,
    pub bytes_sum: f64,
    stamps: Option<PhaseStamps>,
    /// Ticks per phase, in [`Phase::ALL`] order, of the slots read back so far.
    ticks: [u64; 7],
    /// Ticks from the first pass's beginning to the last one's end, summed over the steps.
    span_ticks: u64,
}

impl PhaseTimer {
    /// Count one step that reads `bytes`.
    pub fn count(&mut self, bytes: u64) {
        self.steps += 1;
        self.bytes_sum += bytes as f64;
    }

    /// Read back the filled slots and add them to the sums.
    fn flush(&mut self, gpu: &Gpu) -> Result<()> {
        let Some(st) = self.stamps.as_mut() else {
            return Ok(());
        };
        if st.pending.is_empty() {
            return Ok(());
        }
        let raw = gpu.read_bytes(&st.resolve, 0, st.pending.len() as u64 * st.stride)?;
        let all = ticks(&raw);
        let per_slot = (st.stride / 8) as usize;
        for (slot, phases) in st.pending.iter().enumerate() {
            let t = &all[slot * per_slot..];
            for (i, ph) in phases.iter().enumerate() {
                self.ticks[ph.index()] += t[2 * i + 1].saturating_sub(t[2 * i]);
            }
            if !phases.is_empty() {
                self.span_ticks += t[2 * phases.len() - 1].saturating_sub(t[0]);
            }
        }
        st.pending.clear();
        Ok(())
    }

    /// Seconds per phase ([`Phase::ALL`] order) and of the step spans, summed over the steps.
    pub fn seconds(&mut self, gpu: &Gpu) -> Result<([f64; 7], f64)> {
        self.flush(gpu)?;
        let p = seconds_per_tick(gpu);
        Ok((self.ticks.map(|t| t as f64 * p), self.span_ticks as f64 * p))
    }
}

impl StepTimer for PhaseTimer {
    fn layout(&self) -> PassLayout {
        PassLayout::PerPhase
    }

    fn prepare(&mut self, gpu: &Gpu, step: &Step) -> Result<()> {
        let need = 2 * step.phases.len() as u32;
        ensure!(
            need <= wgpu::QUERY_SET_MAX_QUERIES,
            "profile mode: {} phase passes per step exceed the {} queries of a query set",
            step.phases.len(),
            wgpu::QUERY_SET_MAX_QUERIES
        );
        if self.stamps.as_ref().is_none_or(|s| s.queries < need) {
            self.flush(gpu)?;
            let stride = (8 * need as u64).next_multiple_of(wgpu::QUERY_RESOLVE_BUFFER_ALIGNMENT);
            let slots = ((16u64 << 20) / stride).clamp(1, 4096);
            self.stamps = Some(PhaseStamps {
                qs: query_set(gpu, "decode profile", need),
                queries: need,
                resolve: resolve_buffer(gpu, "decode profile timestamps", slots * stride),
                stride,
                slots,
                pending: Vec::new(),
            });
        }
        if self
            .stamps
            .as_ref()
            .is_some_and(|s| s.pending.len() as u64 == s.slots)
        {
            self.flush(gpu)?;
        }
        Ok(())
    }

    fn writes(&self, pass: usize) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let st = self.stamps.as_ref()?;
        Some(pair_writes(&st.qs, pass as u32))
    }

    fn resolve(&mut self, enc: &mut wgpu::CommandEncoder, step: &Step) {
        let st = self.stamps.as_mut().expect("prepared");
        let slot = st.pending.len() as u64;
        let n = 2 * step.phases.len() as u32;
        enc.resolve_query_set(&st.qs, 0..n, &st.resolve, slot * st.stride);
        st.pending
            .push(step.phases.iter().map(|(p, _)| *p).collect());
    }
}

/// Calls per query set of the per-op profile (two queries each: the set limit is 4096).
const OP_SET_CALLS: usize = (wgpu::QUERY_SET_MAX_QUERIES / 2) as usize;

/// The per-op profile: each call of a step as its own pass with timestamps at its beginning and
/// end, read back after every step (slow: a diagnosis tool, not a speed figure).
#[derive(Default)]
pub(super) struct OpTimer {
    /// Query sets of [`OP_SET_CALLS`] calls (two timestamps each), as many as a step needs.
    sets: Vec<wgpu::QuerySet>,
    /// Resolved timestamps: 16 bytes per call, set k from byte k · 16 · OP_SET_CALLS.
    resolve: Option<wgpu::Buffer>,
    pub times: OpTimes,
}

impl StepTimer for OpTimer {
    fn layout(&self) -> PassLayout {
        PassLayout::PerCall
    }

    fn prepare(&mut self, gpu: &Gpu, step: &Step) -> Result<()> {
        let n = step.nodes.len();
        if self.sets.len() * OP_SET_CALLS < n {
            self.sets = (0..n.div_ceil(OP_SET_CALLS))
                .map(|_| query_set(gpu, "per-op profile", 2 * OP_SET_CALLS as u32))
                .collect();
            let size = (16 * OP_SET_CALLS * self.sets.len()) as u64;
            self.resolve = Some(resolve_buffer(gpu, "per-op profile timestamps", size));
        }
        Ok(())
    }

    fn writes(&self, pass: usize) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let qs = &self.sets[pass / OP_SET_CALLS];
        Some(pair_writes(qs, (pass % OP_SET_CALLS) as u32))
    }

    fn resolve(&mut self, enc: &mut wgpu::CommandEncoder, step: &Step) {
        let n = step.nodes.len();
        let resolve = self.resolve.as_ref().expect("prepared");
        // call i's two timestamps land at byte 16 · i of `resolve`
        for (k, qs) in self.sets.iter().enumerate().take(n.div_ceil(OP_SET_CALLS)) {
            let used = (n - k * OP_SET_CALLS).min(OP_SET_CALLS) as u32;
            let at = (16 * OP_SET_CALLS * k) as u64;
            enc.resolve_query_set(qs, 0..2 * used, resolve, at);
        }
    }

    /// Wait for the step just submitted and add its calls' times.
    fn after_submit(&mut self, gpu: &Gpu, step: &Step) -> Result<()> {
        let period = seconds_per_tick(gpu);
        let resolve = self.resolve.as_ref().expect("prepared");
        let t = ticks(&gpu.read_bytes(resolve, 0, 16 * step.nodes.len() as u64)?);
        let first = t[0];
        let mut last = first;
        for (i, c) in step.calls().enumerate() {
            let (b, e) = (t[2 * i], t[2 * i + 1]);
            self.times
                .add(c.label.op, e.saturating_sub(b) as f64 * period);
            last = last.max(e);
        }
        self.times.steps += 1;
        self.times.span_s += last.saturating_sub(first) as f64 * period;
        Ok(())
    }
}

/// GPU timestamps at the beginning and end of each normal (single-pass) one-token step, for the
/// first `cap` of them: how long the GPU spends on a step and how long it sits idle between steps.
pub(super) struct SpanTimer {
    qs: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    cap: u32,
    n: u32,
}

impl SpanTimer {
    /// A timer of up to `cap` steps (clamped to what one query set holds).
    pub fn new(gpu: &Gpu, cap: u32) -> SpanTimer {
        let cap = cap.clamp(1, wgpu::QUERY_SET_MAX_QUERIES / 2);
        SpanTimer {
            qs: query_set(gpu, "step spans", 2 * cap),
            resolve: resolve_buffer(
                gpu,
                "step span timestamps",
                cap as u64 * wgpu::QUERY_RESOLVE_BUFFER_ALIGNMENT,
            ),
            cap,
            n: 0,
        }
    }

    /// Whether another step fits.
    pub fn has_room(&self) -> bool {
        self.n < self.cap
    }

    /// `(GPU seconds of each step, GPU seconds idle before each step after the first)`, in
    /// submission order.
    pub fn seconds(&self, gpu: &Gpu) -> Result<(Vec<f64>, Vec<f64>)> {
        if self.n == 0 {
            return Ok(Default::default());
        }
        let period = seconds_per_tick(gpu);
        let stride = wgpu::QUERY_RESOLVE_BUFFER_ALIGNMENT;
        let t = ticks(&gpu.read_bytes(&self.resolve, 0, self.n as u64 * stride)?);
        let per = (stride / 8) as usize;
        let tick = |i: usize, k: usize| t[i * per + k];
        let n = self.n as usize;
        let busy = (0..n)
            .map(|i| tick(i, 1).saturating_sub(tick(i, 0)) as f64 * period)
            .collect();
        let idle = (1..n)
            .map(|i| tick(i, 0).saturating_sub(tick(i - 1, 1)) as f64 * period)
            .collect();
        Ok((busy, idle))
    }
}

impl StepTimer for SpanTimer {
    fn layout(&self) -> PassLayout {
        PassLayout::Single
    }

    fn prepare(&mut self, _gpu: &Gpu, _step: &Step) -> Result<()> {
        Ok(())
    }

    fn writes(&self, _pass: usize) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        Some(pair_writes(&self.qs, self.n))
    }

    fn resolve(&mut self, enc: &mut wgpu::CommandEncoder, _step: &Step) {
        let n = self.n;
        enc.resolve_query_set(
            &self.qs,
            2 * n..2 * n + 2,
            &self.resolve,
            n as u64 * wgpu::QUERY_RESOLVE_BUFFER_ALIGNMENT,
        );
        self.n += 1;
    }
}
