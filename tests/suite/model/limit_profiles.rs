//! The GEMV parity and the model reference tests on lavapipe clamped to each limit profile
//! (`gpu::limits`): Apple M1-class limits through wgpu's Metal backend, the WebGPU defaults, no
//! subgroups. Every profile holds every kernel the model's steps reach (the WebGPU defaults
//! included: 8 storage buffers per stage, 16 KiB of workgroup memory), so the model runs and
//! matches the reference under each: transformers' greedy tokens and its teacher-forced logits
//! within 1e-4 relative per row. A profile that allows subgroups keeps them when the adapter
//! has them (so the clamped runs cover the subgroup kernels too).
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
    assert!(
        !p.subgroups() || gpu.has_subgroups() || !crate::ops_util::shared_gpu().has_subgroups(),
        "{p}: the profile allows subgroups and the adapter has them, but they were dropped"
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
                let mut seq = c.prompt_ids.clone();
                seq.extend_from_slice(&c.generated_ids[..c.generated_ids.len() - 1]);
                m.reset();
                let got = m.forward_all(&seq).unwrap();
                let want = reference_logits(name, &c.logits_key);
                assert_eq!(got.len(), want.len(), "{name} case {ci}");
                for (t, (g, w)) in got.iter().zip(&want).enumerate() {
                    let e = rel_err(g, w);
                    assert!(
                        e < 1e-4,
                        "{name} case {ci} under {p}: position {t} logits rel err {e:e} vs transformers"
                    );
                }
            }
        }
    }
}
