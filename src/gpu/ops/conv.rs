//! Causal depthwise short convolution with the residual inside (`wgsl/conv.wgsl`).

use super::{dispatch, SlotOf};
use crate::gpu::call::{dummy, grid, need, BufferTooSmall, Call, Label};
use crate::gpu::kernel::{Bind, Kernel, KernelSpec};
use crate::gpu::Gpu;
use std::fmt;

const SRC: &str = include_str!("../../../wgsl/conv.wgsl");

/// The single, the `PAIR` or the `COMBINE` kernel of conv.wgsl: per set k, x and w read at
/// bindings 1 + 4k and 2 + 4k, state and y written at 3 + 4k and 4 + 4k; `COMBINE` (one set) also
/// reads the routed gammas, the shared experts' rows and their gammas at 5, 6 and 7. Label
/// `conv/short_conv/{single|pair|combine}[+batch]`. Each variant reads the slot uniform at
/// binding 9, except `batch` (never with `paired`), which reads the per-token slots at 10.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvKey {
    pub paired: bool,
    /// The input is the MoE combine (never with `paired`).
    pub combine: bool,
    /// A decode batch: token t in its own slot ([`super::SlotOf::Batch`]).
    pub batch: bool,
}

/// The `Params` of conv.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ConvParams {
    pub t: u32,
    pub c: u32,
    pub k: u32,
    pub accumulate: u32,
    pub top_k: u32,
    pub n_shared: u32,
    pub _p0: u32,
    pub _p1: u32,
}

impl fmt::Display for ConvKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = match (self.paired, self.combine) {
            (true, _) => "pair",
            (false, true) => "combine",
            (false, false) => "single",
        };
        let b = if self.batch { "+batch" } else { "" };
        write!(f, "conv/short_conv/{v}{b}")
    }
}

impl Kernel for ConvKey {
    type Params = ConvParams;
    fn entry(&self) -> &'static str {
        "short_conv"
    }
    fn bindings(&self) -> Vec<(u32, Bind)> {
        let mut binds = vec![(0, Bind::Uniform)];
        for k in 0..1 + self.paired as u32 {
            let b = 4 * k;
            binds.extend([
                (1 + b, Bind::Read),
                (2 + b, Bind::Read),
                (3 + b, Bind::Write),
                (4 + b, Bind::Write),
            ]);
        }
        if self.combine {
            binds.extend([(5, Bind::Read), (6, Bind::Read), (7, Bind::Read)]);
        }
        binds.push(if self.batch {
            (10, Bind::Read)
        } else {
            (9, Bind::Uniform)
        });
        binds
    }
    fn source(&self) -> String {
        crate::gpu::kernel::preprocess(
            SRC,
            &[
                ("PAIR", self.paired),
                ("COMBINE", self.combine),
                ("BATCH", self.batch),
            ],
        )
    }
}

/// Panics unless the short-conv kernel size `k` is one conv.wgsl handles (1..=8, its MAX_K).
pub(super) fn assert_kernel_size(k: u32) {
    assert!(
        (1..=8).contains(&k),
        "short conv kernel size {k} not in 1..=8"
    );
}

