//! Finding non-finite values (NaN, ±Inf) in float tensors, for the checks at conversion, at load
//! (container scales) and in `info --verify`.
use safetensors::Dtype;

/// The first NaN or ±Inf of `v`: (flat index, value).
pub fn first_non_finite(v: &[f32]) -> Option<(usize, f32)> {
    v.iter().position(|x| !x.is_finite()).map(|i| (i, v[i]))
}

/// Bytes tested at once by [`first_hit`]: a multiple of every element size.
const BLOCK: usize = 4096;

/// Index of the first `size`-byte element of `bytes` for which `hit` holds. Each block is first
/// tested whole without an early exit (a loop the compiler vectorises), and searched element by
/// element only when it holds a hit.
fn first_hit(bytes: &[u8], size: usize, hit: impl Fn(&[u8]) -> bool + Copy) -> Option<usize> {
    for (b, block) in bytes.chunks(BLOCK).enumerate() {
        if block.chunks_exact(size).fold(false, |any, c| any | hit(c)) {
            let i = block.chunks_exact(size).position(hit)?;
            return Some(b * (BLOCK / size) + i);
        }
    }
    None
}

/// The first NaN or ±Inf of little-endian `bytes` of `dtype` (F32, BF16, F16; other dtypes hold
/// no floats and give `None`): (flat index, value as f32). Reads the bits, no conversion pass.
pub fn first_non_finite_bytes(bytes: &[u8], dtype: Dtype) -> Option<(usize, f32)> {
    match dtype {
        Dtype::F32 => first_hit(bytes, 4, |c| {
            u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & 0x7f80_0000 == 0x7f80_0000
        })
        .map(|i| {
            let c = &bytes[4 * i..4 * i + 4];
            (i, f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        }),
        // bf16: exponent bits 0x7f80; f16: 0x7c00
        Dtype::BF16 | Dtype::F16 => {
            let exp = if dtype == Dtype::BF16 { 0x7f80 } else { 0x7c00 };
            first_hit(bytes, 2, |c| u16::from_le_bytes([c[0], c[1]]) & exp == exp).map(|i| {
                let b = u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]);
                let v = if dtype == Dtype::BF16 {
                    half::bf16::from_bits(b).to_f32()
                } else {
                    half::f16::from_bits(b).to_f32()
                };
                (i, v)
            })
        }
        _ => None,
    }
}

/// `NaN`, `+inf` or `-inf` (for error messages).
pub fn describe(v: f32) -> &'static str {
    if v.is_nan() {
        "NaN"
    } else if v > 0.0 {
        "+inf"
    } else {
        "-inf"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_first_non_finite_value_of_each_dtype() {
        let f: Vec<u8> = [1.0f32, f32::MAX, f32::NEG_INFINITY, f32::NAN]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(
            first_non_finite_bytes(&f, Dtype::F32),
            Some((2, f32::NEG_INFINITY))
        );
        let b: Vec<u8> = [1.0f32, -3.0e38, f32::INFINITY]
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
            .collect();
        assert_eq!(
            first_non_finite_bytes(&b, Dtype::BF16),
            Some((2, f32::INFINITY))
        );
        let h: Vec<u8> = [65504.0f32, f32::NAN]
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
            .collect();
        let (i, v) = first_non_finite_bytes(&h, Dtype::F16).unwrap();
        assert!(i == 1 && v.is_nan());
        assert_eq!(first_non_finite_bytes(&[0xff; 8], Dtype::U8), None);
        // hits past the first block (the first of two); a trailing partial element is no element
        let mut long = vec![0u8; 3 * BLOCK + 3];
        long[2 * BLOCK + 6..2 * BLOCK + 8].copy_from_slice(&0x7f80u16.to_le_bytes());
        long[2 * BLOCK + 10..2 * BLOCK + 12].copy_from_slice(&0xffc0u16.to_le_bytes());
        long[3 * BLOCK..].fill(0xff);
        assert_eq!(
            first_non_finite_bytes(&long, Dtype::BF16),
            Some((BLOCK + 3, f32::INFINITY))
        );
        assert_eq!(
            first_non_finite_bytes(&long[..3 * BLOCK + 1], Dtype::F32).map(|h| h.0),
            Some((2 * BLOCK + 4) / 4)
        );
        assert_eq!(
            first_non_finite_bytes(&long[..2 * BLOCK], Dtype::BF16),
            None
        );
        assert_eq!(first_non_finite(&[0.0, -0.0, 1e-45]), None);
        assert_eq!(describe(f32::NAN), "NaN");
        assert_eq!(describe(f32::NEG_INFINITY), "-inf");
    }
}
