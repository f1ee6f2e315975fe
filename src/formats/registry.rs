//! The weight-format registry: one ordinal means one thing everywhere.
//!
//! This table is the code side of `FORMATS.md`; `tests/suite/container/formats_doc.rs` parses the Markdown table and
//! checks it row by row against [`REGISTRY`], so documentation and code cannot drift apart.
//! Ordinals 0–9 are shared with the wider MoE-container ecosystem; work in progress takes private
//! ordinals from 100 up. Containers name formats by [`FormatSpec::name`]; the ordinal lives inside the
//! engine.

use std::fmt;

/// A registered weight format. The discriminant is the registry ordinal (FORMATS.md, column 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Format {
    /// Ordinal 0: little-endian f32, 4·I bytes per row.
    F32 = 0,
    /// Ordinal 1: int8, one f32 scale per row.
    Int8 = 1,
    /// Ordinal 2: int4, one f32 scale per row; nibble − 8.
    Int4 = 2,
    /// Ordinal 3: int2, one f32 scale per row.
    Int2 = 3,
    /// Ordinal 4: int4 grouped, group size 32, 64 or 128 (a property of the tensor).
    Int4Grouped = 4,
    /// Ordinal 5: int3 with groups of 64 columns in 24 bytes.
    Int3G64 = 5,
    /// Ordinal 6: E8-lattice / IQ3 codebook format.
    E8Iq3 = 6,
    /// Ordinal 7: OCP MXFP4 (e2m1 values, e8m0 scale per 32).
    Mxfp4 = 7,
    /// Ordinal 8: fp8-e4m3 with one f32 scale per 128×128 block.
    Fp8E4m3B128 = 8,
    /// Ordinal 9: bf16, 2·I bytes per row, no scales.
    Bf16 = 9,
}

/// How a format stores its scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleLayout {
    /// No scales (f32, bf16).
    None,
    /// One f32 per row: `[O]`.
    PerRow,
    /// One f32 per group of `gs` columns: `[O][ceil(I/gs)]`.
    PerGroup,
    /// Scales embedded in the row bytes (block formats that carry their own scale bytes).
    Embedded,
    /// One f32 per 128×128 block: `[ceil(O/128)][ceil(I/128)]`.
    Block128,
}

/// One row of the registry table (FORMATS.md).
#[derive(Clone, Copy, Debug)]
pub struct FormatSpec {
    pub format: Format,
    /// Registry ordinal.
    pub ordinal: u32,
    /// Registry name, as written in container stamps (`inkling.fmt`).
    pub name: &'static str,
    /// Bytes of one row of I columns, as FORMATS.md writes it (`·`, `I`, `ceil(I/N)`; the doc
    /// test evaluates it against the row arithmetic).
    pub bytes_per_row: &'static str,
    /// Scale layout.
    pub scales: ScaleLayout,
    /// Allowed group sizes (empty when the format is not grouped; a single entry when fixed).
    pub group_sizes: &'static [u32],
    /// Whether this engine has a GPU kernel (and CPU decode) for it.
    pub gpu_kernel: bool,
}

