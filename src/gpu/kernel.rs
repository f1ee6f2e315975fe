//! What every WGSL kernel family states about its pipelines ([`Kernel`]: a typed key whose
//! `Display` is the pipeline label, the WGSL, the entry point, the bind layout and the `#[repr(C)]`
//! uniform struct), the one pipeline builder ([`pipeline`]) and its cache ([`PipelineCache`]), and
//! the WGSL preprocessor. Imports no kernel family.

use crate::gpu::Gpu;
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex, OnceLock};

/// How a kernel binding is declared in its bind-group layout (group 0, compute stage).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bind {
    /// `var<uniform>`.
    Uniform,
    /// `var<storage, read>`.
    Read,
    /// `var<storage, read_write>`.
    Write,
}

/// A kernel family's pipeline key: a value names one compiled pipeline (entry point and every
/// flag that changes the WGSL), and its `Display` is the pipeline label (unique across families).
///
/// A new family implements this on a `#[derive(Clone, PartialEq, Eq, Hash)]` struct, declares its
/// uniform as `Params` (`#[repr(C)]`, `bytemuck::Pod`, the WGSL `Params` field for field) and
/// builds its dispatches with [`crate::gpu::call::Dispatch::new`], which takes exactly that type.
pub trait Kernel: Clone + Eq + Hash + fmt::Display + Send + Sync + 'static {
    /// The uniform bound at binding 0: the twin of the WGSL `Params` struct.
    type Params: bytemuck::Pod;
    /// WGSL entry point.
    fn entry(&self) -> &'static str;
    /// The explicit bind-group layout (group 0).
    fn bindings(&self) -> Vec<(u32, Bind)>;
    /// The WGSL after preprocessing.
    fn source(&self) -> String;
    /// Whether the WGSL uses subgroup operations (needs the `SUBGROUP` feature).
    fn subgroups(&self) -> bool {
        false
    }
}

/// A pipeline as data (any family): what `inkling-wgpu shaders` writes, what the translation
/// tests compile and what [`crate::gpu::variants`] lists. Made from a key by [`KernelSpec::of`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSpec {
    /// The pipeline label (the key's `Display`).
    pub key: String,
    pub entry: String,
    pub binds: Vec<(u32, Bind)>,
    pub source: String,
    /// Whether the WGSL uses subgroup operations (needs the `SUBGROUP` feature).
    pub subgroups: bool,
}

