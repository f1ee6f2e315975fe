//! GPU kernels against f64 CPU references on the same bytes: the GEMV and GEMM of every format, the op kernels.

pub mod adapter_features;
pub mod gemm_parity;
pub mod gemv_conv;
pub mod gemv_large;
pub mod gemv_pair;
pub mod gemv_parity;
pub mod gemv_segments;
pub mod gemv_silu;
pub mod gemv_slots;
pub mod gemv_tuning;
pub mod ops_attention;
pub mod ops_attention_fused;
pub mod ops_chain;
pub mod ops_conv;
pub mod ops_elementwise;
pub mod ops_norm;
pub mod ops_router;
