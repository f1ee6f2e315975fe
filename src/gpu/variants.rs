//! Every compute kernel the engine can build, as [`KernelSpec`]s (pipeline key, WGSL, entry point,
//! bind layout), from the code's own variant lists: the GEMV's kernel encodings (the format
//! registry) × reductions × tunings × x tiles × x variants ([`gemv::kernels`]), every op kernel
//! variant ([`ops::kernels`]) and the copy kernel of `bench copy`. `inkling-wgpu shaders` writes
//! them; the tests translate each to MSL, HLSL and SPIR-V. [`check_device`] refuses a device whose
//! limits cannot hold a kernel that a model's options reach, naming the op, the kernel and the limit.

use crate::formats::Encoding;
use crate::gpu::kernel::KernelSpec;
use crate::gpu::limits::LimitProfile;
use crate::gpu::linear::format::{encodings_of, kernel_encodings, Tuning};
use crate::gpu::linear::route::{candidates, silu_tuning, tuning, TILES};
use crate::gpu::linear::{gemm, gemv, gemv_pair};
use crate::gpu::{ops, timing, Gpu};

/// `bench copy`'s kernel (its pipeline uses the layout wgpu derives from the WGSL).
pub fn bench_copy() -> KernelSpec {
    KernelSpec::of(&timing::CopyKey)
}

/// Every kernel the engine can build on a device of `profile` (`None`: any device, i.e. every
/// x tile up to 16384 columns and both reductions), GEMV first, then GEMV pairs (a sample: a
/// pair is two listed GEMVs, [`gemv_pair`], and every format's decode is in one), in a fixed
/// order. Keys are unique.
pub fn all(profile: Option<LimitProfile>) -> Vec<KernelSpec> {
    let (smem, storage, subgroups) = device_limits(profile);
    let mut v = gemv::kernels(smem, subgroups);
    v.extend(gemv_pair::kernels(subgroups, smem, storage));
    with_ops(v, gemm::kernels())
}

/// The kernels of [`all`] that a model whose matrices have these (encoding, columns) `shapes`
/// (`crate::model::Weights::linear_shapes`) can build on a device of `profile`: the GEMV variants
/// of [`gemv::kernels_for`], the GEMM of its encodings, the op kernels of both attention paths
/// and `bench copy`'s kernel. Every kernel such a model builds is in it, a GEMV pair as its two
/// halves (tested); a device without room for a pair runs the halves apart, so pairs are never
/// a requirement of the device check.
pub fn for_model(shapes: &[(Encoding, usize)], profile: Option<LimitProfile>) -> Vec<KernelSpec> {
    let (smem, _, subgroups) = device_limits(profile);
    with_ops(
        gemv::kernels_for(shapes, smem, subgroups),
        gemm::kernels_for(&encodings_of(shapes)),
    )
}

/// Workgroup-memory bytes, storage buffers per shader stage and subgroup support of a device of
/// `profile` (`None`: any device).
fn device_limits(profile: Option<LimitProfile>) -> (u64, u32, bool) {
    let limits = profile.and_then(|p| p.limits());
    let smem = limits
        .as_ref()
        .map_or(u64::MAX, |l| l.max_compute_workgroup_storage_size as u64);
    let storage = limits
        .as_ref()
        .map_or(u32::MAX, |l| l.max_storage_buffers_per_shader_stage);
    (smem, storage, profile.is_none_or(|p| p.subgroups()))
}

/// `gemv` then `gemm`, then every op kernel, the streamed uploads' int3-g64 reorder and `bench
/// copy`'s.
fn with_ops(mut v: Vec<KernelSpec>, gemm: Vec<KernelSpec>) -> Vec<KernelSpec> {
    v.extend(gemm);
    v.extend(ops::kernels());
    v.push(KernelSpec::of(&crate::gpu::linear::staging::Int3RepackKey));
    v.push(bench_copy());
    v
}

