//! Per-format facts of the linear layer's kernels: the unit a GPU row is padded to, the
//! work-split type ([`Tuning`]) and the encodings that have a kernel.

use crate::formats::{Encoding, Format};

/// Columns per unit and `vec4<u32>` words per unit of a format's row in the GPU slab.
pub(crate) fn unit_shape(f: Format) -> (u32, u32) {
    match f {
        Format::F32 => (4, 1),
        Format::Bf16 => (8, 1),
        Format::Int4 | Format::Int4Grouped => (32, 1),
        Format::Int3G64 => (128, 3),
        _ => unreachable!("no kernel for {f}"),
    }
}

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

/// Every encoding with a GEMV kernel (all allowed group sizes), for validation and smoke runs.
pub fn kernel_encodings() -> Vec<Encoding> {
    let mut v = Vec::new();
    for s in crate::formats::REGISTRY.iter().filter(|s| s.gpu_kernel) {
        if s.format == Format::Int4Grouped {
            for &g in s.group_sizes {
                v.push(Encoding {
                    format: s.format,
                    group_size: g as usize,
                });
            }
        } else {
            let gs = if s.format == Format::Int3G64 { 64 } else { 0 };
            v.push(Encoding {
                format: s.format,
                group_size: gs,
            });
        }
    }
    v
}

/// Whether `enc` has a GEMM kernel: f32, bf16, int4 and int4-grouped. int3-g64 keeps the GEMV:
/// the GEMM's int3 decode reads the FORMATS.md bit order, not the GPU order of
/// [`crate::gpu::slab_layout`] that int3-g64 slabs are uploaded in.
pub fn supported(enc: Encoding) -> bool {
    matches!(
        enc.format,
        Format::F32 | Format::Bf16 | Format::Int4 | Format::Int4Grouped
    )
}
