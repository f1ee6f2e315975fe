//! The safetensors header checks that the `safetensors` crate reports without a tensor name, or
//! with the wrong one, or not at all: a name listed twice (a JSON map keeps the last one silently),
//! a shape that disagrees with its byte range, and byte ranges that overlap. Both loaders (the
//! checkpoint's [`crate::model::weights`] and the container's [`super::reader`]) run it before the
//! crate parses the header; everything else (truncation, bad JSON, unknown dtypes) is left to
//! their own messages.
use super::stamp::parse_pairs;
use safetensors::Dtype;

/// `Err(message naming every tensor involved)` for a duplicated name, a shape/byte-range
/// disagreement or overlapping ranges in the header of the safetensors file `bytes`; `Ok` when
/// none of these is found (including when the header cannot be read at all).
pub fn check_header(bytes: &[u8]) -> Result<(), String> {
    let Some(n) = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    else {
        return Ok(());
    };
    let Some(json) = usize::try_from(n)
        .ok()
        .and_then(|n| bytes.get(8..8usize.checked_add(n)?))
        .and_then(|h| std::str::from_utf8(h).ok())
    else {
        return Ok(());
    };
    let Ok(pairs) = parse_pairs::<serde_json::Value>(json) else {
        return Ok(());
    };
    let mut seen = std::collections::HashSet::new();
    let mut ranges: Vec<(u64, u64, &str)> = Vec::new();
    for (name, v) in &pairs {
        if name == "__metadata__" {
            continue;
        }
        if !seen.insert(name.as_str()) {
            return Err(format!("tensor `{name}` is listed twice in the header"));
        }
        let Some((dtype, shape, start, end)) = entry(v) else {
            continue;
        };
        if end < start {
            return Err(format!(
                "tensor `{name}`: data_offsets [{start}, {end}] end before they start"
            ));
        }
        let need = shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .and_then(|numel| numel.checked_mul(dtype.bitsize() as u64))
            .map(|bits| bits.div_ceil(8));
        if need != Some(end - start) {
            let need = need.map_or("more than 2^64".to_string(), |b| b.to_string());
            return Err(format!(
                "tensor `{name}`: shape {shape:?} of {dtype:?} needs {need} bytes, but its \
                 data_offsets [{start}, {end}] hold {}",
                end - start
            ));
        }
        ranges.push((start, end, name));
    }
    ranges.sort();
    for w in ranges.windows(2) {
        let ((s0, e0, a), (s1, e1, b)) = (w[0], w[1]);
        if s1 < e0 {
            return Err(format!(
                "tensors `{a}` (bytes [{s0}, {e0})) and `{b}` (bytes [{s1}, {e1})) overlap"
            ));
        }
    }
    Ok(())
}

/// (dtype, shape, start, end) of a header entry, `None` when it is not well formed (left to the
/// crate's own error).
fn entry(v: &serde_json::Value) -> Option<(Dtype, Vec<u64>, u64, u64)> {
    let dtype: Dtype = serde_json::from_value(v.get("dtype")?.clone()).ok()?;
    let shape = v
        .get("shape")?
        .as_array()?
        .iter()
        .map(|d| d.as_u64())
        .collect::<Option<Vec<u64>>>()?;
    let off = v.get("data_offsets")?.as_array()?;
    match off.as_slice() {
        [s, e] => Some((dtype, shape, s.as_u64()?, e.as_u64()?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str) -> Vec<u8> {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend(std::iter::repeat_n(0u8, 64));
        b
    }

    #[test]
    fn names_every_tensor_involved() {
        let ok = r#"{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]}}"#;
        assert_eq!(check_header(&file(ok)), Ok(()));
        let dup = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#;
        assert_eq!(
            check_header(&file(dup)),
            Err("tensor `a` is listed twice in the header".into())
        );
        let shape = r#"{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}}"#;
        assert_eq!(
            check_header(&file(shape)),
            Err(
                "tensor `a`: shape [2, 3] of F32 needs 24 bytes, but its data_offsets [0, 20] hold 20"
                    .into()
            )
        );
        let overlap = r#"{"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
        assert_eq!(
            check_header(&file(overlap)),
            Err("tensors `a` (bytes [0, 16)) and `b` (bytes [8, 24)) overlap".into())
        );
        let huge = r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}}"#;
        assert!(check_header(&file(huge))
            .unwrap_err()
            .contains("more than 2^64"));
        // unreadable headers are left to the loaders' own messages
        assert_eq!(check_header(b"\x10\x00"), Ok(()));
        assert_eq!(check_header(&file("{not json")), Ok(()));
    }
}
