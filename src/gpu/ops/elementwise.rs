//! Elementwise kernels (`wgsl/elementwise.wgsl`): silu·up, scaling, argmax.

use super::dispatch;
use crate::gpu::call::{grid, need, BufferTooSmall, Call, Label};
use crate::gpu::kernel::{Bind, Kernel, KernelSpec};
use crate::gpu::Gpu;
use std::fmt;

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
    ("scale", &[(0, Bind::Uniform), (5, Bind::Write)]),
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

/// One entry point of elementwise.wgsl (one of [`ENTRIES`]). Label `elementwise/{entry}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ElementwiseKey(pub &'static str);

/// The `Params` of elementwise.wgsl. The WGSL names its fields by position (`a`..`g`); each entry
/// point reads them as the constructor of its params below says.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ElementwiseParams {
    /// Elements (silu_mul: P·I; scale: n; argmax: V).
    pub n: u32,
    pub a: u32,
    pub b: u32,
    pub c: u32,
    pub d: u32,
    pub e: u32,
    pub f: u32,
    pub g: u32,
    pub fc: f32,
    pub _p: [u32; 3],
}

impl ElementwiseParams {
    /// silu_mul over `n` elements of rows of `i`.
    fn silu_mul(n: u32, i: u32, l: SiluMulLayout) -> Self {
        ElementwiseParams {
            n,
            a: i,
            b: l.g_off,
            c: l.g_row_stride,
            d: l.g_elem_stride,
            e: l.u_off,
            f: l.u_row_stride,
            g: l.u_elem_stride,
            ..Default::default()
        }
    }
    /// `scale`: `a` = 0 divides by `fc`, 1 multiplies.
    fn scale(n: u32, multiply: bool, c: f32) -> Self {
        ElementwiseParams {
            n,
            a: multiply as u32,
            fc: c,
            ..Default::default()
        }
    }
    /// argmax: `a` = chunk, `b` = partials, `c` = out_idx, `d` = flag_idx + 1 (0: no flag).
    fn argmax(vocab: u32, parts: u32, out_idx: u32, flag1: u32) -> Self {
        ElementwiseParams {
            n: vocab,
            a: CHUNK,
            b: parts,
            c: out_idx,
            d: flag1,
            ..Default::default()
        }
    }
}

impl fmt::Display for ElementwiseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "elementwise/{}", self.0)
    }
}

impl Kernel for ElementwiseKey {
    type Params = ElementwiseParams;
    fn entry(&self) -> &'static str {
        self.0
    }
    fn bindings(&self) -> Vec<(u32, Bind)> {
        ENTRIES
            .iter()
            .find(|e| e.0 == self.0)
            .unwrap_or_else(|| unreachable!("elementwise.wgsl has no {}", self.0))
            .1
            .to_vec()
    }
    fn source(&self) -> String {
        SRC.to_string()
    }
}

