//! Trust, verify, refuse: the `inkling.fmt` stamp map of a shard and its check against the byte
//! arithmetic of FORMATS.md.
//!
//! A stamp names the registry format of one tensor. It is accepted only when the tensor's bytes
//! agree with it: `rows × bytes_per_row(cols)` weight bytes and the scale count of the companion
//! `NAME.qs` tensor (which also gives the group size of grouped formats). A stamp that disagrees,
//! or that names no registered format, is refused with an error naming the shard, the tensor, the
//! stamp and what the bytes imply. A tensor without a stamp gets a format only where the byte
//! arithmetic allows exactly one.

use crate::formats::{Encoding, Format, ScaleLayout, REGISTRY};
use serde::de::{Deserializer, MapAccess, Visitor};
use std::fmt;

/// Metadata key of the stamp map: a JSON object (as a string) from tensor name to registry name.
pub const STAMP_KEY: &str = "inkling.fmt";
/// Metadata key of the logical shapes: a JSON object from tensor name to `[rows, cols]`
/// (needed for U8 blobs, whose stored shape is `[rows, bytes_per_row]`).
pub const SHAPE_KEY: &str = "inkling.shape";
/// Suffix of the companion scale tensor.
pub const SCALES_SUFFIX: &str = ".qs";

/// Everything that can go wrong reading or verifying a container. The messages are part of the
/// interface (tests assert them verbatim).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ContainerError {
    #[error("{shard}: malformed {key} metadata: {detail}")]
    MalformedMap {
        shard: String,
        key: &'static str,
        detail: String,
    },
    #[error("{shard}: {key} claims tensor {tensor:?} {count} times; at most one claim per tensor is allowed")]
    DuplicateClaim {
        shard: String,
        key: &'static str,
        tensor: String,
        count: usize,
    },
    #[error("{shard}: {key} has an entry for tensor {tensor:?}, but the shard has no tensor of that name")]
    ClaimForMissingTensor {
        shard: String,
        key: &'static str,
        tensor: String,
    },
    #[error("{shard}: tensor {tensor}: stamp {stamp:?} is not a format name in the registry (FORMATS.md); the bytes imply {implied}")]
    UnknownFormat {
        shard: String,
        tensor: String,
        stamp: String,
        implied: String,
    },
    #[error("{shard}: tensor {tensor}: stamp {stamp:?} disagrees with the bytes: {detail}; the bytes imply {implied}")]
    WrongStamp {
        shard: String,
        tensor: String,
        stamp: String,
        detail: String,
        implied: String,
    },
    #[error("{shard}: tensor {tensor}: stamp {stamp:?} names a format this engine cannot decode (no kernel)")]
    NoKernel {
        shard: String,
        tensor: String,
        stamp: String,
    },
    #[error("{shard}: tensor {tensor}: no stamp, and the bytes allow several formats ({implied}); refusing to guess")]
    Ambiguous {
        shard: String,
        tensor: String,
        implied: String,
    },
    #[error(
        "{shard}: tensor {tensor}: no stamp, and the bytes match no registered format ({detail})"
    )]
    NoFormat {
        shard: String,
        tensor: String,
        detail: String,
    },
    #[error("{shard}: tensor {tensor}: {detail}")]
    BadTensor {
        shard: String,
        tensor: String,
        detail: String,
    },
    #[error("{shard}: truncated: {detail}")]
    Truncated { shard: String, detail: String },
    #[error("{shard}: not a valid safetensors file: {detail}")]
    BadFile { shard: String, detail: String },
    #[error("{path}: {detail}")]
    Io { path: String, detail: String },
    #[error("{dir}: tensor {tensor} not found in any shard")]
    MissingTensor { dir: String, tensor: String },
}

/// Parse a JSON object whose values are strings into (key, value) pairs in document order,
/// keeping duplicate keys (serde_json's maps silently keep the last one).
pub fn parse_string_map(json: &str) -> Result<Vec<(String, String)>, String> {
    parse_pairs::<String>(json)
}

/// Parse a JSON object of `name → [rows, cols]`, keeping duplicate keys.
pub fn parse_shape_map(json: &str) -> Result<Vec<(String, [usize; 2])>, String> {
    parse_pairs::<[usize; 2]>(json)
}

/// Parse a JSON object into (key, value) pairs in document order, keeping duplicate keys.
pub(crate) fn parse_pairs<V: serde::de::DeserializeOwned>(
    json: &str,
) -> Result<Vec<(String, V)>, String> {
    struct Pairs<V>(std::marker::PhantomData<V>);
    impl<'de, V: serde::de::DeserializeOwned> Visitor<'de> for Pairs<V> {
        type Value = Vec<(String, V)>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some((k, v)) = m.next_entry::<String, V>()? {
                out.push((k, v));
            }
            Ok(out)
        }
    }
    struct Wrap<V>(Vec<(String, V)>);
    impl<'de, V: serde::de::DeserializeOwned> serde::Deserialize<'de> for Wrap<V> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_map(Pairs(std::marker::PhantomData)).map(Wrap)
        }
    }
    serde_json::from_str::<Wrap<V>>(json)
        .map(|w| w.0)
        .map_err(|e| e.to_string())
}

/// Reject a map with two claims on one tensor. Returns the pairs unchanged otherwise.
pub fn check_unique<V>(
    shard: &str,
    key: &'static str,
    pairs: &[(String, V)],
) -> Result<(), ContainerError> {
    let mut seen = std::collections::HashMap::<&str, usize>::new();
    for (k, _) in pairs {
        *seen.entry(k.as_str()).or_default() += 1;
    }
    if let Some((k, _)) = pairs.iter().find(|(k, _)| seen[k.as_str()] > 1) {
        return Err(ContainerError::DuplicateClaim {
            shard: shard.to_string(),
            key,
            tensor: k.clone(),
            count: seen[k.as_str()],
        });
    }
    Ok(())
}

