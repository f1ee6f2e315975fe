//! Inkling attention with a KV cache (`wgsl/attention.wgsl`): prefill and decode in one kernel.
//!
//! One workgroup of 256 invocations per (token, head), keys in blocks of 64 (4 lanes per key for the
//! q·k dot and the relative bias, then every invocation accumulating one vec4 column of V over a
//! strided share of the block's keys). Head dims divisible by 4 use the vec4 variant of the kernel.

use super::{dispatch, vec4_tag, PosBuffer};
use crate::gpu::call::{grid, need, BufferTooSmall, Call, Dispatch, Label};
use crate::gpu::kernel::{Bind, Kernel, KernelSpec};
use crate::gpu::Gpu;
use std::fmt;

const SRC: &str = include_str!("../../../wgsl/attention.wgsl");

/// A pipeline of attention.wgsl: the attention itself (`attn`) or the KV append (`attn_append`),
/// in the f32 or vec4 variant. Label `attention/{entry}/{f32|vec4}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionKey {
    /// `false`: `attn`; `true`: `attn_append`.
    pub append: bool,
    pub vec4: bool,
}

/// The `Params` of attention.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct AttentionParams {
    pub t: u32,
    pub h: u32,
    pub kvh: u32,
    pub d: u32,
    pub d_rel: u32,
    pub extent: u32,
    /// 0: full attention, else the sliding window W.
    pub window: u32,
    /// Cache capacity in tokens.
    pub cap: u32,
    pub use_tau: u32,
    pub alpha: f32,
    pub n_floor: f32,
    /// Cache rows per sequence slot (slot `pos.y`'s rows start at `pos.y · slot_rows`).
    pub slot_rows: u32,
}

impl fmt::Display for AttentionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "attention/{}/{}", self.entry(), vec4_tag(self.vec4))
    }
}

impl Kernel for AttentionKey {
    type Params = AttentionParams;
    fn entry(&self) -> &'static str {
        if self.append {
            "attn_append"
        } else {
            "attn"
        }
    }
    fn bindings(&self) -> Vec<(u32, Bind)> {
        let (u, r, w) = (Bind::Uniform, Bind::Read, Bind::Write);
        if self.append {
            vec![(0, u), (1, u), (3, r), (4, r), (10, w), (11, w)]
        } else {
            let mut v = vec![(0, u), (1, u)];
            v.extend((2..=8).map(|b| (b, r)));
            v.push((9, w));
            v
        }
    }
    fn source(&self) -> String {
        attention_source(self.vec4, false)
    }
}

/// attention.wgsl in its `VEC4` (head_dim % 4 == 0) and `FUSED` (the one-token kernel with the
/// prologue inside, [`super::attention_fused`]) variant.
pub(crate) fn attention_source(vec4: bool, fused: bool) -> String {
    attention_source_batch(vec4, fused, false)
}

/// attention.wgsl with `BATCH` too (only with `fused`: the one-token kernel over a decode batch).
pub(crate) fn attention_source_batch(vec4: bool, fused: bool, batch: bool) -> String {
    crate::gpu::kernel::preprocess(SRC, &[("VEC4", vec4), ("FUSED", fused), ("BATCH", batch)])
}

/// Both entry points of attention.wgsl, each in the f32 and vec4 variant.
pub(crate) fn kernels() -> Vec<KernelSpec> {
    let mut v = Vec::new();
    for vec4 in [false, true] {
        for append in [false, true] {
            v.push(KernelSpec::of(&AttentionKey { append, vec4 }));
        }
    }
    v
}

/// Shape and settings of one attention layer for a call of `tokens` new tokens.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    /// New tokens T in this call (1 for decode).
    pub tokens: u32,
    /// Query heads H.
    pub heads: u32,
    /// KV heads (H must be a multiple).
    pub kv_heads: u32,
    /// head_dim D (≤ 256).
    pub head_dim: u32,
    /// d_rel (≤ 256).
    pub d_rel: u32,
    /// Extent of the relative bias: the window on sliding layers, `rel_extent` on full layers.
    pub extent: u32,
    /// Sliding window W (`None` = full attention).
    pub window: Option<u32>,
    /// Cache capacity in tokens: max_seq on full layers, ≥ W (normally = W) on sliding layers (a ring).
    pub cache_capacity: u32,
    /// τ scaling `(alpha, n_floor)` on full layers when `log_scaling_n_floor` is set.
    pub tau: Option<(f32, f32)>,
}

impl AttentionShape {
    /// Bytes of each of the k and v cache buffers: `cap · KVH · D · 4`.
    pub fn cache_bytes(&self) -> u64 {
        self.cache_capacity as u64 * self.kv_heads as u64 * self.head_dim as u64 * 4
    }

