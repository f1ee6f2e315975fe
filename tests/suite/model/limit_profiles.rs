//! The GEMV parity and the model reference tests on lavapipe clamped to each limit profile
//! (`gpu::limits`): Apple M1-class limits through wgpu's Metal backend, the WebGPU defaults, no
//! subgroups. Every profile holds every kernel the model's steps reach (the WebGPU defaults
//! included: 8 storage buffers per stage, 16 KiB of workgroup memory), so the model runs and
//! matches the reference under each.
use crate::gpu::gemv_parity::parity_every_format;
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
            let mut m = GpuModel::new(&gpu, &w, GpuModelOptions::new(128))
                .unwrap_or_else(|e| panic!("{name} under {p}: {e:#}"));
            for (ci, c) in r.cases.iter().enumerate() {
                check_greedy_case(&mut m, &format!("{name} under {p}"), ci, c, &eos);
            }
        }
    }
}