/// The five kernels of conv.wgsl (single, pair, combine; single and combine batched).
pub(crate) fn kernels() -> Vec<KernelSpec> {
    [
        (false, false, false),
        (true, false, false),
        (false, true, false),
        (false, false, true),
        (false, true, true),
    ]
    .map(|(paired, combine, batch)| {
        KernelSpec::of(&ConvKey {
            paired,
            combine,
            batch,
        })
    })
    .to_vec()
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
    /// (x and y must be different buffers). Label `"short_conv"`.
    pub fn bind(
        &self,
        gpu: &Gpu,
        x: &wgpu::Buffer,
        w: &wgpu::Buffer,
        state: &wgpu::Buffer,
        y: &wgpu::Buffer,
    ) -> Result<Call, BufferTooSmall> {
        self.bind_sets(gpu, None, &[[x, w, state, y]])
    }

    /// [`ShortConvKernel::bind`] over a state of one `[K−1, C]` block per sequence slot, the
    /// slot(s) of the tokens given by `at`.
    pub fn bind_at(
        &self,
        gpu: &Gpu,
        at: SlotOf<'_>,
        x: &wgpu::Buffer,
        w: &wgpu::Buffer,
        state: &wgpu::Buffer,
        y: &wgpu::Buffer,
    ) -> Result<Call, BufferTooSmall> {
        self.bind_sets(gpu, Some(at), &[[x, w, state, y]])
    }

    /// Two convolutions of this shape in one dispatch (the attention's k and v convs), each exactly
    /// as [`ShortConvKernel::bind`] (the `PAIR` variant of `wgsl/conv.wgsl`): `a` and `b` are
    /// `(x, w, state, y)` with the shapes of `bind` (no buffer of `a` may be one of `b`'s outputs).
    /// Label `"short_conv x2"`.
    pub fn bind_pair(
        &self,
        gpu: &Gpu,
        a: [&wgpu::Buffer; 4],
        b: [&wgpu::Buffer; 4],
    ) -> Result<Call, BufferTooSmall> {
        self.bind_sets(gpu, None, &[a, b])
    }

    /// The weights `[C, K]`, the state `[K−1, C]` and the output `[T, C]` of one convolution hold
    /// this shape.
    fn need_conv(
        &self,
        w: &wgpu::Buffer,
        state: &wgpu::Buffer,
        y: &wgpu::Buffer,
    ) -> Result<(), BufferTooSmall> {
        let (t, c, k) = (self.tokens as u64, self.channels as u64, self.kernel as u64);
        need(w, c * k, "short_conv w")?;
        need(state, (k - 1) * c, "short_conv state")?;
        need(y, t * c, "short_conv y")
    }

    /// One convolution per `(x, w, state, y)` set (one or two) in one dispatch; slot 0 when `at`
    /// is `None`.
    fn bind_sets(
        &self,
        gpu: &Gpu,
        at: Option<SlotOf<'_>>,
        sets: &[[&wgpu::Buffer; 4]],
    ) -> Result<Call, BufferTooSmall> {
        assert_kernel_size(self.kernel);
        let paired = sets.len() == 2;
        assert!(sets.len() == 1 || paired, "one or two convolutions");
        let (t, c) = (self.tokens as u64, self.channels as u64);
        for [x, w, state, y] in sets {
            need(x, t * c, "short_conv x")?;
            self.need_conv(w, state, y)?;
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
        let params = ConvParams {
            t: self.tokens,
            c: self.channels,
            k: self.kernel,
            accumulate: self.accumulate as u32,
            ..Default::default()
        };
        let slot0 = at.is_none().then(|| slot_zero(gpu));
        let batch = slot_entries(at, slot0.as_ref(), &mut entries, self.tokens);
        assert!(!(paired && batch), "the paired conv has no batched variant");
        let key = ConvKey {
            paired,
            combine: false,
            batch,
        };
        let groups = sets.len() as u32 * self.channels.div_ceil(64);
        let d = dispatch(gpu, &key, &params, &entries, grid(groups));
        Ok(Call::new(Label::op(label), vec![d]).owning(slot0))
    }

    /// The convolution of the MoE combine (the `COMBINE` kernel; the weighted sum of the routed and
    /// shared experts' outputs and [`ShortConvKernel::bind`] in one dispatch): the input of token t is `Σ_s gammas[t·k+s]·yr[t·k+s, :] + Σ_j sg[t·S+j]·ys[t·S+j, :]`.
    /// `yr` f32 [T·top_k, C], `gammas` f32 [T·top_k], `shared` = `(ys [T·S, C], sg [T·S], S)` or
    /// `None`; `w`, `state`, `y` as in [`ShortConvKernel::bind`]. Label `"moe_combine+short_conv"`.
    #[allow(clippy::too_many_arguments)]
    pub fn bind_combine(
        &self,
        gpu: &Gpu,
        yr: &wgpu::Buffer,
        gammas: &wgpu::Buffer,
        top_k: u32,
        shared: Option<(&wgpu::Buffer, &wgpu::Buffer, u32)>,
        w: &wgpu::Buffer,
        state: &wgpu::Buffer,
        y: &wgpu::Buffer,
    ) -> Result<Call, BufferTooSmall> {
        self.bind_combine_at(gpu, None, yr, gammas, top_k, shared, [w, state, y])
    }

    /// [`ShortConvKernel::bind_combine`] over slotted states (see [`ShortConvKernel::bind_at`]);
    /// `wsy` = `(w, state, y)`, slot 0 when `at` is `None`.
    #[allow(clippy::too_many_arguments)]
    pub fn bind_combine_at(
        &self,
        gpu: &Gpu,
        at: Option<SlotOf<'_>>,
        yr: &wgpu::Buffer,
        gammas: &wgpu::Buffer,
        top_k: u32,
        shared: Option<(&wgpu::Buffer, &wgpu::Buffer, u32)>,
        wsy: [&wgpu::Buffer; 3],
    ) -> Result<Call, BufferTooSmall> {
        let [w, state, y] = wsy;
        assert_kernel_size(self.kernel);
        let none = dummy(gpu);
        let (ys, sg, ns) = shared.unwrap_or((&none, &none, 0));
        let (t, c, kk, nsu) = (
            self.tokens as u64,
            self.channels as u64,
            top_k as u64,
            ns as u64,
        );
        need(yr, t * kk * c, "moe_combine+short_conv routed rows")?;
        need(gammas, t * kk, "moe_combine+short_conv gammas")?;
        need(ys, t * nsu * c, "moe_combine+short_conv shared rows")?;
        need(sg, t * nsu, "moe_combine+short_conv shared gammas")?;
        self.need_conv(w, state, y)?;
        let params = ConvParams {
            t: self.tokens,
            c: self.channels,
            k: self.kernel,
            accumulate: self.accumulate as u32,
            top_k,
            n_shared: ns,
            ..Default::default()
        };
        let mut entries = vec![
            (1, yr),
            (2, w),
            (3, state),
            (4, y),
            (5, gammas),
            (6, ys),
            (7, sg),
        ];
        let slot0 = at.is_none().then(|| slot_zero(gpu));
        let batch = slot_entries(at, slot0.as_ref(), &mut entries, self.tokens);
        let key = ConvKey {
            paired: false,
            combine: true,
            batch,
        };
        let d = dispatch(
            gpu,
            &key,
            &params,
            &entries,
            grid(self.channels.div_ceil(64)),
        );
        Ok(Call::new(Label::op("moe_combine+short_conv"), vec![d])
            .owning(std::iter::once(none).chain(slot0)))
    }
}

/// The uniform of slot 0 at position 0 (calls bound without a [`SlotOf`]).
fn slot_zero(gpu: &Gpu) -> wgpu::Buffer {
    crate::gpu::call::uniform(gpu, "conv slot 0", &[0u32; 4])
}

/// Add the slot bindings of `at` (or of `slot0`) to `entries`; whether the call is batched.
fn slot_entries<'b>(
    at: Option<SlotOf<'b>>,
    slot0: Option<&'b wgpu::Buffer>,
    entries: &mut Vec<(u32, &'b wgpu::Buffer)>,
    tokens: u32,
) -> bool {
    match at {
        Some(SlotOf::Pos(p)) => {
            entries.push((9, &p.buffer));
            false
        }
        Some(SlotOf::Batch(seq)) => {
            assert!(
                seq.size() >= 16 * tokens as u64,
                "a decode batch's slot table holds fewer than {tokens} entries"
            );
            entries.push((10, seq));
            true
        }
        None => {
            entries.push((9, slot0.expect("slot 0 uniform")));
            false
        }
    }
}
