//! The GPU device: adapter selection, limits, features and small buffer helpers.
//!
//! Backend choice follows `WGPU_BACKEND` (e.g. `vulkan`, `metal`); without it, Vulkan, Metal and DX12
//! are tried. The GL backend is not compiled in, so a missing driver is an error, never a silent
//! fallback. The device is created with the adapter's own limits (`adapter.limits()`), not wgpu's
//! defaults, and with `SUBGROUP` and `TIMESTAMP_QUERY` when the adapter has them; a limit profile
//! (`INKLING_LIMITS`, `gpu::limits`) clamps both.

use crate::gpu::limits::LimitProfile;
use std::sync::Arc;
use wgpu::util::DeviceExt;

/// Errors opening the GPU.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No adapter matched the requested backends (`backends`: the set tried, and the
    /// `WGPU_BACKEND` value it came from when set).
    #[error("no usable GPU adapter was found (backends: {backends}; this build has vulkan, metal and dx12, GL is not built); install a Vulkan or Metal driver (on Linux without a GPU: Mesa's lavapipe, `mesa-vulkan-drivers`)")]
    NoAdapter { backends: String },
    /// The adapter refused the device request.
    #[error("the GPU adapter {adapter} refused to open a device: {source}")]
    RequestDevice {
        adapter: String,
        source: wgpu::RequestDeviceError,
    },
    /// A buffer readback failed (device lost, map error).
    #[error("GPU readback failed: {0}")]
    Readback(String),
    /// The device reported a validation or out-of-memory error.
    #[error("GPU error: {0}")]
    Device(String),
    /// `INKLING_LIMITS` names no limit profile.
    #[error("{0}")]
    Profile(String),
    /// `WGPU_BACKEND` names a backend this build cannot use.
    #[error("{0}")]
    Backend(String),
}

/// The backends this build has, by the names `WGPU_BACKEND` takes (wgpu's spellings).
const BUILT_BACKENDS: [(&str, wgpu::Backends); 6] = [
    ("vulkan", wgpu::Backends::VULKAN),
    ("vk", wgpu::Backends::VULKAN),
    ("metal", wgpu::Backends::METAL),
    ("mtl", wgpu::Backends::METAL),
    ("dx12", wgpu::Backends::DX12),
    ("d3d12", wgpu::Backends::DX12),
];

/// The backends named by a `WGPU_BACKEND` value (comma-separated, case-insensitive, as wgpu reads
/// it). Errors ([`GpuError::Backend`]): a name that is not a backend, or one this build does not
/// have (GL, WebGPU, noop), with the valid names; wgpu itself would only log a warning and try
/// no backend at all.
pub fn parse_backends(value: &str) -> Result<wgpu::Backends, GpuError> {
    let mut backends = wgpu::Backends::empty();
    for name in value.to_lowercase().split(',').map(str::trim) {
        match BUILT_BACKENDS.iter().find(|(n, _)| *n == name) {
            Some((_, b)) => backends |= *b,
            None => {
                let why = match name {
                    "opengl" | "gles" | "gl" => "GL is not built into inkling-wgpu",
                    "webgpu" | "noop" => "inkling-wgpu cannot run on that backend",
                    _ => "no such backend",
                };
                return Err(GpuError::Backend(format!(
                    "WGPU_BACKEND={value:?}: {name:?}: {why}; use vulkan, metal or dx12 \
                     (comma-separated), or unset it to try all three"
                )));
            }
        }
    }
    Ok(backends)
}

/// Names of the backends in `b`, for messages (`vulkan, metal`).
fn backend_names(b: wgpu::Backends) -> String {
    let names: Vec<&str> = [
        (wgpu::Backends::VULKAN, "vulkan"),
        (wgpu::Backends::METAL, "metal"),
        (wgpu::Backends::DX12, "dx12"),
    ]
    .iter()
    .filter(|(f, _)| b.contains(*f))
    .map(|(_, n)| *n)
    .collect();
    names.join(", ")
}

/// Cooperative-matrix configurations in one line, `MxNxK A->C` each (`16x16x16 f16->f32`),
/// comma-separated, or `none`.
pub fn describe_matrix_units(units: &[wgpu::CooperativeMatrixProperties]) -> String {
    if units.is_empty() {
        return "none".to_string();
    }
    let units: Vec<String> = units
        .iter()
        .map(|m| {
            let sat = if m.saturating_accumulation {
                " saturating"
            } else {
                ""
            };
            format!(
                "{}x{}x{} {:?}->{:?}{sat}",
                m.m_size, m.n_size, m.k_size, m.ab_type, m.cr_type
            )
            .to_lowercase()
        })
        .collect();
    units.join(", ")
}

