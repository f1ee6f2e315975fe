//! The attention block after the projections in fewer dispatches: the k/v short convs, the q/k
//! RMSNorms and the KV-cache write fused with the attention (`wgsl/attention.wgsl`, `FUSED`
//! variant) for one-token decode, and one prologue dispatch (`wgsl/attn_prologue.wgsl`) before the
//! ordinary attention for longer chunks.
//!
//! Computes exactly the unfused chain — [`super::ShortConvKernel::bind_pair`] (k, v convs with the
//! residual inside), [`super::RmsNorm::bind_inplace`] on q and k, [`AttentionShape::bind`] — except
//! for the short-conv history: the fused kernels keep it in a ring of K rows at the end of each cache
//! (`[cap + K, KVH, D]`, ring row `p % K` = the raw k/v input of position `p`), so one-token steps
//! never race on it. A sequence must therefore run every chunk through [`FusedAttention`] (any mix of
//! chunk lengths), starting from a cleared ring ([`FusedAttention::ring_range`]).

use super::attention::{attention_source_batch, AttentionParams};
use super::{dispatch, vec4_tag, AttentionShape, PosBuffer};
use crate::gpu::call::{self, grid, need, BufferTooSmall, Call, Label};
use crate::gpu::kernel::{Bind, Kernel, KernelSpec};
use crate::gpu::Gpu;
use std::fmt;

const PROLOGUE_SRC: &str = include_str!("../../../wgsl/attn_prologue.wgsl");

/// Largest short-conv kernel size of the fused kernels (`MAX_CK` in the WGSL).
pub const MAX_CONV_KERNEL: u32 = 8;

/// A pipeline of the fused attention: the one-token attention with its prologue inside
/// (`attention.wgsl` `FUSED`, f32 or vec4; label `attention/fused/{f32|vec4}`, with `+batch` for
/// the decode batch's `BATCH` form, which reads the per-token slots at binding 13) or the chunk
/// prologue (`attn_prologue.wgsl`; label `attention/prologue`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FusedAttentionKey {
    Decode { vec4: bool, batch: bool },
    Prologue,
}

/// The second uniform of both kernels (binding 12): RMSNorm eps and the conv kernel size.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct FusedParams {
    pub eps: f32,
    pub conv_k: u32,
    pub _p: [u32; 2],
}

impl fmt::Display for FusedAttentionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FusedAttentionKey::Decode { vec4, batch } => write!(
                f,
                "attention/fused/{}{}",
                vec4_tag(*vec4),
                if *batch { "+batch" } else { "" }
            ),
            FusedAttentionKey::Prologue => f.write_str("attention/prologue"),
        }
    }
}

impl Kernel for FusedAttentionKey {
    type Params = AttentionParams;
    fn entry(&self) -> &'static str {
        match self {
            FusedAttentionKey::Decode { .. } => "attn",
            FusedAttentionKey::Prologue => "attn_prologue",
        }
    }
    fn bindings(&self) -> Vec<(u32, Bind)> {
        let (u, r, w) = (Bind::Uniform, Bind::Read, Bind::Write);
        match self {
            FusedAttentionKey::Decode { batch, .. } => {
                let mut v = vec![
                    (0, u),
                    (1, u),
                    (2, r),
                    (3, r),
                    (4, r),
                    (5, r),
                    (6, r),
                    (7, w),
                    (8, w),
                    (9, w),
                    (12, u),
                ];
                if *batch {
                    v.push((13, r));
                }
                v
            }
            FusedAttentionKey::Prologue => vec![
                (0, u),
                (1, u),
                (2, w),
                (3, r),
                (4, r),
                (6, r),
                (7, w),
                (8, w),
                (10, w),
                (11, w),
                (12, u),
            ],
        }
    }
    fn source(&self) -> String {
        match self {
            FusedAttentionKey::Decode { vec4, batch } => {
                attention_source_batch(*vec4, true, *batch)
            }
            FusedAttentionKey::Prologue => PROLOGUE_SRC.to_string(),
        }
    }
}

/// Every pipeline of the fused attention (the decode variants, alone and batched; the prologue).
pub(crate) fn kernels() -> Vec<KernelSpec> {
    let mut v = Vec::new();
    for batch in [false, true] {
        for vec4 in [false, true] {
            v.push(KernelSpec::of(&FusedAttentionKey::Decode { vec4, batch }));
        }
    }
    v.push(KernelSpec::of(&FusedAttentionKey::Prologue));
    v
}

