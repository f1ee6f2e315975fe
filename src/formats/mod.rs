//! Weight formats: the registry (FORMATS.md) and the CPU reference that reads the same bytes as
//! the GPU kernels.
pub mod finite;
pub mod quant;
pub mod registry;

pub use quant::{quantize, QMatrix, QMatrixError};
pub use registry::{Encoding, Format, FormatError, FormatSpec, ScaleLayout, REGISTRY};