/// An open GPU: device, queue and what the adapter can do.
#[derive(Clone)]
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    /// Limits the device was created with (the adapter's, clamped by `profile`).
    pub limits: wgpu::Limits,
    /// Features the device was created with.
    pub features: wgpu::Features,
    /// Shared pipeline cache for kernels (see `gpu::kernel`).
    pub cache: Arc<crate::gpu::kernel::PipelineCache>,
    /// Pipelines built on this device so far ([`crate::gpu::kernel::pipeline`]).
    pub compiles: Arc<crate::gpu::kernel::CompileCounter>,
    /// The limit profile the device was clamped to, if any (see `gpu::limits`).
    pub profile: Option<LimitProfile>,
    /// The cooperative-matrix (tensor core, simdgroup matrix) configurations the adapter reports
    /// through wgpu (`Adapter::cooperative_matrix_properties`). No kernel uses them
    /// (BENCHMARKS.md#decision-matrix-units); `bench gemm` reports them.
    pub matrix_units: Vec<wgpu::CooperativeMatrixProperties>,
}

impl Gpu {
    /// Open the first adapter of the backends allowed by `WGPU_BACKEND` (all native ones if unset),
    /// clamped to the limit profile named by `INKLING_LIMITS` if set ([`GpuError::Profile`] for
    /// an unknown name).
    pub fn new() -> Result<Gpu, GpuError> {
        let profile = LimitProfile::from_env().map_err(GpuError::Profile)?;
        Self::with_profile(profile)
    }

    /// [`Gpu::new`] with an explicit limit profile (`None`: the adapter's limits and features),
    /// whatever `INKLING_LIMITS` says.
    pub fn with_profile(profile: Option<LimitProfile>) -> Result<Gpu, GpuError> {
        pollster::block_on(Self::new_async(profile))
    }

