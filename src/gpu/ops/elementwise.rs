//! Elementwise kernels (`wgsl/elementwise.wgsl`): silu·up, residual adds, scaling, MoE combine, argmax.

use super::{bind_group, grid, uniform_words, Bind, Dispatch, OpCall};
use crate::gpu::kernel::KernelSpec;
use crate::gpu::Gpu;

const SRC: &str = include_str!("../../../wgsl/elementwise.wgsl");

/// Every entry point of elementwise.wgsl with its bind layout.
const ENTRIES: &[(&str, &[(u32, Bind)])] = &[
    (
        "silu_mul",
        &[
            (0, Bind::Uniform),
            (1, Bind::Read),
            (2, Bind::Read),
            (5, Bind::Write),
        ],
    ),
    (
        "add",
        &[(0, Bind::Uniform), (1, Bind::Read), (5, Bind::Write)],
    ),
    (
        "add_scaled",
        &[
            (0, Bind::Uniform),
            (1, Bind::Read),
            (2, Bind::Read),
            (5, Bind::Write),
        ],
    ),
    ("scale", &[(0, Bind::Uniform), (5, Bind::Write)]),
    (
        "moe_combine",
        &[
            (0, Bind::Uniform),
            (1, Bind::Read),
            (2, Bind::Read),
            (3, Bind::Read),
            (4, Bind::Read),
            (5, Bind::Write),
        ],
    ),
    (
        "argmax_partial",
        &[
            (0, Bind::Uniform),
            (1, Bind::Read),
            (6, Bind::Write),
            (7, Bind::Write),
        ],
    ),
    (
        "argmax_partial_vec4",
        &[
            (0, Bind::Uniform),
            (11, Bind::Read),
            (6, Bind::Write),
            (7, Bind::Write),
        ],
    ),
    (
        "argmax_final",
        &[
            (0, Bind::Uniform),
            (8, Bind::Write),
            (9, Bind::Read),
            (10, Bind::Read),
        ],
    ),
];

/// The kernel of `entry` (one of [`ENTRIES`]).
fn spec(entry: &str) -> KernelSpec {
    let binds = ENTRIES
        .iter()
        .find(|e| e.0 == entry)
        .unwrap_or_else(|| unreachable!("elementwise.wgsl has no {entry}"))
        .1;
    KernelSpec::new(
        format!("elementwise/{entry}"),
        entry,
        binds,
        SRC.to_string(),
    )
}

/// Every kernel of elementwise.wgsl (one per entry point).
pub(crate) fn kernels() -> Vec<KernelSpec> {
    ENTRIES.iter().map(|e| spec(e.0)).collect()
}

fn elem_groups(n: u32) -> [u32; 3] {
    grid(n.div_ceil(256))
}

/// Where gate and up values live: element (r, i) of gate is `g[g_off + r·g_row_stride + i·g_elem_stride]`,
/// likewise for up.
#[derive(Clone, Copy, Debug)]
pub struct SiluMulLayout {
    pub g_off: u32,
    pub g_row_stride: u32,
    pub g_elem_stride: u32,
    pub u_off: u32,
    pub u_row_stride: u32,
    pub u_elem_stride: u32,
}

impl SiluMulLayout {
    /// Two separate contiguous buffers `[P, I]`.
    pub fn separate(i: u32) -> Self {
        SiluMulLayout {
            g_off: 0,
            g_row_stride: i,
            g_elem_stride: 1,
            u_off: 0,
            u_row_stride: i,
            u_elem_stride: 1,
        }
    }
    /// One `[P, 2I]` buffer, gate = first I columns, up = last I (bind it as both g and u).
    pub fn fused(i: u32) -> Self {
        SiluMulLayout {
            g_off: 0,
            g_row_stride: 2 * i,
            g_elem_stride: 1,
            u_off: i,
            u_row_stride: 2 * i,
            u_elem_stride: 1,
        }
    }
    /// One `[P, 2I]` buffer with gate/up interleaved (g0, u0, g1, u1, …).
    pub fn interleaved(i: u32) -> Self {
        SiluMulLayout {
            g_off: 0,
            g_row_stride: 2 * i,
            g_elem_stride: 2,
            u_off: 1,
            u_row_stride: 2 * i,
            u_elem_stride: 2,
        }
    }
}

/// Constructors for the elementwise calls. Sizes are element counts.
pub struct Elementwise;

#[allow(clippy::too_many_arguments)]
fn words(n: u32, a: u32, b: u32, c: u32, d: u32, e: u32, f: u32, g: u32, fc: f32) -> [u32; 12] {
    [n, a, b, c, d, e, f, g, fc.to_bits(), 0, 0, 0]
}