/// The layer's attention constants as the fused kernels read them, one f32 buffer:
/// `[rel_proj (d_rel·extent) | q_norm (D) | k_norm (D) | k_sconv w [C, K] | v_sconv w [C, K]]`,
/// C = KVH·D. Panics if a part has the wrong length for `shape` and `conv_kernel`.
pub fn attention_consts(shape: &AttentionShape, conv_kernel: u32, parts: [&[f32]; 5]) -> Vec<f32> {
    let s = shape;
    let (d, c, k) = (
        s.head_dim as usize,
        (s.kv_heads * s.head_dim) as usize,
        conv_kernel as usize,
    );
    let want = [(s.d_rel * s.extent) as usize, d, d, c * k, c * k];
    let names = ["rel_proj", "q_norm", "k_norm", "k_sconv", "v_sconv"];
    for ((p, n), name) in parts.iter().zip(want).zip(names) {
        assert_eq!(
            p.len(),
            n,
            "attention constants: {name} has {} values, not {n}",
            p.len()
        );
    }
    parts.concat()
}

/// Buffers of one fused attention call (f32). `q` [T, H, D] raw q_proj output (normalised in place
/// by chunks of T > 1), `k_raw` / `v_raw` [T, KVH·D] raw k/v projections, `r` [T, H, d_rel],
/// `consts` from [`attention_consts`], `k_cache` / `v_cache` [cap + K, KVH, D] (last K rows: the
/// conv ring), `out` [T, H·D]; `k_new` / `v_new` [T, KVH·D] scratch for chunks of T > 1 (after
/// the call: the convolved k after k_norm, the convolved v); one-token calls do not touch them.
pub struct FusedAttentionIo<'a> {
    pub q: &'a wgpu::Buffer,
    pub k_raw: &'a wgpu::Buffer,
    pub v_raw: &'a wgpu::Buffer,
    pub r: &'a wgpu::Buffer,
    pub consts: &'a wgpu::Buffer,
    pub k_cache: &'a wgpu::Buffer,
    pub v_cache: &'a wgpu::Buffer,
    pub out: &'a wgpu::Buffer,
    pub k_new: &'a wgpu::Buffer,
    pub v_new: &'a wgpu::Buffer,
}

/// The attention block after the projections for chunks of `shape.tokens` tokens.
#[derive(Clone, Copy, Debug)]
pub struct FusedAttention {
    pub shape: AttentionShape,
    /// Short-conv kernel size K of the k/v convs (1..=[`MAX_CONV_KERNEL`]).
    pub conv_kernel: u32,
    /// RMSNorm eps of q_norm and k_norm.
    pub eps: f32,
}

impl FusedAttention {
    /// Panics on shapes the kernels cannot run (those of [`AttentionShape::bind`], and a conv kernel
    /// size outside 1..=8).
    pub fn new(shape: AttentionShape, conv_kernel: u32, eps: f32) -> FusedAttention {
        shape.check();
        assert!(
            (1..=MAX_CONV_KERNEL).contains(&conv_kernel),
            "short conv kernel size {conv_kernel} not in 1..={MAX_CONV_KERNEL}"
        );
        FusedAttention {
            shape,
            conv_kernel,
            eps,
        }
    }

    /// Rows of each cache buffer: the capacity plus the K rows of the conv ring.
    pub fn cache_rows(&self) -> u32 {
        self.shape.cache_capacity + self.conv_kernel
    }

    /// Bytes of each of the k and v cache buffers (`(cap + K)·KVH·D·4`).
    pub fn cache_bytes(&self) -> u64 {
        self.cache_rows() as u64 * self.shape.kv_heads as u64 * self.shape.head_dim as u64 * 4
    }

    /// Byte range of the conv ring in each cache buffer: clear it (both caches) at the start of a
    /// sequence.
    pub fn ring_range(&self) -> std::ops::Range<u64> {
        let row = self.shape.kv_heads as u64 * self.shape.head_dim as u64 * 4;
        self.shape.cache_capacity as u64 * row..self.cache_bytes()
    }

    /// The buffers every form reads and writes hold this shape; `(T, C)` as u64.
    fn check_io(&self, io: &FusedAttentionIo<'_>) -> Result<(u64, u64), BufferTooSmall> {
        let s = &self.shape;
        let (t, h, d) = (s.tokens as u64, s.heads as u64, s.head_dim as u64);
        let c = s.kv_heads as u64 * d;
        let consts = (s.d_rel * s.extent) as u64 + 2 * d + 2 * c * self.conv_kernel as u64;
        need(io.q, t * h * d, "fused attention q")?;
        need(io.k_raw, t * c, "fused attention k_raw")?;
        need(io.v_raw, t * c, "fused attention v_raw")?;
        need(io.r, t * h * s.d_rel as u64, "fused attention r")?;
        need(io.consts, consts, "fused attention constants")?;
        let cache = self.cache_rows() as u64 * c;
        need(io.k_cache, cache, "fused attention k_cache")?;
        need(io.v_cache, cache, "fused attention v_cache")?;
        need(io.out, t * h * d, "fused attention out")?;
        Ok((t, c))
    }

