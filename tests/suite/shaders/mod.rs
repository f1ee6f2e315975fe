//! Every shader module the engine can build: naga validation, translation to MSL, HLSL and SPIR-V
//! (checked by spirv-val), the entry points each family declares, and the kernels a model reaches.

pub mod model_variants;
pub mod shader_translation;
pub mod wgsl_validate;
