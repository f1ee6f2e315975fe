//! Causal depthwise short convolution with the residual inside (`wgsl/conv.wgsl`).

use super::{bind_group, pipeline, uniform_words, Bind, Dispatch, OpCall};
use crate::gpu::Gpu;

const SRC: &str = include_str!("../../../wgsl/conv.wgsl");

/// `out[t,c] = x[t,c] + Σ_k w[c,k]·xin[t−(K−1)+k, c]` over `tokens` new tokens and `channels` channels,
/// with the previous K−1 inputs in a state buffer `[K−1, C]` (oldest first), updated in place.
#[derive(Clone, Copy, Debug)]
pub struct ShortConvKernel {
    pub tokens: u32,
    pub channels: u32,
    /// Kernel size K (1..=8; Inkling uses 3 or 4).
    pub kernel: u32,
    /// `true`: `y += out` (fuses the residual add `h += sconv(a)`); `false`: `y = out`.
    pub accumulate: bool,
}

impl ShortConvKernel {
    /// Bytes of the state buffer for this shape (`(K−1)·C` f32, at least 4).
    pub fn state_bytes(&self) -> u64 {
        ((self.kernel as u64 - 1) * self.channels as u64 * 4).max(4)
    }

    /// `x` f32 [T, C], `w` f32 [C, K] (the `[C, 1, K]` tensor), `state` f32 [K−1, C], `y` f32 [T, C]
    /// (x and y must be different buffers).
    pub fn bind(
        &self,
        gpu: &Gpu,
        x: &wgpu::Buffer,
        w: &wgpu::Buffer,
        state: &wgpu::Buffer,
        y: &wgpu::Buffer,
    ) -> ConvCall {
        assert!(
            (1..=8).contains(&self.kernel),
            "short conv kernel size {} not in 1..=8",
            self.kernel
        );
        let (t, c) = (self.tokens as u64, self.channels as u64);
        super::need(x, t * c, "short_conv x");
        super::need(w, c * self.kernel as u64, "short_conv w");
        super::need(state, (self.kernel as u64 - 1) * c, "short_conv state");
        super::need(y, t * c, "short_conv y");
        let pl = pipeline(
            gpu,
            "conv/short_conv",
            SRC,
            "short_conv",
            &[
                (0, Bind::Uniform),
                (1, Bind::Read),
                (2, Bind::Read),
                (3, Bind::Write),
                (4, Bind::Write),
            ],
        );
        let u = uniform_words(
            gpu,
            "short_conv params",
            &[
                self.tokens,
                self.channels,
                self.kernel,
                self.accumulate as u32,
            ],
        );
        let bg = bind_group(
            gpu,
            "short_conv",
            &pl,
            &[(0, &u), (1, x), (2, w), (3, state), (4, y)],
        );
        ConvCall {
            call: OpCall {
                label: "short_conv".into(),
                dispatches: vec![Dispatch {
                    pipeline: pl,
                    bind_group: bg,
                    groups: super::grid(self.channels.div_ceil(64)),
                }],
                owned: vec![u],
            },
            state: state.clone(),
            state_bytes: self.state_bytes(),
        }
    }
}

/// A bound short convolution; also knows its state buffer so a new sequence can clear it.
pub struct ConvCall {
    pub call: OpCall,
    state: wgpu::Buffer,
    state_bytes: u64,
}

impl ConvCall {
    pub fn record(&self, encoder: &mut wgpu::CommandEncoder) {
        self.call.record(encoder);
    }

    pub fn record_in_pass(&self, pass: &mut wgpu::ComputePass<'_>) {
        self.call.record_in_pass(pass);
    }

    /// Record a clear of the state (start of a new sequence: inputs before it are zeros).
    pub fn record_reset(&self, encoder: &mut wgpu::CommandEncoder) {
        encoder.clear_buffer(&self.state, 0, Some(self.state_bytes.next_multiple_of(4)));
    }

    pub fn run(&self, gpu: &Gpu) {
        self.call.run(gpu);
    }
}
