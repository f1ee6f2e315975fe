//! Errors of model loading and running. Every variant names the file and, where there is one, the
//! tensor or config field, so a user can find what is wrong without a debugger.
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{}: {source}", file.display())]
    Io {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: invalid JSON: {source}", file.display())]
    Json {
        file: PathBuf,
        source: serde_json::Error,
    },
    #[error("{}: expected a JSON object, got {got}", file.display())]
    NotAnObject { file: PathBuf, got: String },
    #[error("{}: missing required field `{field}`", file.display())]
    MissingField { file: PathBuf, field: String },
    #[error("{}: field `{field}`: {msg}", file.display())]
    BadField {
        file: PathBuf,
        field: String,
        msg: String,
    },
    #[error("{}: truncated or corrupt safetensors file: {msg}", file.display())]
    Safetensors { file: PathBuf, msg: String },
    #[error("{}: missing tensor `{tensor}`", file.display())]
    MissingTensor { file: PathBuf, tensor: String },
    #[error("{}: tensor `{tensor}` has shape {got:?}, but config.json implies {expected:?}", file.display())]
    Shape {
        file: PathBuf,
        tensor: String,
        got: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("{}: tensor `{tensor}` has dtype {dtype}, which the engine cannot read (F32, BF16, F16)", file.display())]
    Dtype {
        file: PathBuf,
        tensor: String,
        dtype: String,
    },
    #[error("{}: shard `{shard}` (holding tensor `{tensor}`) is missing: {source}", index.display())]
    MissingShard {
        index: PathBuf,
        shard: String,
        tensor: String,
        source: std::io::Error,
    },
    #[error("{}: tensor `{tensor}`: {msg}", file.display())]
    Tensor {
        file: PathBuf,
        tensor: String,
        msg: String,
    },
    /// `dir` is a file or does not exist (`why`: [`crate::container::reader::model_dir_problem`]).
    #[error("{}: {why}", dir.display())]
    NotAModelDir { dir: PathBuf, why: &'static str },
    #[error("{}: no model.safetensors or model.safetensors.index.json", dir.display())]
    NoWeights { dir: PathBuf },
    /// A converted container failed verification (stamp, shape map, truncation, slab layout); the
    /// message names the shard and the tensor.
    #[error(transparent)]
    Container(#[from] crate::container::ContainerError),
    #[error("forward called with no tokens")]
    EmptyInput,
    #[error("token id {id} is outside the vocabulary ({vocab} entries)")]
    TokenOutOfRange { id: u32, vocab: usize },
    /// A router saw a NaN or an Inf (GPU: flagged by the router kernel; CPU: checked in `route`).
    #[error(
        "non-finite value in the forward pass at position {position}: the router logits of layer \
         {layer} hold a NaN or an Inf (damaged weights or activations; `inkling-wgpu info --verify` \
         scans every tensor of the model)"
    )]
    NonFiniteRouter { position: usize, layer: usize },
    /// The output logits of a position hold a NaN or an Inf.
    #[error(
        "non-finite logit at position {position}: the output logits hold a NaN or an Inf (damaged \
         weights or activations; `inkling-wgpu info --verify` scans every tensor of the model)"
    )]
    NonFiniteLogits { position: usize },
}

pub type Result<T> = std::result::Result<T, ModelError>;
