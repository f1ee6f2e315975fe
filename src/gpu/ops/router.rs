//! MoE router: top-k selection, gammas and the pairs list for the MoE GEMV (`wgsl/router.wgsl`).

use super::dispatch;
use crate::gpu::call::{grid, need, uniform, BufferTooSmall, Call, Label};
use crate::gpu::kernel::{Bind, Kernel, KernelSpec};
use crate::gpu::Gpu;
use std::fmt;

const SRC: &str = include_str!("../../../wgsl/router.wgsl");

/// The top-k kernel of router.wgsl. Label `router/route`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RouterKey;

/// The `Params` of router.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RouterParams {
    pub t: u32,
    pub n_routed: u32,
    pub n_shared: u32,
    pub top_k: u32,
    pub scale: f32,
    /// Reported in the status words for non-finite logits.
    pub layer: u32,
    pub _p: [u32; 2],
}

impl fmt::Display for RouterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("router/route")
    }
}

impl Kernel for RouterKey {
    type Params = RouterParams;
    fn entry(&self) -> &'static str {
        "route"
    }
    fn bindings(&self) -> Vec<(u32, Bind)> {
        let (u, r, w) = (Bind::Uniform, Bind::Read, Bind::Write);
        vec![
            (0, u),
            (1, r),
            (2, r),
            (3, w),
            (4, w),
            (5, w),
            (6, w),
            (7, u),
        ]
    }
    fn source(&self) -> String {
        SRC.to_string()
    }
}

/// The one kernel of router.wgsl.
pub(crate) fn kernels() -> Vec<KernelSpec> {
    vec![KernelSpec::of(&RouterKey)]
}

/// One (routed expert, token) work item for the MoE GEMV: 16 bytes, `weight_idx = t·top_k + s` indexes
/// the gammas buffer (and the routed output rows `[T·top_k, hidden]`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Pair {
    pub expert: u32,
    pub token: u32,
    pub weight_idx: u32,
    pub _pad: u32,
}

#[derive(Clone, Copy, Debug)]
pub struct RouterShape {
    pub tokens: u32,
    /// Routed experts E (≤ 2048).
    pub n_routed: u32,
    /// Shared experts S.
    pub n_shared: u32,
    /// top-k (≤ 32, ≤ E).
    pub top_k: u32,
    /// `route_scale × gate.global_scale`.
    pub scale: f32,
}

impl RouterShape {
    /// Panics unless the shape is one the kernel handles (a bug in the caller).
    fn check(&self) {
        let shape = self;
        assert!(
            shape.n_routed <= 2048,
            "router: {} routed experts > 2048",
            shape.n_routed
        );
        assert!(
            shape.top_k >= 1 && shape.top_k <= 32 && shape.top_k <= shape.n_routed,
            "router: bad top_k {}",
            shape.top_k
        );
    }

    /// Top-k of `sigmoid(logits[:E]) + bias` (larger first, ties to the lower index, NaN below every
    /// value, a true −inf included; see `wgsl/router.wgsl` for the counting scheme), weights
    /// `exp(logsigmoid(l) − logsumexp(logsigmoid(l))) · scale` over the chosen and shared logits, as
    /// `model::cpu::route`. `logits` f32 [T, E+S] (routed first), `bias` f32 [E]
    /// (e_score_correction_bias) → `pairs` [T·top_k] of [`Pair`], `gammas` f32 [T·top_k],
    /// `shared_gammas` f32 [T·S] (bind a 4-byte buffer when S = 0). Non-finite logits are not
    /// reported (see [`RouterShape::bind_checked`]).
    pub fn bind(
        &self,
        gpu: &Gpu,
        logits: &wgpu::Buffer,
        bias: &wgpu::Buffer,
        pairs: &wgpu::Buffer,
        gammas: &wgpu::Buffer,
        shared_gammas: &wgpu::Buffer,
    ) -> Result<Call, BufferTooSmall> {
        let status = gpu.storage("router status (unread)", 16);
        let pos = uniform(gpu, "router pos0 (unread)", &[0u32; 4]);
        let call = self.bind_checked(
            gpu,
            logits,
            bias,
            pairs,
            gammas,
            shared_gammas,
            (&status, &pos),
            0,
        )?;
        Ok(call.owning([status, pos]))
    }

    /// [`RouterShape::bind`], and a token whose logits hold a NaN or an Inf sets the run-time status
    /// words `status[2] = layer + 1` (unless an earlier layer already set them) and
    /// `status[3] = max(u32::MAX − (pos0 + t))` over such tokens t (layout: `model::status`);
    /// `check.0` is the status buffer, u32 [≥ 4], `check.1` the uniform `[pos0, 0, 0, 0]` of the
    /// chunk's first absolute position ([`super::PosBuffer`]).
    #[allow(clippy::too_many_arguments)]
    pub fn bind_checked(
        &self,
        gpu: &Gpu,
        logits: &wgpu::Buffer,
        bias: &wgpu::Buffer,
        pairs: &wgpu::Buffer,
        gammas: &wgpu::Buffer,
        shared_gammas: &wgpu::Buffer,
        check: (&wgpu::Buffer, &wgpu::Buffer),
        layer: u32,
    ) -> Result<Call, BufferTooSmall> {
        self.check();
        let (status, pos) = check;
        let s = self;
        let t = s.tokens as u64;
        let n_logits = t * (s.n_routed + s.n_shared) as u64;
        need(logits, n_logits, "router logits")?;
        need(bias, s.n_routed as u64, "router bias")?;
        need(pairs, t * s.top_k as u64 * 4, "router pairs")?;
        need(gammas, t * s.top_k as u64, "router gammas")?;
        need(shared_gammas, t * s.n_shared as u64, "router shared_gammas")?;
        need(status, 4, "router status")?;
        let params = RouterParams {
            t: s.tokens,
            n_routed: s.n_routed,
            n_shared: s.n_shared,
            top_k: s.top_k,
            scale: s.scale,
            layer,
            _p: [0; 2],
        };
        let d = dispatch(
            gpu,
            &RouterKey,
            &params,
            &[
                (1, logits),
                (2, bias),
                (3, pairs),
                (4, gammas),
                (5, shared_gammas),
                (6, status),
                (7, pos),
            ],
            grid(s.tokens),
        );
        Ok(Call::new(Label::op("router top-k"), vec![d]))
    }
}
