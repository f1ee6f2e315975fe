//! The residual chain of a one-token decode step fused into one dispatch (`wgsl/residual.wgsl`):
//! conv input (plain, scaled, or the MoE combine) → short conv with its state update → `h += out` →
//! RMSNorm of the new `h` (optionally divided by a constant, the head's `div_const`).
//!
//! For T = 1 every step of the chain is per channel except the norm's one row reduction, so the
//! whole chain is one workgroup of 256 invocations instead of two or three small dispatches.

use super::{dispatch, vec4_tag};
use crate::gpu::call::{dummy, need, BufferTooSmall, Call, Label};
use crate::gpu::kernel::{Bind, Kernel, KernelSpec};
use crate::gpu::Gpu;
use std::fmt;

const SRC: &str = include_str!("../../../wgsl/residual.wgsl");

/// The kernel of residual.wgsl in its f32 or vec4 variant. Label
/// `residual/sconv_rms_norm/{f32|vec4}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ResidualKey {
    pub vec4: bool,
}

/// The `Params` of residual.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ResidualParams {
    /// Units per row (C, or C / 4 for vec4).
    pub cu: u32,
    /// Channels C.
    pub c: u32,
    /// Conv kernel size K (1..=8).
    pub k: u32,
    /// 0 plain, 1 scaled, 2 MoE combine.
    pub mode: u32,
    pub top_k: u32,
    pub n_shared: u32,
    pub eps: f32,
    pub scale: f32,
    /// 0: no division.
    pub div: f32,
    pub _p: [u32; 3],
}

impl fmt::Display for ResidualKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "residual/sconv_rms_norm/{}", vec4_tag(self.vec4))
    }
}

impl Kernel for ResidualKey {
    type Params = ResidualParams;
    fn entry(&self) -> &'static str {
        "sconv_rms_norm"
    }
    fn bindings(&self) -> Vec<(u32, Bind)> {
        let (r, w) = (Bind::Read, Bind::Write);
        vec![
            (0, Bind::Uniform),
            (1, r),
            (2, r),
            (3, w),
            (4, w),
            (5, r),
            (6, w),
            (7, r),
            (8, r),
            (9, r),
        ]
    }
    fn source(&self) -> String {
        super::wgsl_variant(SRC, self.vec4)
    }
}

/// Both variants (f32, vec4) of residual.wgsl.
pub(crate) fn kernels() -> Vec<KernelSpec> {
    [false, true]
        .map(|vec4| KernelSpec::of(&ResidualKey { vec4 }))
        .to_vec()
}

