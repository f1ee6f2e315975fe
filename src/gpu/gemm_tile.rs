//! What a caller states about the prefill GEMM (`gpu::gemm`) when it binds a call over GEMV
//! weights (`GpuWeights`): the GEMM's output [`Tile`] and whether the call may run as a GEMM
//! ([`GemmChoice`], the field `GemvArgs::gemm`). Imports nothing, so the GEMV's arguments carry
//! the choice without the GEMV importing the GEMM.

/// The output tile of one workgroup: RM rows per thread (BM = 64·RM rows) × NQ quads of pairs
/// (BN = 4·NQ pairs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tile {
    pub rm: u32,
    pub nq: u32,
}

impl Tile {
    /// Rows per workgroup, BM.
    pub fn rows(self) -> u32 {
        64 * self.rm
    }
    /// Pairs per workgroup, BN.
    pub fn pairs(self) -> u32 {
        4 * self.nq
    }
    /// Whether the GEMM kernel can be instantiated with this tile: RM in 1, 2, 4, 8 and NQ in
    /// 2, 4 (its x staging needs an even NQ; workgroup memory bounds NQ).
    pub fn buildable(self) -> bool {
        matches!(self.rm, 1 | 2 | 4 | 8) && matches!(self.nq, 2 | 4)
    }
}

/// Whether a GEMV call (`GemvArgs::gemm`) may run as a GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmChoice {
    /// Always the GEMV.
    Never,
    /// The GEMM when `gemm::select`'s rules pick it (the default).
    Auto,
    /// The GEMM with this tile whenever it can run (a GEMM format, experts ≤ `gemm::EMAX`, ≥ 1
    /// pair); tests and benchmarks.
    Always(Tile),
}
