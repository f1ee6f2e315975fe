//! The integration test suite: one binary (one link of wgpu) for every test module.

#[allow(dead_code)]
mod chat_common;
#[allow(dead_code)]
mod model_common;
#[allow(dead_code)]
mod ops_util;

mod bad_files;
mod bundled_model;
mod chat_cli;
mod chat_render;
mod chat_session;
mod cli_output;
mod cli_prompt;
mod cli_validation;
mod container_stamp;
mod convert_inputs;
mod convert_roundtrip;
mod decode_profile;
mod expert_cache;
mod formats_doc;
mod formats_quant;
mod fuzz_loaders;
mod gemm_parity;
mod gemv_cli;
mod gemv_large;
mod gemv_parity;
mod gemv_segments;
mod gemv_slots;
mod gemv_tuning;
mod generate_cli;
mod limit_profiles;
mod mlx_script;
mod model_bad_inputs;
mod model_config;
mod model_container;
mod model_cpu_reference;
mod model_demo;
mod model_formats_on_disk;
mod model_gpu_cli;
mod model_gpu_fused;
mod model_gpu_pairs;
mod model_gpu_reference;
mod model_non_finite;
mod model_sampling;
mod model_stream;
mod non_finite_files;
mod ops_attention;
mod ops_attention_fused;
mod ops_chain;
mod ops_conv;
mod ops_elementwise;
mod ops_norm;
mod ops_residual;
mod ops_router;
mod perplexity_cli;
mod serve_openai;
mod shader_translation;
mod synth_smoke;
mod test_python;
mod tokenizer_o200k;
mod usage_concurrent;
mod wgsl_validate;
