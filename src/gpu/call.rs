//! The recorded kernel invocation every kernel family returns and every recorder records:
//! [`Call`] (one or more [`Dispatch`]es with a typed [`Label`]), plus the helpers families build
//! dispatches with (workgroup [`grid`], bind groups, uniforms, the buffer-size check).
//!
//! A `Call` is built once (pipelines, bind groups and uniforms made then) and recorded any number
//! of times; recording allocates nothing on the GPU.

use crate::gpu::kernel::{self, Kernel};
use crate::gpu::Gpu;
use std::fmt;
use std::sync::Arc;
use wgpu::util::DeviceExt;

/// Largest workgroup count per dimension (WebGPU's `maxComputeWorkgroupsPerDimension` default).
pub const MAX_GROUPS_PER_DIM: u32 = 65_535;

/// Workgroup grid for `n` workgroups spread over x then y: `[min(n, 65535), ceil(n / 65535), 1]`
/// (`n` = 0 launches one). Kernels reconstruct the linear id as `wid.x + wid.y * nwg.x` and return
/// past `n`.
pub fn grid(n: u32) -> [u32; 3] {
    let n = n.max(1);
    if n <= MAX_GROUPS_PER_DIM {
        [n, 1, 1]
    } else {
        [MAX_GROUPS_PER_DIM, n.div_ceil(MAX_GROUPS_PER_DIM), 1]
    }
}

/// [`grid`] for a `u64` count; `None` when it needs more than 65535² workgroups.
pub fn grid_u64(n: u64) -> Option<[u32; 3]> {
    let gx = n.clamp(1, MAX_GROUPS_PER_DIM as u64);
    let gy = n.div_ceil(gx).max(1);
    (gy <= MAX_GROUPS_PER_DIM as u64).then_some([gx as u32, gy as u32, 1])
}

/// What a call computes, for pass labels and the per-op profile: the decoder layer it belongs to
/// (`None` outside the layers: embedding, head) and the operation (`"q_proj"`, `"rms_norm"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Label {
    pub layer: Option<u16>,
    pub op: &'static str,
}

impl Label {
    /// An operation outside any layer.
    pub const fn op(op: &'static str) -> Label {
        Label { layer: None, op }
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.layer {
            Some(l) => write!(f, "layer {l} {}", self.op),
            None => f.write_str(self.op),
        }
    }
}

/// A buffer that is too small for the problem a kernel was bound to (release builds compile
/// kernels without runtime bounds checks, so every bind checks its buffers first).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: buffer of {bytes} bytes, kernel needs {need} bytes")]
pub struct BufferTooSmall {
    /// The kernel and the binding (`"rms_norm x"`).
    pub what: &'static str,
    pub bytes: u64,
    pub need: u64,
}

/// `Err` unless `buf` holds at least `floats` 4-byte values.
pub fn need(buf: &wgpu::Buffer, floats: u64, what: &'static str) -> Result<(), BufferTooSmall> {
    if buf.size() >= floats * 4 {
        Ok(())
    } else {
        Err(BufferTooSmall {
            what,
            bytes: buf.size(),
            need: floats * 4,
        })
    }
}

/// A 16-byte storage buffer to bind where a kernel's optional input is absent (16 bytes: the
/// minimum binding size of a `vec4` array).
pub fn dummy(gpu: &Gpu) -> wgpu::Buffer {
    gpu.storage("dummy", 16)
}

/// A uniform buffer holding `params`, padded to a multiple of 16 bytes.
pub fn uniform<P: bytemuck::Pod>(gpu: &Gpu, label: &str, params: &P) -> wgpu::Buffer {
    uniform_with(gpu, label, params, wgpu::BufferUsages::empty())
}

/// [`uniform`] with the `extra` usages too (`STORAGE`: also bindable as a storage buffer).
pub fn uniform_with<P: bytemuck::Pod>(
    gpu: &Gpu,
    label: &str,
    params: &P,
    extra: wgpu::BufferUsages,
) -> wgpu::Buffer {
    let mut bytes = bytemuck::bytes_of(params).to_vec();
    bytes.resize(bytes.len().next_multiple_of(16).max(16), 0);
    gpu.device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: &bytes,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST | extra,
        })
}

/// Bind-group entry: the whole of `buf` at `binding`.
pub fn entry(binding: u32, buf: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: buf.as_entire_binding(),
    }
}

/// A bind group for `pipeline` (group 0) from `(binding, buffer)` pairs (whole buffers).
pub fn bind_group(
    gpu: &Gpu,
    label: &str,
    pipeline: &wgpu::ComputePipeline,
    buffers: &[(u32, &wgpu::Buffer)],
) -> wgpu::BindGroup {
    let entries: Vec<wgpu::BindGroupEntry> = buffers
        .iter()
        .map(|&(binding, buf)| entry(binding, buf))
        .collect();
    gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(label),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &entries,
    })
}

