//! Two independent GEMVs in one dispatch: a pair of [`GemvKey`] instantiations, each over its own
//! slab, format, x, pairs and output, whose workgroups share one grid.
//!
//! # Why
//! Through wgpu every dispatch that writes a buffer written before gets a pipeline barrier, and on
//! NVIDIA a compute→compute barrier waits for all earlier work, so two consecutive GEMVs never
//! overlap, however little one of them has to do. The decode step has independent GEMVs that
//! would otherwise run back to back (the router and the shared experts' gate_up both read the
//! normed `h`; the shared experts' down and the routed gate_up read nothing of each other). Their
//! pair runs as one dispatch: the small one's workgroups fill the SMs the large one leaves idle,
//! and one barrier goes.
//!
//! # WGSL
//! Each half is its instantiation's WGSL without its entry point ([`gemv::wgsl_instantiation`]),
//! every module-scope name suffixed (`_a`, `_b`; [`suffixed`]) and the second half's bindings
//! moved up by [`B_BINDINGS`]. The pair's entry point sends workgroup `lin` to `gemv_body_a(lin)`
//! when `lin` is below half a's workgroup count (its `Params`: `n_pairs × row blocks`), else to
//! `gemv_body_b(lin − that)`: a uniform branch per workgroup, both decodes compiled in. Each half
//! computes exactly what it computes alone (the same body, the same sums in the same order);
//! workgroup memory is the two halves' together.
//!
//! # When
//! [`bind_pair`] fuses only what runs as one GEMV dispatch per half (the decode, not the GEMM of
//! a prefill, not a multi-dispatch slab), neither binding a buffer the other writes, on a device
//! with room for both halves' storage buffers and workgroup memory; otherwise it returns `None`
//! and the caller records the two calls.

use crate::formats::Encoding;
use crate::gpu::call::{entry, Call, Dispatch, Label};
use crate::gpu::dispatch::DispatchError;
use crate::gpu::kernel::{self, Bind, Kernel, KernelSpec};
use crate::gpu::linear::args::GemvArgs;
use crate::gpu::linear::format::kernel_encodings;
use crate::gpu::linear::gemv::{
    self, params_entry, workgroup_grid, GemvKey, GemvParams, Planned, PARAMS_BYTES,
};
use crate::gpu::linear::route::{self, direct_candidates, silu_tuning, tuning, LinearOptions};
use crate::gpu::linear::slab::GpuWeights;
use crate::gpu::Gpu;
use std::collections::HashSet;

/// The binding of half b's uniform; its other bindings follow at the same offset from its
/// instantiation's (half a uses bindings 0-11 at most).
pub const B_BINDINGS: u32 = 12;

/// `gemv-pair[{a}|{b}]`: the pipeline of two GEMV instantiations in one dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemvPairKey {
    pub a: GemvKey,
    pub b: GemvKey,
}

impl std::fmt::Display for GemvPairKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "gemv-pair[{}|{}]", self.a, self.b)
    }
}

impl GemvPairKey {
    /// Storage buffers of its bind-group layout: both halves'.
    pub fn storage_buffers(&self) -> u32 {
        self.a.storage_buffers() + self.b.storage_buffers()
    }

    /// Workgroup-memory bytes: both halves'.
    pub fn workgroup_bytes(&self) -> u64 {
        self.a.workgroup_bytes() + self.b.workgroup_bytes()
    }
}

impl Kernel for GemvPairKey {
    type Params = GemvParams;
    fn entry(&self) -> &'static str {
        "main"
    }
    /// Half a's bindings, then half b's moved up by [`B_BINDINGS`].
    fn bindings(&self) -> Vec<(u32, Bind)> {
        let mut v = self.a.bindings();
        v.extend(
            self.b
                .bindings()
                .into_iter()
                .map(|(b, k)| (b + B_BINDINGS, k)),
        );
        v
    }
    fn source(&self) -> String {
        pair_source(&self.a, &self.b)
    }
    fn subgroups(&self) -> bool {
        self.a.subgroups
    }
}

/// The WGSL of a pair: both halves ([`suffixed`]) and the entry point that splits the grid.
/// Panics when the halves differ in their reduction (one device builds both).
pub fn pair_source(a: &GemvKey, b: &GemvKey) -> String {
    assert_eq!(a.subgroups, b.subgroups, "one reduction for both halves");
    let mut out = format!("// gemv pair: a = {a}, b = {b}\n");
    out.push_str(&suffixed(&gemv::wgsl_instantiation(a, false), "_a", 0));
    out.push_str(&suffixed(
        &gemv::wgsl_instantiation(b, false),
        "_b",
        B_BINDINGS,
    ));
    let (builtins, v, sg) = if a.subgroups {
        (
            ",\n    @builtin(subgroup_id) sg_id: u32,\n    @builtin(subgroup_invocation_id) \
             sg_inv: u32,\n    @builtin(subgroup_size) sg_size: u32",
            "sg_id * sg_size + sg_inv",
            "sg_size",
        )
    } else {
        ("", "li", "0u")
    };
    out.push_str(&format!(
        "
// Workgroups [0, n_a) run half a, the rest half b (a uniform branch: lin is workgroup-uniform).
@compute @workgroup_size(256)
fn main(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>{builtins}
) {{
    let lin = wid.x + wid.y * nwg.x;
    let n_a = prm_a.n_pairs * (prm_a.row_blocks.x + prm_a.row_blocks.y);
    if (lin < n_a) {{
        gemv_body_a(lin, li, {v}, {sg});
    }} else {{
        gemv_body_b(lin - n_a, li, {v}, {sg});
    }}
}}
"
    ));
    out
}

