//! Every shader module the engine can build: naga validation, translation to MSL, HLSL and SPIR-V
//! (checked by spirv-val), and the entry points each family declares.

pub mod shader_translation;
pub mod wgsl_validate;
