//! The residual chain of a one-token decode step fused into one dispatch (`wgsl/residual.wgsl`):
//! conv input (plain, scaled, or the MoE combine) → short conv with its state update → `h += out` →
//! RMSNorm of the new `h` (optionally divided by a constant, the head's `div_const`).
//!
//! For T = 1 every step of the chain is per channel except the norm's one row reduction, so the
//! whole chain is one workgroup of 256 invocations instead of two or three small dispatches.

use super::{bind_group, uniform_words, Bind, ConvCall, Dispatch, OpCall};
use crate::gpu::kernel::KernelSpec;
use crate::gpu::Gpu;

const SRC: &str = include_str!("../../../wgsl/residual.wgsl");

/// The kernel of residual.wgsl in its f32 or vec4 variant.
fn sconv_rms_norm_spec(vec4: bool) -> KernelSpec {
    let tag = if vec4 { "vec4" } else { "f32" };
    KernelSpec::new(
        format!("residual/sconv_rms_norm/{tag}"),
        "sconv_rms_norm",
        &[
            (0, Bind::Uniform),
            (1, Bind::Read),
            (2, Bind::Read),
            (3, Bind::Write),
            (4, Bind::Write),
            (5, Bind::Read),
            (6, Bind::Write),
            (7, Bind::Read),
            (8, Bind::Read),
            (9, Bind::Read),
        ],
        super::wgsl_variant(SRC, vec4),
    )
}

/// Both variants (f32, vec4) of residual.wgsl.
pub(crate) fn kernels() -> Vec<KernelSpec> {
    vec![sconv_rms_norm_spec(false), sconv_rms_norm_spec(true)]
}

/// The conv input `xin` of [`SconvRmsNorm`].
#[derive(Clone, Copy)]
pub enum SconvInput<'a> {
    /// `xin = x`, f32 [C] (the attention block: `attn_sconv(o_proj(..))`).
    Plain(&'a wgpu::Buffer),
    /// `xin = x · scale`, f32 [C] (the dense MLP's `global_scale`, i.e. `Elementwise::mul_const`).
    Scaled(&'a wgpu::Buffer, f32),
    /// `xin[c] = Σ_s routed[s, c]·gammas[s] + Σ_j shared[j, c]·shared_gammas[j]` (in that order),
    /// the formula of `Elementwise::moe_combine` with both weightings on: `routed` f32 [top_k, C],
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
    ) -> ConvCall {
        assert!(
            (1..=8).contains(&self.kernel),
            "short conv kernel size {} not in 1..=8",
            self.kernel
        );
        assert!(self.channels > 0, "sconv+rms_norm: no channels");
        let c = self.channels as u64;
        let vec4 = self.channels.is_multiple_of(4);
        let cu = if vec4 {
            self.channels / 4
        } else {
            self.channels
        };
        super::need(conv_w, c * self.kernel as u64, "sconv+rms_norm conv w");
        super::need(state, (self.kernel as u64 - 1) * c, "sconv+rms_norm state");
        super::need(h, c, "sconv+rms_norm h");
        super::need(norm_w, c, "sconv+rms_norm norm w");
        super::need(y, c, "sconv+rms_norm y");
        let dummy = super::dummy(gpu);
        let (mode, x, scale, top_k, gam, ys, sg, ns, label) = match input {
            SconvInput::Plain(x) => (0, x, 1.0, 0, &dummy, &dummy, &dummy, 0, "sconv+rms_norm"),
            SconvInput::Scaled(x, s) => (1, x, s, 0, &dummy, &dummy, &dummy, 0, "sconv+rms_norm"),
            SconvInput::MoeCombine {
                routed,
                gammas,
                top_k,
                shared,
            } => {
                super::need(routed, top_k as u64 * c, "moe_combine+sconv routed");
                super::need(gammas, top_k as u64, "moe_combine+sconv gammas");
                let (ys, sg, ns) = shared.unwrap_or((&dummy, &dummy, 0));
                if ns > 0 {
                    super::need(ys, ns as u64 * c, "moe_combine+sconv shared");
                    super::need(sg, ns as u64, "moe_combine+sconv shared gammas");
                }
                let l = "moe_combine+sconv+rms_norm";
                (2, routed, 1.0, top_k, gammas, ys, sg, ns, l)
            }
        };
        if mode != 2 {
            super::need(x, c, "sconv+rms_norm x");
        }
        let pl = super::listed_pipeline(gpu, &sconv_rms_norm_spec(vec4));
        let u = uniform_words(
            gpu,
            "sconv+rms_norm params",
            &[
                cu,
                self.channels,
                self.kernel,
                mode,
                top_k,
                ns,
                self.eps.to_bits(),
                f32::to_bits(scale),
                self.div.unwrap_or(0.0).to_bits(),
                0,
                0,
                0,
            ],
        );
        // K = 1 has no state: bind a 16-byte dummy of its own (a read-write binding) so the vec4
        // binding has its minimum size
        let no_state = super::dummy(gpu);
        let state_b = if self.kernel == 1 { &no_state } else { state };
        let bg = bind_group(
            gpu,
            label,
            &pl,
            &[
                (0, &u),
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
        );
        ConvCall::new(
            OpCall {
                label: label.into(),
                dispatches: vec![Dispatch {
                    pipeline: pl,
                    bind_group: bg,
                    groups: [1, 1, 1],
                }],
                owned: vec![u, dummy, no_state],
            },
            state,
            self.kernel,
            self.channels,
        )
    }
}
