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
        self.map
            .lock()
            .unwrap()
            .entry(key.to_string())
            .or_insert(p)
            .clone()
    }
}

/// Every instantiation of a WGSL file of `wgsl/` that a device could be handed, as
/// `(label, source)`: files with a preprocessing step list each variant, others are used as is.
/// `tests/wgsl_validate.rs` validates all of them with naga, without a device.
pub fn wgsl_instantiations(file_name: &str, source: &str) -> Vec<(String, String)> {
    match file_name {
        "gemv.wgsl" => {
            use crate::gpu::gemv;
            let mut v = Vec::new();
            for enc in gemv::kernel_encodings() {
                for sg in [false, true] {
                    let red = if sg { "subgroup" } else { "shared" };
                    v.push((
                        format!("gemv.wgsl [{} {red}]", enc.spelling()),
                        gemv::wgsl_source(enc, sg),
                    ));
                    // every tuning `gemv::plan` can pick, staged and (f32/bf16) direct x
                    for &t in gemv::candidates(enc.format) {
                        let direct = [false, true].into_iter().filter(|&d| {
                            !d || (matches!(
                                enc.format,
                                crate::formats::Format::F32 | crate::formats::Format::Bf16
                            ) && t.rows_per_workgroup() <= gemv::DIRECT_MAX_RPW)
                        });
                        for d in direct {
                            let label = format!(
                                "gemv.wgsl [{} {red} {}x{} {}]",
                                enc.spelling(),
                                t.tpr,
                                t.rpt,
                                if d { "direct x" } else { "staged x" }
                            );
                            v.push((label, gemv::wgsl_source_tuned(enc, sg, t, 2048, d)));
                        }
                    }
                }
            }
            v
        }
        "norm.wgsl" => [(false, false), (false, true), (true, false), (true, true)]
            .into_iter()
            .map(|(v, inplace)| {
                (
                    format!(
                        "{file_name} [{}{}]",
                        if v { "vec4" } else { "f32" },
                        if inplace { " inplace" } else { "" }
                    ),
                    crate::gpu::ops::norm::norm_source(v, inplace),
                )
            })
            .collect(),
        "conv.wgsl" => [false, true]
            .into_iter()
            .map(|pair| {
                (
                    format!("{file_name} [{}]", if pair { "pair" } else { "single" }),
                    preprocess(source, &[("PAIR", pair)]),
                )
            })
            .collect(),
        "attention.wgsl" | "residual.wgsl" => [false, true]
            .into_iter()
            .map(|v| {
                (
                    format!("{file_name} [{}]", if v { "vec4" } else { "f32" }),
                    crate::gpu::ops::wgsl_variant(source, v),
                )
            })
            .collect(),
        _ => vec![(file_name.to_string(), source.to_string())],
    }
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
