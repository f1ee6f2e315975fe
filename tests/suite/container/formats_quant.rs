//! CPU side of the formats: exact bit layouts (hand-built bytes), quantise/dequantise round trips,
//! and the reference GEMV.

use crate::ops_util::Rng;
use inkling_wgpu::formats::{quantize, Encoding, Format, FormatError, QMatrix};
use std::borrow::Cow;

fn enc(s: &str) -> Encoding {
    Encoding::parse(s).unwrap()
}

fn mat(e: &str, rows: usize, cols: usize, data: Vec<u8>, scales: &[f32]) -> QMatrix<'static> {
    let s: Vec<u8> = scales.iter().flat_map(|v| v.to_le_bytes()).collect();
    QMatrix::new(enc(e), rows, cols, Cow::Owned(data), Cow::Owned(s)).unwrap()
}

/// splitmix64 → f32 in [-1, 1)

#[test]
fn f32_layout() {
    let mut d = Vec::new();
    for v in [1.5f32, -2.25, 3.0] {
        d.extend_from_slice(&v.to_le_bytes());
    }
    assert_eq!(mat("f32", 1, 3, d, &[]).dequantize(), [1.5, -2.25, 3.0]);
}

#[test]
fn bf16_layout() {
    // 0x3FC0 = 1.5, 0xC010 = -2.25, 0x4040 = 3.0 (little-endian bytes)
    let d = vec![0xC0, 0x3F, 0x10, 0xC0, 0x40, 0x40];
    assert_eq!(mat("bf16", 1, 3, d, &[]).dequantize(), [1.5, -2.25, 3.0]);
}

#[test]
fn int4_layout() {
    // byte 0 = 0xF0: col 0 = low nibble 0 → −8, col 1 = high nibble 15 → 7
    // byte 1 = 0x9A: col 2 = 0xA → 2, col 3 = 0x9 → 1; byte 2 = 0x?3: col 4 = 3 → −5 (I = 5)
    let d = vec![0xF0, 0x9A, 0x73, 0x01, 0x8F, 0x00];
    let m = mat("int4", 2, 5, d, &[0.5, 2.0]);
    assert_eq!(
        m.dequantize(),
        [-4.0, 3.5, 1.0, 0.5, -2.5, /* row 1 */ -14.0, -16.0, 14.0, 0.0, -16.0]
    );
}

#[test]
fn int4_grouped_layout() {
    // I = 40, gs = 32: group 0 = cols 0..32 (scale 1), group 1 = cols 32..40 (scale 10)
    let mut d = vec![0x88u8; 20];
    d[0] = 0x9F; // col 0 → 7, col 1 → 1
    d[16] = 0x07; // col 32 → −1, col 33 → −8
    let m = mat("int4-g32", 1, 40, d, &[1.0, 10.0]);
    let v = m.dequantize();
    assert_eq!(&v[..3], &[7.0, 1.0, 0.0]);
    assert_eq!(&v[32..35], &[-10.0, -80.0, 0.0]);
}

#[test]
fn int3_layout() {
    // one group, I = 64: value k: lo bits at byte k>>2 shift 2(k&3), hi bit at byte 16+(k>>3) bit k&7
    let mut d = vec![0u8; 24];
    let us: Vec<u8> = (0..64).map(|k| ((k * 5 + 3) % 8) as u8).collect();
    for (k, &u) in us.iter().enumerate() {
        d[k >> 2] |= (u & 3) << (2 * (k & 3));
        d[16 + (k >> 3)] |= (u >> 2) << (k & 7);
    }
    let m = mat("int3-g64", 1, 64, d.clone(), &[0.5]);
    let want: Vec<f32> = us.iter().map(|&u| (u as f32 - 4.0) * 0.5).collect();
    assert_eq!(m.dequantize(), want);
    // spot check by hand: k = 0 → u = 3 (lo 3, hi 0) → −0.5; k = 1 → u = 0 → −2; k = 5 → u = 4 → 0
    assert_eq!(d[0] & 3, 3);
    assert_eq!(want[0], -0.5);
    assert_eq!(want[1], -2.0);
    assert_eq!(want[5], 0.0);
}

