//! Every WGSL file of the non-GEMV kernel families parses and validates with naga, without a device.

fn validate(name: &str, src: &str) {
    for (label, text) in inkling_wgpu::gpu::kernel::wgsl_instantiations(name, src) {
        validate_one(&label, &text);
    }
}

fn validate_one(name: &str, src: &str) {
    let module = naga::front::wgsl::parse_str(src)
        .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(src)));
    let mut v = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    );
    v.validate(&module)
        .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(src)));
    assert!(!module.entry_points.is_empty(), "{name}: no entry points");
}

#[test]
fn norm_wgsl_validates() {
    validate("norm.wgsl", include_str!("../../wgsl/norm.wgsl"));
}

#[test]
fn conv_wgsl_validates() {
    validate("conv.wgsl", include_str!("../../wgsl/conv.wgsl"));
}

#[test]
fn attention_wgsl_validates() {
    validate("attention.wgsl", include_str!("../../wgsl/attention.wgsl"));
}

#[test]
fn router_wgsl_validates() {
    validate("router.wgsl", include_str!("../../wgsl/router.wgsl"));
}

#[test]
fn elementwise_wgsl_validates() {
    validate(
        "elementwise.wgsl",
        include_str!("../../wgsl/elementwise.wgsl"),
    );
}

#[test]
fn residual_wgsl_validates() {
    validate("residual.wgsl", include_str!("../../wgsl/residual.wgsl"));
}
