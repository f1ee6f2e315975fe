//! CPU side of the formats: quantisation, dequantisation and the f64 reference GEMV.
//!
//! Quantisation is symmetric with one f32 scale per scale unit (row or group): int4 stores
//! q ∈ [−8, 7] as q+8, int3 stores u = q+4 with q ∈ [−4, 3]. The level is `round(w / scale)`
//! clamped to the format's range; the scale is chosen by a [`ScaleRule`] ([`super::scales`]:
//! `absmax / qmax`, or the search of least squared error). An all-zero unit gets scale 0.
//!
//! The same bytes feed the GPU kernels and the CPU decode here: [`QMatrix`] borrows mapped
//! container bytes (no alignment is assumed; scales are read as little-endian f32 from bytes).

use super::registry::{Encoding, Format, FormatError};
use super::scales::{choose_scale, level, Levels, ScaleRule};
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

/// Quantise a row-major f32 matrix [rows, cols] into `enc` with absmax scales (see the module
/// docs): `quantize_with(enc, w, rows, cols, ScaleRule::Absmax)`.
pub fn quantize(
    enc: Encoding,
    w: &[f32],
    rows: usize,
    cols: usize,
) -> Result<QMatrix<'static>, QMatrixError> {
    quantize_with(enc, w, rows, cols, ScaleRule::Absmax)
}

/// Quantise a row-major f32 matrix [rows, cols] into `enc`, each unit's scale chosen by `rule`
/// ([`super::scales`]); the stored levels are `clamp(round(w / s))` of that scale. f32 copies;
/// bf16 rounds to nearest even. Rows are split over the available CPU threads.
pub fn quantize_with(
    enc: Encoding,
    w: &[f32],
    rows: usize,
    cols: usize,
    rule: ScaleRule,
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
    let spr = enc.scale_count(1, cols);
    let mut data = vec![0u8; rows * rb];
    let mut scales = vec![0f32; rows * spr];
    // Scale search costs ~40 passes over a unit; small matrices are not worth a thread.
    let work = rows * cols * if rule == ScaleRule::Mse { 40 } else { 1 };
    let threads = if work < (1 << 22) || rows < 2 || spr == 0 {
        1
    } else {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(rows)
    };
    let per = rows.div_ceil(threads);
    if threads == 1 {
        quantize_rows(enc, w, cols, &mut data, &mut scales, rule);
    } else {
        std::thread::scope(|sc| {
            for ((wc, dc), sch) in w
                .chunks(per * cols)
                .zip(data.chunks_mut(per * rb))
                .zip(scales.chunks_mut(per * spr))
            {
                sc.spawn(move || quantize_rows(enc, wc, cols, dc, sch, rule));
            }
        });
    }
    let scale_bytes: Vec<u8> = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
    QMatrix::new(enc, rows, cols, Cow::Owned(data), Cow::Owned(scale_bytes))
}

/// Encode the rows of `w` ([n, cols]) into `data` (n · bytes_per_row) and `scales`
/// (n · scales_per_row, zeroed by the caller).
fn quantize_rows(
    enc: Encoding,
    w: &[f32],
    cols: usize,
    data: &mut [u8],
    scales: &mut [f32],
    rule: ScaleRule,
) {
    let rb = enc.bytes_per_row(cols);
    let spr = enc.scale_count(1, cols);
    for (r, dst) in data.chunks_exact_mut(rb.max(1)).enumerate() {
        let src = &w[r * cols..(r + 1) * cols];
        let srow = &mut scales[r * spr..(r + 1) * spr];
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
                for (g, g0) in (0..cols).step_by(gs).enumerate() {
                    let g1 = (g0 + gs).min(cols);
                    let s = choose_scale(rule, &src[g0..g1], Levels::INT4);
                    srow[g] = s;
                    for i in g0..g1 {
                        let q = (level(src[i], s, Levels::INT4) + 8) as u8;
                        dst[i >> 1] |= if i & 1 == 0 { q } else { q << 4 };
                    }
                }
            }
            Format::Int3G64 => {
                for g in 0..cols.div_ceil(64) {
                    let g0 = g * 64;
                    let g1 = (g0 + 64).min(cols);
                    let s = choose_scale(rule, &src[g0..g1], Levels::INT3);
                    srow[g] = s;
                    let grp = &mut dst[g * 24..g * 24 + 24];
                    for k in 0..64 {
                        let u = if g0 + k < g1 {
                            (level(src[g0 + k], s, Levels::INT3) + 4) as u8
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
}
