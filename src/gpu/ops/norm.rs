//! RMSNorm kernels (`wgsl/norm.wgsl`): row norm, in-place per-head norm, embedding gather + embed_norm.
//!
//! Each row gets about one invocation per vec4 (up to 256, several short rows per workgroup), four
//! independent accumulators per invocation, vec4 loads when widths, offsets and strides allow.

use super::{bind_group, grid, uniform_words, Bind, Dispatch, OpCall};
use crate::gpu::kernel::KernelSpec;
use crate::gpu::Gpu;
use std::sync::Arc;

const SRC: &str = include_str!("../../../wgsl/norm.wgsl");

/// Kernel variant and row split for rows of `width` floats: the vec4 variant when `aligned` (width,
/// offsets and strides divisible by 4), and `tpr` invocations per row (a power of two ≤ 256, about one
/// per vec4 of the row, so short rows share a 256-invocation workgroup). Returns
/// `(vec4, tpr)`.
fn split(width: u32, aligned: bool) -> (bool, u32) {
    let vec4 = aligned && width.is_multiple_of(4);
    let units = if vec4 { width / 4 } else { width };
    let tpr = units.clamp(1, 256).next_power_of_two();
    (vec4, tpr)
}

/// Workgroups for `rows` rows at `tpr` invocations per row.
fn row_groups(rows: u32, tpr: u32) -> [u32; 3] {
    grid(rows.div_ceil(256 / tpr))
}

/// The kernel of `entry` (`rms_norm` or `embed_norm`) in the VEC4 and INPLACE variant of
/// norm.wgsl, with its layout.
fn norm_spec(entry: &str, vec4: bool, inplace: bool) -> KernelSpec {
    let binds: &[(u32, Bind)] = match (entry, inplace) {
        ("rms_norm", false) => &[
            (0, Bind::Uniform),
            (1, Bind::Read),
            (2, Bind::Read),
            (3, Bind::Write),
        ],
        ("rms_norm", true) => &[(0, Bind::Uniform), (1, Bind::Read), (2, Bind::Write)],
        ("embed_norm", false) => &[
            (0, Bind::Uniform),
            (1, Bind::Read),
            (3, Bind::Write),
            (5, Bind::Read),
            (6, Bind::Read),
            (7, Bind::Read),
        ],
        _ => unreachable!("norm.wgsl has no {entry} (inplace {inplace})"),
    };
    let tag = if vec4 { "vec4" } else { "f32" };
    let variant = if inplace { "inplace" } else { "out" };
    KernelSpec::new(
        format!("norm/{entry}/{tag}/{variant}"),
        entry,
        binds,
        norm_source(vec4, inplace),
    )
}

/// Every kernel of norm.wgsl: RMSNorm out of place and in place, the embedding gather + norm,
/// each in the f32 and vec4 variant.
pub(crate) fn kernels() -> Vec<KernelSpec> {
    let mut v = Vec::new();
    for vec4 in [false, true] {
        for (entry, inplace) in [
            ("rms_norm", false),
            ("rms_norm", true),
            ("embed_norm", false),
        ] {
            v.push(norm_spec(entry, vec4, inplace));
        }
    }
    v
}

/// The pipeline of [`norm_spec`].
fn norm_pipeline(gpu: &Gpu, entry: &str, vec4: bool, inplace: bool) -> Arc<wgpu::ComputePipeline> {
    super::listed_pipeline(gpu, &norm_spec(entry, vec4, inplace))
}

/// norm.wgsl with its `VEC4` and `INPLACE` flags set.
pub fn norm_source(vec4: bool, inplace: bool) -> String {
    crate::gpu::kernel::preprocess(SRC, &[("VEC4", vec4), ("INPLACE", inplace)])
}

/// Row layout of an RMSNorm: `rows` rows of `width` values; row r of x starts at `x_off + r * x_stride`
/// (elements), of y at `y_off + r * y_stride`.
#[derive(Clone, Copy, Debug)]
pub struct RmsNorm {
    pub rows: u32,
    pub width: u32,
    pub eps: f32,
    pub x_off: u32,
    pub x_stride: u32,
    pub y_off: u32,
    pub y_stride: u32,
}

impl RmsNorm {
    /// Contiguous rows `[rows, width]` in and out.
    pub fn rows(rows: u32, width: u32, eps: f32) -> RmsNorm {
        RmsNorm {
            rows,
            width,
            eps,
            x_off: 0,
            x_stride: width,
            y_off: 0,
            y_stride: width,
        }
    }

    fn words(&self, tpr: u32) -> Vec<u32> {
        vec![
            self.rows,
            self.width,
            self.eps.to_bits(),
            self.x_off,
            self.x_stride,
            self.y_off,
            self.y_stride,
            0,
            0,
            0,
            0,
            tpr,
        ]
    }

