//! The GPU forward: the whole Inkling text model on wgpu, one command encoder and one submission
//! per chunk of at most `max_chunk` tokens. A step of T tokens is built once and cached, so decode
//! (T = 1) allocates nothing per token.
//!
//! The files follow the life of a token:
//! - `resident.rs`: what lives on the GPU (weights, KV caches, conv states, activations) and its upload;
//! - `budget.rs`: memory and traffic estimates (resident part, expert slots, bytes per decode step);
//! - `graph.rs`: the Inkling recipe, one function per block, building a `Step`;
//! - `record.rs`: a step into compute passes, readbacks, the greedy-id ring and host times;
//! - `batch.rs`: sequence slots and the decode batch ([`super::BatchForward`]);
//! - `timing.rs`: the GPU timers of profile mode, the per-op profile and step spans;
//! - `streamed.rs`: expert streaming through a pool of slots, with a CPU fallback.
mod batch;
mod budget;
mod graph;
mod record;
mod resident;
mod streamed;
mod timing;

pub use graph::Fusions;
pub use record::HostTimes;

use super::config::TextConfig;
use super::profile::{DecodeProfile, OpTimes};
use super::status;
use super::stream::{Placement, StreamStats};
use super::usage::Usage;
use super::weights::Weights;
use crate::gpu::linear::route::LinearOptions;
use crate::gpu::Gpu;
use anyhow::{bail, ensure, Context, Result};
use budget::DecodeBytes;
use graph::{Head, PassLayout, Step, StepKey};
use record::{words, Readback, Recorder, RING, STATUS_BYTES};
use resident::Resident;
use std::collections::HashMap;
use std::time::Instant;
use streamed::Streamer;
use timing::{OpTimer, PhaseTimer, SpanTimer, StepTimer};

/// Default largest chunk of tokens one submission processes: long enough that a chunk's routed
/// pairs give the experts of a 256-expert top-6 layer about 12 pairs each, so that they run as
/// the GEMM (`gpu::gemm`) rather than the GEMV. The activations of a chunk scale with it (the
/// logits of every token and their readback copy, `budget::resident_bytes_estimate`): about
/// 0.8 GB for a 201k vocabulary.
pub const DEFAULT_MAX_CHUNK: usize = 512;

/// Storage buffers the decode batch's fused attention (`attention/fused/*+batch`) binds.
pub const BATCH_STORAGE_BUFFERS: u32 = 9;

/// Settings of a [`GpuModel`]; [`GpuModelOptions::new`] gives the defaults for a sequence length.
#[derive(Clone, Debug)]
pub struct GpuModelOptions {
    /// Longest sequence (prompt + generated tokens): the full layers' KV capacity.
    pub max_seq: usize,
    /// Most tokens one submission processes (longer calls are split).
    pub max_chunk: usize,
    /// Largest weight buffer in bytes (default: the adapter's binding limit, at most 2³¹ − 1).
    /// Smaller values split the embedding table into more shards and weight slabs into more
    /// chunks (tests use it to exercise those paths on tiny models).
    pub binding_limit: Option<u64>,
    /// Where the routed experts live (see [`super::stream`]).
    pub placement: Placement,
    /// The routing-count table a streaming model records into; loaded from a usage file, it
    /// ranks the pinned hot set (up to half the slots when there are at least twice `top_k` of
    /// them). Ignored when the experts are resident.
    pub usage: Option<Usage>,
    /// Which fused kernels the steps run ([`Fusions::default`]: the engine's).
    pub fusions: Fusions,
    /// How the linears' calls are built (GEMV tuning, GEMM tile); default: the engine's choice.
    pub linear: LinearOptions,
    /// Sequence slots ([`super::BatchForward`]; not the expert slots of streaming): each has its
    /// own KV caches and conv states of `max_seq` tokens. Default 1.
    pub seq_slots: usize,
}

