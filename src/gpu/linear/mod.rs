//! A linear over a weight slab: the MoE GEMV (`wgsl/gemv.wgsl`) and the prefill GEMM
//! (`wgsl/gemm.wgsl`) over one [`GpuWeights`] slab, behind one [`GpuWeights::bind`].
//!
//! # Problem
//! For a batch of P pairs `(expert, token, weight_idx)` one [`GpuWeights::bind`] computes
//! `y[p, 0..O] = gamma[weight_idx(p)] · W_{expert(p)} · x[token(p), 0..I]` (gamma omitted when
//! `weight_idx == 0xFFFFFFFF` or the call has no gamma buffer). All dtypes are f32 except the
//! weights (any kernel format of FORMATS.md) and the pairs (u32). Accumulation is f32.
//! A dense GEMV is E = 1 with pairs `(0, t, NO_GAMMA)`.
//!
//! The modules, each importing only those listed before it:
//! * [`format`]: per-format facts (unit shape, tunings, which encodings have kernels);
//! * [`slab_layout`]: FORMATS.md row bytes to GPU slab bytes;
//! * [`staging`]: staging views of host bytes on their way into slots, and the ring of staging
//!   buffers streaming uploads reuse;
//! * [`slab`]: [`GpuWeights`], the uploaded slab, its chunks and expert slots (no kernel);
//! * [`args`]: [`GemvArgs`], what a caller states about one call, and its checks;
//! * [`route`]: the choice between the GEMV ([`Plan`] per dispatch) and the GEMM ([`Tile`]);
//! * [`gemv`], [`gemm`]: the two kernels, their WGSL and their recorded calls;
//! * [`gemv_pair`]: two independent GEMVs in one dispatch;
//! * [`oneshot`]: host vectors in and out (tests, smoke, benches).

pub mod args;
pub mod format;
pub mod gemm;
pub mod gemv;
pub mod gemv_pair;
pub mod oneshot;
pub mod route;
pub mod slab;
pub mod slab_layout;
pub mod staging;

use crate::gpu::call::Call;
use crate::gpu::dispatch::DispatchError;
use crate::gpu::Gpu;

pub use args::{ConvEpilogue, GemmChoice, GemvArgs, Reduction, Tile, MAX_SEGMENTS, NO_GAMMA};
pub use format::{kernel_encodings, Tuning};
pub use oneshot::{gemv_pairs, gemv_pairs_with};
pub use route::{route, LinearOptions, Plan, Route};
pub use slab::{default_limit, gpu_row_stride, GpuWeights, WeightChunk};
pub use staging::{run_staged, StagedCopy, Stager, StagingRing};

impl GpuWeights {
    /// [`GpuWeights::bind_with`] with the default [`LinearOptions`] (the engine's own choice).
    pub fn bind(&self, gpu: &Gpu, ordinal: u32, args: GemvArgs) -> Result<Call, DispatchError> {
        self.bind_with(gpu, ordinal, args, &LinearOptions::default())
    }

    /// Bind a call over these weights under `opts`: the GEMM ([`gemm::bind`]) or the GEMV
    /// ([`gemv`]), as [`route::route`] says; callers see one [`Call`] either way (label `"gemm"`
    /// or `"gemv"`). Errors: those of [`GpuWeights::check_args`], checked first whichever kernel
    /// runs the call, and of [`gemm::bind`] or [`GpuWeights::bind_gemv`].
    pub fn bind_with(
        &self,
        gpu: &Gpu,
        ordinal: u32,
        args: GemvArgs,
        opts: &LinearOptions,
    ) -> Result<Call, DispatchError> {
        match route::route(self, &args, opts) {
            Route::Gemm(tile) => {
                self.check_args(gpu, ordinal, &args)?;
                gemm::bind(gpu, self, &args, tile)
            }
            Route::Gemv(plans) => gemv::bind(gpu, self, ordinal, args, &plans),
        }
    }
}
