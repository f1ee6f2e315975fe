//! RMSNorm kernels (`wgsl/norm.wgsl`): row norm, in-place per-head norm, embedding gather + embed_norm.
//!
//! Each row gets about one invocation per vec4 (up to 256, several short rows per workgroup), four
//! independent accumulators per invocation, vec4 loads when widths, offsets and strides allow.

use super::{dispatch, vec4_tag};
use crate::gpu::call::{dummy, grid, need, BufferTooSmall, Call, Label};
use crate::gpu::kernel::{Bind, Kernel, KernelSpec};
use crate::gpu::Gpu;
use std::fmt;

const SRC: &str = include_str!("../../../wgsl/norm.wgsl");

/// The entry points of norm.wgsl.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NormEntry {
    /// `rms_norm` out of place.
    RmsNorm,
    /// `rms_norm` in place (the `INPLACE` variant).
    RmsNormInPlace,
    /// `embed_norm`: embedding gather + RMSNorm.
    EmbedNorm,
}

/// A pipeline of norm.wgsl. Label `norm/{entry}/{f32|vec4}/{out|inplace}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NormKey {
    pub entry: NormEntry,
    pub vec4: bool,
}

/// The `Params` of norm.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct NormParams {
    pub rows: u32,
    pub width: u32,
    pub eps: f32,
    pub x_off: u32,
    pub x_stride: u32,
    pub y_off: u32,
    pub y_stride: u32,
    /// embed_norm: first table row of the shard.
    pub row_lo: u32,
    /// embed_norm: rows in the shard.
    pub n_rows: u32,
    /// embed_norm: 1 when the shard is bf16.
    pub bf16: u32,
    /// embed_norm: index of the first id.
    pub ids_off: u32,
    /// Invocations per row (a power of two ≤ 256).
    pub tpr: u32,
}

impl NormKey {
    fn inplace(&self) -> bool {
        self.entry == NormEntry::RmsNormInPlace
    }
}

impl fmt::Display for NormKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let variant = if self.inplace() { "inplace" } else { "out" };
        let (e, t) = (self.entry(), vec4_tag(self.vec4));
        write!(f, "norm/{e}/{t}/{variant}")
    }
}

impl Kernel for NormKey {
    type Params = NormParams;
    fn entry(&self) -> &'static str {
        match self.entry {
            NormEntry::RmsNorm | NormEntry::RmsNormInPlace => "rms_norm",
            NormEntry::EmbedNorm => "embed_norm",
        }
    }
    fn bindings(&self) -> Vec<(u32, Bind)> {
        let (u, r, w) = (Bind::Uniform, Bind::Read, Bind::Write);
        match self.entry {
            NormEntry::RmsNorm => vec![(0, u), (1, r), (2, r), (3, w)],
            NormEntry::RmsNormInPlace => vec![(0, u), (1, r), (2, w)],
            NormEntry::EmbedNorm => vec![(0, u), (1, r), (3, w), (5, r), (6, r), (7, r)],
        }
    }
    fn source(&self) -> String {
        norm_source(self.vec4, self.inplace())
    }
}

/// Every kernel of norm.wgsl: RMSNorm out of place and in place, the embedding gather + norm,
/// each in the f32 and vec4 variant.
pub(crate) fn kernels() -> Vec<KernelSpec> {
    let mut v = Vec::new();
    for vec4 in [false, true] {
        for entry in [
            NormEntry::RmsNorm,
            NormEntry::RmsNormInPlace,
            NormEntry::EmbedNorm,
        ] {
            v.push(KernelSpec::of(&NormKey { entry, vec4 }));
        }
    }
    v
}

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

