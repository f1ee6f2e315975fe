// Device-to-device copy through a compute shader: the bandwidth ceiling for `bench copy`.
// dst[i] = src[i] over n vec4<u32> words, grid-stride loop over a 1-D dispatch (≤ 65535 groups).
struct Params {
    n: u32,       // vec4 words to copy
    stride: u32,  // threads in the whole dispatch
    _p0: u32,
    _p1: u32,
}
@group(0) @binding(0) var<uniform> prm: Params;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<u32>>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    var i = gid.x;
    loop {
        if (i >= prm.n) { break; }
        dst[i] = src[i];
        i += prm.stride;
    }
}
