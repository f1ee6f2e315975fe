//! Kernel plumbing shared by every WGSL kernel family: the description of one pipeline
//! ([`KernelSpec`]: key, WGSL, entry point, bind layout), the pipeline cache keyed by each
//! kernel's own cache key (ratchet-style: the kernel owns its key, bind layout and dispatch
//! size) and the WGSL preprocessor.

use crate::gpu::Gpu;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Compiled compute pipelines, keyed by a kernel's cache key.
#[derive(Default)]
pub struct PipelineCache {
    map: Mutex<HashMap<String, Arc<wgpu::ComputePipeline>>>,
}

impl PipelineCache {
    /// The pipeline for `key`, built by `make` on first use.
    pub fn get_or_create(
        &self,
        key: &str,
        make: impl FnOnce() -> wgpu::ComputePipeline,
    ) -> Arc<wgpu::ComputePipeline> {
        if let Some(p) = self.map.lock().unwrap().get(key) {
            return p.clone();
        }
        let p = Arc::new(make());
        self.map
            .lock()
            .unwrap()
            .entry(key.to_string())
            .or_insert(p)
            .clone()
    }
}

/// How a kernel binding is declared in its bind-group layout (group 0, compute stage).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bind {
    /// `var<uniform>`.
    Uniform,
    /// `var<storage, read>`.
    Read,
    /// `var<storage, read_write>`.
    Write,
}

/// One compute pipeline the engine can build: its cache key (unique per WGSL text and entry
/// point), the WGSL after preprocessing, the entry point and the explicit bind-group layout.
/// [`crate::gpu::variants`] lists every one of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSpec {
    pub key: String,
    pub entry: String,
    pub binds: Vec<(u32, Bind)>,
    pub source: String,
    /// Whether the WGSL uses subgroup operations (needs the `SUBGROUP` feature).
    pub subgroups: bool,
}

impl KernelSpec {
    /// A spec without subgroup operations.
    pub fn new(key: impl Into<String>, entry: &str, binds: &[(u32, Bind)], source: String) -> Self {
        KernelSpec {
            key: key.into(),
            entry: entry.to_string(),
            binds: binds.to_vec(),
            source,
            subgroups: false,
        }
    }

    /// Storage-buffer bindings (read-only and read-write) in the layout.
    pub fn storage_buffers(&self) -> u32 {
        self.binds.iter().filter(|b| b.1 != Bind::Uniform).count() as u32
    }

    /// Uniform-buffer bindings in the layout.
    pub fn uniform_buffers(&self) -> u32 {
        self.binds.iter().filter(|b| b.1 == Bind::Uniform).count() as u32
    }
}

/// Build (or fetch from the device's cache) the pipeline of `spec` with its explicit layout.
pub fn pipeline(gpu: &Gpu, spec: &KernelSpec) -> Arc<wgpu::ComputePipeline> {
    gpu.cache.get_or_create(&spec.key, || {
        let entries: Vec<wgpu::BindGroupLayoutEntry> = spec
            .binds
            .iter()
            .map(|&(binding, b)| wgpu::BindGroupLayoutEntry {
                binding,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: match b {
                        Bind::Uniform => wgpu::BufferBindingType::Uniform,
                        Bind::Read | Bind::Write => wgpu::BufferBindingType::Storage {
                            read_only: b == Bind::Read,
                        },
                    },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let key = spec.key.as_str();
        let bgl = gpu
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(key),
                entries: &entries,
            });
        let layout = gpu
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(key),
                bind_group_layouts: &[Some(&bgl)],
                immediate_size: 0,
            });
        let module = gpu.shader(key, &spec.source);
        gpu.device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(key),
                layout: Some(&layout),
                module: &module,
                entry_point: Some(&spec.entry),
                compilation_options: Default::default(),
                cache: None,
            })
    })
}

/// Keep the lines of the active branches of `//!IF FLAG` / `//!ELSE` / `//!END` blocks (blocks
/// may nest); `flags` gives every flag's value. Panics on an unknown flag or unbalanced lines
/// (a bug in the skeleton, caught by the WGSL validation tests).
pub fn preprocess(src: &str, flags: &[(&str, bool)]) -> String {
    let mut out = String::with_capacity(src.len());
    // per open block: (the enclosing block is kept, this branch is kept)
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let mut keep = true;
    for line in src.lines() {
        let l = line.trim();
        if let Some(name) = l.strip_prefix("//!IF ") {
            let v = flags
                .iter()
                .find(|f| f.0 == name.trim())
                .unwrap_or_else(|| panic!("WGSL: unknown //!IF flag {name}"))
                .1;
            stack.push((keep, v));
            keep = keep && v;
        } else if l == "//!ELSE" {
            let (outer, v) = stack
                .last()
                .copied()
                .expect("WGSL: //!ELSE outside a block");
            keep = outer && !v;
        } else if l == "//!END" {
            keep = stack.pop().expect("WGSL: //!END outside a block").0;
        } else if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(stack.is_empty(), "WGSL: unclosed //!IF block");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preprocess_named_flags_nest() {
        let src = "a\n//!IF A\nb\n//!IF B\nc\n//!ELSE\nd\n//!END\n//!ELSE\ne\n//!END\nf\n";
        let run = |a, b| preprocess(src, &[("A", a), ("B", b)]);
        assert_eq!(run(true, true), "a\nb\nc\nf\n");
        assert_eq!(run(true, false), "a\nb\nd\nf\n");
        assert_eq!(run(false, true), "a\ne\nf\n");
        assert_eq!(run(false, false), "a\ne\nf\n");
    }
}