/// norm.wgsl with its `VEC4` and `INPLACE` flags set.
fn norm_source(vec4: bool, inplace: bool) -> String {
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

    fn params(&self, tpr: u32) -> NormParams {
        NormParams {
            rows: self.rows,
            width: self.width,
            eps: self.eps,
            x_off: self.x_off,
            x_stride: self.x_stride,
            y_off: self.y_off,
            y_stride: self.y_stride,
            tpr,
            ..Default::default()
        }
    }

    /// `y = w ⊙ x · rsqrt(mean(x²) + eps)` per row. `w` f32 [width]. Label `"rms_norm"`.
    pub fn bind(
        &self,
        gpu: &Gpu,
        x: &wgpu::Buffer,
        w: &wgpu::Buffer,
        y: &wgpu::Buffer,
    ) -> Result<Call, BufferTooSmall> {
        let aligned = [self.x_off, self.x_stride, self.y_off, self.y_stride]
            .iter()
            .all(|v| v.is_multiple_of(4));
        let (vec4, tpr) = split(self.width, aligned);
        let last = (self.rows.max(1) as u64 - 1) * self.x_stride as u64 + self.width as u64;
        need(x, self.x_off as u64 + last, "rms_norm x")?;
        let last_y = (self.rows.max(1) as u64 - 1) * self.y_stride as u64 + self.width as u64;
        need(y, self.y_off as u64 + last_y, "rms_norm y")?;
        need(w, self.width as u64, "rms_norm w")?;
        let key = NormKey {
            entry: NormEntry::RmsNorm,
            vec4,
        };
        let d = dispatch(
            gpu,
            &key,
            &self.params(tpr),
            &[(1, w), (2, x), (3, y)],
            row_groups(self.rows, tpr),
        );
        Ok(Call::new(Label::op("rms_norm"), vec![d]))
    }

    /// In place on `x` (per-head q/k norm: `rows = T·heads`, `width = head_dim`; only x_off/x_stride
    /// used). Label `"rms_norm_inplace"`.
    pub fn bind_inplace(
        &self,
        gpu: &Gpu,
        x: &wgpu::Buffer,
        w: &wgpu::Buffer,
    ) -> Result<Call, BufferTooSmall> {
        let aligned = self.x_off.is_multiple_of(4) && self.x_stride.is_multiple_of(4);
        let (vec4, tpr) = split(self.width, aligned);
        let last = (self.rows.max(1) as u64 - 1) * self.x_stride as u64 + self.width as u64;
        need(x, self.x_off as u64 + last, "rms_norm_inplace x")?;
        need(w, self.width as u64, "rms_norm_inplace w")?;
        let key = NormKey {
            entry: NormEntry::RmsNormInPlace,
            vec4,
        };
        let d = dispatch(
            gpu,
            &key,
            &self.params(tpr),
            &[(1, w), (2, x)],
            row_groups(self.rows, tpr),
        );
        Ok(Call::new(Label::op("rms_norm_inplace"), vec![d]))
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
    /// Label `"embed_norm"`.
    pub fn bind(
        &self,
        gpu: &Gpu,
        ids: &wgpu::Buffer,
        shards: &[EmbedShard<'_>],
        w: &wgpu::Buffer,
        y: &wgpu::Buffer,
    ) -> Result<Call, BufferTooSmall> {
        need(ids, (self.ids_off + self.tokens) as u64, "embed_norm ids")?;
        need(w, self.hidden as u64, "embed_norm w")?;
        need(y, self.tokens as u64 * self.hidden as u64, "embed_norm y")?;
        let none = dummy(gpu);
        let mut dispatches = Vec::new();
        for s in shards {
            let elems = s.n_rows as u64 * self.hidden as u64;
            let words = if s.bf16 { elems.div_ceil(2) } else { elems };
            need(s.buffer, words, "embed_norm table shard")?;
            let (vec4, tpr) = split(self.hidden, true);
            let params = NormParams {
                rows: self.tokens,
                width: self.hidden,
                eps: self.eps,
                y_stride: self.hidden,
                row_lo: s.first_row,
                n_rows: s.n_rows,
                bf16: s.bf16 as u32,
                ids_off: self.ids_off,
                tpr,
                ..Default::default()
            };
            let (t32, t16) = if s.bf16 {
                (&none, s.buffer)
            } else {
                (s.buffer, &none)
            };
            let key = NormKey {
                entry: NormEntry::EmbedNorm,
                vec4,
            };
            dispatches.push(dispatch(
                gpu,
                &key,
                &params,
                &[(1, w), (3, y), (5, ids), (6, t32), (7, t16)],
                row_groups(self.tokens, tpr),
            ));
        }
        Ok(Call::new(Label::op("embed_norm"), dispatches).owning([none]))
    }
}