impl KernelSpec {
    /// The spec of pipeline `k`.
    pub fn of<K: Kernel>(k: &K) -> KernelSpec {
        KernelSpec {
            key: k.to_string(),
            entry: k.entry().to_string(),
            binds: k.bindings(),
            source: k.source(),
            subgroups: k.subgroups(),
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

/// Values built once per typed key, whatever the key's type: one map per key type, one cell per
/// key. Two threads asking for the same key get the same value, built once; different keys build
/// in parallel.
pub struct OnceCache<V> {
    families: Mutex<HashMap<TypeId, Box<dyn Any + Send + Sync>>>,
    _v: std::marker::PhantomData<fn() -> V>,
}

impl<V> Default for OnceCache<V> {
    fn default() -> Self {
        OnceCache {
            families: Mutex::new(HashMap::new()),
            _v: std::marker::PhantomData,
        }
    }
}

type Cells<K, V> = HashMap<K, Arc<OnceLock<Arc<V>>>>;

impl<V: Send + Sync + 'static> OnceCache<V> {
    /// The value of `key`, built by `make` on first use.
    pub fn get_or_build<K>(&self, key: &K, make: impl FnOnce() -> V) -> Arc<V>
    where
        K: Clone + Eq + Hash + Send + Sync + 'static,
    {
        let cell = {
            let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
            let cells = families
                .entry(TypeId::of::<K>())
                .or_insert_with(|| Box::new(Cells::<K, V>::new()))
                .downcast_mut::<Cells<K, V>>()
                .expect("one map type per key type");
            cells.entry(key.clone()).or_default().clone()
        };
        cell.get_or_init(|| Arc::new(make())).clone()
    }
}

/// Compiled compute pipelines, keyed by each family's typed key (on [`Gpu::cache`]).
pub type PipelineCache = OnceCache<wgpu::ComputePipeline>;

/// The pipeline of `k` with its explicit layout, built on first use and cached on the device.
pub fn pipeline<K: Kernel>(gpu: &Gpu, k: &K) -> Arc<wgpu::ComputePipeline> {
    gpu.cache.get_or_build(k, || build(gpu, &KernelSpec::of(k)))
}

/// Compile `spec` with its explicit bind-group layout (uncached).
fn build(gpu: &Gpu, spec: &KernelSpec) -> wgpu::ComputePipeline {
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
}

/// Keep the lines of the active branches of `//!IF FLAG` / `//!ELSE` / `//!END` blocks (blocks
/// may nest); `flags` gives every flag's value. A `//!EACH name=array …` / `//!END EACH` block
/// (no `//!IF` inside) is written once per `name=array` pair with `$NAME` and `$ARRAY` replaced:
/// one WGSL function per storage array, written once. Panics on an unknown flag or unbalanced
/// lines (a bug in the skeleton, caught by the WGSL validation tests).
pub fn preprocess(src: &str, flags: &[(&str, bool)]) -> String {
    let mut out = String::with_capacity(src.len());
    // per open block: (the enclosing block is kept, this branch is kept)
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let mut keep = true;
    // an open `//!EACH` block: its pairs and lines so far
    let mut each: Option<(Vec<(String, String)>, Vec<&str>)> = None;
    for line in src.lines() {
        let l = line.trim();
        if let Some((pairs, body)) = each.as_mut() {
            if l == "//!END EACH" {
                for (name, array) in pairs.iter() {
                    for b in body.iter() {
                        out.push_str(&b.replace("$NAME", name).replace("$ARRAY", array));
                        out.push('\n');
                    }
                }
                each = None;
            } else {
                assert!(!l.starts_with("//!"), "WGSL: {l} inside //!EACH");
                body.push(line);
            }
            continue;
        }
        if let Some(list) = l.strip_prefix("//!EACH ") {
            if keep {
                let pairs = list
                    .split_whitespace()
                    .map(|p| {
                        let (n, a) = p
                            .split_once('=')
                            .unwrap_or_else(|| panic!("WGSL: //!EACH item {p} is not name=array"));
                        (n.to_string(), a.to_string())
                    })
                    .collect();
                each = Some((pairs, Vec::new()));
            } else {
                each = Some((Vec::new(), Vec::new()));
            }
        } else if let Some(name) = l.strip_prefix("//!IF ") {
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
    assert!(each.is_none(), "WGSL: unclosed //!EACH block");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;

    #[test]
    fn preprocess_named_flags_nest() {
        let src = "a\n//!IF A\nb\n//!IF B\nc\n//!ELSE\nd\n//!END\n//!ELSE\ne\n//!END\nf\n";
        let run = |a, b| preprocess(src, &[("A", a), ("B", b)]);
        assert_eq!(run(true, true), "a\nb\nc\nf\n");
        assert_eq!(run(true, false), "a\nb\nd\nf\n");
        assert_eq!(run(false, true), "a\ne\nf\n");
        assert_eq!(run(false, false), "a\ne\nf\n");
    }

    #[test]
    fn preprocess_each_writes_one_copy_per_pair() {
        let src = "a\n//!IF A\n//!EACH ld_x=x ld_y=y\nfn $NAME() { $ARRAY[0]; }\n//!END EACH\n//!END\nb\n";
        assert_eq!(
            preprocess(src, &[("A", true)]),
            "a\nfn ld_x() { x[0]; }\nfn ld_y() { y[0]; }\nb\n"
        );
        assert_eq!(preprocess(src, &[("A", false)]), "a\nb\n");
    }

    /// Two threads asking for one key at the same time: one build, one shared value; another key
    /// (and the same fields under another key type) builds its own.
    #[test]
    fn cache_builds_a_key_once_across_threads() {
        #[derive(Clone, PartialEq, Eq, Hash)]
        struct KeyA(u32);
        #[derive(Clone, PartialEq, Eq, Hash)]
        struct KeyB(u32);
        let cache = OnceCache::<u64>::default();
        let builds = AtomicUsize::new(0);
        let gate = Barrier::new(2);
        let make = || {
            builds.fetch_add(1, Ordering::SeqCst);
            // hold the build open so the other thread arrives while it runs
            std::thread::sleep(std::time::Duration::from_millis(50));
            7u64
        };
        let (a, b) = std::thread::scope(|s| {
            let ta = s.spawn(|| {
                gate.wait();
                cache.get_or_build(&KeyA(1), make)
            });
            let tb = s.spawn(|| {
                gate.wait();
                cache.get_or_build(&KeyA(1), make)
            });
            (ta.join().unwrap(), tb.join().unwrap())
        });
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(*cache.get_or_build(&KeyA(2), || 8), 8);
        assert_eq!(*cache.get_or_build(&KeyB(1), || 9), 9);
        assert_eq!(*cache.get_or_build(&KeyA(1), || 10), 7);
    }
}
