//! inkling-wgpu: Inkling mixture-of-experts language models on any GPU through wgpu.
//!
//! Layout: [`formats`] (registry and CPU reference), [`gpu`] (device, kernels, dispatcher),
//! [`model`] (config, weights, forward), [`cli`] (the `inkling-wgpu` command).
pub mod cli;
pub mod container;
pub mod formats;
pub mod gpu;
pub mod model;

/// `n` bytes as `B`, `KiB`, `MiB`, `GiB` or `TiB` (powers of 1024, two decimals above bytes).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// Directory of the bundled default model (`tests/fixtures/austen-demo`: a small Inkling trained on
/// Jane Austen's novels, int4-g64 routed experts; made by `tools/make_demo_model.py`).
pub fn bundled_model_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/austen-demo")
}
