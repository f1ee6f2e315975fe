//! Weight formats: the registry (FORMATS.md) and the CPU reference that reads the same bytes as
//! the GPU kernels.
pub mod finite;
pub mod quant;
pub mod registry;
pub mod scales;

pub use quant::{quantize, quantize_with, QMatrix, QMatrixError};
pub use registry::{Encoding, Format, FormatError, FormatSpec, ScaleLayout, REGISTRY};
pub use scales::ScaleRule;
