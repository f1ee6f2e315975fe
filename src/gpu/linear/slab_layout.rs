//! How FORMATS.md row bytes become GPU slab bytes (FORMATS.md, *GPU layout*): each row padded
//! with zeros to a whole number of units (16 bytes; 48 bytes, two groups, for int3-g64), and the
//! bits of every int3-g64 group put in the GPU order the GEMV and the GEMM decode with one
//! bitwise select per eight values. Every other format keeps its bytes.
//!
//! int3-g64 GPU order, per 24-byte group (the same six little-endian u32 words: four lo words,
//! two hi words, holding the same values as FORMATS.md's layout; only bit positions inside each
//! word move):
//! * lo word w (values 16w .. 16w + 15): the 2-bit low part of value 16w + n (n < 8) at bits
//!   4n .. 4n + 1, of value 16w + 8 + n at bits 4n + 2 .. 4n + 3;
//! * hi word q (values 32q .. 32q + 31): the high bit of value 32q + n (n < 8) at bit 4n + 2,
//!   of 32q + 8 + n at 4n + 1, of 32q + 16 + n at 4n + 3, of 32q + 24 + n at 4n.
//!
//! So `(lo & 0x33333333) | (hi & 0xCCCCCCCC)` (and the same with `lo >> 2`, `hi << 1`, `hi >> 1`,
//! `hi << 2`) holds eight whole 3-bit values at bits 4n .. 4n + 2 (bit 4n + 3 is masked off).

use crate::formats::Encoding;
use crate::gpu::linear::format::lookup;

/// Bytes of one int3-g64 group (FORMATS.md).
const INT3_GROUP_BYTES: usize = 24;

/// Whether GPU rows differ from the FORMATS.md rows beyond zero padding.
pub fn reorders_bits(enc: Encoding) -> bool {
    lookup(enc.format).is_some_and(|k| k.gpu_bit_order)
}

/// Copy whole rows of `row_bytes` FORMATS.md bytes from `src` into `dst` at `stride` bytes per
/// row (`stride ≥ row_bytes`), zero padding after each row, int3-g64 groups in GPU order.
/// `dst.len()` must be `src.len() / row_bytes * stride`. `dst` is only written, never read (it
/// may be a write-combined staging view, where reads are slow).
pub fn write_gpu_rows(enc: Encoding, src: &[u8], row_bytes: usize, stride: usize, dst: &mut [u8]) {
    debug_assert_eq!(dst.len(), src.len() / row_bytes * stride);
    if row_bytes == stride && !reorders_bits(enc) {
        dst.copy_from_slice(src);
        return;
    }
    let reorder = reorders_bits(enc);
    for (s, d) in src
        .chunks_exact(row_bytes)
        .zip(dst.chunks_exact_mut(stride))
    {
        if reorder {
            for (gs, gd) in s
                .chunks_exact(INT3_GROUP_BYTES)
                .zip(d.chunks_exact_mut(INT3_GROUP_BYTES))
            {
                int3_group_to_gpu(gs, gd);
            }
        } else {
            d[..row_bytes].copy_from_slice(s);
        }
        d[row_bytes..].fill(0);
    }
}

/// The padded GPU bytes of whole rows (see [`write_gpu_rows`]).
pub fn gpu_rows(enc: Encoding, src: &[u8], row_bytes: usize, stride: usize) -> Vec<u8> {
    let mut v = vec![0u8; src.len() / row_bytes * stride];
    write_gpu_rows(enc, src, row_bytes, stride, &mut v);
    v
}

/// Eight 2-bit fields (bits 2n of a 16-bit value) to bits 4n.
fn spread_pairs(x: u32) -> u32 {
    let x = (x | (x << 8)) & 0x00FF_00FF;
    let x = (x | (x << 4)) & 0x0F0F_0F0F;
    (x | (x << 2)) & 0x3333_3333
}

/// Eight bits (bits n of an 8-bit value) to bits 4n.
fn spread_bits(x: u32) -> u32 {
    let x = (x | (x << 12)) & 0x000F_000F;
    let x = (x | (x << 6)) & 0x0303_0303;
    (x | (x << 3)) & 0x1111_1111
}

/// One int3-g64 group `src` (24 bytes, FORMATS.md order) into `dst` (24 bytes) in GPU order
/// (module docs); `dst` is only written.
fn int3_group_to_gpu(src: &[u8], dst: &mut [u8]) {
    let mut w = [0u32; 6];
    for (k, c) in src.chunks_exact(4).enumerate() {
        w[k] = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    for lo in &mut w[..4] {
        *lo = spread_pairs(*lo & 0xFFFF) | (spread_pairs(*lo >> 16) << 2);
    }
    for hi in &mut w[4..] {
        let h = *hi;
        *hi = (spread_bits(h & 0xFF) << 2)
            | (spread_bits((h >> 8) & 0xFF) << 1)
            | (spread_bits((h >> 16) & 0xFF) << 3)
            | spread_bits(h >> 24);
    }
    for (k, c) in dst.chunks_exact_mut(4).enumerate() {
        c.copy_from_slice(&w[k].to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decode one GPU-order group the way the kernel does and compare with FORMATS.md's u.
    #[test]
    fn int3_gpu_order_decodes_every_value() {
        let mut s = 0x1234_5678_9abc_def0u64;
        for _ in 0..64 {
            let mut g = [0u8; 24];
            for b in &mut g {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                *b = (s >> 56) as u8;
            }
            let u = |k: usize| {
                ((g[k >> 2] >> (2 * (k & 3))) & 3) | (((g[16 + (k >> 3)] >> (k & 7)) & 1) << 2)
            };
            let want: Vec<u8> = (0..64).map(u).collect();
            let mut gpu = [0xA5u8; 24];
            int3_group_to_gpu(&g, &mut gpu);
            let w: Vec<u32> = gpu
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let mut got = Vec::new();
            for lw in 0..4 {
                let h = w[4 + lw / 2];
                let (h0, h1) = if lw % 2 == 0 {
                    (h, h << 1)
                } else {
                    (h >> 1, h << 2)
                };
                for (l, hh) in [(w[lw], h0), (w[lw] >> 2, h1)] {
                    let n = (l & 0x3333_3333) | (hh & 0xCCCC_CCCC);
                    got.extend((0..8).map(|k| ((n >> (4 * k)) & 7) as u8));
                }
            }
            assert_eq!(got, want);
        }
    }
}
