//! Files: the format registry and quantisation, stamped containers, `convert` and `synth`, damaged and hostile files, the loaders' fuzz.

pub mod bad_files;
pub mod container_stamp;
pub mod convert_inputs;
pub mod convert_replace;
pub mod convert_roundtrip;
pub mod formats_doc;
pub mod formats_quant;
pub mod fuzz_loaders;
pub mod non_finite_files;
pub mod synth_smoke;
