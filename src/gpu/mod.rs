//! GPU side: device, kernels and the format dispatcher.
//!
//! `kernel` (the [`kernel::Kernel`] trait, pipeline builder and cache) and `call` (the recorded
//! [`call::Call`]) are what every kernel family builds on: `linear` (a linear over a weight
//! slab: the MoE GEMV over every kernel format and the prefill GEMM for calls with many pairs per
//! expert) and `ops` (everything else). `dispatch` checks format ordinals, `variants`
//! lists every pipeline, `timing` reads GPU timestamps and times copies, `limits` clamps a device to a profile.
pub mod call;
pub mod device;
pub mod dispatch;
pub mod kernel;
pub mod limits;
pub mod linear;
pub mod ops;
pub mod timing;
pub mod variants;

pub use call::{Call, Label};
pub use device::{Gpu, GpuError};
pub use dispatch::DispatchError;
pub use linear::{gemv_pairs, gemv_pairs_with};