/// Every kernel of elementwise.wgsl (one per entry point).
pub(crate) fn kernels() -> Vec<KernelSpec> {
    ENTRIES
        .iter()
        .map(|e| KernelSpec::of(&ElementwiseKey(e.0)))
        .collect()
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

/// One dispatch of `entry` over `n` elements, as a call labelled `entry`.
fn one(
    gpu: &Gpu,
    entry: &'static str,
    params: ElementwiseParams,
    bufs: &[(u32, &wgpu::Buffer)],
) -> Call {
    let d = dispatch(
        gpu,
        &ElementwiseKey(entry),
        &params,
        bufs,
        elem_groups(params.n),
    );
    Call::new(Label::op(entry), vec![d])
}

/// `out[r·I + i] = silu(gate(r, i)) · up(r, i)` for `rows` × `i` elements. Label `"silu_mul"`.
#[derive(Clone, Copy, Debug)]
pub struct SiluMul {
    pub rows: u32,
    pub i: u32,
    pub layout: SiluMulLayout,
}

impl SiluMul {
    /// `g`, `u` f32 as `layout` says, `out` f32 [rows, I].
    pub fn bind(
        &self,
        gpu: &Gpu,
        g: &wgpu::Buffer,
        u: &wgpu::Buffer,
        out: &wgpu::Buffer,
    ) -> Result<Call, BufferTooSmall> {
        let (l, i) = (self.layout, self.i);
        let n = self.rows * i;
        if n > 0 {
            let (r1, i1) = (self.rows as u64 - 1, i as u64 - 1);
            let g_last = l.g_off as u64 + r1 * l.g_row_stride as u64 + i1 * l.g_elem_stride as u64;
            let u_last = l.u_off as u64 + r1 * l.u_row_stride as u64 + i1 * l.u_elem_stride as u64;
            need(g, g_last + 1, "silu_mul gate")?;
            need(u, u_last + 1, "silu_mul up")?;
            need(out, n as u64, "silu_mul out")?;
        }
        Ok(one(
            gpu,
            "silu_mul",
            ElementwiseParams::silu_mul(n, i, l),
            &[(1, g), (2, u), (5, out)],
        ))
    }
}

/// `x[i] = x[i] / c` for `n` elements (the head's `logits_mup_width_multiplier`; a true
/// division). Label `"scale"`.
#[derive(Clone, Copy, Debug)]
pub struct DivConst {
    pub n: u32,
    pub c: f32,
}

impl DivConst {
    /// `x` f32 [n], in place.
    pub fn bind(&self, gpu: &Gpu, x: &wgpu::Buffer) -> Result<Call, BufferTooSmall> {
        scale(gpu, self.n, self.c, false, x, "div_const x")
    }
}

/// `x[i] = x[i] · c` for `n` elements. Label `"scale"`.
#[derive(Clone, Copy, Debug)]
pub struct MulConst {
    pub n: u32,
    pub c: f32,
}

impl MulConst {
    /// `x` f32 [n], in place.
    pub fn bind(&self, gpu: &Gpu, x: &wgpu::Buffer) -> Result<Call, BufferTooSmall> {
        scale(gpu, self.n, self.c, true, x, "mul_const x")
    }
}

/// The `scale` entry point: `x[i] · c` when `multiply`, else `x[i] / c`.
fn scale(
    gpu: &Gpu,
    n: u32,
    c: f32,
    multiply: bool,
    x: &wgpu::Buffer,
    what: &'static str,
) -> Result<Call, BufferTooSmall> {
    need(x, n as u64, what)?;
    let params = ElementwiseParams::scale(n, multiply, c);
    Ok(one(gpu, "scale", params, &[(5, x)]))
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

/// Logits per partial maximum.
const CHUNK: u32 = 1024;

impl Argmax {
    /// Label `"argmax"`.
    pub fn bind(
        &self,
        gpu: &Gpu,
        logits: &wgpu::Buffer,
        out: &wgpu::Buffer,
    ) -> Result<Call, BufferTooSmall> {
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
    ) -> Result<Call, BufferTooSmall> {
        need(logits, self.vocab as u64, "argmax logits")?;
        let last = flag_idx.map_or(self.out_idx, |f| f.max(self.out_idx));
        need(out, last as u64 + 1, "argmax out")?;
        let parts = self.vocab.div_ceil(CHUNK).max(1);
        let pv = gpu.storage("argmax partial values", parts as u64 * 4);
        // indices, then one non-finite flag per partial
        let pi = gpu.storage("argmax partial indices", 2 * parts as u64 * 4);
        let flag1 = flag_idx.map_or(0, |f| f + 1);
        let params = ElementwiseParams::argmax(self.vocab, parts, self.out_idx, flag1);
        // vocab % 4 == 0: the buffer holds whole vec4s up to the vocab (need() checked `vocab` floats)
        let vec4 = self.vocab.is_multiple_of(4);
        let (entry, input) = if vec4 {
            ("argmax_partial_vec4", 11)
        } else {
            ("argmax_partial", 1)
        };
        let partial = dispatch(
            gpu,
            &ElementwiseKey(entry),
            &params,
            &[(input, logits), (6, &pv), (7, &pi)],
            grid(parts),
        );
        let fin = dispatch(
            gpu,
            &ElementwiseKey("argmax_final"),
            &params,
            &[(8, out), (9, &pv), (10, &pi)],
            [1, 1, 1],
        );
        Ok(Call::new(Label::op("argmax"), vec![partial, fin]).owning([pv, pi]))
    }
}