impl GpuModelOptions {
    /// Sequences of up to `max_seq` tokens, chunks of [`DEFAULT_MAX_CHUNK`], the adapter's binding
    /// limit, every expert resident, the engine's fused kernels.
    pub fn new(max_seq: usize) -> GpuModelOptions {
        GpuModelOptions {
            max_seq,
            max_chunk: DEFAULT_MAX_CHUNK,
            binding_limit: None,
            placement: Placement::Resident,
            usage: None,
            fusions: Fusions::default(),
            linear: LinearOptions::default(),
            seq_slots: 1,
        }
    }
}

/// The GPU model: what is resident, the recorded steps, and one sequence's state.
///
/// `'w` is the lifetime of the mapped weights a streaming model reads its routed experts from.
pub struct GpuModel<'w> {
    gpu: Gpu,
    cfg: TextConfig,
    max_seq: usize,
    max_chunk: usize,
    /// Tokens the selected sequence slot holds.
    pos: usize,
    /// The selected slot's conv states may hold a previous sequence's inputs.
    dirty: bool,
    /// The selected sequence slot ([`super::BatchForward::select`]).
    seq_slot: usize,
    /// `(pos, dirty)` of every sequence slot (the selected one's entry is stale).
    parked: Vec<(usize, bool)>,
    res: Resident,
    steps: HashMap<StepKey, Step>,
    rec: Recorder,
    decode_bytes: DecodeBytes,
    stream: Option<Streamer<'w>>,
    profile: Option<PhaseTimer>,
    op_profile: Option<OpTimer>,
    spans: Option<SpanTimer>,
    fusions: Fusions,
}

