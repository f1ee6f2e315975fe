//! The GEMV skeleton's instantiations differ only where their flags say (every kernel is parsed,
//! validated and translated in `shader_translation.rs`).

#[test]
fn gemv_variants_differ_only_by_prelude_and_reduction() {
    use inkling_wgpu::gpu::linear::format::kernel_encodings;
    use inkling_wgpu::gpu::linear::gemv::{wgsl_format_const, wgsl_source};
    for enc in kernel_encodings() {
        let a = wgsl_source(enc, false);
        let b = wgsl_source(enc, true);
        assert!(!a.contains("subgroupShuffleXor") && b.contains("subgroupShuffleXor"));
        // the format is named, its ordinal written once, from the registry
        let name = wgsl_format_const(enc.format);
        assert!(a.contains(&format!("const FMT: u32 = {name};")));
        assert!(a.contains(&format!("const {name}: u32 = {}u;", enc.format.ordinal())));
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
    use inkling_wgpu::gpu::linear::format::Tuning;
    use inkling_wgpu::gpu::linear::gemv::wgsl_source_tuned;
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

#[test]
fn gemv_skeleton_names_every_format_ordinal() {
    // FORMATS.md is the only place an ordinal is written: the skeleton compares FMT with names
    let src = inkling_wgpu::gpu::linear::gemv::GEMV_WGSL;
    for (k, _) in src.match_indices("FMT ==") {
        let next = src[k + 6..].trim_start();
        assert!(
            next.starts_with("FMT_"),
            "gemv.wgsl compares FMT with {:?}",
            &next[..8]
        );
    }
    assert!(src.contains("FMT == FMT_BF16"));
    for spec in inkling_wgpu::formats::REGISTRY {
        let name = inkling_wgpu::gpu::linear::gemv::wgsl_format_const(spec.format);
        assert!(name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'));
    }
}

#[test]
fn gemv_two_chunk_variant_binds_a_second_slab() {
    use inkling_wgpu::gpu::kernel::KernelSpec;
    use inkling_wgpu::gpu::linear::format::kernel_encodings;
    use inkling_wgpu::gpu::linear::gemv::GemvKey;
    use inkling_wgpu::gpu::linear::route::tuning;
    for enc in kernel_encodings() {
        let one = KernelSpec::of(&GemvKey::new(enc, false, tuning(enc.format), 2048, false));
        let two = KernelSpec::of(
            &GemvKey::new(enc, false, tuning(enc.format), 2048, false).with_chunks(2),
        );
        assert!(
            !one.source.contains("W1") && two.source.contains("W1[") && two.source.contains("S1[")
        );
        // chunk 1 has its own load functions and hot loop (calls of unit_scales_1 besides its
        // definition: in its hot loop or its unit_dot_1)
        assert!(
            two.source.contains("fn unit_dot_1(")
                && two.source.contains("fn unit_scales_1(")
                && two.source.matches("unit_scales_1(").count() > 1
        );
        for src in [&one.source, &two.source] {
            assert!(src.lines().all(|l| !l.trim().starts_with("//!")));
        }
        assert_eq!(two.storage_buffers(), one.storage_buffers() + 2);
        assert_eq!(two.storage_buffers(), 8, "WebGPU's default limit");
    }
}
