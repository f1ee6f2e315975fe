//! The GEMV skeleton's instantiations differ only where their flags say (every kernel is parsed,
//! validated and translated in `shader_translation.rs`).

#[test]
fn gemv_variants_differ_only_by_prelude_and_reduction() {
    use inkling_wgpu::gpu::gemv::{kernel_encodings, wgsl_source};
    for enc in kernel_encodings() {
        let a = wgsl_source(enc, false);
        let b = wgsl_source(enc, true);
        assert!(!a.contains("subgroupShuffleXor") && b.contains("subgroupShuffleXor"));
        assert!(a.contains(&format!("const FMT: u32 = {}u;", enc.format.ordinal())));
        for src in [&a, &b] {
            assert!(src.lines().all(|l| !l.trim().starts_with("//!")));
            // the default instantiation stages x
            assert!(src.contains("var<workgroup> XS") && src.contains("X: array<f32>;"));
        }
    }
}

#[test]
fn gemv_direct_x_variant_stages_nothing() {
    use inkling_wgpu::formats::Encoding;
    use inkling_wgpu::gpu::gemv::{wgsl_source_tuned, Tuning};
    let t = Tuning { tpr: 64, rpt: 1 };
    for enc in [Encoding::F32, Encoding::BF16] {
        for sg in [false, true] {
            let d = wgsl_source_tuned(enc, sg, t, 2048, true);
            let s = wgsl_source_tuned(enc, sg, t, 2048, false);
            assert!(d.lines().all(|l| !l.trim().starts_with("//!")));
            assert!(!d.contains("var<workgroup> XS") && !d.contains("XS["));
            assert!(d.contains("var<storage, read> X: array<vec4<f32>>;"));
            assert!(s.contains("var<workgroup> XS") && s.contains("X: array<f32>;"));
            // staged: one barrier after staging; direct: only the reduction's
            let barriers = |src: &str| src.matches("workgroupBarrier()").count();
            assert!(barriers(&d) < barriers(&s), "{}", enc.spelling());
            assert_eq!(d.contains("subgroupShuffleXor"), sg);
        }
    }
}
