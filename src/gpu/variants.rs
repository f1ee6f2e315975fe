//! Every compute kernel the engine can build, as [`KernelSpec`]s (pipeline key, WGSL, entry point,
//! bind layout), from the code's own variant lists: the GEMV's kernel encodings (the format
//! registry) × reductions × tunings × x tiles × x variants ([`gemv::kernels`]), every op kernel
//! variant ([`ops::kernels`]) and the copy kernel of `bench copy`. `inkling-wgpu shaders` writes
//! them; the tests translate each to MSL, HLSL and SPIR-V. [`check_device`] refuses a device whose
//! limits cannot hold them, naming the limit.

use crate::gpu::kernel::KernelSpec;
use crate::gpu::limits::LimitProfile;
use crate::gpu::linear::format::{kernel_encodings, Tuning};
use crate::gpu::linear::route::{candidates, tuning, TILES};
use crate::gpu::linear::{gemm, gemv};
use crate::gpu::{ops, timing, Gpu};

/// `bench copy`'s kernel (its pipeline uses the layout wgpu derives from the WGSL).
pub fn bench_copy() -> KernelSpec {
    KernelSpec::of(&timing::CopyKey)
}

/// Every kernel the engine can build on a device of `profile` (`None`: any device, i.e. every
/// x tile up to 16384 columns and both reductions), GEMV first, in a fixed order. Keys are unique.
pub fn all(profile: Option<LimitProfile>) -> Vec<KernelSpec> {
    let smem = profile
        .and_then(|p| p.limits())
        .map_or(u64::MAX, |l| l.max_compute_workgroup_storage_size as u64);
    let subgroups = profile.is_none_or(|p| p.subgroups());
    let mut v = gemv::kernels(smem, subgroups);
    v.extend(gemm::kernels());
    v.extend(ops::kernels());
    v.push(bench_copy());
    v
}

/// A device limit that a kernel of the engine exceeds.
#[derive(Debug, thiserror::Error)]
#[error(
    "kernel {kernel} needs {need} {what}, but this device allows {have} \
     (wgpu limit `{limit}`{profile}); the engine cannot run on it"
)]
pub struct LimitError {
    /// The pipeline key.
    pub kernel: String,
    /// What is counted (e.g. "storage buffers in one bind group").
    pub what: &'static str,
    pub need: u64,
    pub have: u64,
    /// The `wgpu::Limits` field.
    pub limit: &'static str,
    /// `", limit profile NAME"` when the device is clamped to a profile.
    pub profile: String,
}

/// Check the limits every kernel depends on against `gpu`'s: storage and uniform buffers per
/// stage of every op kernel, of the GEMV layout (shared by all GEMV kernels) and of the GEMM and
/// its grouping pass, and the workgroup memory of every GEMV tuning at its smallest x tile (512
/// columns). The op kernels' workgroup memory (under 10 KiB each), the GEMM's (under 12.3 KiB)
/// and their workgroup sizes (≤ 256) are within WebGPU's defaults, which the translation tests
/// check with naga.
pub fn check_device(gpu: &Gpu) -> Result<(), LimitError> {
    check_limits(&gpu.limits, gpu.profile)
}

/// [`check_device`] for a device with `limits`.
pub fn check_limits(
    limits: &wgpu::Limits,
    profile: Option<LimitProfile>,
) -> Result<(), LimitError> {
    let err = |kernel: &str, what, need: u64, have: u64, limit| LimitError {
        kernel: kernel.to_string(),
        what,
        need,
        have,
        limit,
        profile: profile
            .map(|p| format!(", limit profile {p}"))
            .unwrap_or_default(),
    };
    let encs = kernel_encodings();
    let mut specs = ops::kernels();
    let t = tuning(encs[0].format);
    specs.push(KernelSpec::of(&gemv::GemvKey::new(
        encs[0], false, t, 512, false,
    )));
    specs.push(KernelSpec::of(&gemm::GemmKey::new(encs[0], TILES[0])));
    specs.push(KernelSpec::of(&gemm::SortKey(TILES[0])));
    for s in &specs {
        let (sb, ub) = (s.storage_buffers(), s.uniform_buffers());
        if sb > limits.max_storage_buffers_per_shader_stage {
            return Err(err(
                &s.key,
                "storage buffers in one bind group",
                sb as u64,
                limits.max_storage_buffers_per_shader_stage as u64,
                "max_storage_buffers_per_shader_stage",
            ));
        }
        if ub > limits.max_uniform_buffers_per_shader_stage {
            return Err(err(
                &s.key,
                "uniform buffers in one bind group",
                ub as u64,
                limits.max_uniform_buffers_per_shader_stage as u64,
                "max_uniform_buffers_per_shader_stage",
            ));
        }
    }
    let smem = limits.max_compute_workgroup_storage_size as u64;
    for enc in encs {
        for &t in candidates(enc.format) {
            let need = gemv::workgroup_bytes(enc.format, t, 512, false);
            if need > smem {
                let Tuning { tpr, rpt } = t;
                return Err(err(
                    &format!("gemv {} {tpr}x{rpt}", enc.spelling()),
                    "bytes of workgroup memory",
                    need,
                    smem,
                    "max_compute_workgroup_storage_size",
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique_and_profiles_only_drop_kernels() {
        let every = all(None);
        let keys: std::collections::HashSet<&str> = every.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(keys.len(), every.len(), "duplicate pipeline keys");
        for p in LimitProfile::ALL {
            let sub = all(Some(p));
            assert!(sub.len() < every.len(), "{p}");
            assert!(sub.iter().all(|s| keys.contains(s.key.as_str())), "{p}");
            assert_eq!(sub.iter().any(|s| s.subgroups), p.subgroups(), "{p}");
        }
    }

    #[test]
    fn webgpu_defaults_cannot_bind_the_fused_residual_kernel() {
        let e = check_limits(&wgpu::Limits::default(), Some(LimitProfile::WebGpu)).unwrap_err();
        assert_eq!(e.limit, "max_storage_buffers_per_shader_stage");
        assert_eq!((e.need, e.have), (9, 8));
        assert!(e.kernel.starts_with("residual/sconv_rms_norm/"), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("limit profile webgpu"), "{msg}");
        check_limits(&crate::gpu::limits::apple_m1_limits(), None).unwrap();
    }
}
