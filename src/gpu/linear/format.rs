//! Per-format facts of the linear layer: one [`KernelFormat`] row per weight format with a GPU
//! kernel ([`KERNEL_FORMATS`]), read by the slab (unit padding, bit order), the routing (tunings,
//! direct x, GEMM support) and the kernels. Adding a kernel format is one row here plus its
//! registry entry (`gpu_kernel: true`) and its decode in `wgsl/gemv.wgsl` (and `wgsl/gemm.wgsl`
//! when `gemm`).

use crate::formats::{Encoding, Format};

/// Work split of one instantiation: threads per row (`tpr`, THREADS_PER_ROW in the WGSL, a power
/// of two ≤ 256) and rows per thread (`rpt`, ROWS_PER_THREAD: rows sharing every x load).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tuning {
    pub tpr: u32,
    pub rpt: u32,
}

impl Tuning {
    /// Rows per workgroup (ROWS_PER_WORKGROUP): (256 / tpr) thread groups × rpt rows.
    pub fn rows_per_workgroup(self) -> u32 {
        (256 / self.tpr) * self.rpt
    }
}

/// What the linear layer knows about one kernel format.
#[derive(Clone, Copy, Debug)]
pub struct KernelFormat {
    pub format: Format,
    /// Columns per unit: a GPU row is padded to whole units and the kernels decode a unit per
    /// 16-byte word group.
    pub cols_per_unit: u32,
    /// `vec4<u32>` words (16 bytes) per unit.
    pub words_per_unit: u32,
    /// Weights with scales, decoded from per-unit word arrays (`UNIT_ARRAYS` in the WGSL): x is
    /// always staged and long hot loops prefetch.
    pub quantised: bool,
    /// The staged-x tunings, most rows per workgroup first; the first is the format's default
    /// (BENCHMARKS.md#decision-gemv-tunings).
    pub tunings: &'static [Tuning],
    /// Fewest workgroups (pairs × row blocks) a call must launch to take the tuning of the same
    /// index in [`KernelFormat::tunings`] (`route::plan` takes the first that reaches its
    /// minimum, else the last tuning; the last entry is never consulted).
    pub min_workgroups: &'static [u64],
    /// The GEMV may read x straight from global memory (`XDIRECT`) when x is aligned.
    pub direct_x: bool,
    /// The prefill GEMM has a decode for it (every format of the table today; a new format can
    /// start on the GEMV alone).
    pub gemm: bool,
    /// Slab bytes are stored with their bits in the GPU order of
    /// [`crate::gpu::linear::slab_layout`] (same bytes per group, other bit positions).
    pub gpu_bit_order: bool,
    /// In a MoE decode layer with shared experts, the routed GEMV of this format that the shared
    /// experts' down runs beside, in one dispatch (BENCHMARKS.md#decision-gemv-pairs).
    pub shared_down_beside: RoutedGemv,
    /// Fewest pairs per used expert (`P / min(E, P)`; the tokens of a dense linear) from which
    /// `route::select` runs a call as the GEMM; below it the GEMV (BENCHMARKS.md#decision-min-pairs).
    pub gemm_min_pairs: u32,
}

/// The GEMM threshold of f32, bf16 and the int4 family ([`KernelFormat::gemm_min_pairs`]).
pub const MIN_PAIRS_PER_EXPERT: u32 = 9;

/// The largest [`KernelFormat::gemm_min_pairs`] of the table: a prompt of this many pairs per
/// expert runs every format's GEMM.
pub const fn max_gemm_min_pairs() -> u32 {
    let mut m = 0;
    let mut i = 0;
    while i < KERNEL_FORMATS.len() {
        if KERNEL_FORMATS[i].gemm_min_pairs > m {
            m = KERNEL_FORMATS[i].gemm_min_pairs;
        }
        i += 1;
    }
    m
}

/// One of the two routed-expert GEMVs of a MoE decode layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoutedGemv {
    /// `gate_up` with its silu·up epilogue.
    GateUp,
    /// `down`.
    Down,
}

const fn t(tpr: u32, rpt: u32) -> Tuning {
    Tuning { tpr, rpt }
}

/// The int4 family's staged tunings and their workgroup minimums: 8 × 4 (128 rows per workgroup)
/// from 384 workgroups, 8 × 2 (64) from 96, 32 × 2 (16) from 256, then one row per thread down to
/// 256 × 1 (BENCHMARKS.md#decision-gemv-tunings: within 12% of the best of ten tunings at every
/// `bench kernels` shape on an H200, and the tail for the few-row matrices).
const INT4_TUNINGS: &[Tuning] = &[t(8, 4), t(8, 2), t(32, 2), t(64, 1), t(128, 1), t(256, 1)];
const INT4_MIN_WORKGROUPS: &[u64] = &[384, 96, 256, 256, 256, 0];
/// The staged tunings of f32 and bf16 (used when x is not aligned for direct reads), each from
/// 256 workgroups.
const GENERIC_TUNINGS: &[Tuning] = &[
    t(16, 4),
    t(32, 4),
    t(32, 2),
    t(32, 1),
    t(64, 1),
    t(128, 1),
    t(256, 1),
];
const GENERIC_MIN_WORKGROUPS: &[u64] = &[256, 256, 256, 256, 256, 256, 0];
/// int3-g64's staged tunings (one row per thread: three words per unit; two rows per thread
/// spill) and their minimums: 4 × 1 (64 rows per workgroup) from 96 workgroups, 16 × 1 from 96,
/// then 64 × 1 down to 256 × 1 from 256 (BENCHMARKS.md#decision-gemv-tunings: within 8% of the
/// best of nine tunings at every shape).
const INT3_TUNINGS: &[Tuning] = &[t(4, 1), t(16, 1), t(64, 1), t(128, 1), t(256, 1)];
const INT3_MIN_WORKGROUPS: &[u64] = &[96, 96, 256, 256, 0];

