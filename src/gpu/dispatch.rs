//! The format dispatcher: the one place where a format ORDINAL becomes a GPU decode.
//!
//! * an ordinal missing from the registry (FORMATS.md) → [`DispatchError::UnknownOrdinal`];
//! * a registered ordinal without a kernel here (1, 3, 6, 7, 8) → [`DispatchError::NoKernel`];
//! * an ordinal other than the one the uploaded weights carry → [`DispatchError::EncodingMismatch`].
//!
//! The pipeline is always chosen from the weights' own [`Encoding`] after that check, so one
//! format's bytes can never run through another format's decode.
//!
//! Entry points: [`GemvCall::new`] (build once, record many times) and [`gemv_pairs`] (one-shot,
//! host vectors in and out; for tests, smoke and benches).

use crate::formats::{Encoding, Format, FormatError, QMatrixError};
use crate::gpu::gemv::{GemvArgs, GemvCall, GpuWeights, Reduction, NO_GAMMA};
use crate::gpu::{Gpu, GpuError};

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

/// One-shot GEMV through the dispatcher: `x` is T×I f32 (row-major), `pairs` are
/// `(expert, token, weight_idx)` (uploaded as 16-byte `Pair`s with a zero pad word) with
/// `weight_idx` indexing `gammas` or [`NO_GAMMA`]; returns P×O
/// f32. The output buffer is poisoned with NaN before the dispatch. `reduction` picks the variant.
pub fn gemv_pairs_with(
    gpu: &Gpu,
    ordinal: u32,
    w: &GpuWeights,
    x: &[f32],
    pairs: &[(u32, u32, u32)],
    gammas: &[f32],
    reduction: Reduction,
) -> Result<Vec<f32>, DispatchError> {
    check(ordinal, w.encoding())?;
    let (o, i) = (w.rows(), w.cols());
    if x.is_empty() || !x.len().is_multiple_of(i) {
        return Err(DispatchError::Shape(format!(
            "x has {} values, not a multiple of I = {i}",
            x.len()
        )));
    }
    let tokens = x.len() / i;
    for (p, &(e, t, wi)) in pairs.iter().enumerate() {
        if e as usize >= w.experts()
            || t as usize >= tokens
            || (wi != NO_GAMMA && wi as usize >= gammas.len())
        {
            return Err(DispatchError::Shape(format!(
                "pair {p} = ({e}, {t}, {wi}) out of range ({} experts, {tokens} tokens, {} gammas)",
                w.experts(),
                gammas.len()
            )));
        }
    }
    if pairs.is_empty() {
        return Ok(Vec::new());
    }
    let xb = gpu.storage_init("gemv x", bytemuck::cast_slice(x));
    let flat: Vec<u32> = pairs.iter().flat_map(|&(e, t, wi)| [e, t, wi, 0]).collect();
    let pb = gpu.storage_init("gemv pairs", bytemuck::cast_slice(&flat));
    let gb =
        (!gammas.is_empty()).then(|| gpu.storage_init("gemv gamma", bytemuck::cast_slice(gammas)));
    let poison = vec![f32::NAN; pairs.len() * o];
    let yb = gpu.storage_init("gemv y", bytemuck::cast_slice(&poison));
    let mut args =
        GemvArgs::new(&xb, tokens as u32, &pb, pairs.len() as u32, &yb).reduction(reduction);
    if let Some(g) = &gb {
        args = args.gamma(g);
    }
    let call = GemvCall::new(gpu, ordinal, w, args)?;
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    call.record(&mut enc);
    gpu.queue.submit([enc.finish()]);
    Ok(gpu.read_f32(&yb, pairs.len() * o)?)
}

/// [`gemv_pairs_with`] with the automatic reduction variant.
pub fn gemv_pairs(
    gpu: &Gpu,
    ordinal: u32,
    w: &GpuWeights,
    x: &[f32],
    pairs: &[(u32, u32, u32)],
    gammas: &[f32],
) -> Result<Vec<f32>, DispatchError> {
    gemv_pairs_with(gpu, ordinal, w, x, pairs, gammas, Reduction::Auto)
}
