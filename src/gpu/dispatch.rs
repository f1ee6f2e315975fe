//! The format dispatcher: the one place where a format ORDINAL becomes a GPU decode.
//!
//! * an ordinal missing from the registry (FORMATS.md) → [`DispatchError::UnknownOrdinal`];
//! * a registered ordinal without a kernel here (1, 3, 6, 7, 8) → [`DispatchError::NoKernel`];
//! * an ordinal other than the one the uploaded weights carry → [`DispatchError::EncodingMismatch`].
//!
//! The pipeline is always chosen from the weights' own [`Encoding`] after that check, so one
//! format's bytes can never run through another format's decode.
//!
//! Entry points: [`crate::gpu::GpuWeights::bind`] (build once, record many times) and
//! [`crate::gpu::gemv_pairs`] (one-shot, host vectors in and out; for tests, smoke and benches).

use crate::formats::{Encoding, Format, FormatError, QMatrixError};
use crate::gpu::GpuError;

/// Why a GEMV was refused.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// The ordinal is not in the registry.
    #[error("format ordinal {0} is not in the registry (FORMATS.md); refusing to guess a decode")]
    UnknownOrdinal(u32),
    /// The ordinal is registered but has no GPU kernel in this engine.
    #[error(
        "format {name} (ordinal {ordinal}) is registered but has no GPU kernel in this engine"
    )]
    NoKernel { ordinal: u32, name: &'static str },
    /// The ordinal disagrees with the encoding of the uploaded weights.
    #[error(
        "ordinal {ordinal} ({asked}) asked for, but the weights are {weights}; refusing to decode one format's bytes as another"
    )]
    EncodingMismatch {
        ordinal: u32,
        asked: &'static str,
        weights: String,
    },
    /// Shapes, sizes or buffers that do not fit the problem.
    #[error("bad GEMV problem: {0}")]
    Shape(String),
    /// A CPU-side matrix error.
    #[error(transparent)]
    Matrix(#[from] QMatrixError),
    /// A device error (readback).
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

/// The format of a registered ordinal that has a kernel here.
pub fn resolve(ordinal: u32) -> Result<Format, DispatchError> {
    match Format::from_ordinal(ordinal) {
        Err(FormatError::UnknownOrdinal(o)) => Err(DispatchError::UnknownOrdinal(o)),
        Err(e) => Err(DispatchError::Shape(e.to_string())),
        Ok(f) if !f.has_kernel() => Err(DispatchError::NoKernel {
            ordinal,
            name: f.name(),
        }),
        Ok(f) => Ok(f),
    }
}

/// Check `ordinal` against the encoding the weights carry; returns the encoding to run.
pub fn check(ordinal: u32, weights: Encoding) -> Result<Encoding, DispatchError> {
    let f = resolve(ordinal)?;
    if f != weights.format {
        return Err(DispatchError::EncodingMismatch {
            ordinal,
            asked: f.name(),
            weights: weights.spelling(),
        });
    }
    Ok(weights)
}
