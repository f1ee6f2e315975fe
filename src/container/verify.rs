//! The full non-finite scan behind `inkling-wgpu info --verify`: every float tensor of every shard
//! (F32, BF16, F16 values, `.qs` scales included) read once, looking for NaN and ±Inf. Quantised U8
//! blobs hold levels, which are always finite; their scales are checked here and at every load.
use super::reader::Container;
use crate::formats::finite::{describe, first_non_finite_bytes};

/// A tensor holding a NaN or an Inf: where, and its first such value.
#[derive(Clone, Debug, PartialEq)]
pub struct NonFinite {
    pub shard: String,
    pub tensor: String,
    /// Flat index of the first non-finite value.
    pub index: usize,
    pub value: f32,
}

impl std::fmt::Display for NonFinite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: tensor `{}`: element {} (flat index) is {}",
            self.shard,
            self.tensor,
            self.index,
            describe(self.value)
        )
    }
}

/// Total bytes [`scan`] reads (every tensor of every shard).
pub fn scan_bytes(c: &Container) -> u64 {
    c.shards
        .iter()
        .flat_map(|s| &s.tensors)
        .map(|t| t.len() as u64)
        .sum()
}

/// Every tensor of `c` holding a NaN or an Inf, in file order; `progress(bytes)` is called after
/// each tensor with the bytes it covered.
pub fn scan(c: &Container, progress: &mut dyn FnMut(u64)) -> Vec<NonFinite> {
    let mut found = Vec::new();
    for s in &c.shards {
        for t in &s.tensors {
            if let Some((index, value)) = first_non_finite_bytes(s.bytes(t), t.dtype) {
                found.push(NonFinite {
                    shard: s.display(),
                    tensor: t.name.clone(),
                    index,
                    value,
                });
            }
            progress(t.len() as u64);
        }
    }
    found
}
