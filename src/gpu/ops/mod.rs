//! GPU kernels for every non-GEMV operation of the Inkling decoder, one file per WGSL file.
//!
//! Each family describes a shape (`RmsNorm`, `AttentionShape`, `Argmax`, ...) and binds it to
//! buffers with `shape.bind(gpu, buffers…) -> Result<Call, BufferTooSmall>`; its pipelines are
//! typed keys implementing [`crate::gpu::kernel::Kernel`]. All activations are f32. Per-token
//! parameters (the absolute position of the first new token) come from a 16-byte uniform the host
//! updates with `queue.write_buffer` ([`PosBuffer`]).

pub mod attention;
pub mod attention_fused;
pub mod conv;
pub mod elementwise;
pub mod norm;
pub mod router;
pub mod split;

use crate::gpu::call::{self, Dispatch};
use crate::gpu::kernel::{Kernel, KernelSpec};
use crate::gpu::Gpu;

pub use attention::AttentionShape;
pub use attention_fused::{attention_consts, FusedAttention, FusedAttentionIo};
pub use conv::ShortConvKernel;
pub use elementwise::{Argmax, DivConst, MulConst, SiluMul, SiluMulLayout};
pub use norm::{EmbedNorm, EmbedShard, RmsNorm};
pub use router::{Pair, RouterShape};
pub use split::SplitColumns;

/// [`Dispatch::new`] for an op kernel. Debug builds (the tests) check that the kernel is one of
/// [`kernels`], so a new variant cannot escape `inkling-wgpu shaders` and the MSL/HLSL
/// translation test.
pub(crate) fn dispatch<K: Kernel>(
    gpu: &Gpu,
    key: &K,
    params: &K::Params,
    buffers: &[(u32, &wgpu::Buffer)],
    groups: [u32; 3],
) -> Dispatch {
    if cfg!(debug_assertions) {
        static LISTED: std::sync::OnceLock<Vec<KernelSpec>> = std::sync::OnceLock::new();
        let spec = KernelSpec::of(key);
        assert!(
            LISTED.get_or_init(kernels).contains(&spec),
            "op kernel {} (entry {}) is not listed, or listed with another WGSL or \
             layout, by gpu::ops::kernels(); list every variant there",
            spec.key,
            spec.entry
        );
    }
    Dispatch::new(gpu, key, params, buffers, groups)
}

/// Every pipeline the op kernels can build, each variant of each file.
pub fn kernels() -> Vec<KernelSpec> {
    let mut v = Vec::new();
    v.extend(attention::kernels());
    v.extend(attention_fused::kernels());
    v.extend(conv::kernels());
    v.extend(elementwise::kernels());
    v.extend(norm::kernels());
    v.extend(router::kernels());
    v.extend(split::kernels());
    v
}

