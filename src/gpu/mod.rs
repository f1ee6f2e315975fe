//! GPU side: device, kernels and the format dispatcher.
//!
//! `kernel` (the [`kernel::Kernel`] trait, pipeline builder and cache) and `call` (the recorded
//! [`call::Call`]) are what every kernel family builds on: `gemv` (the MoE GEMV over every
//! kernel format), `gemm` (the prefill GEMM `gemv` hands calls with many pairs per expert to) and
//! `ops` (everything else). `dispatch` checks format ordinals, `variants`
//! lists every pipeline, `timing` reads GPU timestamps and times copies, `limits` clamps a device to a profile.
pub mod call;
pub mod device;
pub mod dispatch;
pub mod gemm;
pub mod gemm_tile;
pub mod gemv;
pub mod gemv_pairs;
pub mod kernel;
pub mod limits;
pub mod ops;
pub mod slab_layout;
pub mod timing;
pub mod variants;

pub use call::{Call, Label};
pub use device::{Gpu, GpuError};
pub use dispatch::DispatchError;
pub use gemv_pairs::{gemv_pairs, gemv_pairs_with};