    /// The uniform of attention.wgsl for this shape.
    pub fn params(&self) -> AttentionParams {
        let s = self;
        let (use_tau, alpha, n_floor) = match s.tau {
            Some((a, n)) => (1u32, a, n),
            None => (0, 0.0, 1.0),
        };
        AttentionParams {
            t: s.tokens,
            h: s.heads,
            kvh: s.kv_heads,
            d: s.head_dim,
            d_rel: s.d_rel,
            extent: s.extent,
            window: s.window.unwrap_or(0),
            cap: s.cache_capacity,
            use_tau,
            alpha,
            n_floor,
            slot_rows: s.cache_capacity,
        }
    }

    /// Panics unless the shape is one the kernel handles (a bug in the caller).
    pub(crate) fn check(&self) {
        let s = self;
        assert!(
            s.head_dim >= 1 && s.head_dim <= 256,
            "head_dim {} not in 1..=256",
            s.head_dim
        );
        assert!(s.d_rel <= 256, "d_rel {} > 256", s.d_rel);
        assert!(
            s.kv_heads >= 1 && s.heads.is_multiple_of(s.kv_heads),
            "heads {} not a multiple of kv_heads {}",
            s.heads,
            s.kv_heads
        );
        if let Some(w) = s.window {
            assert!(
                w >= 1 && s.cache_capacity >= w,
                "sliding ring capacity {} < window {w}",
                s.cache_capacity
            );
        }
    }

    /// Bind one call. Buffers (f32): `q` [T, H, D] (after q_norm), `k_new`/`v_new` [T, KVH, D] (k after
    /// k_sconv + k_norm, v after v_sconv), `r` [T, H, d_rel] (r_proj output), `proj` [d_rel, extent],
    /// `k_cache`/`v_cache` [cap, KVH, D], `out` [T, H·D]. `pos.x` = absolute position of the first new
    /// token = tokens already cached. Recording runs attention, then appends the new k/v to the caches;
    /// the host advances `pos` by T before the next call.
    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        &self,
        gpu: &Gpu,
        pos: &PosBuffer,
        q: &wgpu::Buffer,
        k_new: &wgpu::Buffer,
        v_new: &wgpu::Buffer,
        r: &wgpu::Buffer,
        proj: &wgpu::Buffer,
        k_cache: &wgpu::Buffer,
        v_cache: &wgpu::Buffer,
        out: &wgpu::Buffer,
    ) -> Result<Call, BufferTooSmall> {
        self.check();
        let s = self;
        let (t, h, kvh, d) = (
            s.tokens as u64,
            s.heads as u64,
            s.kv_heads as u64,
            s.head_dim as u64,
        );
        need(q, t * h * d, "attention q")?;
        need(k_new, t * kvh * d, "attention k_new")?;
        need(v_new, t * kvh * d, "attention v_new")?;
        need(r, t * h * s.d_rel as u64, "attention r")?;
        need(proj, s.d_rel as u64 * s.extent as u64, "attention proj")?;
        let cache = s.cache_capacity as u64 * kvh * d;
        need(k_cache, cache, "attention k_cache")?;
        need(v_cache, cache, "attention v_cache")?;
        need(out, t * h * d, "attention out")?;
        Ok(Call::new(
            Label::op("attention"),
            self.dispatches(
                gpu,
                pos,
                [q, k_new, v_new, r, proj, k_cache, v_cache, out],
                self.cache_capacity,
            ),
        ))
    }

    /// The two dispatches of [`AttentionShape::bind`] (attend, append) on
    /// `[q, k_new, v_new, r, proj, k_cache, v_cache, out]`, sizes already checked.
    pub(crate) fn dispatches(
        &self,
        gpu: &Gpu,
        pos: &PosBuffer,
        b: [&wgpu::Buffer; 8],
        slot_rows: u32,
    ) -> Vec<Dispatch> {
        let s = self;
        let [q, k_new, v_new, r, proj, k_cache, v_cache, out] = b;
        let params = AttentionParams {
            slot_rows,
            ..s.params()
        };
        // D % 4 == 0: every row is 16-byte aligned and every buffer a whole number of vec4s.
        let vec4 = s.head_dim.is_multiple_of(4);
        let attn = dispatch(
            gpu,
            &AttentionKey {
                append: false,
                vec4,
            },
            &params,
            &[
                (1, &pos.buffer),
                (2, q),
                (3, k_new),
                (4, v_new),
                (5, r),
                (6, proj),
                (7, k_cache),
                (8, v_cache),
                (9, out),
            ],
            grid(s.tokens * s.heads),
        );
        let unit = if vec4 { 4 } else { 1 };
        let n_append =
            (s.tokens as u64 * s.kv_heads as u64 * s.head_dim as u64 / unit).div_ceil(256) as u32;
        let append = dispatch(
            gpu,
            &AttentionKey { append: true, vec4 },
            &params,
            &[
                (1, &pos.buffer),
                (3, k_new),
                (4, v_new),
                (10, k_cache),
                (11, v_cache),
            ],
            grid(n_append),
        );
        vec![attn, append]
    }
}
