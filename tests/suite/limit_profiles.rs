//! The GEMV parity and the model reference tests on lavapipe clamped to each limit profile
//! (`gpu::limits`): Apple M1-class limits through wgpu's Metal backend, the WebGPU defaults, no
//! subgroups. A profile that cannot hold the model must refuse it with an error naming the wgpu
//! limit (the WebGPU defaults allow 8 storage buffers per stage; the fused residual kernel binds 9).
use crate::gemv_parity::parity_every_format;
use crate::model_common::*;
use inkling_wgpu::gpu::limits::LimitProfile;
use inkling_wgpu::gpu::Gpu;
use inkling_wgpu::model::{Checkpoint, GpuModel, GpuModelOptions, Weights};

/// The GPU clamped to `p`, or a clear failure (never a skip).
fn profile_gpu(p: LimitProfile) -> Gpu {
    let gpu = Gpu::with_profile(Some(p)).unwrap_or_else(|e| {
        panic!("limit-profile tests need a GPU adapter (lavapipe on CI) and none opened: {e}")
    });
    if let Some(l) = p.limits() {
        assert!(
            gpu.limits.max_compute_workgroup_storage_size <= l.max_compute_workgroup_storage_size
                && gpu.limits.max_storage_buffers_per_shader_stage
                    <= l.max_storage_buffers_per_shader_stage
                && gpu.limits.max_storage_buffer_binding_size <= l.max_storage_buffer_binding_size,
            "{p}: device limits not clamped"
        );
    }
    assert!(
        p.subgroups() || !gpu.has_subgroups(),
        "{p}: subgroups left on"
    );
    assert!(gpu.describe().contains(p.name()));
    gpu
}

#[test]
fn gemv_parity_under_every_limit_profile() {
    for p in LimitProfile::ALL {
        parity_every_format(&profile_gpu(p));
    }
}

#[test]
fn model_reference_under_every_limit_profile() {
    for p in LimitProfile::ALL {
        let gpu = profile_gpu(p);
        for name in FIXTURES {
            let ck = Checkpoint::open(&fixture(name)).unwrap();
            let w = Weights::load(&ck).unwrap();
            let r = reference(name);
            let eos = ck.generation.clone().unwrap().eos_token_ids;
            match GpuModel::new(&gpu, &w, GpuModelOptions::new(128)) {
                Ok(mut m) => {
                    assert_ne!(p, LimitProfile::WebGpu, "{name}: expected a limit error");
                    for (ci, c) in r.cases.iter().enumerate() {
                        check_greedy_case(&mut m, name, ci, c, &eos);
                    }
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    assert_eq!(p, LimitProfile::WebGpu, "{name} under {p}: {msg}");
                    assert!(
                        msg.contains("max_storage_buffers_per_shader_stage")
                            && msg.contains("residual/sconv_rms_norm")
                            && msg.contains("limit profile webgpu"),
                        "{name}: {msg}"
                    );
                }
            }
        }
    }
}