/// The registry, in ordinal order. Source of truth together with FORMATS.md.
pub const REGISTRY: &[FormatSpec] = &[
    FormatSpec {
        format: Format::F32,
        ordinal: 0,
        name: "f32",
        bytes_per_row: "4·I",
        scales: ScaleLayout::None,
        group_sizes: &[],
        gpu_kernel: true,
    },
    FormatSpec {
        format: Format::Int8,
        ordinal: 1,
        name: "int8",
        bytes_per_row: "I",
        scales: ScaleLayout::PerRow,
        group_sizes: &[],
        gpu_kernel: false,
    },
    FormatSpec {
        format: Format::Int4,
        ordinal: 2,
        name: "int4",
        bytes_per_row: "ceil(I/2)",
        scales: ScaleLayout::PerRow,
        group_sizes: &[],
        gpu_kernel: true,
    },
    FormatSpec {
        format: Format::Int2,
        ordinal: 3,
        name: "int2",
        bytes_per_row: "ceil(I/4)",
        scales: ScaleLayout::PerRow,
        group_sizes: &[],
        gpu_kernel: false,
    },
    FormatSpec {
        format: Format::Int4Grouped,
        ordinal: 4,
        name: "int4-grouped",
        bytes_per_row: "ceil(I/2)",
        scales: ScaleLayout::PerGroup,
        group_sizes: &[32, 64, 128],
        gpu_kernel: true,
    },
    FormatSpec {
        format: Format::Int3G64,
        ordinal: 5,
        name: "int3-g64",
        bytes_per_row: "ceil(I/64)·24",
        scales: ScaleLayout::PerGroup,
        group_sizes: &[64],
        gpu_kernel: true,
    },
    FormatSpec {
        format: Format::E8Iq3,
        ordinal: 6,
        name: "e8-iq3",
        bytes_per_row: "ceil(I/256)·98",
        scales: ScaleLayout::Embedded,
        group_sizes: &[256],
        gpu_kernel: false,
    },
    FormatSpec {
        format: Format::Mxfp4,
        ordinal: 7,
        name: "mxfp4",
        bytes_per_row: "ceil(I/32)·17",
        scales: ScaleLayout::Embedded,
        group_sizes: &[32],
        gpu_kernel: false,
    },
    FormatSpec {
        format: Format::Fp8E4m3B128,
        ordinal: 8,
        name: "fp8-e4m3-b128",
        bytes_per_row: "I",
        scales: ScaleLayout::Block128,
        group_sizes: &[128],
        gpu_kernel: false,
    },
    FormatSpec {
        format: Format::Bf16,
        ordinal: 9,
        name: "bf16",
        bytes_per_row: "2·I",
        scales: ScaleLayout::None,
        group_sizes: &[],
        gpu_kernel: true,
    },
];

/// Errors of registry lookups.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    /// The ordinal is not in FORMATS.md.
    #[error("format ordinal {0} is not in the registry (FORMATS.md); refusing to guess a decode")]
    UnknownOrdinal(u32),
    /// The name is not in FORMATS.md.
    #[error("format name {0:?} is not in the registry (FORMATS.md); known: {1}")]
    UnknownName(String, String),
    /// The format is registered but this engine has no kernel for it.
    #[error("format {name} (ordinal {ordinal}) is registered but has no GPU kernel or CPU decode in this engine")]
    NoKernel { ordinal: u32, name: &'static str },
    /// A group size that the format does not allow.
    #[error("group size {gs} is not allowed for format {name} (allowed: {allowed:?})")]
    BadGroupSize {
        name: &'static str,
        gs: u32,
        allowed: &'static [u32],
    },
}

