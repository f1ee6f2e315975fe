//! CPU side of the formats: quantisation, dequantisation and the f64 reference GEMV.
//!
//! Quantisation is symmetric with `scale = absmax / qmax` per scale unit (row or group), where
//! qmax is 7 for int4 (values q ∈ [−8, 7], stored q+8) and 3 for int3 (u ∈ [0, 7], w = (u−4)·s,
//! so q = u−4 ∈ [−4, 3]). The nearest level is `round(w / scale)` clamped to the format's range.
//! An all-zero unit gets scale 0.
//!
//! The same bytes feed the GPU kernels and the CPU decode here: [`QMatrix`] borrows mapped
//! container bytes (no alignment is assumed; scales are read as little-endian f32 from bytes).

use super::registry::{Encoding, Format, FormatError};
use half::bf16;
use std::borrow::Cow;

/// A weight matrix [rows = O, cols = I] in one registered encoding.
///
/// `data` holds `rows · encoding.bytes_per_row(cols)` bytes, row-major (FORMATS.md column 3);
/// `scales` holds `encoding.scale_count(rows, cols)` little-endian f32 values as raw bytes, so that
/// both can borrow unaligned bytes from a memory-mapped safetensors file.
#[derive(Clone, Debug)]
pub struct QMatrix<'a> {
    pub enc: Encoding,
    pub rows: usize,
    pub cols: usize,
    pub data: Cow<'a, [u8]>,
    pub scales: Cow<'a, [u8]>,
}

/// Shape/byte-count disagreement when building a [`QMatrix`].
#[derive(Debug, thiserror::Error)]
pub enum QMatrixError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("{what}: {enc} [{rows}, {cols}] needs {expected} bytes, got {got}")]
    ByteCount {
        what: &'static str,
        enc: String,
        rows: usize,
        cols: usize,
        expected: usize,
        got: usize,
    },
}

impl<'a> QMatrix<'a> {
    /// Wrap bytes, checking them against FORMATS.md byte arithmetic.
    pub fn new(
        enc: Encoding,
        rows: usize,
        cols: usize,
        data: Cow<'a, [u8]>,
        scales: Cow<'a, [u8]>,
    ) -> Result<Self, QMatrixError> {
        enc.format.require_kernel()?;
        enc.format.check_group_size(enc.group_size)?;
        let want = rows * enc.bytes_per_row(cols);
        if data.len() != want {
            return Err(QMatrixError::ByteCount {
                what: "weight bytes",
                enc: enc.spelling(),
                rows,
                cols,
                expected: want,
                got: data.len(),
            });
        }
        let want_s = 4 * enc.scale_count(rows, cols);
        if scales.len() != want_s {
            return Err(QMatrixError::ByteCount {
                what: "scale bytes",
                enc: enc.spelling(),
                rows,
                cols,
                expected: want_s,
                got: scales.len(),
            });
        }
        Ok(QMatrix {
            enc,
            rows,
            cols,
            data,
            scales,
        })
    }

    /// Bytes per row of the weight data.
    pub fn row_bytes(&self) -> usize {
        self.enc.bytes_per_row(self.cols)
    }

    /// Scale `i` (little-endian f32 read from possibly unaligned bytes).
    #[inline]
    pub fn scale(&self, i: usize) -> f32 {
        let b = &self.scales[4 * i..4 * i + 4];
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    /// Decode row `r` into `out[..cols]` (f32), per the FORMATS.md dequantisation column.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let n = self.cols;
        let rb = self.row_bytes();
        let row = &self.data[r * rb..(r + 1) * rb];
        match self.enc.format {
            Format::F32 => {
                for (i, o) in out[..n].iter_mut().enumerate() {
                    let b = &row[4 * i..4 * i + 4];
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            Format::Bf16 => {
                for (i, o) in out[..n].iter_mut().enumerate() {
                    *o = bf16::from_bits(u16::from_le_bytes([row[2 * i], row[2 * i + 1]])).to_f32();
                }
            }
            Format::Int4 | Format::Int4Grouped => {
                let spr = self.enc.scales_per_row(n);
                let gs = if self.enc.format == Format::Int4 {
                    n.max(1)
                } else {
                    self.enc.group_size
                };
                for (i, o) in out[..n].iter_mut().enumerate() {
                    let byte = row[i >> 1];
                    let nib = if i & 1 == 0 { byte & 0xF } else { byte >> 4 };
                    *o = (nib as i32 - 8) as f32 * self.scale(r * spr + i / gs);
                }
            }
            Format::Int3G64 => {
                let spr = self.enc.scales_per_row(n);
                for (i, o) in out[..n].iter_mut().enumerate() {
                    let g = i / 64;
                    let k = i % 64;
                    let grp = &row[g * 24..g * 24 + 24];
                    let lo = (grp[k >> 2] >> (2 * (k & 3))) & 3;
                    let hi = (grp[16 + (k >> 3)] >> (k & 7)) & 1;
                    let u = lo | (hi << 2);
                    *o = (u as i32 - 4) as f32 * self.scale(r * spr + g);
                }
            }
            _ => unreachable!("QMatrix::new refuses formats without a kernel"),
        }
    }

    /// Dequantise the whole matrix to f32, row-major [rows, cols].
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for r in 0..self.rows {
            self.dequantize_row(r, &mut out[r * self.cols..(r + 1) * self.cols]);
        }
        out
    }

    /// Reference GEMV y = W·x accumulated in f64 (the oracle for every GPU test).
    /// `x.len()` must equal `cols`; returns `rows` values.
    pub fn gemv_ref_f64(&self, x: &[f32]) -> Vec<f64> {
        assert_eq!(
            x.len(),
            self.cols,
            "gemv_ref_f64: x has {} values, matrix has {} columns",
            x.len(),
            self.cols
        );
        let mut row = vec![0f32; self.cols];
        (0..self.rows)
            .map(|r| {
                self.dequantize_row(r, &mut row);
                row.iter().zip(x).map(|(&w, &v)| w as f64 * v as f64).sum()
            })
            .collect()
    }

    /// CPU GEMV for the model's CPU path: `y[r] = Σ_i W[r,i]·x[i]`, f64 accumulation, f32 result.
    /// Reads the same bytes as the GPU kernels.
    pub fn gemv(&self, x: &[f32], y: &mut [f32]) {
        assert_eq!(x.len(), self.cols);
        assert_eq!(y.len(), self.rows);
        let mut row = vec![0f32; self.cols];
        for (r, yr) in y.iter_mut().enumerate() {
            self.dequantize_row(r, &mut row);
            let mut acc = 0f64;
            for (&w, &v) in row.iter().zip(x) {
                acc += w as f64 * v as f64;
            }
            *yr = acc as f32;
        }
    }

    /// Borrowed view of rows `r0..r1` (row-aligned; scales follow the rows).
    pub fn rows_view(&self, r0: usize, r1: usize) -> QMatrix<'_> {
        let rb = self.row_bytes();
        let spr = self.enc.scales_per_row(self.cols);
        QMatrix {
            enc: self.enc,
            rows: r1 - r0,
            cols: self.cols,
            data: Cow::Borrowed(&self.data[r0 * rb..r1 * rb]),
            scales: Cow::Borrowed(&self.scales[4 * r0 * spr..4 * r1 * spr]),
        }
    }