/// The op kernels the Inkling decoder's steps can build, each with the operation that builds it:
/// every variant its shapes can take (f32 or vec4 rows), and none that the recipe does not reach.
/// The op names are the labels of the calls ([`crate::gpu::Label`]).
/// `fused_attention`: the attention after the projections as [`FusedAttention`] (the engine);
/// `false`: its separate kernels (conv pair, in-place q/k norms), the fused kernel's test oracle.
/// Both run [`AttentionShape`]'s kernels (the fused one for prompt chunks). What
/// [`crate::gpu::variants::check_device`] checks against a device's limits.
pub fn decoder_kernels(fused_attention: bool) -> Vec<(&'static str, KernelSpec)> {
    use attention::AttentionKey;
    use attention_fused::FusedAttentionKey;
    use conv::ConvKey;
    use elementwise::ElementwiseKey;
    use norm::{NormEntry, NormKey};
    let mut v = Vec::new();
    let mut push = |op, spec| v.push((op, spec));
    for vec4 in [false, true] {
        let norm = |entry| KernelSpec::of(&NormKey { entry, vec4 });
        push("embed_norm", norm(NormEntry::EmbedNorm));
        push("rms_norm", norm(NormEntry::RmsNorm));
        if !fused_attention {
            push("rms_norm_inplace", norm(NormEntry::RmsNormInPlace));
        }
        // the fused attention's prompt chunks run the prologue, then these two
        let attention = if fused_attention {
            "attention prologue+attention"
        } else {
            "attention"
        };
        for append in [false, true] {
            push(attention, KernelSpec::of(&AttentionKey { append, vec4 }));
        }
        if fused_attention {
            let fused = FusedAttentionKey::Decode { vec4, batch: false };
            push("attention fused", KernelSpec::of(&fused));
        }
    }
    if fused_attention {
        let prologue = KernelSpec::of(&FusedAttentionKey::Prologue);
        push("attention prologue+attention", prologue);
    }
    let conv = |paired, combine, batch| {
        KernelSpec::of(&ConvKey {
            paired,
            combine,
            batch,
        })
    };
    push("short_conv", conv(false, false, false));
    push("moe_combine+short_conv", conv(false, true, false));
    if !fused_attention {
        push("short_conv x2", conv(true, false, false));
    }
    for (op, entry) in [
        ("silu_mul", "silu_mul"),
        ("scale", "scale"),
        ("argmax", "argmax_partial"),
        ("argmax", "argmax_partial_vec4"),
        ("argmax", "argmax_final"),
    ] {
        push(op, KernelSpec::of(&ElementwiseKey(entry)));
    }
    push("router top-k", KernelSpec::of(&router::RouterKey));
    push("split", KernelSpec::of(&split::SplitKey));
    v
}

/// The per-step position uniform: `vec4<u32>` whose `.x` is the absolute position of the first token of
/// the current call (= number of tokens already in the caches) and `.y` the sequence slot whose KV
/// cache and conv states the call reads and writes. Shared by all stateful calls of a step.
pub struct PosBuffer {
    pub buffer: wgpu::Buffer,
}

impl PosBuffer {
    /// A uniform that kernels may also bind as a storage `array<vec4<u32>>` of one entry (the
    /// GEMV's short-conv epilogue reads its slot so, like a decode batch's table).
    pub fn new(gpu: &Gpu, pos0: u32) -> PosBuffer {
        PosBuffer {
            buffer: call::uniform_with(gpu, "pos", &[pos0, 0, 0, 0], wgpu::BufferUsages::STORAGE),
        }
    }

    /// Queue an update of the position and slot (takes effect for the next submission).
    pub fn set(&self, queue: &wgpu::Queue, pos0: u32, slot: u32) {
        queue.write_buffer(&self.buffer, 0, bytemuck::cast_slice(&[pos0, slot, 0, 0]));
    }
}

/// Where a stateful kernel (short conv, attention) finds the sequence slot of its tokens.
#[derive(Clone, Copy)]
pub enum SlotOf<'b> {
    /// Every token of the chunk belongs to the slot `pos.y` names (and sits at `pos.x + t`).
    Pos(&'b PosBuffer),
    /// A decode batch: token t belongs to slot `seq[t].y` at position `seq[t].x` (`seq` a storage
    /// buffer of `[pos, slot, 0, 0]` u32 per token; slots distinct).
    Batch(&'b wgpu::Buffer),
}

/// The VEC4 variant of a kernel file (`//!IF VEC4` / `//!ELSE` / `//!END`, see
/// [`crate::gpu::kernel::preprocess`]): rows 16-byte aligned, bound as `array<vec4<f32>>`, when
/// `vec4`, else the f32 one.
pub fn wgsl_variant(src: &str, vec4: bool) -> String {
    crate::gpu::kernel::preprocess(src, &[("VEC4", vec4)])
}

/// `"vec4"` or `"f32"`: the variant tag in pipeline labels.
fn vec4_tag(vec4: bool) -> &'static str {
    if vec4 {
        "vec4"
    } else {
        "f32"
    }
}