/// A device limit that a kernel an op builds exceeds.
#[derive(Debug, thiserror::Error)]
#[error(
    "op {op}: kernel {kernel} needs {need} {what}, but this device allows {have} \
     (wgpu limit `{limit}`{profile}); the model cannot run on it"
)]
pub struct LimitError {
    /// The operation (the label of its calls, e.g. `"attention fused"`, `"gemv"`).
    pub op: String,
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

/// Check the kernels a model with the fused attention (`fused_attention`) or its oracle builds
/// against `gpu`'s limits, op by op (see [`check_limits`]).
pub fn check_device(gpu: &Gpu, fused_attention: bool) -> Result<(), LimitError> {
    check_limits(&gpu.limits, gpu.profile, fused_attention)
}

/// [`check_device`] for a device with `limits`: storage and uniform buffers per stage of every op
/// kernel the decoder's steps reach ([`ops::decoder_kernels`]), of the GEMV layout (shared by all
/// GEMV kernels) and of the GEMM and its grouping pass, and the workgroup memory of every GEMV
/// tuning at its smallest x tile (512 columns). The op kernels' workgroup memory (under 10 KiB
/// each), the GEMM's (under 12.3 KiB) and their workgroup sizes (≤ 256) are within WebGPU's
/// defaults, which the translation tests check with naga. Errors: the first op whose kernel
/// exceeds a limit, naming the op, the kernel and the limit.
pub fn check_limits(
    limits: &wgpu::Limits,
    profile: Option<LimitProfile>,
    fused_attention: bool,
) -> Result<(), LimitError> {
    let err = |op: &str, kernel: &str, what, need: u64, have: u64, limit| LimitError {
        op: op.to_string(),
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
    let mut specs = ops::decoder_kernels(fused_attention);
    let t = tuning(encs[0].format);
    let gemv_layout = gemv::GemvKey::new(encs[0], false, t, 512, false);
    specs.push(("gemv", KernelSpec::of(&gemv_layout)));
    let gemm_key = gemm::GemmKey::new(encs[0], TILES[0]);
    specs.push(("gemm", KernelSpec::of(&gemm_key)));
    specs.push(("gemm", KernelSpec::of(&gemm::SortKey::of(TILES[0]))));
    for (op, s) in &specs {
        let (sb, ub) = (s.storage_buffers(), s.uniform_buffers());
        if sb > limits.max_storage_buffers_per_shader_stage {
            return Err(err(
                op,
                &s.key,
                "storage buffers in one bind group",
                sb as u64,
                limits.max_storage_buffers_per_shader_stage as u64,
                "max_storage_buffers_per_shader_stage",
            ));
        }
        if ub > limits.max_uniform_buffers_per_shader_stage {
            return Err(err(
                op,
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
            let need = gemv::workgroup_bytes(enc.format, t, 512, false, silu_tuning(t));
            if need > smem {
                let Tuning { tpr, rpt } = t;
                return Err(err(
                    "gemv",
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
    fn webgpu_defaults_hold_every_kernel_the_decoder_reaches() {
        for fused_attention in [true, false] {
            let webgpu = Some(LimitProfile::WebGpu);
            check_limits(&wgpu::Limits::default(), webgpu, fused_attention).unwrap();
            check_limits(
                &crate::gpu::limits::apple_m1_limits(),
                None,
                fused_attention,
            )
            .unwrap();
        }
    }

    #[test]
    fn an_op_over_a_limit_is_named_with_its_kernel_and_the_limit() {
        let limits = wgpu::Limits {
            max_storage_buffers_per_shader_stage: 7,
            ..Default::default()
        };
        let e = check_limits(&limits, Some(LimitProfile::WebGpu), false).unwrap_err();
        assert_eq!(e.limit, "max_storage_buffers_per_shader_stage");
        assert_eq!((e.need, e.have), (8, 7));
        assert_eq!(e.op, "attention");
        assert!(e.kernel.starts_with("attention/attn/"), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("op attention: kernel attention/attn/")
                && msg.contains("limit profile webgpu"),
            "{msg}"
        );
        let e = check_limits(&limits, None, true).unwrap_err();
        assert_eq!(e.op, "attention prologue+attention", "{e}");
    }
}