/// One recorded dispatch: pipeline, bind group, workgroup grid, and the uniform it owns.
pub struct Dispatch {
    /// The pipeline key, kept by debug builds only (for the step's device-check assertion;
    /// `None` in release builds and for a dispatch made from parts).
    kernel: Option<String>,
    pipeline: Arc<wgpu::ComputePipeline>,
    bind_group: wgpu::BindGroup,
    groups: [u32; 3],
    _uniform: Option<wgpu::Buffer>,
}

impl Dispatch {
    /// Pipeline `key`, its `Params` in a uniform at binding 0, `buffers` at the other bindings,
    /// launched on `groups`.
    pub fn new<K: Kernel>(
        gpu: &Gpu,
        key: &K,
        params: &K::Params,
        buffers: &[(u32, &wgpu::Buffer)],
        groups: [u32; 3],
    ) -> Dispatch {
        let pipeline = kernel::pipeline(gpu, key);
        let label = key.entry();
        let u = uniform(gpu, label, params);
        let mut all = Vec::with_capacity(buffers.len() + 1);
        all.push((0u32, &u));
        all.extend_from_slice(buffers);
        let bind_group = bind_group(gpu, label, &pipeline, &all);
        Dispatch {
            kernel: cfg!(debug_assertions).then(|| key.to_string()),
            pipeline,
            bind_group,
            groups,
            _uniform: Some(u),
        }
    }

    /// A dispatch whose bind group the family made itself (e.g. uniforms at offsets of a shared
    /// buffer the call keeps).
    pub fn from_parts(
        pipeline: Arc<wgpu::ComputePipeline>,
        bind_group: wgpu::BindGroup,
        groups: [u32; 3],
    ) -> Dispatch {
        Dispatch {
            kernel: None,
            pipeline,
            bind_group,
            groups,
            _uniform: None,
        }
    }
}

/// A reusable, fully bound kernel invocation: dispatches executed in order (each sees the
/// previous one's writes), the buffers they refer to, and a [`Label`].
pub struct Call {
    pub label: Label,
    dispatches: Vec<Dispatch>,
    /// Scratch and uniform buffers the bind groups refer to (kept alive here).
    owned: Vec<wgpu::Buffer>,
}

impl Call {
    pub fn new(label: Label, dispatches: Vec<Dispatch>) -> Call {
        Call {
            label,
            dispatches,
            owned: Vec::new(),
        }
    }

    /// Keep `buffers` alive as long as the call.
    pub fn owning(mut self, buffers: impl IntoIterator<Item = wgpu::Buffer>) -> Call {
        self.owned.extend(buffers);
        self
    }

    /// Number of dispatches.
    pub fn dispatches(&self) -> usize {
        self.dispatches.len()
    }

    /// The pipeline keys of the dispatches made by [`Dispatch::new`], in order (debug builds;
    /// empty in release builds).
    pub fn kernels(&self) -> impl Iterator<Item = &str> {
        self.dispatches.iter().filter_map(|d| d.kernel.as_deref())
    }

    /// Record into an open compute pass.
    pub fn record_in_pass(&self, pass: &mut wgpu::ComputePass<'_>) {
        let mut current: Option<&Arc<wgpu::ComputePipeline>> = None;
        for d in &self.dispatches {
            if !current.is_some_and(|c| Arc::ptr_eq(c, &d.pipeline)) {
                pass.set_pipeline(&d.pipeline);
                current = Some(&d.pipeline);
            }
            pass.set_bind_group(0, &d.bind_group, &[]);
            pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
        }
    }

    /// Record as its own compute pass in `encoder`.
    pub fn record(&self, encoder: &mut wgpu::CommandEncoder) {
        let label = self.label.to_string();
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(&label),
            timestamp_writes: None,
        });
        self.record_in_pass(&mut pass);
    }

    /// Record into a fresh encoder and submit (tests and one-off use).
    pub fn run(&self, gpu: &Gpu) {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        self.record(&mut enc);
        gpu.queue.submit([enc.finish()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_split_over_x_then_y() {
        assert_eq!(grid(0), [1, 1, 1]);
        assert_eq!(grid(65_535), [65_535, 1, 1]);
        assert_eq!(grid(65_536), [65_535, 2, 1]);
        assert_eq!(grid_u64(65_536), Some([65_535, 2, 1]));
        assert_eq!(grid_u64(65_535u64 * 65_535 + 1), None);
    }

    #[test]
    fn labels_name_their_layer() {
        let l = Label::op("q_proj");
        assert_eq!(l.to_string(), "q_proj");
        let l = Label {
            layer: Some(3),
            ..l
        };
        assert_eq!(l.to_string(), "layer 3 q_proj");
    }
}