    /// Both uniforms of the kernels: the attention's params (slot blocks of `cache_rows` rows)
    /// and eps/K.
    fn uniforms(&self, gpu: &Gpu) -> (AttentionParams, wgpu::Buffer) {
        let params = AttentionParams {
            slot_rows: self.cache_rows(),
            ..self.shape.params()
        };
        let fp = call::uniform(
            gpu,
            "fused attention eps/K",
            &FusedParams {
                eps: self.eps,
                conv_k: self.conv_kernel,
                _p: [0; 2],
            },
        );
        (params, fp)
    }

    /// Bind one call. One-token shapes: one dispatch (label `"attention fused"`); longer chunks:
    /// the prologue, then the attention and the KV append of [`AttentionShape::bind`] (three
    /// dispatches). `pos.x` = absolute position of the first token, as for [`AttentionShape::bind`].
    pub fn bind(
        &self,
        gpu: &Gpu,
        pos: &PosBuffer,
        io: &FusedAttentionIo<'_>,
    ) -> Result<Call, BufferTooSmall> {
        let s = &self.shape;
        let (t, c) = self.check_io(io)?;
        let (params, fp) = self.uniforms(gpu);
        if s.tokens == 1 {
            let vec4 = s.head_dim.is_multiple_of(4);
            let one = dispatch(
                gpu,
                &FusedAttentionKey::Decode { vec4, batch: false },
                &params,
                &[
                    (1, &pos.buffer),
                    (2, io.q),
                    (3, io.k_raw),
                    (4, io.v_raw),
                    (5, io.r),
                    (6, io.consts),
                    (7, io.k_cache),
                    (8, io.v_cache),
                    (9, io.out),
                    (12, &fp),
                ],
                grid(s.heads),
            );
            return Ok(Call::new(Label::op("attention fused"), vec![one]).owning([fp]));
        }
        need(io.k_new, t * c, "fused attention k_new")?;
        need(io.v_new, t * c, "fused attention v_new")?;
        let prologue = dispatch(
            gpu,
            &FusedAttentionKey::Prologue,
            &params,
            &[
                (1, &pos.buffer),
                (2, io.q),
                (3, io.k_raw),
                (4, io.v_raw),
                (6, io.consts),
                (7, io.k_cache),
                (8, io.v_cache),
                (10, io.k_new),
                (11, io.v_new),
                (12, &fp),
            ],
            grid(s.kv_heads + s.tokens * s.heads),
        );
        let attn = s.dispatches(
            gpu,
            pos,
            [
                io.q, io.k_new, io.v_new, io.r, io.consts, io.k_cache, io.v_cache, io.out,
            ],
            self.cache_rows(),
        );
        let mut all = vec![prologue];
        all.extend(attn);
        Ok(Call::new(Label::op("attention prologue+attention"), all).owning([fp]))
    }

    /// Bind the decode batch: `shape.tokens` tokens of as many different sequence slots, token t
    /// at position `seq[t].x` of slot `seq[t].y` (`seq` [T] of `[pos, slot, 0, 0]` u32), each
    /// computed exactly as a one-token [`FusedAttention::bind`] of its slot; the caches hold one
    /// block of [`FusedAttention::cache_rows`] rows per slot. One dispatch, label
    /// `"attention fused"`. `pos` is bound but not read.
    pub fn bind_batch(
        &self,
        gpu: &Gpu,
        pos: &PosBuffer,
        seq: &wgpu::Buffer,
        io: &FusedAttentionIo<'_>,
    ) -> Result<Call, BufferTooSmall> {
        let s = &self.shape;
        let (t, _) = self.check_io(io)?;
        need(seq, 4 * t, "fused attention slot table")?;
        let (params, fp) = self.uniforms(gpu);
        let vec4 = s.head_dim.is_multiple_of(4);
        let one = dispatch(
            gpu,
            &FusedAttentionKey::Decode { vec4, batch: true },
            &params,
            &[
                (1, &pos.buffer),
                (2, io.q),
                (3, io.k_raw),
                (4, io.v_raw),
                (5, io.r),
                (6, io.consts),
                (7, io.k_cache),
                (8, io.v_cache),
                (9, io.out),
                (12, &fp),
                (13, seq),
            ],
            grid(s.tokens * s.heads),
        );
        Ok(Call::new(Label::op("attention fused"), vec![one]).owning([fp]))
    }
}
