//! `shaders --model` / `gpu::variants::for_model`: every GEMV and GEMM pipeline a GPU model builds
//! while it prefills and decodes (read back from the device's pipeline cache) is among the kernels
//! `for_model` lists for that model's matrices, and that list is a strict subset of every kernel.
use crate::model_common::{fixture, FIXTURES};
use crate::ops_util::gpu;
use inkling_wgpu::gpu::kernel::KernelSpec;
use inkling_wgpu::gpu::linear::gemm::{GemmKey, SortKey};
use inkling_wgpu::gpu::linear::gemv::GemvKey;
use inkling_wgpu::gpu::linear::gemv_pair::GemvPairKey;
use inkling_wgpu::gpu::variants;
use inkling_wgpu::model::{Checkpoint, GpuModel, GpuModelOptions, Weights};
use std::collections::HashSet;

#[test]
fn a_model_builds_only_kernels_its_variant_list_holds() {
    let all = variants::all(None).len();
    for name in FIXTURES.iter().copied().chain(["austen-demo"]) {
        let ck = Checkpoint::open(&fixture(name)).unwrap();
        let w = Weights::load(&ck).unwrap();
        let listed: HashSet<String> = variants::for_model(&w.linear_shapes(), None)
            .into_iter()
            .map(|s| s.key)
            .collect();
        assert!(listed.len() < all, "{name}: {} of {all}", listed.len());
        // a fresh device: its cache holds only this model's pipelines
        let g = gpu();
        let mut m = GpuModel::new(&g, &w, GpuModelOptions::new(96)).unwrap();
        // a prompt long enough for the prefill GEMM on every routed expert, then decode steps
        let prompt: Vec<u32> = (0..64).map(|i| 3 + (i * 7) % 50).collect();
        m.forward(&prompt).unwrap();
        for t in [5, 9, 11] {
            m.forward(&[t]).unwrap();
        }
        let mut built: Vec<String> = g
            .cache
            .keys::<GemvKey>()
            .iter()
            .map(|k| KernelSpec::of(k).key)
            .collect();
        let gemv = built.len();
        built.extend(
            g.cache
                .keys::<GemmKey>()
                .iter()
                .map(|k| KernelSpec::of(k).key),
        );
        built.extend(
            g.cache
                .keys::<SortKey>()
                .iter()
                .map(|k| KernelSpec::of(k).key),
        );
        // a pair's pipeline is its two halves
        let pairs = g.cache.keys::<GemvPairKey>();
        for p in &pairs {
            built.extend([p.a, p.b].iter().map(|k| KernelSpec::of(k).key));
        }
        assert!(gemv > 0, "{name}: no GEMV pipeline was built");
        for k in &built {
            assert!(
                listed.contains(k),
                "{name}: built {k}, not in for_model's list"
            );
        }
        eprintln!(
            "{name}: {} pipelines of the linear layer built ({gemv} GEMV, {} GEMV pairs), {} kernels \
             listed of {all}",
            built.len(),
            pairs.len(),
            listed.len()
        );
    }
}
