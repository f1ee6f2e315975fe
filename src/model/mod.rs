//! The Inkling text model: config, weights, CPU and GPU forward.
//!
//! - [`config`]: `config.json` / `generation_config.json` → [`TextConfig`], [`GenerationConfig`].
//! - [`weights`]: [`Checkpoint`] (mapped safetensors, or a converted container verified through
//!   [`crate::container::Container`]) → [`Weights`] (shared by CPU and GPU paths).
//! - [`batch`]: sequence slots decoded together ([`BatchForward`], [`CpuSlots`]).
//! - [`cache`]: KV ring buffers and short-conv states ([`Cache`]).
//! - [`expert_cache`]: slot bookkeeping of a GPU expert cache (which routed experts are resident).
//! - [`usage`]: the per-model routing-count file that ranks the expert cache's pinned hot set.
//! - [`cpu`]: the CPU forward ([`CpuModel`]), the oracle.
//! - [`gpu`]: the GPU forward ([`GpuModel`]): residency, the layer recipe, recording, timers,
//!   expert streaming.
//! - [`stream`]: expert placement ([`Placement`]) and streaming counters ([`StreamStats`]).
//! - [`profile`]: decode profiles (per phase, per op) and their roofline.
//! - [`error`]: the model's typed errors ([`ModelError`]).
//! - [`sampling`], [`generate`], [`text`]: the decode loop, sampling and streamed detokenisation.
//! - [`status`]: the run-time non-finite checks' status words and their errors.
//! - [`eval`]: perplexity and KL divergence to a base model over strided windows.
pub mod batch;
pub mod cache;
pub mod config;
pub mod cpu;
pub mod error;
pub mod eval;
pub mod expert_cache;
pub mod generate;
pub mod gpu;
pub mod page_cache;
pub mod profile;
pub mod sampling;
pub mod status;
pub mod stream;
pub mod text;
pub mod usage;
pub mod weights;

pub use batch::{BatchForward, CpuSlots};
pub use cache::Cache;
pub use config::{AttnGeom, AttnKind, GenerationConfig, MlpKind, TextConfig};
pub use cpu::CpuModel;
pub use error::ModelError;
pub use gpu::{GpuModel, GpuModelOptions, HostTimes};
pub use stream::{Placement, StreamStats};
pub use weights::{Checkpoint, Layout, Weights};

/// A forward backend holding one sequence's state: [`CpuModel`] (the f32 oracle) or [`GpuModel`].
pub trait Forward {
    /// Feed `tokens` (prefill chunk or one decode token); logits of the last one
    /// (`config.logits_width()` values).
    fn forward(&mut self, tokens: &[u32]) -> anyhow::Result<Vec<f32>>;
    /// Feed `tokens` and return the logits of every one of them (`tokens.len()` rows of
    /// `config.logits_width()` values).
    fn forward_all(&mut self, tokens: &[u32]) -> anyhow::Result<Vec<Vec<f32>>>;
    /// Feed `tokens` and return only the greedy choice after the last one (ties to the lowest id).
    /// Backends that can pick it without handing back the logits (the GPU: argmax on the device,
    /// 4 bytes read back) override this; the default is the argmax of [`Forward::forward`].
    fn forward_greedy(&mut self, tokens: &[u32]) -> anyhow::Result<u32> {
        Ok(sampling::argmax(&self.forward(tokens)?))
    }
    /// The backend's pipelined greedy decode, when it has one in its current mode (`None`, the
    /// default: callers loop over [`Forward::forward_greedy`]).
    fn greedy_pipeline(&mut self) -> Option<&mut dyn GreedyPipeline> {
        None
    }
    /// Forget the sequence.
    fn reset(&mut self);
    /// Tokens consumed so far.
    fn position(&self) -> usize;
    /// `"cpu"` or `"gpu"`.
    fn backend(&self) -> &'static str;
    /// Adapter description (`"cpu"` for the CPU path).
    fn adapter(&self) -> String;
    /// How expert streaming went so far (`None`: every routed expert is resident).
    fn stream_stats(&self) -> Option<stream::StreamStats> {
        None
    }
}

/// A pipelined greedy decode (see [`Forward::greedy_pipeline`]).
pub trait GreedyPipeline {
    /// Feed `prompt`, then hand each greedy id to `on_id` in order (feeding it back) while
    /// `on_id` returns `true`, at most `max_new` ids. The GPU keeps one step in flight, so after
    /// a stop the state may be one token ahead (see [`crate::model::GpuModel::greedy_stream`]);
    /// `position()` says so.
    fn greedy_stream(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        on_id: &mut dyn FnMut(u32) -> anyhow::Result<bool>,
    ) -> anyhow::Result<()>;
}

impl Forward for CpuModel<'_, '_> {
    fn forward(&mut self, tokens: &[u32]) -> anyhow::Result<Vec<f32>> {
        Ok(CpuModel::forward(self, tokens)?)
    }
    fn forward_all(&mut self, tokens: &[u32]) -> anyhow::Result<Vec<Vec<f32>>> {
        Ok(CpuModel::forward_all(self, tokens)?)
    }
    fn reset(&mut self) {
        CpuModel::reset(self)
    }
    fn position(&self) -> usize {
        CpuModel::position(self)
    }
    fn backend(&self) -> &'static str {
        "cpu"
    }
    fn adapter(&self) -> String {
        "host CPU (f32 reference forward)".into()
    }
}