/// One row per format with a GPU kernel (the registry's `gpu_kernel` formats).
pub const KERNEL_FORMATS: &[KernelFormat] = &[
    KernelFormat {
        format: Format::F32,
        cols_per_unit: 4,
        words_per_unit: 1,
        quantised: false,
        tunings: GENERIC_TUNINGS,
        min_workgroups: GENERIC_MIN_WORKGROUPS,
        direct_x: true,
        gemm: true,
        gpu_bit_order: false,
        shared_down_beside: RoutedGemv::Down,
        gemm_min_pairs: MIN_PAIRS_PER_EXPERT,
    },
    KernelFormat {
        format: Format::Bf16,
        cols_per_unit: 8,
        words_per_unit: 1,
        quantised: false,
        tunings: GENERIC_TUNINGS,
        min_workgroups: GENERIC_MIN_WORKGROUPS,
        direct_x: true,
        gemm: true,
        gpu_bit_order: false,
        shared_down_beside: RoutedGemv::Down,
        gemm_min_pairs: MIN_PAIRS_PER_EXPERT,
    },
    KernelFormat {
        format: Format::Int4Grouped,
        cols_per_unit: 32,
        words_per_unit: 1,
        quantised: true,
        tunings: INT4_TUNINGS,
        min_workgroups: INT4_MIN_WORKGROUPS,
        direct_x: false,
        gemm: true,
        gpu_bit_order: false,
        shared_down_beside: RoutedGemv::Down,
        gemm_min_pairs: MIN_PAIRS_PER_EXPERT,
    },
    KernelFormat {
        format: Format::Int3G64,
        cols_per_unit: 128,
        words_per_unit: 3,
        quantised: true,
        tunings: INT3_TUNINGS,
        min_workgroups: INT3_MIN_WORKGROUPS,
        direct_x: false,
        gemm: true,
        gpu_bit_order: true,
        shared_down_beside: RoutedGemv::GateUp,
        gemm_min_pairs: 14,
    },
    KernelFormat {
        format: Format::Int4,
        cols_per_unit: 32,
        words_per_unit: 1,
        quantised: true,
        tunings: INT4_TUNINGS,
        min_workgroups: INT4_MIN_WORKGROUPS,
        direct_x: false,
        gemm: true,
        gpu_bit_order: false,
        shared_down_beside: RoutedGemv::Down,
        gemm_min_pairs: MIN_PAIRS_PER_EXPERT,
    },
];

/// The row of `f`, or `None` when `f` has no GPU kernel.
pub fn lookup(f: Format) -> Option<&'static KernelFormat> {
    KERNEL_FORMATS.iter().find(|k| k.format == f)
}

/// The row of `f`. Panics when `f` has no GPU kernel: callers hold a [`crate::gpu::linear::GpuWeights`]
/// or an encoding of [`kernel_encodings`], and a slab is only uploaded for a format that
/// `dispatch::resolve` accepts (the registry's `gpu_kernel` formats, exactly the table's rows;
/// a unit test checks both lists agree).
pub fn row(f: Format) -> &'static KernelFormat {
    lookup(f).unwrap_or_else(|| panic!("no GPU kernel for {f} (not in KERNEL_FORMATS)"))
}

/// Columns per unit and `vec4<u32>` words per unit of a format's row in the GPU slab ([`row`]).
pub(crate) fn unit_shape(f: Format) -> (u32, u32) {
    let r = row(f);
    (r.cols_per_unit, r.words_per_unit)
}

/// Every encoding with a GEMV kernel, for validation and smoke runs: each [`KERNEL_FORMATS`]
/// row in registry order with each group size the registry allows (group size 0 for the
/// formats without groups).
pub fn kernel_encodings() -> Vec<Encoding> {
    let mut v = Vec::new();
    for s in crate::formats::REGISTRY
        .iter()
        .filter(|s| lookup(s.format).is_some())
    {
        if s.group_sizes.is_empty() {
            v.push(Encoding {
                format: s.format,
                group_size: 0,
            });
        }
        for &g in s.group_sizes {
            v.push(Encoding {
                format: s.format,
                group_size: g as usize,
            });
        }
    }
    v
}

/// The distinct encodings of (encoding, columns) `shapes`, in first-seen order.
pub fn encodings_of(shapes: &[(Encoding, usize)]) -> Vec<Encoding> {
    let mut encs: Vec<Encoding> = Vec::new();
    for &(e, _) in shapes {
        if !encs.contains(&e) {
            encs.push(e);
        }
    }
    encs
}

/// Whether `enc` has a GEMM kernel ([`KernelFormat::gemm`]: every kernel format).
pub fn supported(enc: Encoding) -> bool {
    lookup(enc.format).is_some_and(|r| r.gemm)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table's formats are exactly the registry's `gpu_kernel` formats (what
    /// `dispatch::resolve` accepts), so [`row`] never panics for an uploaded slab.
    #[test]
    fn table_matches_registry() {
        for s in crate::formats::REGISTRY {
            assert_eq!(lookup(s.format).is_some(), s.gpu_kernel, "{}", s.format);
        }
        for r in KERNEL_FORMATS {
            assert!(!r.tunings.is_empty() && r.words_per_unit >= 1);
            assert_eq!(r.tunings.len(), r.min_workgroups.len(), "{}", r.format);
            assert_eq!(r.direct_x, !r.quantised, "{}", r.format);
        }
    }
}
