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
        ConvCall::new(
            OpCall {
                label: "short_conv".into(),
                dispatches: vec![Dispatch {
                    pipeline: pl,
                    bind_group: bg,
                    groups: super::grid(self.channels.div_ceil(64)),
                }],
                owned: vec![u],
            },
            state,
            self.kernel,
            self.channels,
        )
    }

    /// Two convolutions of this shape in one dispatch (the attention's k and v convs), each exactly
    /// as [`ShortConvKernel::bind`] (`short_conv_pair` in `wgsl/conv.wgsl`): `a` and `b` are
    /// `(x, w, state, y)` with the shapes of `bind` (no buffer of `a` may be one of `b`'s outputs).
    /// Label `"short_conv x2"`; a reset clears both states.
    pub fn bind_pair(&self, gpu: &Gpu, a: [&wgpu::Buffer; 4], b: [&wgpu::Buffer; 4]) -> ConvCall {
        assert!(
            (1..=8).contains(&self.kernel),
            "short conv kernel size {} not in 1..=8",
            self.kernel
        );
        let (t, c) = (self.tokens as u64, self.channels as u64);
        for [x, w, state, y] in [a, b] {
            super::need(x, t * c, "short_conv x");
            super::need(w, c * self.kernel as u64, "short_conv w");
            super::need(state, (self.kernel as u64 - 1) * c, "short_conv state");
            super::need(y, t * c, "short_conv y");
        }
        let binds: Vec<(u32, Bind)> = std::iter::once((0, Bind::Uniform))
            .chain([1, 2, 5, 6].map(|i| (i, Bind::Read)))
            .chain([3, 4, 7, 8].map(|i| (i, Bind::Write)))
            .collect();
        let pl = pipeline(gpu, "conv/short_conv_pair", SRC, "short_conv_pair", &binds);
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
            "short_conv x2",
            &pl,
            &[
                (0, &u),
                (1, a[0]),
                (2, a[1]),
                (3, a[2]),
                (4, a[3]),
                (5, b[0]),
                (6, b[1]),
                (7, b[2]),
                (8, b[3]),
            ],
        );
        let mut call = ConvCall::new(
            OpCall {
                label: "short_conv x2".into(),
                dispatches: vec![Dispatch {
                    pipeline: pl,
                    bind_group: bg,
                    groups: super::grid(2 * self.channels.div_ceil(64)),
                }],
                owned: vec![u],
            },
            a[2],
            self.kernel,
            self.channels,
        );
        call.states.push((b[2].clone(), self.state_bytes()));
        call
    }
}

/// A bound short convolution (or a kernel that contains one); also knows its state buffers so a new
/// sequence can clear them.
pub struct ConvCall {
    pub call: OpCall,
    states: Vec<(wgpu::Buffer, u64)>,
}

impl ConvCall {
    /// `call` updates the conv state `state` of a kernel of size `kernel` over `channels` channels.
    pub fn new(call: OpCall, state: &wgpu::Buffer, kernel: u32, channels: u32) -> ConvCall {
        let bytes = ((kernel as u64 - 1) * channels as u64 * 4).max(4);
        ConvCall {
            call,
            states: vec![(state.clone(), bytes)],
        }
    }

    pub fn record(&self, encoder: &mut wgpu::CommandEncoder) {
        self.call.record(encoder);
    }

    pub fn record_in_pass(&self, pass: &mut wgpu::ComputePass<'_>) {
        self.call.record_in_pass(pass);
    }

    /// Record a clear of the state(s) (start of a new sequence: inputs before it are zeros).
    pub fn record_reset(&self, encoder: &mut wgpu::CommandEncoder) {
        for (state, bytes) in &self.states {
            encoder.clear_buffer(state, 0, Some(bytes.next_multiple_of(4)));
        }
    }

    pub fn run(&self, gpu: &Gpu) {
        self.call.run(gpu);
    }
}