/// What one tensor's bytes look like, as far as the stamp check is concerned.
#[derive(Clone, Copy, Debug)]
pub struct TensorBytes {
    /// Logical matrix rows (O).
    pub rows: usize,
    /// Logical matrix columns (I).
    pub cols: usize,
    /// Weight bytes.
    pub data_len: usize,
    /// Number of f32 values in the `.qs` companion (0 when there is none).
    pub scale_count: usize,
    /// Storage dtype of the weight tensor: `Some(F32 | BF16)` pins the format, `None` (U8) leaves
    /// it to the byte arithmetic.
    pub dtype_format: Option<Format>,
}

/// Every encoding (registry format × allowed group size) that the byte arithmetic allows.
pub fn implied_encodings(t: &TensorBytes) -> Vec<Encoding> {
    let mut out = Vec::new();
    for spec in REGISTRY {
        if let Some(f) = t.dtype_format {
            if f != spec.format {
                continue;
            }
        }
        let gss: Vec<usize> = if spec.scales == ScaleLayout::PerGroup {
            spec.group_sizes.iter().map(|&g| g as usize).collect()
        } else {
            vec![0]
        };
        for gs in gss {
            let enc = Encoding {
                format: spec.format,
                group_size: gs,
            };
            if t.rows * enc.bytes_per_row(t.cols) == t.data_len
                && enc.scale_count(t.rows, t.cols) == t.scale_count
            {
                out.push(enc);
            }
        }
    }
    out
}

/// Human description of [`implied_encodings`].
pub fn describe_implied(t: &TensorBytes) -> String {
    let v = implied_encodings(t);
    let names: Vec<String> = v.iter().map(enc_label).collect();
    match names.len() {
        0 => format!(
            "no registered format ([{}, {}] with {} weight bytes and {} scales)",
            t.rows, t.cols, t.data_len, t.scale_count
        ),
        1 => names[0].clone(),
        _ => format!("one of {}", names.join(", ")),
    }
}

/// Registry name plus group size where the format has several (`int4-grouped/g64`).
pub fn enc_label(e: &Encoding) -> String {
    if e.format.spec().group_sizes.len() > 1 {
        format!("{}/g{}", e.format.name(), e.group_size)
    } else {
        e.format.name().to_string()
    }
}

/// Verify one tensor against its stamp (or infer without one). Returns the encoding to decode with.
///
/// For a grouped format the group size is the one whose scale count matches; where several do
/// (every row is a single group: `cols ≤ gs`), they decode identically and the smallest is taken.
pub fn verify_tensor(
    shard: &str,
    tensor: &str,
    stamp: Option<&str>,
    t: &TensorBytes,
) -> Result<Encoding, ContainerError> {
    let implied = implied_encodings(t);
    let Some(stamp) = stamp else {
        return match implied.len() {
            1 => Ok(implied[0]),
            0 => Err(ContainerError::NoFormat {
                shard: shard.into(),
                tensor: tensor.into(),
                detail: describe_implied(t)
                    .trim_start_matches("no registered format (")
                    .trim_end_matches(')')
                    .to_string(),
            }),
            _ => Err(ContainerError::Ambiguous {
                shard: shard.into(),
                tensor: tensor.into(),
                implied: implied.iter().map(enc_label).collect::<Vec<_>>().join(", "),
            }),
        };
    };
    let format = match Format::from_name(stamp) {
        Ok(f) => f,
        Err(_) => {
            return Err(ContainerError::UnknownFormat {
                shard: shard.into(),
                tensor: tensor.into(),
                stamp: stamp.into(),
                implied: describe_implied(t),
            })
        }
    };
    if let Some(e) = implied.iter().find(|e| e.format == format) {
        if !format.has_kernel() {
            return Err(ContainerError::NoKernel {
                shard: shard.into(),
                tensor: tensor.into(),
                stamp: stamp.into(),
            });
        }
        return Ok(*e);
    }
    // Explain the disagreement with the format's own arithmetic.
    let spec = format.spec();
    let detail = if let Some(df) = t.dtype_format.filter(|&df| df != format) {
        format!("the tensor is stored as {df}, not as a byte blob")
    } else {
        let gs_list: Vec<usize> = if spec.scales == ScaleLayout::PerGroup {
            spec.group_sizes.iter().map(|&g| g as usize).collect()
        } else {
            vec![0]
        };
        let want_bytes = t.rows * format.bytes_per_row(t.cols, gs_list[0]);
        let want_scales: Vec<String> = gs_list
            .iter()
            .map(|&g| {
                let n = format.scale_count(t.rows, t.cols, g);
                if spec.scales == ScaleLayout::PerGroup && gs_list.len() > 1 {
                    format!("{n} (g{g})")
                } else {
                    n.to_string()
                }
            })
            .collect();
        format!(
            "[{}, {}] in {} needs {} weight bytes and {} scales, found {} bytes and {} scales",
            t.rows,
            t.cols,
            format.name(),
            want_bytes,
            want_scales.join(" or "),
            t.data_len,
            t.scale_count
        )
    };
    Err(ContainerError::WrongStamp {
        shard: shard.into(),
        tensor: tensor.into(),
        stamp: stamp.into(),
        detail,
        implied: describe_implied(t),
    })
}