/// The conv input `xin` of [`SconvRmsNorm`].
#[derive(Clone, Copy)]
pub enum SconvInput<'a> {
    /// `xin = x`, f32 [C] (the attention block: `attn_sconv(o_proj(..))`).
    Plain(&'a wgpu::Buffer),
    /// `xin = x · scale`, f32 [C] (the dense MLP's `global_scale`, i.e. [`super::MulConst`]).
    Scaled(&'a wgpu::Buffer, f32),
    /// `xin[c] = Σ_s routed[s, c]·gammas[s] + Σ_j shared[j, c]·shared_gammas[j]` (in that order),
    /// the MoE combine with both weightings on: `routed` f32 [top_k, C],
    /// `gammas` f32 [top_k], `shared` = (f32 [S, C], f32 [S], S) when there are shared experts.
    MoeCombine {
        routed: &'a wgpu::Buffer,
        gammas: &'a wgpu::Buffer,
        top_k: u32,
        shared: Option<(&'a wgpu::Buffer, &'a wgpu::Buffer, u32)>,
    },
}

/// One token's `h += sconv(xin)` then `y = nw ⊙ h · rsqrt(mean(h²) + eps)` (then `y /= div` if `div`
/// is set), in one dispatch. The conv is `wgsl/conv.wgsl`'s `short_conv` at T = 1 with `accumulate`
/// (Inkling ShortConvolution with the residual inside, the decoder's `h = h + sconv(a)`), the norm
/// `wgsl/norm.wgsl`'s `rms_norm` (transformers `InklingRMSNorm`); all f32.
#[derive(Clone, Copy, Debug)]
pub struct SconvRmsNorm {
    /// Channels C (the hidden size).
    pub channels: u32,
    /// Conv kernel size K (1..=8).
    pub kernel: u32,
    pub eps: f32,
    /// `Some(d)`: divide the normed row by `d` (the head's `logits_mup_width_multiplier`).
    pub div: Option<f32>,
}

impl SconvRmsNorm {
    /// `conv_w` f32 [C, K], `state` f32 [K−1, C] (updated), `h` f32 [C] (updated in place),
    /// `norm_w` f32 [C], `y` f32 [C]. `y` must not alias any input. The label is
    /// `"sconv+rms_norm"` (`"moe_combine+sconv+rms_norm"` with [`SconvInput::MoeCombine`]).
    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        &self,
        gpu: &Gpu,
        input: SconvInput<'_>,
        conv_w: &wgpu::Buffer,
        state: &wgpu::Buffer,
        h: &wgpu::Buffer,
        norm_w: &wgpu::Buffer,
        y: &wgpu::Buffer,
    ) -> Result<Call, BufferTooSmall> {
        super::conv::assert_kernel_size(self.kernel);
        assert!(self.channels > 0, "sconv+rms_norm: no channels");
        let c = self.channels as u64;
        let vec4 = self.channels.is_multiple_of(4);
        let cu = if vec4 {
            self.channels / 4
        } else {
            self.channels
        };
        need(conv_w, c * self.kernel as u64, "sconv+rms_norm conv w")?;
        need(state, (self.kernel as u64 - 1) * c, "sconv+rms_norm state")?;
        need(h, c, "sconv+rms_norm h")?;
        need(norm_w, c, "sconv+rms_norm norm w")?;
        need(y, c, "sconv+rms_norm y")?;
        let none = dummy(gpu);
        let (mode, x, scale, top_k, gam, ys, sg, ns, label) = match input {
            SconvInput::Plain(x) => (0, x, 1.0, 0, &none, &none, &none, 0, "sconv+rms_norm"),
            SconvInput::Scaled(x, s) => (1, x, s, 0, &none, &none, &none, 0, "sconv+rms_norm"),
            SconvInput::MoeCombine {
                routed,
                gammas,
                top_k,
                shared,
            } => {
                need(routed, top_k as u64 * c, "moe_combine+sconv routed")?;
                need(gammas, top_k as u64, "moe_combine+sconv gammas")?;
                let (ys, sg, ns) = shared.unwrap_or((&none, &none, 0));
                if ns > 0 {
                    need(ys, ns as u64 * c, "moe_combine+sconv shared")?;
                    need(sg, ns as u64, "moe_combine+sconv shared gammas")?;
                }
                let l = "moe_combine+sconv+rms_norm";
                (2, routed, 1.0, top_k, gammas, ys, sg, ns, l)
            }
        };
        if mode != 2 {
            need(x, c, "sconv+rms_norm x")?;
        }
        let params = ResidualParams {
            cu,
            c: self.channels,
            k: self.kernel,
            mode,
            top_k,
            n_shared: ns,
            eps: self.eps,
            scale,
            div: self.div.unwrap_or(0.0),
            _p: [0; 3],
        };
        // K = 1 has no state: bind a 16-byte dummy of its own (a read-write binding) so the vec4
        // binding has its minimum size
        let no_state = dummy(gpu);
        let state_b = if self.kernel == 1 { &no_state } else { state };
        let d = dispatch(
            gpu,
            &ResidualKey { vec4 },
            &params,
            &[
                (1, x),
                (2, conv_w),
                (3, state_b),
                (4, h),
                (5, norm_w),
                (6, y),
                (7, gam),
                (8, ys),
                (9, sg),
            ],
            [1, 1, 1],
        );
        Ok(Call::new(Label::op(label), vec![d]).owning([none, no_state]))
    }
}
