// int3-g64 groups from their FORMATS.md bit order to the GPU order the GEMV and GEMM decode, in place
// (src/gpu/linear/slab_layout.rs documents both orders and does the same on the host): the
// streamed uploads copy int3-g64 experts as stored and this pass reorders them in their slot.
// Each 24-byte group is six u32 words: four lo words (2-bit low parts), two hi words (high bits).
// Grid-stride loop over `groups` groups starting at word `offset` (1-D dispatch, ≤ 65535 groups).
struct Params {
    offset: u32,  // u32 word of the first group in the buffer
    groups: u32,  // groups to reorder
    stride: u32,  // threads in the whole dispatch
    _p0: u32,
}
@group(0) @binding(0) var<uniform> prm: Params;
@group(0) @binding(1) var<storage, read_write> w: array<u32>;

// Eight 2-bit fields (bits 2n of a 16-bit value) to bits 4n.
fn spread_pairs(v: u32) -> u32 {
    var x = (v | (v << 8u)) & 0x00FF00FFu;
    x = (x | (x << 4u)) & 0x0F0F0F0Fu;
    return (x | (x << 2u)) & 0x33333333u;
}

// Eight bits (bits n of an 8-bit value) to bits 4n.
fn spread_bits(v: u32) -> u32 {
    var x = (v | (v << 12u)) & 0x000F000Fu;
    x = (x | (x << 6u)) & 0x03030303u;
    return (x | (x << 3u)) & 0x11111111u;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    var g = gid.x;
    loop {
        if (g >= prm.groups) { break; }
        let b = prm.offset + 6u * g;
        for (var k = 0u; k < 4u; k++) {
            let lo = w[b + k];
            w[b + k] = spread_pairs(lo & 0xFFFFu) | (spread_pairs(lo >> 16u) << 2u);
        }
        for (var k = 4u; k < 6u; k++) {
            let h = w[b + k];
            w[b + k] = (spread_bits(h & 0xFFu) << 2u) | (spread_bits((h >> 8u) & 0xFFu) << 1u)
                | (spread_bits((h >> 16u) & 0xFFu) << 3u) | spread_bits(h >> 24u);
        }
        g += prm.stride;
    }
}
