//! The model: CPU and GPU forwards against transformers and each other, loading, configuration, sampling, expert streaming and its usage file, limit profiles.

pub mod decode_profile;
pub mod expert_cache;
pub mod limit_profiles;
pub mod model_bad_inputs;
pub mod model_batch;
pub mod model_config;
pub mod model_container;
pub mod model_cpu_reference;
pub mod model_demo;
pub mod model_formats_on_disk;
pub mod model_generation_config;
pub mod model_gpu_cli;
pub mod model_gpu_fused;
pub mod model_gpu_pairs;
pub mod model_gpu_reference;
pub mod model_non_finite;
pub mod model_penalties;
pub mod model_sampling;
pub mod model_stream;
pub mod tokenizer_o200k;
pub mod usage_concurrent;
