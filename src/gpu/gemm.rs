//! The MoE GEMM (`wgsl/gemm.wgsl`): the GEMV problem of [`crate::gpu::gemv`] for calls with many
//! pairs per expert (prefill chunks), with each weight read once per tile of pairs.
//!
//! # Problem
//! Exactly the GEMV's: for P pairs `(expert, token, weight_idx)`,
//! `y[p, 0..O] = gamma[weight_idx(p)] · W_{expert(p)} · x[token(p), 0..I]` (or x row p with
//! `x_per_pair`), f32 in and out, f32 accumulation, over the same [`GpuWeights`] slab (rows in
//! FORMATS.md bytes padded to whole units, f32 scales) and the same decode of each format.
//! [`GemvCall::new`](crate::gpu::gemv::GemvCall::new) builds a [`GemmCall`] instead of GEMV
//! dispatches when [`select`] says so; callers see one call either way.
//!
//! # Kernel shape
//! A workgroup (256 threads = 64 row sets × 4 lanes) computes a tile of BM = 64·RM rows × BN =
//! 4·NQ pairs of one expert ([`Tile`]). Columns run in steps of 128: the x rows of the tile's
//! pairs for the step are staged in workgroup memory (BN × 128 f32, padded against bank
//! conflicts), then each lane decodes 32 columns of its RM rows straight from global memory, once
//! per weight, and adds each weight times the BN staged x values into its RM × BN accumulators
//! (vec4 over 4 pairs: every x vec4 read from workgroup memory feeds RM FMAs). The 4 lanes of a
//! row set add their partial sums through workgroup memory at the end. Workgroup memory:
//! 16·(128·NQ + 4) + 4096 bytes, at most 12.3 KiB (within WebGPU's default 16 KiB).
//!
//! # Grouping by expert
//! A one-expert slab (dense linears) tiles the pairs in order: tile s holds pairs s·BN .. s·BN +
//! BN. A slab of several experts first runs a one-workgroup pass (`sort_pairs`) that counts the
//! pairs of each expert, scans the counts and scatters the pair indices in expert order into a
//! scratch buffer owned by the call, with a table of tiles (expert, first index, count); the
//! GEMM then launches ceil(P / BN) + min(E, P) tiles per row block, a bound on Σ_e ceil(count_e /
//! BN), and the tiles past the used ones exit at once. The pairs come from the GPU router, so
//! the host never sees them. At most [`EMAX`] experts (workgroup memory of the pass).
//!
//! # Selection ([`select`])
//! The GEMM replaces the GEMV when the call leaves the choice to the engine (automatic reduction,
//! no forced tuning, no [`crate::gpu::gemv::set_tuning_override`], [`GemmChoice::Auto`]), the
//! format has a GEMM kernel, E ≤ [`EMAX`], and the pairs per used expert,
//! `P / min(E, P)`, reach [`MIN_PAIRS_PER_EXPERT`]: below that the GEMV, which reads each weight
//! once per pair at the copy bandwidth, wastes less than the GEMM's partly empty tiles.

use crate::formats::{Encoding, Format};
use crate::gpu::dispatch::DispatchError;
use crate::gpu::gemv::{self, gpu_row_stride, GemvArgs, GpuWeights, Reduction};
use crate::gpu::kernel::{Bind, KernelSpec};
use crate::gpu::Gpu;
use std::sync::Arc;

/// Source of the GEMM skeleton and its grouping pass.
pub const GEMM_WGSL: &str = include_str!("../../wgsl/gemm.wgsl");

/// Fewest pairs per used expert (`P / min(E, P)`; the tokens of a dense linear) for which
/// [`select`] picks the GEMM.
pub const MIN_PAIRS_PER_EXPERT: u32 = 4;

/// Most experts of a slab the grouping pass handles (two u32 per expert of workgroup memory);
/// larger slabs keep the GEMV.
pub const EMAX: u32 = 1024;