    /// Owned copy.
    pub fn into_owned(self) -> QMatrix<'static> {
        QMatrix {
            enc: self.enc,
            rows: self.rows,
            cols: self.cols,
            data: Cow::Owned(self.data.into_owned()),
            scales: Cow::Owned(self.scales.into_owned()),
        }
    }
}

fn symmetric_scale(vals: &[f32], qmax: f32) -> f32 {
    let absmax = vals.iter().fold(0f32, |m, v| m.max(v.abs()));
    absmax / qmax
}

fn level(v: f32, s: f32, lo: i32, hi: i32) -> i32 {
    if s == 0.0 {
        0
    } else {
        ((v / s).round() as i32).clamp(lo, hi)
    }
}

/// Quantise a row-major f32 matrix [rows, cols] into `enc` (symmetric, scale = absmax/qmax; see
/// the module docs). f32 copies; bf16 rounds to nearest even.
pub fn quantize(
    enc: Encoding,
    w: &[f32],
    rows: usize,
    cols: usize,
) -> Result<QMatrix<'static>, QMatrixError> {
    assert_eq!(
        w.len(),
        rows * cols,
        "quantize: {} values for [{rows}, {cols}]",
        w.len()
    );
    enc.format.require_kernel()?;
    enc.format.check_group_size(enc.group_size)?;
    let rb = enc.bytes_per_row(cols);
    let mut data = vec![0u8; rows * rb];
    let mut scales: Vec<f32> = Vec::with_capacity(enc.scale_count(rows, cols));
    for r in 0..rows {
        let src = &w[r * cols..(r + 1) * cols];
        let dst = &mut data[r * rb..(r + 1) * rb];
        match enc.format {
            Format::F32 => {
                for (i, v) in src.iter().enumerate() {
                    dst[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
            Format::Bf16 => {
                for (i, v) in src.iter().enumerate() {
                    dst[2 * i..2 * i + 2]
                        .copy_from_slice(&bf16::from_f32(*v).to_bits().to_le_bytes());
                }
            }
            Format::Int4 | Format::Int4Grouped => {
                let gs = if enc.format == Format::Int4 {
                    cols.max(1)
                } else {
                    enc.group_size
                };
                for g0 in (0..cols).step_by(gs) {
                    let g1 = (g0 + gs).min(cols);
                    let s = symmetric_scale(&src[g0..g1], 7.0);
                    scales.push(s);
                    for i in g0..g1 {
                        let q = (level(src[i], s, -8, 7) + 8) as u8;
                        dst[i >> 1] |= if i & 1 == 0 { q } else { q << 4 };
                    }
                }
                if cols == 0 && enc.format == Format::Int4 {
                    scales.push(0.0);
                }
            }
            Format::Int3G64 => {
                for g in 0..cols.div_ceil(64) {
                    let g0 = g * 64;
                    let g1 = (g0 + 64).min(cols);
                    let s = symmetric_scale(&src[g0..g1], 3.0);
                    scales.push(s);
                    let grp = &mut dst[g * 24..g * 24 + 24];
                    for k in 0..64 {
                        let u = if g0 + k < g1 {
                            (level(src[g0 + k], s, -4, 3) + 4) as u8
                        } else {
                            4
                        };
                        grp[k >> 2] |= (u & 3) << (2 * (k & 3));
                        grp[16 + (k >> 3)] |= ((u >> 2) & 1) << (k & 7);
                    }
                }
            }
            _ => unreachable!("require_kernel checked"),
        }
    }
    let scale_bytes: Vec<u8> = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
    QMatrix::new(enc, rows, cols, Cow::Owned(data), Cow::Owned(scale_bytes))
}
