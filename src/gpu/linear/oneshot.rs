//! One-shot GEMV through the dispatcher: host vectors in and out (tests, smoke, benches).

use crate::gpu::dispatch::{self, DispatchError};
use crate::gpu::linear::args::{GemvArgs, Reduction, NO_GAMMA};
use crate::gpu::linear::slab::GpuWeights;
use crate::gpu::Gpu;

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
    dispatch::check(ordinal, w.encoding())?;
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
    w.bind(gpu, ordinal, args)?.run(gpu);
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
