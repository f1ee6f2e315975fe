//! The column split (`wgsl/split.wgsl`): one `[T, C]` matrix whose columns are four consecutive
//! blocks (a layer's concatenated q, k, v and r projections of a prompt chunk) copied into four
//! packed matrices.

use super::dispatch;
use crate::gpu::call::{grid, need, BufferTooSmall, Call, Label};
use crate::gpu::kernel::{Bind, Kernel, KernelSpec};
use crate::gpu::Gpu;
use std::fmt;

const SRC: &str = include_str!("../../../wgsl/split.wgsl");

/// The one kernel of split.wgsl. Label `split/split_columns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SplitKey;

/// The `Params` of split.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SplitParams {
    /// T·C elements.
    pub n: u32,
    /// Columns C.
    pub cols: u32,
    pub _p: [u32; 2],
    /// End column of each block (the last is C).
    pub ends: [u32; 4],
}

impl fmt::Display for SplitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "split/split_columns")
    }
}

impl Kernel for SplitKey {
    type Params = SplitParams;
    fn entry(&self) -> &'static str {
        "split_columns"
    }
    fn bindings(&self) -> Vec<(u32, Bind)> {
        let mut v = vec![(0, Bind::Uniform), (1, Bind::Read)];
        v.extend((2..=5).map(|b| (b, Bind::Write)));
        v
    }
    fn source(&self) -> String {
        SRC.to_string()
    }
}

/// The kernel of split.wgsl.
pub(crate) fn kernels() -> Vec<KernelSpec> {
    vec![KernelSpec::of(&SplitKey)]
}

/// `out_i[t, 0..w_i] = x[t, s_i..s_i + w_i]` for the `tokens` rows of `x` f32 `[T, Σ w_i]`, with
/// `s_i = w_0 + … + w_{i−1}`: an exact copy. Label `"split"`.
#[derive(Clone, Copy, Debug)]
pub struct SplitColumns {
    pub tokens: u32,
    /// Columns w_i of each block (any may be 0; their sum is C > 0).
    pub widths: [u32; 4],
}

impl SplitColumns {
    /// `x` f32 `[T, C]`, `outs[i]` f32 `[T, w_i]` (packed). The outputs must not alias `x` or
    /// each other. Panics when every width is 0.
    pub fn bind(
        &self,
        gpu: &Gpu,
        x: &wgpu::Buffer,
        outs: [&wgpu::Buffer; 4],
    ) -> Result<Call, BufferTooSmall> {
        let mut ends = [0u32; 4];
        let mut c = 0;
        for (e, w) in ends.iter_mut().zip(self.widths) {
            c += w;
            *e = c;
        }
        assert!(c > 0, "split: no columns");
        let t = self.tokens as u64;
        need(x, t * c as u64, "split x")?;
        const WHAT: [&str; 4] = ["split out 0", "split out 1", "split out 2", "split out 3"];
        for ((o, w), what) in outs.iter().zip(self.widths).zip(WHAT) {
            need(o, t * w as u64, what)?;
        }
        let n = self.tokens * c;
        let params = SplitParams {
            n,
            cols: c,
            _p: [0; 2],
            ends,
        };
        let bufs: Vec<(u32, &wgpu::Buffer)> =
            std::iter::once((1, x)).chain((2..).zip(outs)).collect();
        let d = dispatch(gpu, &SplitKey, &params, &bufs, grid(n.div_ceil(256)));
        Ok(Call::new(Label::op("split"), vec![d]))
    }
}
