//! Stamped quantised containers: `inkling-wgpu convert` writes them, the loader verifies and maps
//! them (see `FORMATS.md, section Container`).
//!
//! - [`writer`]: safetensors shards written by hand (exact tensor order, alignment padding), to
//!   `*.PID.tmp` files renamed into place when complete.
//! - [`stamp`]: the `inkling.fmt` stamp map and its verification against FORMATS.md arithmetic.
//! - [`header`]: safetensors header checks that name every tensor involved (duplicates, shape
//!   against byte range, overlaps).
//! - [`reader`]: [`Container`]: memory-mapped shards, stamps verified at open, linears as
//!   zero-copy [`crate::formats::QMatrix`], expert slabs as contiguous byte ranges.
//! - [`convert`]: the conversion itself (source name mapping of both checkpoint layouts,
//!   quantisation, slab planning).
//! - [`write`]: writing a whole container, shared by `convert` and `synth` (shard plan, the
//!   destination check, the write through [`writer`] and the renames into place).
//! - [`verify`]: the full NaN/Inf scan of every tensor (`info --verify`).
//! - [`names`]: the one released ↔ transformers tensor-name mapping of checkpoints.
//!
//! Tensor names in a container are the transformers `InklingForCausalLM` names (layout a), except
//! that routed and shared experts are stored per expert ([`expert_name`], [`shared_expert_name`])
//! with gate and up de-interleaved.
pub mod convert;
pub mod header;
pub mod names;
pub mod reader;
pub mod replace;
pub mod stamp;
pub mod synth;
mod synth_values;
pub mod verify;
pub mod write;
pub mod writer;

pub use convert::{convert, ConvertOptions, ConvertSummary};
pub use reader::{Container, ExpertSlab, Shard, SlabPart, TensorEntry};
pub use stamp::{verify_tensor, ContainerError, TensorBytes, SCALES_SUFFIX, SHAPE_KEY, STAMP_KEY};
pub use writer::FailPlan;

/// Alignment (bytes, absolute file offset) of each slab and of each expert inside it.
pub const SLAB_ALIGN: usize = 4096;
/// Alignment of each weight or scale part inside an expert (wgpu's largest
/// `min_storage_buffer_offset_alignment`), so a slot buffer can bind the parts directly.
pub const PART_ALIGN: usize = 256;
/// Alignment of every other tensor.
pub const TENSOR_ALIGN: usize = 64;
/// Prefix of the U8 filler tensors that keep the data buffer hole-free.
pub const PAD_PREFIX: &str = "__pad__.";
/// Metadata key holding the container version.
pub const VERSION_KEY: &str = "inkling.container";
/// Current container version.
pub const VERSION: &str = "1";

/// Whether a tensor name is alignment padding.
pub fn is_pad(name: &str) -> bool {
    name.starts_with(PAD_PREFIX)
}

/// The three projections of an expert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proj {
    Gate,
    Up,
    Down,
}

/// Projections in slab order.
pub const EXPERT_PROJS: [Proj; 3] = [Proj::Gate, Proj::Up, Proj::Down];

impl Proj {
    pub fn as_str(self) -> &'static str {
        match self {
            Proj::Gate => "gate",
            Proj::Up => "up",
            Proj::Down => "down",
        }
    }
}

/// Name of routed expert `e`'s `proj` matrix in layer `layer` of a converted container.
pub fn expert_name(layer: usize, e: usize, proj: Proj) -> String {
    format!(
        "model.layers.{layer}.mlp.experts.{e}.{}_proj.weight",
        proj.as_str()
    )
}

/// Name of shared expert `s`'s `proj` matrix in layer `layer` of a converted container.
pub fn shared_expert_name(layer: usize, s: usize, proj: Proj) -> String {
    format!(
        "model.layers.{layer}.mlp.shared_experts.{s}.{}_proj.weight",
        proj.as_str()
    )
}
