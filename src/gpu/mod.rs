//! GPU side: device, buffers, kernels and the format dispatcher.
pub mod device;
pub mod kernel;
pub mod limits;
pub mod ops;
pub mod variants;

pub use device::{Gpu, GpuError};
pub mod dispatch;
pub mod gemm;
pub mod gemv;

pub use dispatch::{gemv_pairs, DispatchError};
pub use gemv::{GemvArgs, GemvCall, GpuWeights, Reduction};