/// `src` (WGSL without an entry point) with every name it declares at module scope (`fn`,
/// `const`, `var`, `struct`, `alias`, `override` at the start of a line, after any attributes)
/// followed by `suffix` wherever it is used (never after a `.`: a field), and every
/// `@binding(N)` moved to `@binding(N + offset)`. Comments are renamed alike (harmless).
pub fn suffixed(src: &str, suffix: &str, offset: u32) -> String {
    let names = module_names(src);
    let mut out = String::with_capacity(src.len() + 4096);
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_alphabetic() || c == b'_' {
            let j = ident_end(b, i);
            let word = &src[i..j];
            out.push_str(word);
            if names.contains(word) && (i == 0 || b[i - 1] != b'.') {
                out.push_str(suffix);
            }
            i = j;
        } else if c.is_ascii_digit() {
            let j = ident_end(b, i);
            out.push_str(&src[i..j]);
            i = j;
        } else if src[i..].starts_with("@binding(") {
            let start = i + "@binding(".len();
            let end = start + src[start..].find(')').expect("@binding(N)");
            let n: u32 = src[start..end].trim().parse().expect("a binding number");
            out.push_str(&format!("@binding({})", n + offset));
            i = end + 1;
        } else {
            let ch = src[i..].chars().next().expect("in bounds");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// End of the identifier or number that starts at byte `i`.
fn ident_end(b: &[u8], i: usize) -> usize {
    let mut j = i;
    while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
        j += 1;
    }
    j
}

/// The names `src` declares at module scope: lines that start without indentation with a
/// declaration keyword (after `@…` attributes), the name being the next identifier (after a
/// `var`'s `<…>`).
fn module_names(src: &str) -> HashSet<String> {
    let mut names = HashSet::new();
    for line in src.lines() {
        if line.starts_with([' ', '\t', '/', '}']) {
            continue;
        }
        let mut rest = line.trim_start();
        while let Some(r) = rest.strip_prefix('@') {
            // an attribute `@name(...)` or `@name`
            let end = r.find([' ', '(']).unwrap_or(r.len());
            rest = &r[end..];
            if let Some(r2) = rest.strip_prefix('(') {
                rest = &r2[r2.find(')').map_or(r2.len(), |k| k + 1)..];
            }
            rest = rest.trim_start();
        }
        for kw in ["fn ", "const ", "var", "struct ", "alias ", "override "] {
            if let Some(r) = rest.strip_prefix(kw) {
                let mut r = r.trim_start();
                if kw == "var" {
                    if let Some(r2) = r.strip_prefix('<') {
                        r = r2[r2.find('>').map_or(r2.len(), |k| k + 1)..].trim_start();
                    }
                }
                let n = ident_end(r.as_bytes(), 0);
                if n > 0 {
                    names.insert(r[..n].to_string());
                }
                break;
            }
        }
    }
    names
}

/// One half of a pair: a slab, its format's ordinal, the call's arguments and options.
pub struct Half<'a> {
    pub w: &'a GpuWeights,
    pub ordinal: u32,
    pub args: GemvArgs<'a>,
    pub opts: &'a LinearOptions,
}

/// The one GEMV dispatch `h` runs alone, or `None` when it runs as the GEMM or as more than one
/// dispatch. Errors: those of [`GpuWeights::bind`].
fn one_dispatch(gpu: &Gpu, h: &Half<'_>) -> Result<Option<Planned>, DispatchError> {
    match route::route(h.w, &h.args, h.opts) {
        route::Route::Gemm(_) => Ok(None),
        route::Route::Gemv(plans) => {
            let mut d = gemv::planned(gpu, h.w, h.ordinal, h.args, &plans)?;
            Ok((d.len() == 1 && plans.len() == 1).then(|| d.remove(0)))
        }
    }
}

/// Whether neither dispatch binds a buffer the other writes (its `read_write` bindings): then
/// their workgroups may run in any order.
fn independent(a: &Planned, b: &Planned) -> bool {
    // some buffer `w` writes is bound by `other`
    let clash = |w: &Planned, other: &Planned| {
        let kinds = w.key.bindings();
        w.buffers
            .iter()
            .filter(|(k, _)| kinds.contains(&(*k, Bind::Write)))
            .any(|(_, buf)| other.buffers.iter().any(|(_, o)| o == buf))
    };
    !clash(a, b) && !clash(b, a)
}

