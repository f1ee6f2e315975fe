//! Every shader module the engine can build: naga validation, translation to MSL, HLSL and SPIR-V
//! (checked by spirv-val), the entry points each family declares, the kernels a model reaches, and
//! `shaders --out` replacing its earlier output.

pub mod model_variants;
pub mod shader_translation;
pub mod shaders_out;
pub mod wgsl_validate;
