//! GPU side: device, buffers, kernels and the format dispatcher.
pub mod device;
pub mod kernel;

pub use device::{Gpu, GpuError};
