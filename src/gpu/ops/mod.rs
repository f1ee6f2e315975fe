//! GPU kernels for every non-GEMV operation of the Inkling decoder (ratchet-style).
//!
//! Each kernel is a struct built once per shape (`XxxKernel::new(gpu, shape)`): it owns its pipeline
//! (cached in [`crate::gpu::kernel::PipelineCache`] under its own key), its bind-group layout and its
//! dispatch size. `kernel.bind(gpu, buffers…)` makes an [`OpCall`] holding the bind group and the small
//! uniform buffer; recording an `OpCall` into a caller's encoder or compute pass allocates nothing on the
//! GPU, so a whole decode step can be built once and submitted many times. Per-token parameters
//! (the absolute position of the first new token) come from a 16-byte uniform buffer the host updates
//! with `queue.write_buffer` ([`PosBuffer`]).
//!
//! All activations are f32. Every dispatch with many workgroups is spread over x and y
//! ([`grid`]), so no dimension exceeds 65535 workgroups.

pub mod attention;
pub mod conv;
pub mod elementwise;
pub mod norm;
pub mod residual;
pub mod router;

use crate::gpu::Gpu;
use std::sync::Arc;
use wgpu::util::DeviceExt;

pub use attention::{AttentionCall, AttentionKernel, AttentionShape};
pub use conv::{ConvCall, ShortConvKernel};
pub use elementwise::{Argmax, ArgmaxCall, Elementwise, SiluMulLayout};
pub use norm::{EmbedNorm, EmbedShard, RmsNorm};
pub use residual::{SconvInput, SconvRmsNorm};
pub use router::{Pair, Router, RouterShape};

/// Largest workgroup count per dimension (WebGPU's `maxComputeWorkgroupsPerDimension` default).
pub const MAX_GROUPS: u32 = 65535;

/// Workgroup grid for `n` workgroups spread over x then y: `[min(n, 65535), ceil(n / 65535), 1]`.
/// Kernels reconstruct the linear id as `wid.x + wid.y * nwg.x` and return past `n`.
pub fn grid(n: u32) -> [u32; 3] {
    let n = n.max(1);
    if n <= MAX_GROUPS {
        [n, 1, 1]
    } else {
        [MAX_GROUPS, n.div_ceil(MAX_GROUPS), 1]
    }
}

pub(crate) use crate::gpu::kernel::Bind;
use crate::gpu::kernel::KernelSpec;

/// Build (or fetch from the cache) the pipeline of `spec`. Debug builds (the tests) check that
/// the kernel is one of [`kernels`], so a new variant cannot escape `inkling-wgpu shaders` and
/// the MSL/HLSL translation test.
pub(crate) fn listed_pipeline(gpu: &Gpu, spec: &KernelSpec) -> Arc<wgpu::ComputePipeline> {
    if cfg!(debug_assertions) {
        static LISTED: std::sync::OnceLock<Vec<KernelSpec>> = std::sync::OnceLock::new();
        let listed = LISTED.get_or_init(kernels);
        assert!(
            listed.contains(spec),
            "op kernel {} (entry {}) is not listed, or listed with another WGSL or \
             layout, by gpu::ops::kernels(); list every variant there",
            spec.key,
            spec.entry
        );
    }
    crate::gpu::kernel::pipeline(gpu, spec)
}

/// Every pipeline the op kernels can build, each variant of each file.
pub fn kernels() -> Vec<KernelSpec> {
    let mut v = Vec::new();
    v.extend(attention::kernels());
    v.extend(conv::kernels());
    v.extend(elementwise::kernels());
    v.extend(norm::kernels());
    v.extend(residual::kernels());
    v.extend(router::kernels());
    v
}

/// A bind group for `pipeline` from `(binding, buffer)` pairs (whole buffers).
pub(crate) fn bind_group(
    gpu: &Gpu,
    label: &str,
    pipeline: &wgpu::ComputePipeline,
    buffers: &[(u32, &wgpu::Buffer)],
) -> wgpu::BindGroup {
    let layout = pipeline.get_bind_group_layout(0);
    let entries: Vec<wgpu::BindGroupEntry> = buffers
        .iter()
        .map(|&(binding, buf)| wgpu::BindGroupEntry {
            binding,
            resource: buf.as_entire_binding(),
        })
        .collect();
    gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(label),
        layout: &layout,
        entries: &entries,
    })
}