#[test]
fn int3_tail_padding_is_u4() {
    let q = quantize(enc("int3-g64"), &[1.0; 65], 1, 65).unwrap();
    assert_eq!(q.data.len(), 48);
    // group 1 holds column 64 then 63 padding values that must be u = 4 (lo 0, hi 1)
    let grp = &q.data[24..48];
    for k in 1..64 {
        let lo = (grp[k >> 2] >> (2 * (k & 3))) & 3;
        let hi = (grp[16 + (k >> 3)] >> (k & 7)) & 1;
        assert_eq!(lo | (hi << 2), 4, "padding value {k}");
    }
}

fn round_trip(e: &str, cols: usize, bound: impl Fn(f32) -> f32) {
    let rows = 5;
    let mut rng = Rng(cols as u64 * 31 + e.len() as u64);
    let w: Vec<f32> = (0..rows * cols).map(|_| rng.f() * 3.0).collect();
    let q = quantize(enc(e), &w, rows, cols).unwrap();
    assert_eq!(q.data.len(), rows * enc(e).bytes_per_row(cols));
    let d = q.dequantize();
    let enc = enc(e);
    let unit = match enc.format {
        Format::Int4 => cols,
        Format::Int4Grouped | Format::Int3G64 => enc.group_size,
        _ => cols,
    };
    for r in 0..rows {
        for g0 in (0..cols).step_by(unit) {
            let g1 = (g0 + unit).min(cols);
            let absmax = w[r * cols + g0..r * cols + g1]
                .iter()
                .fold(0f32, |m, v| m.max(v.abs()));
            for i in g0..g1 {
                let (a, b) = (w[r * cols + i], d[r * cols + i]);
                assert!(
                    (a - b).abs() <= bound(absmax) + 1e-6,
                    "{e} I={cols} [{r},{i}]: {a} → {b}"
                );
            }
        }
    }
}

#[test]
fn round_trip_error_bounds() {
    for cols in [1, 7, 63, 64, 65, 100, 129] {
        round_trip("f32", cols, |_| 0.0);
        round_trip("bf16", cols, |a| a * 2f32.powi(-8));
        // half a step: step = absmax / qmax
        round_trip("int4", cols, |a| a / 7.0 / 2.0 * 1.0001);
        round_trip("int4-g32", cols, |a| a / 7.0 / 2.0 * 1.0001);
        round_trip("int4-g64", cols, |a| a / 7.0 / 2.0 * 1.0001);
        round_trip("int4-g128", cols, |a| a / 7.0 / 2.0 * 1.0001);
        round_trip("int3-g64", cols, |a| a / 3.0 / 2.0 * 1.0001);
    }
}

#[test]
fn reference_gemv_matches_dequantised_dot() {
    let mut rng = Rng(7);
    let (rows, cols) = (9, 100);
    let w: Vec<f32> = (0..rows * cols).map(|_| rng.f()).collect();
    let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
    for e in ["f32", "bf16", "int4", "int4-g32", "int3-g64"] {
        let q = quantize(enc(e), &w, rows, cols).unwrap();
        let d = q.dequantize();
        let y = q.gemv_ref_f64(&x);
        let mut y32 = vec![0f32; rows];
        q.gemv(&x, &mut y32);
        for r in 0..rows {
            let want: f64 = (0..cols)
                .map(|i| d[r * cols + i] as f64 * x[i] as f64)
                .sum();
            assert!((y[r] - want).abs() < 1e-9);
            assert!((y32[r] as f64 - want).abs() < 1e-5);
        }
    }
}

#[test]
fn encodings_parse_and_refuse() {
    for s in [
        "f32",
        "bf16",
        "int4",
        "int4-g32",
        "int4-g64",
        "int4-g128",
        "int3-g64",
    ] {
        assert_eq!(Encoding::parse(s).unwrap().spelling(), s);
    }
    assert!(matches!(
        Encoding::parse("int4-g48"),
        Err(FormatError::BadGroupSize { .. })
    ));
    assert!(matches!(
        Encoding::parse("mxfp4"),
        Err(FormatError::NoKernel { ordinal: 7, .. })
    ));
    assert!(
        Encoding::parse("int4-grouped").is_err(),
        "a grouped format needs its group size"
    );
    assert!(matches!(
        Format::from_ordinal(42),
        Err(FormatError::UnknownOrdinal(42))
    ));
    assert!(QMatrix::new(
        enc("int4"),
        2,
        5,
        Cow::Owned(vec![0; 5]),
        Cow::Owned(vec![0; 8])
    )
    .is_err());
}