impl<'w> GpuModel<'w> {
    /// Upload `w` and build a model as `opts` says: routed experts resident, or streamed from
    /// `w`'s mapped bytes through a pool of expert slots (see [`super::stream`]).
    ///
    /// Errors: a kernel that `opts` reach over one of the device's limits
    /// ([`crate::gpu::variants::LimitError`], naming the op, its kernel and the limit), `max_seq`
    /// or `max_chunk` zero, `max_seq` past `u32`, a conv kernel size the GPU short conv lacks, a
    /// KV cache larger than a binding, a GPU memory budget below the resident part plus one
    /// expert slot, and the GPU running out of memory during the upload.
    pub fn new(gpu: &Gpu, w: &'w Weights<'w>, opts: GpuModelOptions) -> Result<GpuModel<'w>> {
        let slots = Self::plan_slots(w, &opts)?;
        // out of memory while uploading is an error that says what to do, not a panic
        let oom = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let built = Self::build(gpu, w, &opts, slots);
        if let Some(e) = pollster::block_on(oom.pop()) {
            bail!(
                "the GPU ran out of memory while uploading the model ({e}); {}",
                match slots {
                    None => "give a budget with --gpu-mem GiB (or --expert-slots N) so the routed \
                             experts stream from the container"
                        .to_string(),
                    Some(n) => format!("{n} expert slots did not fit: use a smaller --gpu-mem"),
                }
            );
        }
        let mut m = built?;
        let max_topk = m.res.max_topk;
        if let (Some(s), Some(u)) = (m.stream.as_mut(), opts.usage) {
            s.load_hot_set(&m.gpu, u, max_topk);
        }
        m.build_decode_steps()?;
        Ok(m)
    }

    /// Record the one-token steps (and, when streaming, the routed parts a one-token step can
    /// have) now, so that their pipelines are built with the model and a decode builds none.
    fn build_decode_steps(&mut self) -> Result<()> {
        let chained = if self.stream.is_none() {
            &[false, true][..]
        } else {
            &[false][..]
        };
        for &chained in chained {
            let key = StepKey {
                tokens: 1,
                head: Head::Last,
                chained,
                batch: false,
            };
            if !self.steps.contains_key(&key) {
                let step = graph::build_step(&self.gpu, &self.cfg, &self.res, key, self.fusions)?;
                self.steps.insert(key, step);
            }
        }
        if let Some(s) = self.stream.as_mut() {
            s.build_decode_parts(&self.gpu, &self.res)?;
        }
        Ok(())
    }

    /// Upload everything; `slots = Some(n)` leaves the routed experts off the GPU and allocates a
    /// pool of `n` expert slots instead.
    fn build(
        gpu: &Gpu,
        w: &'w Weights<'w>,
        opts: &GpuModelOptions,
        slots: Option<usize>,
    ) -> Result<GpuModel<'w>> {
        let cfg = w.config.clone();
        crate::gpu::variants::check_device(gpu, opts.fusions.attention)?;
        let max_seq = opts.max_seq;
        ensure!(max_seq >= 1, "max_seq must be at least 1");
        ensure!(
            u32::try_from(max_seq).is_ok(),
            "a sequence of {max_seq} tokens (prompt + --max-tokens) is more than the GPU model's \
             positions can index (at most {}); use a smaller --max-tokens",
            u32::MAX
        );
        ensure!(opts.max_chunk >= 1, "max_chunk must be at least 1");
        let max_chunk = opts.max_chunk.min(max_seq);
        ensure!(
            opts.seq_slots >= 1,
            "a model needs at least one sequence slot"
        );
        ensure!(
            opts.seq_slots == 1 || opts.fusions.attention,
            "sequence slots need the fused attention"
        );
        let sb = gpu.limits.max_storage_buffers_per_shader_stage;
        ensure!(
            opts.seq_slots == 1 || sb >= BATCH_STORAGE_BUFFERS,
            "{} sequence slots: the decode batch's attention kernel binds {BATCH_STORAGE_BUFFERS} \
             storage buffers, but this device allows {sb} per shader stage (wgpu limit \
             `max_storage_buffers_per_shader_stage`); use one sequence slot",
            opts.seq_slots
        );
        ensure!(
            opts.seq_slots <= max_chunk,
            "{} sequence slots are more than a chunk of {max_chunk} tokens can batch",
            opts.seq_slots
        );
        let kk = cfg.conv_kernel_size;
        ensure!(
            (1..=8).contains(&kk),
            "conv_kernel_size {kk} not supported by the GPU short conv (1..=8)"
        );
        let limit = crate::gpu::linear::slab::default_limit(gpu)
            .min(opts.binding_limit.unwrap_or(u64::MAX));
        let sizes = resident::Sizes {
            max_seq,
            max_chunk,
            limit,
            stream_routed: slots.is_some(),
            seq_slots: opts.seq_slots,
        };
        let mut res = Resident::upload(gpu, w, sizes)?;
        res.linear = opts.linear;
        let stream = match slots {
            None => None,
            Some(n) => Some(Streamer::new(
                gpu,
                w,
                n,
                limit,
                max_chunk,
                res.max_topk,
                opts.linear,
            )?),
        };
        Ok(GpuModel {
            rec: Recorder::new(gpu, max_chunk * cfg.logits_width()),
            decode_bytes: DecodeBytes::of(&res),
            gpu: gpu.clone(),
            cfg,
            max_seq,
            max_chunk,
            pos: 0,
            dirty: false,
            seq_slot: 0,
            parked: vec![(0, false); opts.seq_slots],
            res,
            steps: HashMap::new(),
            stream,
            profile: None,
            op_profile: None,
            spans: None,
            fusions: opts.fusions,
        })
    }

    /// How many expert slots `opts.placement` gives this model: `None` = fully resident (every
    /// routed expert fits, or no budget was given). Errors: zero slots asked for, or a budget
    /// below the resident part plus one slot.
    pub fn plan_slots(w: &Weights<'_>, opts: &GpuModelOptions) -> Result<Option<usize>> {
        let sizes = (opts.max_seq, opts.max_chunk, opts.seq_slots);
        budget::plan_slots(w, opts.placement, sizes)
    }

    /// GPU bytes of one expert slot (gate‖up and down, padded rows, scales).
    pub fn slot_bytes(w: &Weights<'_>) -> u64 {
        budget::slot_bytes(w)
    }

    /// An estimate of the GPU bytes of everything but the routed experts: dense linears, shared
    /// experts, router, embedding table, head, norms and conv weights as stored, the KV caches
    /// and conv states of `opts.seq_slots` sequences of `opts.max_seq` tokens, and the
    /// activations of a `max_chunk` chunk.
    pub fn resident_bytes_estimate(w: &Weights<'_>, opts: &GpuModelOptions) -> u64 {
        budget::resident_bytes_estimate(w, opts.max_seq, opts.max_chunk, opts.seq_slots)
    }

    /// GPU bytes of the sequence state `opts` asks for: KV caches (with the fused attention's
    /// conv rings) and conv states of `opts.seq_slots` sequences of `opts.max_seq` tokens.
    pub fn state_bytes(w: &Weights<'_>, opts: &GpuModelOptions) -> u64 {
        budget::state_bytes(w, opts.max_seq, opts.seq_slots)
    }

    /// Counters of expert streaming (`None` when the routed experts are resident).
    pub fn stream_stats(&self) -> Option<StreamStats> {
        self.stream.as_ref().map(|s| s.stats())
    }

    /// The routing counts recorded so far (streaming only), for the usage file.
    pub fn usage(&self) -> Option<&Usage> {
        self.stream.as_ref().map(|s| s.usage())
    }

    /// Test hook: make the GPU part of `layer`'s routed experts fail in the step that feeds
    /// position `pos` (streaming only; the layer is then recomputed on the CPU). Errors when
    /// the model is fully resident.
    #[doc(hidden)]
    pub fn inject_routed_failure(&mut self, pos: usize, layer: usize) -> Result<()> {
        self.stream
            .as_mut()
            .context("failure injection needs a streaming model")?
            .inject_failure(pos, layer);
        Ok(())
    }

    /// The device this model runs on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Longest sequence (tokens) the KV caches hold.
    pub fn max_seq(&self) -> usize {
        self.max_seq
    }

    /// Tokens per submission.
    pub fn max_chunk(&self) -> usize {
        self.max_chunk
    }

    /// Tokens consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Number of distinct recorded steps built so far (one per (token count, head mode)).
    pub fn recorded_steps(&self) -> usize {
        self.steps.len()
    }

    /// Dispatches of the one-token decode step (the chained one when it was recorded, else the
    /// unchained one), and of those the dispatches of each layer; `None` before a one-token
    /// step with a head was recorded.
    pub fn dispatches_per_step(&self) -> Option<(usize, Vec<usize>)> {
        let key = |chained| StepKey {
            tokens: 1,
            head: Head::Last,
            chained,
            batch: false,
        };
        let step = self.steps.get(&key(true)).or(self.steps.get(&key(false)))?;
        let mut per_layer = vec![0; self.res.layers.len()];
        let mut total = 0;
        for c in step.calls() {
            total += c.dispatches();
            if let Some(l) = c.label.layer {
                per_layer[l as usize] += c.dispatches();
            }
        }
        Some((total, per_layer))
    }

    /// [`GpuModel::dispatches_per_step`] as a [`StepDispatches`]: the step's dispatches, of them
    /// the fixed ones outside the layers (embedding and head), and the layer count.
    pub fn step_dispatches(&self) -> Option<crate::model::profile::StepDispatches> {
        let (step, per_layer) = self.dispatches_per_step()?;
        Some(crate::model::profile::StepDispatches {
            step,
            fixed: step - per_layer.iter().sum::<usize>(),
            layers: per_layer.len(),
        })
    }

    /// Bytes a one-token step at position `pos` must read: one embedding row, every norm, conv
    /// weight and conv state, every dense linear, `top_k` routed and every shared expert per
    /// sparse layer, the head's rows, and per layer the K and V cache entries it attends over
    /// (`min(pos + 1, capacity)` of each).
    pub fn decode_bytes(&self, pos: usize) -> u64 {
        self.decode_bytes.at(pos)
    }

    /// Whether profile mode can time phases (the adapter has `TIMESTAMP_QUERY`).
    pub fn has_timestamps(&self) -> bool {
        self.gpu.has_timestamps()
    }

    /// Enter profile mode (dropping anything accumulated so far): from now on every one-token step
    /// is counted, with its bytes, and, with `TIMESTAMP_QUERY`, recorded as one timed compute pass
    /// per phase run. The kernels are the same, so the results are too.
    pub fn start_profile(&mut self) {
        self.profile = Some(PhaseTimer::default());
    }

    /// Leave profile mode and return what it accumulated (reads the timestamps back).
    pub fn take_profile(&mut self) -> Result<DecodeProfile> {
        let Some(mut p) = self.profile.take() else {
            return Ok(DecodeProfile::default());
        };
        let mut out = DecodeProfile {
            steps: p.steps,
            bytes_sum: p.bytes_sum,
            phase_s: None,
            span_s: None,
        };
        // streaming steps are several submissions and carry no timestamps
        if self.has_timestamps() && self.stream.is_none() {
            let (phase_s, span_s) = p.seconds(&self.gpu)?;
            out.phase_s = Some(phase_s);
            out.span_s = Some(span_s);
        }
        Ok(out)
    }

    /// Enter the per-op profile: every later one-token step records each kernel as its own
    /// compute pass with timestamps at its beginning and end, and waits for its times (slow: a
    /// diagnosis tool, not a speed figure; the kernels and their order are those of the normal
    /// step). Errors: the adapter lacks `TIMESTAMP_QUERY`, or the model streams experts.
    pub fn start_op_profile(&mut self) -> Result<()> {
        ensure!(
            self.has_timestamps(),
            "the per-op profile needs TIMESTAMP_QUERY, which {} lacks",
            self.gpu.describe()
        );
        ensure!(
            self.stream.is_none(),
            "the per-op profile does not time streamed steps"
        );
        self.op_profile = Some(OpTimer::default());
        Ok(())
    }

    /// Leave the per-op profile and return the GPU seconds per kernel name, summed over the steps.
    pub fn take_op_profile(&mut self) -> OpTimes {
        self.op_profile.take().map(|p| p.times).unwrap_or_default()
    }

    /// Time the next `cap` normal one-token steps on the GPU (a timestamp at the beginning and
    /// the end of each step's single pass; no change to what runs). Errors without
    /// `TIMESTAMP_QUERY`.
    pub fn start_step_spans(&mut self, cap: u32) -> Result<()> {
        ensure!(
            self.has_timestamps(),
            "step timestamps need TIMESTAMP_QUERY, which {} lacks",
            self.gpu.describe()
        );
        self.spans = Some(SpanTimer::new(&self.gpu, cap));
        Ok(())
    }

    /// Stop timing steps; returns `(GPU seconds of each step, GPU seconds idle before each step
    /// after the first)`, in submission order.
    pub fn take_step_spans(&mut self) -> Result<(Vec<f64>, Vec<f64>)> {
        match self.spans.take() {
            Some(s) => s.seconds(&self.gpu),
            None => Ok(Default::default()),
        }
    }

    /// Host time per phase of the one-token steps since the model was built or
    /// [`GpuModel::reset_host_times`] (the record/finish/submit split tells whether a decode step is
    /// bound by the host or by the GPU).
    pub fn host_times(&self) -> HostTimes {
        self.rec.host
    }

    /// Start counting [`GpuModel::host_times`] afresh.
    pub fn reset_host_times(&mut self) {
        self.rec.host = HostTimes::default();
    }

    /// Forget the sequence: position 0, conv states and the fused attention's conv rings cleared
    /// (KV slots are overwritten before they are read, so the rest of the caches needs no
    /// clearing).
    pub fn reset(&mut self) {
        self.pos = 0;
        if self.dirty {
            self.res.clear_slot(&self.gpu, self.seq_slot);
            self.dirty = false;
        }
    }

    /// Feed `tokens` and return the logits of the last one (`config.logits_width()` values).
    /// Errors (as every forward of this type): a token past the vocabulary, `max_seq` exceeded,
    /// and a NaN or an Inf in a router's logits or in the logits
    /// ([`super::ModelError::NonFiniteRouter`] / [`super::ModelError::NonFiniteLogits`], naming
    /// the position; the model must be [`GpuModel::reset`] before it is used again).
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let mut out = self.run(tokens, Head::Last)?;
        Ok(out.pop().expect("one row"))
    }

    /// Feed `tokens` and return the logits of every one of them.
    pub fn forward_all(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.run(tokens, Head::All)
    }

    /// Feed `tokens` and return only the greedy choice after the last one (argmax on the GPU,
    /// ties to the lowest id; 4 bytes read back).
    pub fn forward_greedy(&mut self, tokens: &[u32]) -> Result<u32> {
        self.check(tokens)?;
        self.clear_status();
        let chunks: Vec<&[u32]> = tokens.chunks(self.max_chunk).collect();
        let last = chunks.len() - 1;
        for (ci, c) in chunks.into_iter().enumerate() {
            if ci == last {
                self.submit(Some(c), Head::Last, Readback::Argmax)?;
                let w = words(&self.rec.read_back(&self.gpu, STATUS_BYTES)?);
                status::check(&w, self.pos - 1)?;
                return Ok(w[status::ID]);
            }
            self.submit(Some(c), Head::None, Readback::None)?;
        }
        unreachable!("at least one chunk")
    }

    /// Whether [`GpuModel::greedy_stream`] is available: not in profile mode (which times one step
    /// per submission) and not while streaming experts (a step is several submissions).
    pub fn can_stream_greedy(&self) -> bool {
        self.profile.is_none() && self.stream.is_none()
    }

    /// Greedy decode with one step in flight: feed `prompt`, then hand each greedy id to `on_id`
    /// in order while it returns `true`, at most `max_new` ids. Each decode step after the prompt
    /// is *chained*: recorded once, its embedding reads the previous step's argmax on the device
    /// and its position is copied on the device, so step k + 1 is submitted before step k's id is
    /// mapped (a ring of two readback buffers), and the GPU does not wait for the host.
    ///
    /// Errors when [`GpuModel::can_stream_greedy`] is false (callers then loop over
    /// [`GpuModel::forward_greedy`]), and as [`GpuModel::forward`].
    ///
    /// When `on_id` stops the run (e.g. on an EOS), the step speculatively submitted behind that
    /// id has already fed it: the cache is left one step ahead, holding the prompt and *every*
    /// id handed out, and [`GpuModel::position`] counts it (prompt + ids handed out). That step's
    /// own argmax is discarded. At `max_new` no step is speculated, so position is then
    /// prompt + ids − 1, as with the unpipelined loop. Either way the state is a consistent
    /// prefix of the sequence, and [`GpuModel::reset`] (which every new prompt goes through)
    /// clears the conv states; KV slots are overwritten before they are read.
    pub fn greedy_stream(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        on_id: &mut dyn FnMut(u32) -> Result<bool>,
    ) -> Result<()> {
        ensure!(
            self.can_stream_greedy(),
            "the pipelined greedy decode runs neither in profile mode nor with streamed experts"
        );
        self.check(prompt)?;
        if max_new == 0 {
            return Ok(());
        }
        self.clear_status();
        let prompt_last = self.pos + prompt.len() - 1;
        let chunks = prompt.len().div_ceil(self.max_chunk);
        let mut cur = None;
        for (ci, c) in prompt.chunks(self.max_chunk).enumerate() {
            if ci + 1 == chunks {
                cur = Some((0, self.submit(Some(c), Head::Last, Readback::Ring(0))?));
            } else {
                self.submit(Some(c), Head::None, Readback::None)?;
            }
        }
        let (mut slot, mut idx) = cur.expect("at least one chunk");
        let mut n = 0;
        loop {
            // the step that feeds id n (not known to the host yet), if it may be needed
            let spec = if n + 1 < max_new && self.pos < self.max_seq {
                let s = (slot + 1) % RING;
                Some((s, self.submit(None, Head::Last, Readback::Ring(s))?))
            } else {
                None
            };
            let id = self.rec.read_ring(&self.gpu, slot, idx, prompt_last + n)?;
            n += 1;
            if !on_id(id)? || n >= max_new {
                return Ok(());
            }
            match spec {
                Some(s) => (slot, idx) = s,
                // past max_seq: the same error as the unpipelined path
                None => {
                    self.check(&[id])?;
                    unreachable!("a step was not speculated only past max_seq");
                }
            }
        }
    }

    fn check(&self, tokens: &[u32]) -> Result<()> {
        ensure!(!tokens.is_empty(), "no tokens to feed");
        if let Some(&id) = tokens
            .iter()
            .find(|&&id| id as usize >= self.cfg.vocab_size)
        {
            return Err(super::ModelError::TokenOutOfRange {
                id,
                vocab: self.cfg.vocab_size,
            }
            .into());
        }
        ensure!(
            self.pos + tokens.len() <= self.max_seq,
            "sequence of {} tokens exceeds the GPU model's max_seq {}",
            self.pos + tokens.len(),
            self.max_seq
        );
        Ok(())
    }

    /// Zero the status words (all but the greedy id) before a call feeds tokens.
    fn clear_status(&self) {
        let zeros = [0u8; STATUS_BYTES as usize - 4];
        self.gpu
            .queue
            .write_buffer(&self.res.acts.argmax, 4, &zeros);
    }

    fn run(&mut self, tokens: &[u32], head: Head) -> Result<Vec<Vec<f32>>> {
        self.check(tokens)?;
        self.clear_status();
        let width = self.cfg.logits_width();
        let chunks: Vec<&[u32]> = tokens.chunks(self.max_chunk).collect();
        let last = chunks.len() - 1;
        let mut out = Vec::new();
        for (ci, c) in chunks.into_iter().enumerate() {
            let h = match head {
                Head::All => Head::All,
                _ if ci == last => Head::Last,
                _ => Head::None,
            };
            let rows = match h {
                Head::None => 0,
                Head::Last => 1,
                Head::All => c.len(),
            };
            let bytes = (rows * width * 4) as u64;
            let rb = if rows > 0 {
                Readback::Logits(bytes)
            } else {
                Readback::None
            };
            self.submit(Some(c), h, rb)?;
            if rows > 0 {
                let b = self.rec.read_back(&self.gpu, bytes + STATUS_BYTES)?;
                status::check(&words(&b[bytes as usize..]), self.pos - 1)?;
                let v: Vec<f32> = b[..bytes as usize]
                    .chunks_exact(4)
                    .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                    .collect();
                status::check_logits(&v, width, self.pos - rows)?;
                out.extend(v.chunks_exact(width).map(|r| r.to_vec()));
            }
        }
        Ok(out)
    }

    /// Record and submit one chunk (≤ max_chunk tokens): the ids and position writes, the step's
    /// passes, and the copy of `copy` for the host, in one submission (several when experts
    /// stream). `tokens == None` is a chained one-token step: its id is the previous step's
    /// argmax (read on the device) and its position is copied on the device from `positions`, so
    /// nothing is written from the host.
    fn submit(
        &mut self,
        tokens: Option<&[u32]>,
        head: Head,
        copy: Readback,
    ) -> Result<wgpu::SubmissionIndex> {
        let n_tok = tokens.map_or(1, |t| t.len());
        let key = StepKey {
            tokens: n_tok as u32,
            head,
            chained: tokens.is_none(),
            batch: false,
        };
        if !self.steps.contains_key(&key) {
            let step = graph::build_step(&self.gpu, &self.cfg, &self.res, key, self.fusions)?;
            self.steps.insert(key, step);
        }
        let GpuModel {
            gpu,
            res,
            steps,
            rec,
            decode_bytes,
            stream,
            profile,
            op_profile,
            spans,
            pos,
            dirty,
            seq_slot,
            ..
        } = self;
        let mut enc = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("inkling step"),
            });
        match tokens {
            Some(tokens) => {
                gpu.queue
                    .write_buffer(&res.acts.ids, 0, bytemuck::cast_slice(tokens));
                res.pos.set(&gpu.queue, *pos as u32, *seq_slot as u32);
            }
            // the position only: `.y` keeps the slot the host wrote
            None => enc.copy_buffer_to_buffer(
                &res.acts.positions,
                16 * *pos as u64,
                &res.pos.buffer,
                0,
                4,
            ),
        }
        let t_record = Instant::now();
        let step = &steps[&key];
        let one_token = n_tok == 1;
        if let (true, Some(p)) = (one_token, profile.as_mut()) {
            p.count(decode_bytes.at(*pos));
        }
        // one-token steps of a resident model may be timed: profile mode, else the per-op
        // profile, else step spans (in the single-pass layout)
        let mut timer: Option<&mut dyn StepTimer> = if !one_token || stream.is_some() {
            None
        } else if let Some(p) = profile.as_mut().filter(|_| gpu.has_timestamps()) {
            Some(p)
        } else if let Some(o) = op_profile.as_mut() {
            Some(o)
        } else {
            spans
                .as_mut()
                .filter(|s| s.has_room())
                .map(|s| s as &mut dyn StepTimer)
        };
        let layout = match &timer {
            Some(t) => t.layout(),
            None => PassLayout::Single,
        };
        if let Some(t) = timer.as_deref_mut() {
            t.prepare(gpu, step)?;
        }
        let at = *pos;
        let mut cut = |layer, enc| match stream.as_mut() {
            Some(s) => s.cut(gpu, res, (layer, key.tokens, at), enc),
            None => unreachable!("a routed cut in a resident model"),
        };
        let mut enc = rec.record(enc, step, layout, timer.as_deref(), &mut cut)?;
        if let Some(t) = timer.as_deref_mut() {
            t.resolve(&mut enc, step);
        }
        rec.copy_readback(&mut enc, &res.acts, copy);
        let idx = rec.submit(gpu, enc, t_record, one_token);
        *pos += n_tok;
        *dirty = true;
        if let Some(t) = timer {
            t.after_submit(gpu, step)?;
        }
        Ok(idx)
    }
}

impl super::Forward for GpuModel<'_> {
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        GpuModel::forward(self, tokens)
    }
    fn forward_all(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        GpuModel::forward_all(self, tokens)
    }
    fn forward_greedy(&mut self, tokens: &[u32]) -> Result<u32> {
        GpuModel::forward_greedy(self, tokens)
    }
    fn reset(&mut self) {
        GpuModel::reset(self)
    }
    fn position(&self) -> usize {
        GpuModel::position(self)
    }
    fn greedy_pipeline(&mut self) -> Option<&mut dyn super::GreedyPipeline> {
        if self.can_stream_greedy() {
            Some(self)
        } else {
            None
        }
    }
    fn backend(&self) -> &'static str {
        "gpu"
    }
    fn adapter(&self) -> String {
        self.gpu.describe()
    }
    fn stream_stats(&self) -> Option<StreamStats> {
        GpuModel::stream_stats(self)
    }
}

impl super::GreedyPipeline for GpuModel<'_> {
    fn greedy_stream(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        on_id: &mut dyn FnMut(u32) -> Result<bool>,
    ) -> Result<()> {
        GpuModel::greedy_stream(self, prompt, max_new, on_id)
    }
}