impl Format {
    /// The registry row of this format.
    pub fn spec(self) -> &'static FormatSpec {
        &REGISTRY[self as usize]
    }
    /// Registry ordinal.
    pub fn ordinal(self) -> u32 {
        self as u32
    }
    /// Registry name.
    pub fn name(self) -> &'static str {
        self.spec().name
    }
    /// Look up an ordinal; an ordinal missing from FORMATS.md is [`FormatError::UnknownOrdinal`].
    pub fn from_ordinal(ordinal: u32) -> Result<Format, FormatError> {
        REGISTRY
            .iter()
            .find(|s| s.ordinal == ordinal)
            .map(|s| s.format)
            .ok_or(FormatError::UnknownOrdinal(ordinal))
    }
    /// Look up a registry name (exact match).
    pub fn from_name(name: &str) -> Result<Format, FormatError> {
        REGISTRY
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.format)
            .ok_or_else(|| {
                FormatError::UnknownName(
                    name.to_string(),
                    REGISTRY
                        .iter()
                        .map(|s| s.name)
                        .collect::<Vec<_>>()
                        .join(", "),
                )
            })
    }
    /// Whether this engine implements the format (GPU kernel and CPU decode).
    pub fn has_kernel(self) -> bool {
        self.spec().gpu_kernel
    }
    /// Error unless the format has a kernel here.
    pub fn require_kernel(self) -> Result<(), FormatError> {
        if self.has_kernel() {
            Ok(())
        } else {
            Err(FormatError::NoKernel {
                ordinal: self.ordinal(),
                name: self.name(),
            })
        }
    }

    /// Bytes per row of an [O, I] matrix with `cols` = I, per FORMATS.md column 3.
    /// `gs` is the group size for grouped formats (ignored otherwise).
    pub fn bytes_per_row(self, cols: usize, gs: usize) -> usize {
        let _ = gs;
        match self {
            Format::F32 => 4 * cols,
            Format::Int8 => cols,
            Format::Int4 | Format::Int4Grouped => cols.div_ceil(2),
            Format::Int2 => cols.div_ceil(4),
            Format::Int3G64 => cols.div_ceil(64) * 24,
            Format::E8Iq3 => cols.div_ceil(256) * 98,
            Format::Mxfp4 => cols.div_ceil(32) * 17,
            Format::Fp8E4m3B128 => cols,
            Format::Bf16 => 2 * cols,
        }
    }

    /// Number of f32 scales of an [O, I] matrix (0 for formats without separate f32 scales).
    pub fn scale_count(self, rows: usize, cols: usize, gs: usize) -> usize {
        match self.spec().scales {
            ScaleLayout::None | ScaleLayout::Embedded => 0,
            ScaleLayout::PerRow => rows,
            ScaleLayout::PerGroup => rows * cols.div_ceil(gs.max(1)),
            ScaleLayout::Block128 => rows.div_ceil(128) * cols.div_ceil(128),
        }
    }

    /// Check a group size against the registry row. Non-grouped formats accept any value.
    pub fn check_group_size(self, gs: usize) -> Result<(), FormatError> {
        let s = self.spec();
        if s.scales == ScaleLayout::PerGroup && !s.group_sizes.contains(&(gs as u32)) {
            return Err(FormatError::BadGroupSize {
                name: s.name,
                gs: gs as u32,
                allowed: s.group_sizes,
            });
        }
        Ok(())
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A concrete weight encoding: a format plus its group size where it has one.
///
/// User-facing spellings (`--experts`): `f32`, `bf16`, `int4` (per-row scale), `int4-g32`,
/// `int4-g64`, `int4-g128` (ordinal 4 with that group size), `int3-g64`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Encoding {
    pub format: Format,
    /// Group size in columns; 0 for formats without groups (f32, bf16, per-row int4).
    pub group_size: usize,
}

impl Encoding {
    pub const F32: Encoding = Encoding {
        format: Format::F32,
        group_size: 0,
    };
    pub const BF16: Encoding = Encoding {
        format: Format::Bf16,
        group_size: 0,
    };

    /// Parse a user-facing spelling (see the type docs).
    pub fn parse(s: &str) -> Result<Encoding, FormatError> {
        let e = match s {
            "f32" => Encoding::F32,
            "bf16" => Encoding::BF16,
            "int4" => Encoding {
                format: Format::Int4,
                group_size: 0,
            },
            "int3-g64" => Encoding {
                format: Format::Int3G64,
                group_size: 64,
            },
            _ => {
                if let Some(g) = s.strip_prefix("int4-g") {
                    let gs: usize = g.parse().map_err(|_| unknown_spelling(s))?;
                    Format::Int4Grouped.check_group_size(gs)?;
                    Encoding {
                        format: Format::Int4Grouped,
                        group_size: gs,
                    }
                } else {
                    let f = Format::from_name(s).map_err(|_| unknown_spelling(s))?;
                    f.require_kernel()?;
                    // a grouped format needs its group size in the spelling (`int4-g64`)
                    f.check_group_size(0)?;
                    Encoding {
                        format: f,
                        group_size: 0,
                    }
                }
            }
        };
        Ok(e)
    }

    /// User-facing spelling, inverse of [`Encoding::parse`].
    pub fn spelling(&self) -> String {
        match self.format {
            Format::Int4Grouped => format!("int4-g{}", self.group_size),
            f => f.name().to_string(),
        }
    }

    /// Bytes per row of an [O, I] matrix.
    pub fn bytes_per_row(&self, cols: usize) -> usize {
        self.format.bytes_per_row(cols, self.group_size)
    }
    /// Number of f32 scales of an [O, I] matrix.
    pub fn scale_count(&self, rows: usize, cols: usize) -> usize {
        self.format.scale_count(rows, cols, self.group_size)
    }
    /// Scales per row (0 when the format has none).
    pub fn scales_per_row(&self, cols: usize) -> usize {
        self.scale_count(1, cols)
    }
}

fn unknown_spelling(s: &str) -> FormatError {
    FormatError::UnknownName(
        s.to_string(),
        "f32, bf16, int4, int4-g32, int4-g64, int4-g128, int3-g64".to_string(),
    )
}
