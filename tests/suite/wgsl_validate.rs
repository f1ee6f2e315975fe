//! Every `wgsl/*.wgsl` file, in every instantiation, parses and validates with naga — no device.
//! Validation enables subgroup capabilities (the subgroup variants use them).

use naga::valid::{Capabilities, ShaderStages, SubgroupOperationSet, ValidationFlags, Validator};

fn validate(label: &str, src: &str) -> Result<(), String> {
    let module = naga::front::wgsl::parse_str(src)
        .map_err(|e| format!("{label}: parse: {}", e.emit_to_string(src)))?;
    let mut v = Validator::new(ValidationFlags::all(), Capabilities::all());
    v.subgroup_stages(ShaderStages::all());
    v.subgroup_operations(SubgroupOperationSet::all());
    v.validate(&module)
        .map_err(|e| format!("{label}: validate: {}", e.emit_to_string(src)))?;
    Ok(())
}

#[test]
fn every_wgsl_file_validates() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("wgsl");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("wgsl/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wgsl"))
        .collect();
    files.sort();
    assert!(
        files.iter().any(|p| p.ends_with("gemv.wgsl")),
        "wgsl/gemv.wgsl missing"
    );
    let mut errors = Vec::new();
    let mut n = 0;
    for f in &files {
        let src = std::fs::read_to_string(f).unwrap();
        let name = f.file_name().unwrap().to_str().unwrap();
        for (label, text) in inkling_wgpu::gpu::kernel::wgsl_instantiations(name, &src) {
            n += 1;
            if let Err(e) = validate(&label, &text) {
                errors.push(e);
            }
        }
    }
    assert!(
        errors.is_empty(),
        "{} of {n} WGSL instantiations failed:\n{}",
        errors.len(),
        errors.join("\n")
    );
    // f32, int4, int4-g32/64/128, int3-g64, bf16, each with two reductions
    assert!(n >= 14, "only {n} instantiations validated");
}

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
