//! Expert streaming: routed experts that do not fit the GPU live in the mapped container (disk or
//! page cache) and are placed into a fixed pool of GPU expert slots when the router asks for them.
//!
//! The dense part (attention, norms, convolutions, router, shared experts, embeddings, head) and
//! the KV caches stay resident ([`crate::model::GpuModel`]). Every routed expert of the model has
//! the same shape, so one pool of `slots` experts (a gate‖up slab `[slots, 2I, H]` and a down slab
//! `[slots, H, I]`, in the experts' own encoding) serves every layer; a GEMV over the pool whose
//! pairs name *slots* is a GEMV over whichever experts the slots hold.
//!
//! Per sparse layer, the step is cut at the routed experts: the submission up to there is followed
//! by a readback of the router's (expert, token) pairs (the only routing readback; the fully
//! resident engine has none). [`ExpertCache::plan_layer`] then splits the layer's distinct experts
//! into *rounds* of at most the slots that may be handed out at once, so a slot handed out in a
//! round is never overwritten before that round's dispatch. Round 0 runs its hits first, in their
//! own submission, so the GPU computes them while the host copies the misses from the mapped
//! bytes: each miss's gate‖up and down ranges (contiguous in a converted container's slab) are
//! copied into `queue.write_buffer_with` staging views in pieces of at most 4 MiB, on up to 8
//! threads ([`crate::gpu::linear::slab::run_staged`]). Each part's pairs are compacted, its outputs copied
//! back to the pairs' rows of `y_routed`, and the step goes on with the MoE combine exactly as
//! when resident.
//!
//! If the GPU part of a layer fails (an error captured by the out-of-memory and validation error
//! scopes pushed around it, a staging buffer the queue refused, or an injected failure in tests),
//! the slots the layer's plan installed but did not fill are forgotten by the cache, and the
//! layer's routed experts are recomputed on the CPU from the same mapped bytes and written into
//! `y_routed`, with one warning: the token stays right.
use super::expert_cache::{Assign, ExpertCache};
use super::usage::Usage;
use super::weights::Ffn;

/// Threads copying misses from the mapped weights: the cores, at most 8.
pub fn upload_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
}

/// Where the routed experts live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Placement {
    /// Every routed expert resident on the GPU (uploaded once; no uploads after start-up).
    #[default]
    Resident,
    /// A total GPU memory budget in bytes (`--gpu-mem`): the resident part is estimated
    /// ([`crate::model::GpuModel::resident_bytes_estimate`]) and the rest becomes expert slots; a
    /// budget that holds every expert means [`Placement::Resident`].
    GpuMem(u64),
    /// Exactly this many expert slots (`--expert-slots`; tests use it to go down to one layer's
    /// top-k). At least as many slots as routed experts in the model means resident.
    Slots(usize),
}

/// Counters of a streaming run (all zero when resident).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StreamStats {
    /// Expert slots in the pool.
    pub slots: usize,
    /// Of those, pinned by the hot set.
    pub pinned: usize,
    /// Distinct (layer, expert) requests that found their expert resident.
    pub hits: u64,
    /// Distinct requests that had to upload it.
    pub misses: u64,
    /// Bytes read from the mapped container for uploads after start-up (weights + scales).
    pub bytes_read: u64,
    /// Uploads after start-up.
    pub uploads: u64,
    /// Host seconds copying misses from the mapped bytes into staging memory (reading the page
    /// cache or the disk): the upload stall as the host sees it. The misses' dispatch cannot start
    /// before this copy ends; round 0's hits run on the GPU meanwhile, and the staging-to-slot
    /// transfer after it is not included, so the GPU's real wait may be shorter or longer.
    pub upload_s: f64,
    /// The part of `upload_s` spent in one-token (decode) steps.
    pub decode_upload_s: f64,
    /// Host seconds waiting for the router's pairs of each streamed layer (this includes the GPU
    /// computing that layer up to its router, so it is not all idle time).
    pub routing_wait_s: f64,
    /// Bytes and seconds of the hot-set load at start-up.
    pub startup_bytes: u64,
    pub startup_s: f64,
    /// Layers whose routed experts were recomputed on the CPU after a GPU failure.
    pub cpu_fallbacks: u64,
}

impl StreamStats {
    /// Hits over requests (`None` when nothing was requested).
    pub fn hit_rate(&self) -> Option<f64> {
        let n = self.hits + self.misses;
        (n > 0).then(|| self.hits as f64 / n as f64)
    }