/// Both GEMVs as one dispatch (label `"gemv pair"`), or `None` when either runs as the GEMM or as
/// more than one dispatch, when one binds a buffer the other writes (the two calls in order are
/// then what the caller means), or when the device has no room for both halves' storage buffers,
/// uniforms or workgroup memory (the caller then records the two calls). Each half writes exactly
/// what its call alone writes. Errors: those of either call alone.
pub fn bind_pair(gpu: &Gpu, a: Half<'_>, b: Half<'_>) -> Result<Option<Call>, DispatchError> {
    let (Some(da), Some(db)) = (one_dispatch(gpu, &a)?, one_dispatch(gpu, &b)?) else {
        return Ok(None);
    };
    if !independent(&da, &db) {
        return Ok(None);
    }
    let key = GemvPairKey {
        a: da.key,
        b: db.key,
    };
    let l = &gpu.limits;
    let fits = key.a.subgroups == key.b.subgroups
        && key.storage_buffers() <= l.max_storage_buffers_per_shader_stage
        && 2 <= l.max_uniform_buffers_per_shader_stage
        && key.workgroup_bytes() <= l.max_compute_workgroup_storage_size as u64
        && B_BINDINGS + 11 < l.max_bindings_per_bind_group;
    if !fits {
        return Ok(None);
    }
    let align = PARAMS_BYTES.next_multiple_of(l.min_uniform_buffer_offset_alignment as u64);
    let params = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("gemv pair params"),
        size: 2 * align,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    gpu.queue
        .write_buffer(&params, 0, bytemuck::bytes_of(&da.params));
    gpu.queue
        .write_buffer(&params, align, bytemuck::bytes_of(&db.params));
    let pipeline = kernel::pipeline(gpu, &key);
    let mut entries = vec![params_entry(0, &params, 0)];
    entries.extend(da.buffers.iter().map(|(k, buf)| entry(*k, buf)));
    entries.push(params_entry(B_BINDINGS, &params, align));
    entries.extend(db.buffers.iter().map(|(k, buf)| entry(k + B_BINDINGS, buf)));
    let bg = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("gemv pair"),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &entries,
    });
    let groups = workgroup_grid(da.workgroups + db.workgroups)?;
    Ok(Some(
        Call::new(
            Label::op("gemv pair"),
            vec![Dispatch::from_parts(pipeline, bg, groups)],
        )
        .owning([params]),
    ))
}

/// Pair kernels for the translation tests: for each kernel encoding and reduction, the bf16
/// direct-x GEMV (the router, the shared down) with the encoding's default staged GEMV with the
/// silu·up epilogue, and the encoding's plain default GEMV with the bf16 one: every decode in the
/// suffixed form, in both halves; only those within `smem_limit` bytes of workgroup memory and
/// `storage_limit` storage buffers.
pub fn kernels(subgroups: bool, smem_limit: u64, storage_limit: u32) -> Vec<KernelSpec> {
    let bf16 = Encoding::BF16;
    let mut v = Vec::new();
    for sg in [false, true].into_iter().filter(|&sg| !sg || subgroups) {
        let direct = GemvKey::new(bf16, sg, direct_candidates()[0], 0, true);
        for enc in kernel_encodings() {
            let t = tuning(enc.format);
            let staged = GemvKey::new(enc, sg, t, 2048, false);
            if silu_tuning(t) {
                v.push(GemvPairKey {
                    a: direct,
                    b: staged.with_silu(true),
                });
            }
            v.push(GemvPairKey {
                a: staged,
                b: direct,
            });
        }
    }
    v.into_iter()
        .filter(|k| k.workgroup_bytes() <= smem_limit && k.storage_buffers() <= storage_limit)
        .map(|k| KernelSpec::of(&k))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names_and_only_they_are_suffixed() {
        let src = "const A: u32 = 1u;\n@group(0) @binding(3) var<storage, read> W: array<u32>;\n\
                   var<workgroup> red: array<f32, A>;\nstruct P { x: u32 }\n\
                   fn f(x: u32) -> u32 {\n    let y = p.red + A + W[x] + 0x1Au;\n    return y;\n}\n";
        let out = suffixed(src, "_b", 12);
        assert!(out.contains("const A_b: u32"), "{out}");
        assert!(out.contains("@binding(15) var<storage, read> W_b"), "{out}");
        assert!(
            out.contains("var<workgroup> red_b: array<f32, A_b>"),
            "{out}"
        );
        assert!(out.contains("struct P_b"), "{out}");
        assert!(out.contains("fn f_b(x: u32)"), "{out}");
        // a field after `.` keeps its name; locals and numbers are untouched
        assert!(
            out.contains("let y = p.red + A_b + W_b[x] + 0x1Au;"),
            "{out}"
        );
    }
}