fn one(
    gpu: &Gpu,
    entry: &str,
    w: &[u32],
    bufs: &[(u32, &wgpu::Buffer)],
    groups: [u32; 3],
) -> OpCall {
    let pl = super::listed_pipeline(gpu, &spec(entry));
    let u = uniform_words(gpu, entry, w);
    let mut all = vec![(0u32, &u)];
    all.extend_from_slice(bufs);
    let bg = bind_group(gpu, entry, &pl, &all);
    OpCall {
        label: entry.into(),
        dispatches: vec![Dispatch {
            pipeline: pl,
            bind_group: bg,
            groups,
        }],
        owned: vec![u],
    }
}

impl Elementwise {
    /// `out[r·I + i] = silu(gate(r, i)) · up(r, i)` for `rows` × `i` elements; `out` f32 [rows, I].
    pub fn silu_mul(
        gpu: &Gpu,
        rows: u32,
        i: u32,
        layout: SiluMulLayout,
        g: &wgpu::Buffer,
        u: &wgpu::Buffer,
        out: &wgpu::Buffer,
    ) -> OpCall {
        let l = layout;
        let n = rows * i;
        if n > 0 {
            let (r1, i1) = (rows as u64 - 1, i as u64 - 1);
            let g_last = l.g_off as u64 + r1 * l.g_row_stride as u64 + i1 * l.g_elem_stride as u64;
            let u_last = l.u_off as u64 + r1 * l.u_row_stride as u64 + i1 * l.u_elem_stride as u64;
            super::need(g, g_last + 1, "silu_mul gate");
            super::need(u, u_last + 1, "silu_mul up");
            super::need(out, n as u64, "silu_mul out");
        }
        one(
            gpu,
            "silu_mul",
            &words(
                n,
                i,
                l.g_off,
                l.g_row_stride,
                l.g_elem_stride,
                l.u_off,
                l.u_row_stride,
                l.u_elem_stride,
                0.0,
            ),
            &[(1, g), (2, u), (5, out)],
            elem_groups(n),
        )
    }

    /// `x[i] += y[i]` for `n` elements.
    pub fn add(gpu: &Gpu, n: u32, x: &wgpu::Buffer, y: &wgpu::Buffer) -> OpCall {
        super::need(x, n as u64, "add x");
        super::need(y, n as u64, "add y");
        one(
            gpu,
            "add",
            &words(n, 0, 0, 0, 0, 0, 0, 0, 0.0),
            &[(1, y), (5, x)],
            elem_groups(n),
        )
    }

    /// `x[i] += s[s_idx] · y[i]` for `n` elements (`s` f32 buffer, e.g. a `global_scale` tensor).
    pub fn add_scaled(
        gpu: &Gpu,
        n: u32,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        s: &wgpu::Buffer,
        s_idx: u32,
    ) -> OpCall {
        super::need(x, n as u64, "add_scaled x");
        super::need(y, n as u64, "add_scaled y");
        super::need(s, s_idx as u64 + 1, "add_scaled s");
        one(
            gpu,
            "add_scaled",
            &words(n, s_idx, 0, 0, 0, 0, 0, 0, 0.0),
            &[(1, y), (2, s), (5, x)],
            elem_groups(n),
        )
    }

    /// `x[i] = x[i] / c` for `n` elements (the head's `logits_mup_width_multiplier`; a true division).
    pub fn div_const(gpu: &Gpu, n: u32, x: &wgpu::Buffer, c: f32) -> OpCall {
        super::need(x, n as u64, "div_const x");
        one(
            gpu,
            "scale",
            &words(n, 0, 0, 0, 0, 0, 0, 0, c),
            &[(5, x)],
            elem_groups(n),
        )
    }

    /// `x[i] = x[i] · c` for `n` elements.
    pub fn mul_const(gpu: &Gpu, n: u32, x: &wgpu::Buffer, c: f32) -> OpCall {
        super::need(x, n as u64, "mul_const x");
        one(
            gpu,
            "scale",
            &words(n, 1, 0, 0, 0, 0, 0, 0, c),
            &[(5, x)],
            elem_groups(n),
        )
    }

