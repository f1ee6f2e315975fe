//! inkling-wgpu: Inkling mixture-of-experts language models on any GPU through wgpu.
//!
//! Layout: [`formats`] (registry and CPU reference), [`gpu`] (device, kernels, dispatcher),
//! [`model`] (config, weights, forward), [`cli`] (the `inkling-wgpu` command).
pub mod cli;
pub mod container;
pub mod formats;
pub mod gpu;
pub mod model;

/// Directory of the bundled default model (`tests/fixtures/tiny-causal-f32`).
pub fn bundled_model_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-causal-f32")
}