    async fn new_async(profile: Option<LimitProfile>) -> Result<Gpu, GpuError> {
        let from_env = std::env::var("WGPU_BACKEND").ok();
        let backends = match &from_env {
            Some(v) => parse_backends(v)?,
            None => wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12,
        };
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle().with_env();
        desc.backends = backends;
        let instance = wgpu::Instance::new(desc);
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                force_fallback_adapter: false,
                compatible_surface: None,
                apply_limit_buckets: false,
            })
            .await
            .map_err(|_| GpuError::NoAdapter {
                backends: match &from_env {
                    Some(v) => format!("{} from WGPU_BACKEND={v:?}", backend_names(backends)),
                    None => backend_names(backends),
                },
            })?;
        let info = adapter.get_info();
        let matrix_units = adapter.cooperative_matrix_properties();
        let mut limits = adapter.limits();
        // what the kernels use (subgroup reductions) and what the profilers use (timestamps at
        // the beginning and end of compute passes); nothing else
        let wanted = wgpu::Features::SUBGROUP | wgpu::Features::TIMESTAMP_QUERY;
        let mut features = adapter.features() & wanted;
        if let Some(p) = profile {
            limits = p.clamp_limits(&limits);
            features = p.clamp_features(features);
        }
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("inkling-wgpu"),
                required_features: features,
                required_limits: limits.clone(),
                experimental_features: wgpu::ExperimentalFeatures::default(),
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|source| GpuError::RequestDevice {
                adapter: info.name.clone(),
                source,
            })?;
        Ok(Gpu {
            device,
            queue,
            info,
            limits,
            features,
            cache: Arc::new(Default::default()),
            compiles: Default::default(),
            profile,
            matrix_units,
        })
    }

    /// Whether subgroup operations are available.
    pub fn has_subgroups(&self) -> bool {
        self.features.contains(wgpu::Features::SUBGROUP)
    }

    /// Whether the adapter is a CPU (lavapipe, WARP): benchmarks shrink their shapes and skip
    /// their warm-up there.
    pub fn is_cpu(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    /// Whether timestamp queries are available.
    pub fn has_timestamps(&self) -> bool {
        self.features.contains(wgpu::Features::TIMESTAMP_QUERY)
    }

    /// Largest storage-buffer binding in bytes (128 MiB on lavapipe).
    pub fn max_binding(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size
    }

    /// One line naming the adapter: `backend, name (driver driver_info), type` (the type in words:
    /// `discrete GPU`, `software adapter on the CPU`, ...), then the limit profile if any.
    pub fn describe(&self) -> String {
        let profile = self
            .profile
            .map(|p| format!(", limits clamped to {p}"))
            .unwrap_or_default();
        let kind = match self.info.device_type {
            wgpu::DeviceType::DiscreteGpu => "discrete GPU",
            wgpu::DeviceType::IntegratedGpu => "integrated GPU",
            wgpu::DeviceType::VirtualGpu => "virtual GPU",
            wgpu::DeviceType::Cpu => "software adapter on the CPU",
            wgpu::DeviceType::Other => "adapter of unknown type",
        };
        format!(
            "{:?}, {} ({} {}), {kind}{profile}",
            self.info.backend, self.info.name, self.info.driver, self.info.driver_info,
        )
    }

    /// The adapter's cooperative-matrix configurations in one line ([`describe_matrix_units`]).
    pub fn describe_matrix_units(&self) -> String {
        describe_matrix_units(&self.matrix_units)
    }

    /// Compile WGSL. Release builds use `create_shader_module_trusted` without runtime bounds
    /// checks (every kernel is validated by naga in the tests and bounds-checked by construction).
    pub fn shader(&self, label: &str, source: &str) -> wgpu::ShaderModule {
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(label),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        };
        if cfg!(debug_assertions) {
            self.device.create_shader_module(desc)
        } else {
            // SAFETY: our kernels index only within the sizes passed in their uniforms, which the
            // host-side code checks against the bound buffer sizes before every dispatch.
            unsafe {
                self.device
                    .create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
            }
        }
    }

    /// A storage buffer initialised from bytes (usage STORAGE | COPY_SRC | COPY_DST).
    pub fn storage_init(&self, label: &str, bytes: &[u8]) -> wgpu::Buffer {
        // wgpu requires a non-zero size that is a multiple of 4 for mapped-at-creation buffers.
        let mut padded;
        let contents = if bytes.is_empty() || !bytes.len().is_multiple_of(4) {
            padded = bytes.to_vec();
            padded.resize(bytes.len().max(4).next_multiple_of(4), 0);
            &padded[..]
        } else {
            bytes
        };
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
            })
    }

    /// An uninitialised storage buffer of `size` bytes (rounded up to 4, at least 4).
    pub fn storage(&self, label: &str, size: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: size.max(4).next_multiple_of(4),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Copy `size` bytes from `buf` (at `offset`) back to the host. Blocks until done.
    pub fn read_bytes(
        &self,
        buf: &wgpu::Buffer,
        offset: u64,
        size: u64,
    ) -> Result<Vec<u8>, GpuError> {
        let size4 = size.next_multiple_of(4);
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: size4.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(buf, offset, &staging, 0, size4);
        self.queue.submit([enc.finish()]);
        self.map_read(&staging, size)
    }

    /// Wait for the queue, then copy the first `size` bytes of `buf` (a `MAP_READ` buffer the
    /// submitted work has filled) to the host and unmap it again. Blocks until done.
    pub fn map_read(&self, buf: &wgpu::Buffer, size: u64) -> Result<Vec<u8>, GpuError> {
        let slice = buf.slice(0..size.next_multiple_of(4).max(4));
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        rx.recv()
            .map_err(|e| GpuError::Readback(e.to_string()))?
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        let out = slice
            .get_mapped_range()
            .map_err(|e| GpuError::Readback(format!("{e:?}")))?[..size as usize]
            .to_vec();
        buf.unmap();
        Ok(out)
    }

    /// Read `n` f32 values from the start of `buf`.
    pub fn read_f32(&self, buf: &wgpu::Buffer, n: usize) -> Result<Vec<f32>, GpuError> {
        let b = self.read_bytes(buf, 0, 4 * n as u64)?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Read `n` u32 values from the start of `buf`.
    pub fn read_u32(&self, buf: &wgpu::Buffer, n: usize) -> Result<Vec<u32>, GpuError> {
        let b = self.read_bytes(buf, 0, 4 * n as u64)?;
        Ok(b.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every configuration named with its sizes and types, in the adapter's order.
    #[test]
    fn matrix_units_in_one_line() {
        assert_eq!(describe_matrix_units(&[]), "none");
        let unit = |m, ab, cr, sat| wgpu::CooperativeMatrixProperties {
            m_size: m,
            n_size: 16,
            k_size: 8,
            ab_type: ab,
            cr_type: cr,
            saturating_accumulation: sat,
        };
        let units = [
            unit(
                16,
                wgpu::CooperativeScalarType::F16,
                wgpu::CooperativeScalarType::F32,
                false,
            ),
            unit(
                8,
                wgpu::CooperativeScalarType::F32,
                wgpu::CooperativeScalarType::F32,
                true,
            ),
        ];
        assert_eq!(
            describe_matrix_units(&units),
            "16x16x8 f16->f32, 8x16x8 f32->f32 saturating"
        );
    }
}