/// Workgroups per dimension (WebGPU/wgpu limit).
const MAX_GROUPS_PER_DIM: u32 = 65_535;
/// Size of the uniform block (`Params` in the WGSL).
const PARAMS_BYTES: u64 = 80;

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
}

/// Every tile [`select`] picks: 128 rows × 8 pairs. Measured on an H200 (BENCHMARKS.md, `bench
/// gemm`): 128 × 8 ran 18–24 TFLOP/s in every format; 128 × 16 ran 2 TFLOP/s and 256 × 8 did in
/// int4, so the driver's compiler is taken to keep the accumulators of those instantiations out
/// of registers. [`GemmChoice::Always`] builds any RM in 1, 2, 4 and BN in 8, 16.
pub const TILES: [Tile; 1] = [Tile { rm: 2, nq: 2 }];

/// Whether `enc` has a GEMM kernel (every GEMV kernel format).
pub fn supported(enc: Encoding) -> bool {
    matches!(
        enc.format,
        Format::F32 | Format::Bf16 | Format::Int4 | Format::Int4Grouped | Format::Int3G64
    )
}

/// Whether a [`GemvArgs`] call may run as a GEMM ([`GemvArgs::gemm`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmChoice {
    /// Always the GEMV.
    Never,
    /// The GEMM when [`select`]'s rules pick it (the default).
    Auto,
    /// The GEMM with this tile whenever it can run (format, experts ≤ [`EMAX`], ≥ 1 pair);
    /// tests and benchmarks.
    Always(Tile),
}

