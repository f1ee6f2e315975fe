//! GPU side: device, buffers, kernels and the format dispatcher.
pub mod device;
pub mod kernel;
pub mod ops;

pub use device::{Gpu, GpuError};
