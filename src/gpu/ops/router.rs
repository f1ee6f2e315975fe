//! MoE router: top-k selection, gammas and the pairs list for the MoE GEMV (`wgsl/router.wgsl`).

use super::{bind_group, grid, uniform_words, Bind, Dispatch, OpCall};
use crate::gpu::kernel::KernelSpec;
use crate::gpu::Gpu;

const SRC: &str = include_str!("../../../wgsl/router.wgsl");

/// The top-k kernel of router.wgsl.
fn route_spec() -> KernelSpec {
    KernelSpec::new(
        "router/route",
        "route",
        &[
            (0, Bind::Uniform),
            (1, Bind::Read),
            (2, Bind::Read),
            (3, Bind::Write),
            (4, Bind::Write),
            (5, Bind::Write),
            (6, Bind::Write),
            (7, Bind::Uniform),
        ],
        SRC.to_string(),
    )
}

/// The one kernel of router.wgsl.
pub(crate) fn kernels() -> Vec<KernelSpec> {
    vec![route_spec()]
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

pub struct Router {
    pub shape: RouterShape,
}

impl Router {
    pub fn new(shape: RouterShape) -> Router {
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
        Router { shape }
    }

    /// Top-k of `sigmoid(logits[:E]) + bias` (larger first, ties to the lower index, NaN below every
    /// value, a true −inf included; see `wgsl/router.wgsl` for the counting scheme), weights
    /// `exp(logsigmoid(l) − logsumexp(logsigmoid(l))) · scale` over the chosen and shared logits, as
    /// `model::cpu::route`. `logits` f32 [T, E+S] (routed first), `bias` f32 [E]
    /// (e_score_correction_bias) → `pairs` [T·top_k] of [`Pair`], `gammas` f32 [T·top_k],
    /// `shared_gammas` f32 [T·S] (bind a 4-byte buffer when S = 0). Non-finite logits are not
    /// reported (see [`Router::bind_checked`]).
    pub fn bind(
        &self,
        gpu: &Gpu,
        logits: &wgpu::Buffer,
        bias: &wgpu::Buffer,
        pairs: &wgpu::Buffer,
        gammas: &wgpu::Buffer,
        shared_gammas: &wgpu::Buffer,
    ) -> OpCall {
        let status = gpu.storage("router status (unread)", 16);
        let pos = uniform_words(gpu, "router pos0 (unread)", &[0, 0, 0, 0]);
        let mut call = self.bind_checked(
            gpu,
            logits,
            bias,
            pairs,
            gammas,
            shared_gammas,
            (&status, &pos),
            0,
        );
        call.owned.extend([status, pos]);
        call
    }

    /// [`Router::bind`], and a token whose logits hold a NaN or an Inf sets the run-time status
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
    ) -> OpCall {
        let (status, pos) = check;
        let s = &self.shape;
        let t = s.tokens as u64;
        super::need(
            logits,
            t * (s.n_routed + s.n_shared) as u64,
            "router logits",
        );
        super::need(bias, s.n_routed as u64, "router bias");
        super::need(pairs, t * s.top_k as u64 * 4, "router pairs");
        super::need(gammas, t * s.top_k as u64, "router gammas");
        super::need(shared_gammas, t * s.n_shared as u64, "router shared_gammas");
        super::need(status, 4, "router status");
        let pl = super::listed_pipeline(gpu, &route_spec());
        let u = uniform_words(
            gpu,
            "router params",
            &[
                s.tokens,
                s.n_routed,
                s.n_shared,
                s.top_k,
                s.scale.to_bits(),
                layer,
                0,
                0,
            ],
        );
        let bg = bind_group(
            gpu,
            "router",
            &pl,
            &[
                (0, &u),
                (1, logits),
                (2, bias),
                (3, pairs),
                (4, gammas),
                (5, shared_gammas),
                (6, status),
                (7, pos),
            ],
        );
        OpCall {
            label: "router top-k".into(),
            dispatches: vec![Dispatch {
                pipeline: pl,
                bind_group: bg,
                groups: grid(s.tokens),
            }],
            owned: vec![u],
        }
    }
}
