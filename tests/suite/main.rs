//! The integration test suite: one binary (one link of wgpu) for every test module, grouped as the
//! source tree is (`gpu`, `model`, `cli`, `chat`, `serve`, `container`, `shaders`). The fast tier is the
//! library's unit tests and `gpu` (README.md, *Tests*): `cargo test --lib && cargo test --test suite gpu::`.

#[allow(dead_code)]
mod chat_common;
#[allow(dead_code)]
mod model_common;
#[allow(dead_code)]
mod ops_util;

mod chat;
mod cli;
mod container;
mod gpu;
mod model;
mod serve;
mod shaders;