    /// `y = w ⊙ x · rsqrt(mean(x²) + eps)` per row. `w` f32 [width].
    pub fn bind(&self, gpu: &Gpu, x: &wgpu::Buffer, w: &wgpu::Buffer, y: &wgpu::Buffer) -> OpCall {
        let aligned = [self.x_off, self.x_stride, self.y_off, self.y_stride]
            .iter()
            .all(|v| v.is_multiple_of(4));
        let (vec4, tpr) = split(self.width, aligned);
        let pl = norm_pipeline(gpu, "rms_norm", vec4, false);
        let last = (self.rows.max(1) as u64 - 1) * self.x_stride as u64 + self.width as u64;
        super::need(x, self.x_off as u64 + last, "rms_norm x");
        let last_y = (self.rows.max(1) as u64 - 1) * self.y_stride as u64 + self.width as u64;
        super::need(y, self.y_off as u64 + last_y, "rms_norm y");
        super::need(w, self.width as u64, "rms_norm w");
        let u = uniform_words(gpu, "rms_norm params", &self.words(tpr));
        let bg = bind_group(gpu, "rms_norm", &pl, &[(0, &u), (1, w), (2, x), (3, y)]);
        OpCall {
            label: "rms_norm".into(),
            dispatches: vec![Dispatch {
                pipeline: pl,
                bind_group: bg,
                groups: row_groups(self.rows, tpr),
            }],
            owned: vec![u],
        }
    }

    /// In place on `x` (per-head q/k norm: `rows = T·heads`, `width = head_dim`; only x_off/x_stride used).
    pub fn bind_inplace(&self, gpu: &Gpu, x: &wgpu::Buffer, w: &wgpu::Buffer) -> OpCall {
        let aligned = self.x_off.is_multiple_of(4) && self.x_stride.is_multiple_of(4);
        let (vec4, tpr) = split(self.width, aligned);
        let pl = norm_pipeline(gpu, "rms_norm", vec4, true);
        let last = (self.rows.max(1) as u64 - 1) * self.x_stride as u64 + self.width as u64;
        super::need(x, self.x_off as u64 + last, "rms_norm_inplace x");
        super::need(w, self.width as u64, "rms_norm_inplace w");
        let u = uniform_words(gpu, "rms_norm_inplace params", &self.words(tpr));
        let bg = bind_group(gpu, "rms_norm_inplace", &pl, &[(0, &u), (1, w), (2, x)]);
        OpCall {
            label: "rms_norm_inplace".into(),
            dispatches: vec![Dispatch {
                pipeline: pl,
                bind_group: bg,
                groups: row_groups(self.rows, tpr),
            }],
            owned: vec![u],
        }
    }
}

/// One shard of an embedding table: a buffer holding rows `[first_row, first_row + n_rows)` of
/// `[vocab, hidden]`, f32 or bf16 (bf16 packed two per u32, element 2k in the low half: the raw
/// little-endian bytes of a safetensors BF16 tensor). Split big tables so each shard fits
/// `Gpu::max_binding()`.
pub struct EmbedShard<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub first_row: u32,
    pub n_rows: u32,
    pub bf16: bool,
}

/// Embedding gather fused with `embed_norm`: `y[t, :] = w ⊙ rmsnorm(table[ids[ids_off + t], :])`.
#[derive(Clone, Copy, Debug)]
pub struct EmbedNorm {
    /// Tokens T.
    pub tokens: u32,
    /// Hidden size.
    pub hidden: u32,
    pub eps: f32,
    /// Index of the first id in the ids buffer (u32).
    pub ids_off: u32,
}

impl EmbedNorm {
    /// `ids` u32 [ids_off + T], `w` f32 [hidden], `y` f32 [T, hidden]. One dispatch per shard.
    pub fn bind(
        &self,
        gpu: &Gpu,
        ids: &wgpu::Buffer,
        shards: &[EmbedShard<'_>],
        w: &wgpu::Buffer,
        y: &wgpu::Buffer,
    ) -> OpCall {
        let mut dispatches = Vec::new();
        super::need(ids, (self.ids_off + self.tokens) as u64, "embed_norm ids");
        super::need(w, self.hidden as u64, "embed_norm w");
        super::need(y, self.tokens as u64 * self.hidden as u64, "embed_norm y");
        let dummy = super::dummy(gpu);
        let mut owned = Vec::new();
        for s in shards {
            let elems = s.n_rows as u64 * self.hidden as u64;
            super::need(
                s.buffer,
                if s.bf16 { elems.div_ceil(2) } else { elems },
                "embed_norm table shard",
            );
            let (vec4, tpr) = split(self.hidden, true);
            let pl = norm_pipeline(gpu, "embed_norm", vec4, false);
            let words = vec![
                self.tokens,
                self.hidden,
                self.eps.to_bits(),
                0,
                0,
                0,
                self.hidden,
                s.first_row,
                s.n_rows,
                s.bf16 as u32,
                self.ids_off,
                tpr,
            ];
            let u = uniform_words(gpu, "embed_norm params", &words);
            let (t32, t16) = if s.bf16 {
                (&dummy, s.buffer)
            } else {
                (s.buffer, &dummy)
            };
            let bg = bind_group(
                gpu,
                "embed_norm",
                &pl,
                &[(0, &u), (1, w), (3, y), (5, ids), (6, t32), (7, t16)],
            );
            dispatches.push(Dispatch {
                pipeline: pl,
                bind_group: bg,
                groups: row_groups(self.tokens, tpr),
            });
            owned.push(u);
        }
        owned.push(dummy);
        OpCall {
            label: "embed_norm".into(),
            dispatches,
            owned,
        }
    }
}
