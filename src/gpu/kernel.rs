//! Kernel plumbing shared by every WGSL kernel family: a pipeline cache keyed by each kernel's
//! own cache key (ratchet-style: the kernel owns its key, bind layout and dispatch size).

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
        self.map.lock().unwrap().entry(key.to_string()).or_insert(p).clone()
    }
}
