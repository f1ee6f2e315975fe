//! Inkling attention with a KV cache (`wgsl/attention.wgsl`): prefill and decode in one kernel.
//!
//! One workgroup of 256 invocations per (token, head), keys in blocks of 64 (4 lanes per key for the
//! q·k dot and the relative bias, then every invocation accumulating one vec4 column of V over a
//! strided share of the block's keys). Head dims divisible by 4 use the vec4 variant of the kernel.

use super::{bind_group, grid, uniform_words, Bind, Dispatch, OpCall, PosBuffer};
use crate::gpu::kernel::KernelSpec;
use crate::gpu::Gpu;

const SRC: &str = include_str!("../../../wgsl/attention.wgsl");

/// `entry` (`attn` or `attn_append`) of attention.wgsl in its f32 or vec4 variant.
fn attention_spec(entry: &str, vec4: bool) -> KernelSpec {
    let binds: &[(u32, Bind)] = match entry {
        "attn" => &[
            (0, Bind::Uniform),
            (1, Bind::Uniform),
            (2, Bind::Read),
            (3, Bind::Read),
            (4, Bind::Read),
            (5, Bind::Read),
            (6, Bind::Read),
            (7, Bind::Read),
            (8, Bind::Read),
            (9, Bind::Write),
        ],
        "attn_append" => &[
            (0, Bind::Uniform),
            (1, Bind::Uniform),
            (3, Bind::Read),
            (4, Bind::Read),
            (10, Bind::Write),
            (11, Bind::Write),
        ],
        _ => unreachable!("attention.wgsl has no {entry}"),
    };
    let tag = if vec4 { "vec4" } else { "f32" };
    KernelSpec::new(
        format!("attention/{entry}/{tag}"),
        entry,
        binds,
        super::wgsl_variant(SRC, vec4),
    )
}

/// Both entry points of attention.wgsl, each in the f32 and vec4 variant.
pub(crate) fn kernels() -> Vec<KernelSpec> {
    let mut v = Vec::new();
    for vec4 in [false, true] {
        v.push(attention_spec("attn", vec4));
        v.push(attention_spec("attn_append", vec4));
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
}

/// Built once per layer shape.
pub struct AttentionKernel {
    pub shape: AttentionShape,
}

impl AttentionKernel {
    pub fn new(shape: AttentionShape) -> AttentionKernel {
        let s = &shape;
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
        AttentionKernel { shape }
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
    ) -> AttentionCall {
        let s = &self.shape;
        let (t, h, kvh, d) = (
            s.tokens as u64,
            s.heads as u64,
            s.kv_heads as u64,
            s.head_dim as u64,
        );
        super::need(q, t * h * d, "attention q");
        super::need(k_new, t * kvh * d, "attention k_new");
        super::need(v_new, t * kvh * d, "attention v_new");
        super::need(r, t * h * s.d_rel as u64, "attention r");
        super::need(proj, s.d_rel as u64 * s.extent as u64, "attention proj");
        super::need(
            k_cache,
            s.cache_capacity as u64 * kvh * d,
            "attention k_cache",
        );
        super::need(
            v_cache,
            s.cache_capacity as u64 * kvh * d,
            "attention v_cache",
        );
        super::need(out, t * h * d, "attention out");
        let (use_tau, alpha, n_floor) = match s.tau {
            Some((a, n)) => (1u32, a, n),
            None => (0, 0.0, 1.0),
        };
        let words = [
            s.tokens,
            s.heads,
            s.kv_heads,
            s.head_dim,
            s.d_rel,
            s.extent,
            s.window.unwrap_or(0),
            s.cache_capacity,
            use_tau,
            alpha.to_bits(),
            n_floor.to_bits(),
            0,
        ];
        let u = uniform_words(gpu, "attention params", &words);
        // D % 4 == 0: every row is 16-byte aligned and every buffer a whole number of vec4s.
        let vec4 = s.head_dim.is_multiple_of(4);
        let attn = super::listed_pipeline(gpu, &attention_spec("attn", vec4));
        let append = super::listed_pipeline(gpu, &attention_spec("attn_append", vec4));
        let bg_attn = bind_group(
            gpu,
            "attn",
            &attn,
            &[
                (0, &u),
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
        );
        let bg_append = bind_group(
            gpu,
            "attn_append",
            &append,
            &[
                (0, &u),
                (1, &pos.buffer),
                (3, k_new),
                (4, v_new),
                (10, k_cache),
                (11, v_cache),
            ],
        );
        let unit = if vec4 { 4 } else { 1 };
        let n_append =
            (s.tokens as u64 * s.kv_heads as u64 * s.head_dim as u64 / unit).div_ceil(256) as u32;
        AttentionCall {
            call: OpCall {
                label: "attention".into(),
                dispatches: vec![
                    Dispatch {
                        pipeline: attn,
                        bind_group: bg_attn,
                        groups: grid(s.tokens * s.heads),
                    },
                    Dispatch {
                        pipeline: append,
                        bind_group: bg_append,
                        groups: grid(n_append),
                    },
                ],
                owned: vec![u],
            },
        }
    }
}

/// A bound attention call (attend, then append to the cache).
pub struct AttentionCall {
    pub call: OpCall,
}

impl AttentionCall {
    pub fn record(&self, encoder: &mut wgpu::CommandEncoder) {
        self.call.record(encoder);
    }

    pub fn record_in_pass(&self, pass: &mut wgpu::ComputePass<'_>) {
        self.call.record_in_pass(pass);
    }

    pub fn run(&self, gpu: &Gpu) {
        self.call.run(gpu);
    }
}
