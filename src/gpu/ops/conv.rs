//! Causal depthwise short convolution with the residual inside (`wgsl/conv.wgsl`).

use super::{bind_group, uniform_words, Bind, Dispatch, OpCall};
use crate::gpu::kernel::KernelSpec;
use crate::gpu::Gpu;

const SRC: &str = include_str!("../../../wgsl/conv.wgsl");

/// The single or the `PAIR` kernel of conv.wgsl: per set k, x and w read at bindings 1 + 4k and
/// 2 + 4k, state and y written at 3 + 4k and 4 + 4k.
fn conv_spec(paired: bool) -> KernelSpec {
    let mut binds = vec![(0, Bind::Uniform)];
    for k in 0..1 + paired as u32 {
        let b = 4 * k;
        binds.extend([
            (1 + b, Bind::Read),
            (2 + b, Bind::Read),
            (3 + b, Bind::Write),
            (4 + b, Bind::Write),
        ]);
    }
    let key = if paired {
        "conv/short_conv/pair"
    } else {
        "conv/short_conv/single"
    };
    let src = crate::gpu::kernel::preprocess(SRC, &[("PAIR", paired)]);
    KernelSpec::new(key, "short_conv", &binds, src)
}

/// Both kernels of conv.wgsl (single, pair).
pub(crate) fn kernels() -> Vec<KernelSpec> {
    vec![conv_spec(false), conv_spec(true)]
}

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
        self.bind_sets(gpu, &[[x, w, state, y]])
    }

    /// Two convolutions of this shape in one dispatch (the attention's k and v convs), each exactly
    /// as [`ShortConvKernel::bind`] (the `PAIR` variant of `wgsl/conv.wgsl`): `a` and `b` are
    /// `(x, w, state, y)` with the shapes of `bind` (no buffer of `a` may be one of `b`'s outputs).
    /// Label `"short_conv x2"`; a reset clears both states.
    pub fn bind_pair(&self, gpu: &Gpu, a: [&wgpu::Buffer; 4], b: [&wgpu::Buffer; 4]) -> ConvCall {
        self.bind_sets(gpu, &[a, b])
    }

    /// One convolution per `(x, w, state, y)` set (one or two) in one dispatch.
    fn bind_sets(&self, gpu: &Gpu, sets: &[[&wgpu::Buffer; 4]]) -> ConvCall {
        assert!(
            (1..=8).contains(&self.kernel),
            "short conv kernel size {} not in 1..=8",
            self.kernel
        );
        let paired = sets.len() == 2;
        assert!(sets.len() == 1 || paired, "one or two convolutions");
        let (t, c) = (self.tokens as u64, self.channels as u64);
        for [x, w, state, y] in sets {
            super::need(x, t * c, "short_conv x");
            super::need(w, c * self.kernel as u64, "short_conv w");
            super::need(state, (self.kernel as u64 - 1) * c, "short_conv state");
            super::need(y, t * c, "short_conv y");
        }
        let mut entries = Vec::new();
        for (k, set) in sets.iter().enumerate() {
            let b = 4 * k as u32;
            entries.extend((1..=4).map(|i| (i + b, set[i as usize - 1])));
        }
        let label = if paired {
            "short_conv x2"
        } else {
            "short_conv"
        };
        let pl = super::listed_pipeline(gpu, &conv_spec(paired));
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
        entries.insert(0, (0, &u));
        let bg = bind_group(gpu, label, &pl, &entries);
        let mut call = ConvCall::new(
            OpCall {
                label: label.into(),
                dispatches: vec![Dispatch {
                    pipeline: pl,
                    bind_group: bg,
                    groups: super::grid(sets.len() as u32 * self.channels.div_ceil(64)),
                }],
                owned: vec![],
            },
            sets[0][2],
            self.kernel,
            self.channels,
        );
        for set in &sets[1..] {
            call.states.push((set[2].clone(), self.state_bytes()));
        }
        call.call.owned.push(u);
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