/// A uniform buffer holding `words` (u32 or f32 bit patterns), padded to 16 bytes.
pub(crate) fn uniform_words(gpu: &Gpu, label: &str, words: &[u32]) -> wgpu::Buffer {
    let mut w = words.to_vec();
    w.resize(words.len().next_multiple_of(4).max(4), 0);
    gpu.device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: bytemuck::cast_slice(&w),
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        })
}

/// One recorded dispatch: pipeline, bind group, workgroup grid.
pub struct Dispatch {
    pub(crate) pipeline: Arc<wgpu::ComputePipeline>,
    pub(crate) bind_group: wgpu::BindGroup,
    pub(crate) groups: [u32; 3],
}

/// A reusable, fully bound kernel invocation (one or more dispatches, executed in order).
///
/// Holds its own uniform buffers; nothing is allocated when it is recorded.
pub struct OpCall {
    pub(crate) label: String,
    pub(crate) dispatches: Vec<Dispatch>,
    /// Uniform/scratch buffers the bind groups refer to (kept alive here).
    pub(crate) owned: Vec<wgpu::Buffer>,
}

impl OpCall {
    /// Record into an open compute pass (dispatches run in order; each sees the previous one's writes).
    pub fn record_in_pass(&self, pass: &mut wgpu::ComputePass<'_>) {
        for d in &self.dispatches {
            pass.set_pipeline(&d.pipeline);
            pass.set_bind_group(0, &d.bind_group, &[]);
            pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
        }
    }

    /// Record as its own compute pass in `encoder`.
    pub fn record(&self, encoder: &mut wgpu::CommandEncoder) {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(&self.label),
            timestamp_writes: None,
        });
        self.record_in_pass(&mut pass);
    }

    /// Record into a fresh encoder and submit (convenience for tests and one-off use).
    pub fn run(&self, gpu: &Gpu) {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        self.record(&mut enc);
        gpu.queue.submit([enc.finish()]);
    }

    /// The uniform buffers and scratch owned by this call (first = the main parameter block).
    pub fn owned_buffers(&self) -> &[wgpu::Buffer] {
        &self.owned
    }
}

/// The per-step position uniform: `vec4<u32>` whose `.x` is the absolute position of the first token of
/// the current call (= number of tokens already in the caches). Shared by all attention calls of a step.
pub struct PosBuffer {
    pub buffer: wgpu::Buffer,
}

impl PosBuffer {
    pub fn new(gpu: &Gpu, pos0: u32) -> PosBuffer {
        PosBuffer {
            buffer: uniform_words(gpu, "pos", &[pos0, 0, 0, 0]),
        }
    }

    /// Queue an update of the position (takes effect for the next submission).
    pub fn set(&self, queue: &wgpu::Queue, pos0: u32) {
        queue.write_buffer(&self.buffer, 0, bytemuck::cast_slice(&[pos0, 0u32, 0, 0]));
    }
}

/// The VEC4 variant of a kernel file (`//!IF VEC4` / `//!ELSE` / `//!END`, see
/// [`crate::gpu::kernel::preprocess`]): rows 16-byte aligned, bound as `array<vec4<f32>>`, when
/// `vec4`, else the f32 one.
pub fn wgsl_variant(src: &str, vec4: bool) -> String {
    crate::gpu::kernel::preprocess(src, &[("VEC4", vec4)])
}

/// A 4-byte storage buffer to bind where a kernel's optional input is absent.
pub(crate) fn dummy(gpu: &Gpu) -> wgpu::Buffer {
    gpu.storage("dummy", 16)
}

/// Panic unless `buf` holds at least `floats` 4-byte values. Release builds compile kernels without
/// runtime bounds checks, so every bind checks the buffers against the sizes in its uniforms.
pub(crate) fn need(buf: &wgpu::Buffer, floats: u64, what: &str) {
    assert!(
        buf.size() >= floats * 4,
        "{what}: buffer of {} bytes, kernel needs {} bytes",
        buf.size(),
        floats * 4
    );
}