    /// MoE combine over `tokens` × `hidden`:
    /// `out[t,:] (= or +=) Σ_s wr·y[t·top_k+s, :] + Σ_j ws·ys[t·S+j, :]` where `wr = gammas[t·top_k+s]`
    /// if `weight_routed` else 1 and `ws = shared_gammas[t·S+j]` if `weight_shared` else 1.
    /// `shared` = `(ys [T·S, hidden], shared_gammas [T·S], S)` or `None`.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine(
        gpu: &Gpu,
        tokens: u32,
        hidden: u32,
        top_k: u32,
        y: &wgpu::Buffer,
        gammas: &wgpu::Buffer,
        weight_routed: bool,
        shared: Option<(&wgpu::Buffer, &wgpu::Buffer, u32)>,
        weight_shared: bool,
        accumulate: bool,
        out: &wgpu::Buffer,
    ) -> OpCall {
        let n = tokens * hidden;
        let dummy = super::dummy(gpu);
        let (ys, sg, ns) = match shared {
            Some((ys, sg, ns)) => (ys, sg, ns),
            None => (&dummy, &dummy, 0),
        };
        let (t, kk, nsu) = (tokens as u64, top_k as u64, ns as u64);
        super::need(y, t * kk * hidden as u64, "moe_combine y");
        super::need(
            gammas,
            if weight_routed { t * kk } else { 0 },
            "moe_combine gammas",
        );
        super::need(ys, t * nsu * hidden as u64, "moe_combine shared ys");
        super::need(
            sg,
            if weight_shared { t * nsu } else { 0 },
            "moe_combine shared gammas",
        );
        super::need(out, n as u64, "moe_combine out");
        let mut call = one(
            gpu,
            "moe_combine",
            &words(
                n,
                hidden,
                top_k,
                ns,
                weight_routed as u32,
                weight_shared as u32,
                accumulate as u32,
                0,
                0.0,
            ),
            &[(1, y), (2, gammas), (3, ys), (4, sg), (5, out)],
            elem_groups(n),
        );
        call.owned.push(dummy);
        call
    }
}

/// Greedy argmax over `vocab` f32 logits (ties → lowest index; NaNs never win), writing one u32 to
/// `out[out_idx]` (e.g. the ids buffer the next step's embedding reads). Two dispatches: partial maxima
/// over chunks of 1024 logits (four per invocation, one vec4 load when `vocab % 4 == 0`; ~200
/// workgroups for a 201k vocab), then one workgroup over the partials.
#[derive(Clone, Copy, Debug)]
pub struct Argmax {
    pub vocab: u32,
    pub out_idx: u32,
}

pub struct ArgmaxCall {
    pub call: OpCall,
}

impl ArgmaxCall {
    pub fn record(&self, encoder: &mut wgpu::CommandEncoder) {
        self.call.record(encoder);
    }
    pub fn record_in_pass(&self, pass: &mut wgpu::ComputePass<'_>) {
        self.call.record_in_pass(pass);
    }
    pub fn run(&self, gpu: &Gpu) {
        self.call.run(gpu);
    }
}

const CHUNK: u32 = 1024;

impl Argmax {
    pub fn bind(&self, gpu: &Gpu, logits: &wgpu::Buffer, out: &wgpu::Buffer) -> ArgmaxCall {
        self.bind_flagged(gpu, logits, out, None)
    }

    /// [`Argmax::bind`], and when `flag_idx` is given, `out[flag_idx]` is set to 1 if any of the
    /// logits is NaN or ±Inf (never cleared by the kernel: the run-time status word of
    /// `model::status`).
    pub fn bind_flagged(
        &self,
        gpu: &Gpu,
        logits: &wgpu::Buffer,
        out: &wgpu::Buffer,
        flag_idx: Option<u32>,
    ) -> ArgmaxCall {
        super::need(logits, self.vocab as u64, "argmax logits");
        let last = flag_idx.map_or(self.out_idx, |f| f.max(self.out_idx));
        super::need(out, last as u64 + 1, "argmax out");
        let parts = self.vocab.div_ceil(CHUNK).max(1);
        let pv = gpu.storage("argmax partial values", parts as u64 * 4);
        // indices, then one non-finite flag per partial
        let pi = gpu.storage("argmax partial indices", 2 * parts as u64 * 4);
        let flag1 = flag_idx.map_or(0, |f| f + 1);
        let u = uniform_words(
            gpu,
            "argmax params",
            &words(self.vocab, CHUNK, parts, self.out_idx, flag1, 0, 0, 0, 0.0),
        );
        // vocab % 4 == 0: the buffer holds whole vec4s up to the vocab (need() checked `vocab` floats)
        let vec4 = self.vocab.is_multiple_of(4);
        let (entry, input) = if vec4 {
            ("argmax_partial_vec4", 11)
        } else {
            ("argmax_partial", 1)
        };
        let p1 = super::listed_pipeline(gpu, &spec(entry));
        let p2 = super::listed_pipeline(gpu, &spec("argmax_final"));
        let b1 = bind_group(
            gpu,
            "argmax_partial",
            &p1,
            &[(0, &u), (input, logits), (6, &pv), (7, &pi)],
        );
        let b2 = bind_group(
            gpu,
            "argmax_final",
            &p2,
            &[(0, &u), (8, out), (9, &pv), (10, &pi)],
        );
        ArgmaxCall {
            call: OpCall {
                label: "argmax".into(),
                dispatches: vec![
                    Dispatch {
                        pipeline: p1,
                        bind_group: b1,
                        groups: grid(parts),
                    },
                    Dispatch {
                        pipeline: p2,
                        bind_group: b2,
                        groups: [1, 1, 1],
                    },
                ],
                owned: vec![u, pv, pi],
            },
        }
    }
}