/// Benchmark-only switch: with `false`, [`GemmChoice::Auto`] keeps the GEMV (`bench prefill
/// --compare` times the same model both ways). Calls built earlier keep their choice.
static AUTO_ENABLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Let [`GemmChoice::Auto`] pick the GEMM (`true`, the default) or never (`false`) for calls built
/// from now on.
pub fn set_auto_enabled(on: bool) {
    AUTO_ENABLED.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The tile to run `args` over `weights` as a GEMM, or `None` to keep the GEMV (rules in the
/// module docs).
pub fn select(weights: &GpuWeights, args: &GemvArgs<'_>) -> Option<Tile> {
    let e = weights.experts() as u32;
    let p = args.n_pairs;
    if !supported(weights.encoding()) || e > EMAX || p == 0 {
        return None;
    }
    match args.gemm {
        GemmChoice::Never => return None,
        GemmChoice::Always(t) => return Some(t),
        GemmChoice::Auto => {}
    }
    if !AUTO_ENABLED.load(std::sync::atomic::Ordering::Relaxed)
        || args.tuning.is_some()
        || args.reduction != Reduction::Auto
        || gemv::tuning_override().is_some()
    {
        return None;
    }
    let per_expert = p / e.min(p);
    if per_expert < MIN_PAIRS_PER_EXPERT {
        return None;
    }
    Some(TILES[0])
}

/// The WGSL of one instantiation: the generated prelude, then the GEMM (`sort` false, entry
/// `main`) or the grouping pass (`sort` true, entry `sort_pairs`; only BN matters to it).
pub fn wgsl_source(enc: Encoding, tile: Tile, sort: bool) -> String {
    let mut out = format!(
        "// gemm instantiation: {}{}, rm {} bn {}\nconst FMT: u32 = {}u;\nconst GS: u32 = {}u;\n\
         const RM: u32 = {}u;\nconst NQ: u32 = {}u;\nconst BN: u32 = {}u;\nconst EMAX: u32 = {EMAX}u;\n",
        enc.spelling(),
        if sort { " (sort pass)" } else { "" },
        tile.rm,
        tile.pairs(),
        enc.format.ordinal(),
        enc.group_size,
        tile.rm,
        tile.nq,
        tile.pairs(),
    );
    out.push_str(&crate::gpu::kernel::preprocess(
        GEMM_WGSL,
        &[("SORT", sort)],
    ));
    out
}

/// The GEMM kernel of `enc` with `tile`: uniform params, then weights, scales, x, pairs, gamma
/// and the grouping scratch read-only, y read-write.
pub fn kernel_spec(enc: Encoding, tile: Tile) -> KernelSpec {
    let key = format!("gemm:{}:{}x{}", enc.spelling(), tile.rows(), tile.pairs());
    let ro = Bind::Read;
    let binds = [
        (0, Bind::Uniform),
        (1, ro),
        (2, ro),
        (3, ro),
        (4, ro),
        (5, ro),
        (6, ro),
        (7, Bind::Write),
    ];
    KernelSpec::new(key, "main", &binds, wgsl_source(enc, tile, false))
}

/// The grouping pass for tiles of `bn` pairs: uniform params, pairs read-only, scratch
/// read-write.
pub fn sort_spec(tile: Tile) -> KernelSpec {
    let key = format!("gemm/sort:{}", tile.pairs());
    let binds = [(0, Bind::Uniform), (1, Bind::Read), (2, Bind::Write)];
    let src = wgsl_source(Encoding::F32, tile, true);
    KernelSpec::new(key, "sort_pairs", &binds, src)
}

/// Every GEMM kernel the engine can build: each kernel encoding × [`TILES`], then the grouping
/// pass of each BN.
pub fn kernels() -> Vec<KernelSpec> {
    let mut v = Vec::new();
    for enc in gemv::kernel_encodings()
        .into_iter()
        .filter(|&e| supported(e))
    {
        for t in TILES {
            v.push(kernel_spec(enc, t));
        }
    }
    v.extend(TILES.iter().map(|&t| sort_spec(t)));
    v
}

/// Workgroup-memory bytes of the GEMM with `tile` (x tile, reduction buffer, slot table).
pub fn workgroup_bytes(tile: Tile) -> u64 {
    16 * (128 * tile.nq as u64 + 4) + 16 * 256 + 12 * tile.pairs() as u64 + 4
}

/// One recorded dispatch.
struct Dispatch {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind_group: wgpu::BindGroup,
    gx: u32,
    gy: u32,
}

/// A GEMM ready to record: pipelines, uniform blocks, the grouping scratch and bind groups, all
/// made once in [`GemmCall::new`]; recording allocates nothing.
pub struct GemmCall {
    _params: wgpu::Buffer,
    _scratch: wgpu::Buffer,
    _dummy: Option<wgpu::Buffer>,
    sort: Option<Dispatch>,
    parts: Vec<Dispatch>,
    tile: Tile,
}

impl GemmCall {
    /// Build the GEMM of `args` over `weights` with `tile`. The caller
    /// ([`GemvCall::new`](crate::gpu::gemv::GemvCall::new)) has checked the ordinal and the
    /// buffer sizes of `args`; `args.n_pairs` must be ≥ 1.
    pub fn new(
        gpu: &Gpu,
        weights: &GpuWeights,
        args: &GemvArgs<'_>,
        tile: Tile,
    ) -> Result<GemmCall, DispatchError> {
        let enc = weights.encoding();
        let (o, i) = (weights.rows() as u32, weights.cols() as u32);
        let experts = weights.experts() as u32;
        let np = args.n_pairs;
        if np == 0 || experts > EMAX {
            return Err(DispatchError::Shape(format!(
                "GEMM over {np} pairs and {experts} experts (needs ≥ 1 pair, ≤ {EMAX} experts)"
            )));
        }
        let x_stride = if args.x_stride == 0 { i } else { args.x_stride };
        let y_stride = if args.y_stride == 0 { o } else { args.y_stride };
        let bn = tile.pairs();
        let sorted = experts > 1;
        let n_tiles = np.div_ceil(bn) + if sorted { experts.min(np) } else { 0 };
        let scratch_words = if sorted {
            4 * n_tiles as u64 + np as u64
        } else {
            4
        };
        let scratch = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("gemm pair groups"),
            size: 4 * scratch_words,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let align =
            PARAMS_BYTES.next_multiple_of(gpu.limits.min_uniform_buffer_offset_alignment as u64);
        let chunks = weights.chunks();
        let params = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("gemm params"),
            size: align * chunks.len() as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let dummy = args
            .gamma
            .is_none()
            .then(|| gpu.storage("gemm no gamma", 4));
        let gamma = args.gamma.or(dummy.as_ref()).unwrap();
        let spr = enc.scales_per_row(weights.cols()) as u32;
        let row_v = (gpu_row_stride(enc, weights.cols()) / 16) as u32;
        let block = |k: u64| {
            wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &params,
                offset: k * align,
                size: wgpu::BufferSize::new(PARAMS_BYTES),
            })
        };
        let gemm_pipe = crate::gpu::kernel::pipeline(gpu, &kernel_spec(enc, tile));
        let mut parts = Vec::new();
        for (k, c) in chunks.iter().enumerate() {
            let rb = (c.r1 - c.r0).div_ceil(tile.rows());
            let p: [u32; 20] = [
                o,
                i,
                np,
                row_v,
                c.e0,
                c.e1,
                c.r0,
                c.r1,
                x_stride,
                args.x_offset,
                y_stride,
                args.y_offset,
                spr,
                rb,
                args.gamma.is_some() as u32,
                (sorted as u32) | ((args.x_per_pair as u32) << 8),
                n_tiles,
                experts,
                0,
                0,
            ];
            gpu.queue
                .write_buffer(&params, k as u64 * align, bytemuck::cast_slice(&p));
            let bind_group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("gemm"),
                layout: &gemm_pipe.get_bind_group_layout(0),
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: block(k as u64),
                    },
                    entry(1, &c.weights),
                    entry(2, &c.scales),
                    entry(3, args.x),
                    entry(4, args.pairs),
                    entry(5, gamma),
                    entry(6, &scratch),
                    entry(7, args.y),
                ],
            });
            let total = n_tiles as u64 * rb as u64;
            let gx = total.min(MAX_GROUPS_PER_DIM as u64) as u32;
            let gy = total.div_ceil(gx as u64);
            if gy > MAX_GROUPS_PER_DIM as u64 {
                return Err(DispatchError::Shape(format!(
                    "{total} GEMM workgroups exceed 65535²"
                )));
            }
            parts.push(Dispatch {
                pipeline: gemm_pipe.clone(),
                bind_group,
                gx,
                gy: gy as u32,
            });
        }
        let sort = sorted.then(|| {
            let pipeline = crate::gpu::kernel::pipeline(gpu, &sort_spec(tile));
            let bind_group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("gemm sort"),
                layout: &pipeline.get_bind_group_layout(0),
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: block(0),
                    },
                    entry(1, args.pairs),
                    entry(2, &scratch),
                ],
            });
            Dispatch {
                pipeline,
                bind_group,
                gx: 1,
                gy: 1,
            }
        });
        Ok(GemmCall {
            _params: params,
            _scratch: scratch,
            _dummy: dummy,
            sort,
            parts,
            tile,
        })
    }

    /// The tile every dispatch uses.
    pub fn tile(&self) -> Tile {
        self.tile
    }

    /// Number of dispatches: the grouping pass (slabs of several experts), then one per weight
    /// chunk.
    pub fn dispatches(&self) -> usize {
        self.parts.len() + self.sort.is_some() as usize
    }

    /// Record the dispatches into an open compute pass (the grouping pass first; wgpu orders the
    /// dispatches of a pass, so the GEMM sees its scratch).
    pub fn record_in_pass(&self, pass: &mut wgpu::ComputePass<'_>) {
        for d in self.sort.iter().chain(&self.parts) {
            pass.set_pipeline(&d.pipeline);
            pass.set_bind_group(0, &d.bind_group, &[]);
            pass.dispatch_workgroups(d.gx, d.gy, 1);
        }
    }
}

fn entry(binding: u32, buf: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: buf.as_entire_binding(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workgroup_memory_within_webgpu_defaults() {
        for t in TILES {
            assert!(workgroup_bytes(t) <= 16384, "{t:?}");
        }
    }
}