    /// Host copy rate of the uploads, GB/s: bytes read from the mapped container after start-up
    /// over [`StreamStats::upload_s`] (the copies into staging memory; the GPU-side transfer that
    /// follows is not timed).
    pub fn upload_gbs(&self) -> f64 {
        if self.upload_s > 0.0 {
            self.bytes_read as f64 / self.upload_s / 1e9
        } else {
            0.0
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "slots": self.slots,
            "pinned": self.pinned,
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": self.hit_rate(),
            "bytes_read": self.bytes_read,
            "uploads": self.uploads,
            "upload_s": self.upload_s,
            "upload_gbs": self.upload_gbs(),
            "decode_upload_s": self.decode_upload_s,
            "routing_wait_s": self.routing_wait_s,
            "startup_bytes": self.startup_bytes,
            "startup_s": self.startup_s,
            "cpu_fallbacks": self.cpu_fallbacks,
        })
    }

    /// What happened between `earlier` (a reading of the same run) and `self`: the counters'
    /// differences (slots and pinned as `self` has them).
    pub fn since(&self, earlier: &StreamStats) -> StreamStats {
        StreamStats {
            slots: self.slots,
            pinned: self.pinned,
            hits: self.hits - earlier.hits,
            misses: self.misses - earlier.misses,
            bytes_read: self.bytes_read - earlier.bytes_read,
            uploads: self.uploads - earlier.uploads,
            upload_s: self.upload_s - earlier.upload_s,
            decode_upload_s: self.decode_upload_s - earlier.decode_upload_s,
            routing_wait_s: self.routing_wait_s - earlier.routing_wait_s,
            startup_bytes: self.startup_bytes,
            startup_s: self.startup_s,
            cpu_fallbacks: self.cpu_fallbacks - earlier.cpu_fallbacks,
        }
    }

    /// The short form for a chat turn's stats line: `hit 36.2% · 1.234 GB read` (`hit n/a` when
    /// nothing was requested).
    pub fn brief(&self) -> String {
        format!(
            "hit {} · {:.3} GB read",
            self.hit_rate()
                .map_or("n/a".to_string(), |h| format!("{:.1}%", 100.0 * h)),
            self.bytes_read as f64 / 1e9
        )
    }

    /// One line for the stats output.
    pub fn line(&self) -> String {
        format!(
            "experts: {} slot{} ({} pinned) | hit rate {} ({} hits, {} misses) | read {:.3} GB in {} uploads, {:.2} GB/s host copy | upload stall (host copy) {:.3} s | routing readbacks {:.3} s{}",
            self.slots,
            if self.slots == 1 { "" } else { "s" },
            self.pinned,
            self.hit_rate()
                .map_or("n/a".to_string(), |h| format!("{:.1}%", 100.0 * h)),
            self.hits,
            self.misses,
            self.bytes_read as f64 / 1e9,
            self.uploads,
            self.upload_gbs(),
            self.upload_s,
            self.routing_wait_s,
            if self.cpu_fallbacks > 0 {
                format!(
                    " | {} layer{} recomputed on the CPU",
                    self.cpu_fallbacks,
                    if self.cpu_fallbacks == 1 { "" } else { "s" }
                )
            } else {
                String::new()
            }
        )
    }
}

/// `(gate‖up weight pieces, their scale pieces, down weights, down scales)` of one expert.
pub(crate) type ExpertPieces<'a> = ([&'a [u8]; 2], [&'a [u8]; 2], &'a [u8], &'a [u8]);

/// Pieces of one routed expert's bytes in the mapped weights: gate rows then up rows (the
/// gate‖up slot), and down (the down slot), each with its scales.
pub(crate) fn expert_pieces<'a>(f: &'a Ffn<'_>) -> ExpertPieces<'a> {
    (
        [&f.gate.data[..], &f.up.data[..]],
        [&f.gate.scales[..], &f.up.scales[..]],
        &f.down.data[..],
        &f.down.scales[..],
    )
}

/// The host-side state of streaming (the GPU buffers live in the model).
pub(crate) struct StreamState<'w> {
    /// Routed experts per layer (empty for dense layers), borrowed from the mapped weights.
    pub experts: Vec<&'w [Ffn<'w>]>,
    pub cache: ExpertCache,
    pub usage: Usage,
    pub stats: StreamStats,
    /// Injected failure: the routed experts of `layer` in the step that feeds position `pos`.
    pub fail_at: Option<(usize, usize)>,
    pub warned: bool,
}

/// Parts of one round: hits (no upload) and loads, each `(assigns)`; empty parts dropped.
pub(crate) fn round_parts(assign: &[Assign]) -> Vec<Vec<Assign>> {
    let hits: Vec<Assign> = assign.iter().copied().filter(|a| !a.load).collect();
    let loads: Vec<Assign> = assign.iter().copied().filter(|a| a.load).collect();
    [hits, loads]
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::StreamStats;

    #[test]
    fn the_stats_line_counts_in_words() {
        let one = StreamStats {
            slots: 1,
            cpu_fallbacks: 1,
            ..Default::default()
        };
        let l = one.line();
        assert!(
            l.starts_with("experts: 1 slot (0 pinned) | hit rate n/a"),
            "{l}"
        );
        assert!(l.ends_with(" | 1 layer recomputed on the CPU"), "{l}");
        let two = StreamStats {
            slots: 2,
            cpu_fallbacks: 3,
            ..Default::default()
        };
        let l = two.line();
        assert!(l.starts_with("experts: 2 slots (0 pinned)"), "{l}");
        assert!(l.ends_with(" | 3 layers recomputed on the CPU"), "{l}");
    }
}
