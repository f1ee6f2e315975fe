//! The MoE GEMM (prefill) against the f64 CPU reference on the SAME bytes, and against the GEMV
//! on the same inputs: every kernel format, odd shapes, 1 to 64 tokens, repeated experts, gamma
//! or not, strided x and y, x per pair, chunked slabs. Outputs are poisoned with NaN first.
//! Runs on lavapipe in CI: a missing adapter FAILS (no skip).

use crate::gpu::gemv_parity::rel_err;
use crate::ops_util::{gpu, Rng};
use inkling_wgpu::formats::{quantize, Encoding, QMatrix};
use inkling_wgpu::gpu::linear::args::{GemmChoice, Tile};
use inkling_wgpu::gpu::linear::format::supported;
use inkling_wgpu::gpu::linear::route::TILES;
use inkling_wgpu::gpu::linear::route::{route, GemmTiles, LinearOptions, MIN_PAIRS_PER_EXPERT};

/// The selectable tiles and the others `GemmChoice::Always` builds (benchmarks).
const ALL_TILES: [Tile; 8] = [
    Tile { rm: 2, nq: 2 },
    Tile { rm: 2, nq: 4 },
    Tile { rm: 4, nq: 2 },
    Tile { rm: 1, nq: 4 },
    Tile { rm: 4, nq: 4 },
    Tile { rm: 8, nq: 4 },
    Tile { rm: 1, nq: 8 },
    Tile { rm: 2, nq: 8 },
];
use inkling_wgpu::gpu::linear::args::{GemvArgs, NO_GAMMA};
use inkling_wgpu::gpu::linear::format::kernel_encodings;
use inkling_wgpu::gpu::linear::slab::GpuWeights;
use inkling_wgpu::gpu::Gpu;

const TOL: f64 = 1e-5;

/// One problem: x rows at `x_stride` from `x_offset` (NaN elsewhere), pairs `(expert, token,
/// weight_idx)`, outputs at `y_stride` from `y_offset`.
struct Problem<'a> {
    x_rows: &'a [Vec<f32>],
    x_stride: usize,
    x_offset: usize,
    pairs: &'a [(u32, u32, u32)],
    gammas: &'a [f32],
    x_per_pair: bool,
    y_stride: usize,
    y_offset: usize,
}

/// Run `pr` with `choice`; returns the whole poisoned y buffer and whether a GEMM ran.
fn run(gpu: &Gpu, w: &GpuWeights, pr: &Problem, choice: GemmChoice) -> (Vec<f32>, bool) {
    let i = w.cols();
    let mut x = vec![f32::NAN; pr.x_offset + pr.x_rows.len() * pr.x_stride + 5];
    for (t, r) in pr.x_rows.iter().enumerate() {
        x[pr.x_offset + t * pr.x_stride..][..i].copy_from_slice(r);
    }
    let flat: Vec<u32> = pr
        .pairs
        .iter()
        .flat_map(|&(e, t, wi)| [e, t, wi, 0])
        .collect();
    let ylen = pr.y_offset + pr.pairs.len() * pr.y_stride;
    let xb = gpu.storage_init("x", bytemuck::cast_slice(&x));
    let pb = gpu.storage_init("pairs", bytemuck::cast_slice(&flat));
    let gb = gpu.storage_init("gamma", bytemuck::cast_slice(pr.gammas));
    let yb = gpu.storage_init("y", bytemuck::cast_slice(&vec![f32::NAN; ylen]));
    let mut args = GemvArgs::new(&xb, pr.x_rows.len() as u32, &pb, pr.pairs.len() as u32, &yb)
        .x_per_pair(pr.x_per_pair)
        .gemm(choice);
    if !pr.gammas.is_empty() {
        args = args.gamma(&gb);
    }
    args.x_stride = pr.x_stride as u32;
    args.x_offset = pr.x_offset as u32;
    args.y_stride = pr.y_stride as u32;
    args.y_offset = pr.y_offset as u32;
    let call = w.bind(gpu, w.encoding().format.ordinal(), args).unwrap();
    call.run(gpu);
    (gpu.read_f32(&yb, ylen).unwrap(), call.label.op == "gemm")
}

/// Check every pair of `y` against the f64 reference: pairs of experts outside the slab stay NaN,
/// so do the gaps between output rows. Returns the largest relative error.
fn check(what: &str, mats: &[QMatrix], pr: &Problem, y: &[f32]) -> f64 {
    let o = mats[0].rows;
    let mut worst = 0f64;
    for (p, &(e, t, wi)) in pr.pairs.iter().enumerate() {
        let got = &y[pr.y_offset + p * pr.y_stride..][..o];
        if e as usize >= mats.len() {
            assert!(
                got.iter().all(|v| v.is_nan()),
                "{what}: pair {p} of no expert written"
            );
            continue;
        }
        let g = match (wi, pr.gammas.is_empty()) {
            (NO_GAMMA, _) | (_, true) => 1.0,
            _ => pr.gammas[wi as usize] as f64,
        };
        let xr = if pr.x_per_pair { p } else { t as usize };
        let r: Vec<f64> = mats[e as usize]
            .gemv_ref_f64(&pr.x_rows[xr])
            .into_iter()
            .map(|v| v * g)
            .collect();
        assert!(
            got.iter().all(|v| v.is_finite()),
            "{what}: pair {p}: NaN left (poison)"
        );
        let err = rel_err(got, &r);
        assert!(
            err <= TOL,
            "{what}: pair {p} = ({e},{t},{wi}): rel err {err:e}"
        );
        worst = worst.max(err);
        if pr.y_stride > o && p + 1 < pr.pairs.len() {
            let gap = &y[pr.y_offset + p * pr.y_stride + o..pr.y_offset + (p + 1) * pr.y_stride];
            assert!(
                gap.iter().all(|v| v.is_nan()),
                "{what}: pair {p}: gap written"
            );
        }
    }
    worst
}

fn mats(rng: &mut Rng, enc: Encoding, experts: usize, o: usize, i: usize) -> Vec<QMatrix<'static>> {
    (0..experts)
        .map(|_| quantize(enc, &rng.vec(o * i, 1.0), o, i).unwrap())
        .collect()
}

fn rows(rng: &mut Rng, n: usize, i: usize) -> Vec<Vec<f32>> {
    (0..n).map(|_| rng.vec(i, 1.0)).collect()
}

/// Dense (one expert, pairs (0, t)) at odd shapes, 1, 3, 17 and 64 tokens, every format and
/// tile, gamma on some pairs, against the reference and the GEMV.
#[test]
fn dense_every_format_odd_shapes_and_token_counts() {
    let gpu = gpu();
    let mut rng = Rng(0x6e33);
    let shapes = [(1, 1), (33, 63), (130, 200), (257, 129), (5, 384)];
    let (mut worst, mut worst_vs_gemv) = (0f64, 0f64);
    for enc in gemm_encodings() {
        for (si, &(o, i)) in shapes.iter().enumerate() {
            let m = mats(&mut rng, enc, 1, o, i);
            let w = GpuWeights::upload(&gpu, &m).unwrap();
            for (ti, &t) in [1usize, 3, 17, 64].iter().enumerate() {
                let tile = ALL_TILES[(si + ti) % ALL_TILES.len()];
                let x_rows = rows(&mut rng, t, i);
                let pairs: Vec<(u32, u32, u32)> = (0..t as u32)
                    .map(|k| (0, k, if k % 3 == 1 { k % 2 } else { NO_GAMMA }))
                    .collect();
                let pr = Problem {
                    x_rows: &x_rows,
                    x_stride: i,
                    x_offset: 0,
                    pairs: &pairs,
                    gammas: &[0.75, -1.5],
                    x_per_pair: false,
                    y_stride: o,
                    y_offset: 0,
                };
                let what = format!("{} [{o}x{i}] t {t} {tile:?}", enc.spelling());
                let (y, ran) = run(&gpu, &w, &pr, GemmChoice::Always(tile));
                assert!(ran, "{what}: no GEMM");
                worst = worst.max(check(&what, &m, &pr, &y));
                let (yv, ran) = run(&gpu, &w, &pr, GemmChoice::Never);
                assert!(!ran);
                let err = rel_err(&y, &yv.iter().map(|&v| v as f64).collect::<Vec<_>>());
                assert!(err <= TOL, "{what}: GEMM vs GEMV rel err {err:e}");
                worst_vs_gemv = worst_vs_gemv.max(err);
            }
        }
    }
    eprintln!("dense GEMM: max rel err {worst:.2e} vs f64, {worst_vs_gemv:.2e} vs GEMV");
}

/// Routed experts (grouped by the sort pass): repeated experts, an expert with more pairs than a
/// tile, unused experts, a pair of no expert (left unwritten), gammas, strided x and y, and the
/// down projection's x per pair; a slab split into chunks by experts and one split by rows.
#[test]
fn routed_grouped_by_expert_every_format() {
    let gpu = gpu();
    let mut rng = Rng(0x9a1);
    let (experts, o, i) = (6usize, 70usize, 136usize);
    let (mut worst, mut worst_vs_gemv) = (0f64, 0f64);
    for enc in gemm_encodings() {
        let m = mats(&mut rng, enc, experts, o, i);
        let stride = inkling_wgpu::gpu::linear::slab::gpu_row_stride(enc, i) as u64;
        let slabs = [
            GpuWeights::upload(&gpu, &m).unwrap(),
            // two experts per chunk
            GpuWeights::upload_with_limit(&gpu, &m, 2 * o as u64 * stride).unwrap(),
            // 32 rows per chunk
            GpuWeights::upload_with_limit(&gpu, &m, 32 * stride).unwrap(),
        ];
        assert!(slabs[1].chunks().len() == 3 && slabs[2].chunks().len() == 18);
        for (k, w) in slabs.iter().enumerate() {
            let tile = ALL_TILES[k % ALL_TILES.len()];
            let tokens = 13;
            // expert 1 gets 20 pairs (more than a tile), 4 unused, expert 9 does not exist
            let mut pairs = Vec::new();
            let mut gammas = Vec::new();
            for t in 0..tokens as u32 {
                for e in [1, (t % 3) * 2, 5, 1] {
                    pairs.push((e, t, gammas.len() as u32));
                    gammas.push(rng.f() * 2.0);
                }
                pairs.push((1, t, NO_GAMMA));
            }
            pairs.insert(7, (9, 3, NO_GAMMA));
            let x_per_pair = k == 1;
            let n_x = if x_per_pair { pairs.len() } else { tokens };
            let x_rows = rows(&mut rng, n_x, i);
            let pr = Problem {
                x_rows: &x_rows,
                x_stride: i + 3,
                x_offset: 5,
                pairs: &pairs,
                gammas: &gammas,
                x_per_pair,
                y_stride: o + 2,
                y_offset: 1,
            };
            let what = format!("{} slab {k} {tile:?}", enc.spelling());
            let (y, ran) = run(&gpu, w, &pr, GemmChoice::Always(tile));
            assert!(ran, "{what}: no GEMM");
            worst = worst.max(check(&what, &m, &pr, &y));
            let (yv, _) = run(&gpu, w, &pr, GemmChoice::Never);
            check(&format!("{what} (GEMV)"), &m, &pr, &yv);
            for (p, &(e, ..)) in pairs.iter().enumerate().filter(|(_, p)| p.0 < 6) {
                let a = &y[1 + p * (o + 2)..][..o];
                let b: Vec<f64> = yv[1 + p * (o + 2)..][..o]
                    .iter()
                    .map(|&v| v as f64)
                    .collect();
                let err = rel_err(a, &b);
                assert!(
                    err <= TOL,
                    "{what}: pair {p} (expert {e}) GEMM vs GEMV {err:e}"
                );
                worst_vs_gemv = worst_vs_gemv.max(err);
            }
        }
    }
    eprintln!("routed GEMM: max rel err {worst:.2e} vs f64, {worst_vs_gemv:.2e} vs GEMV");
}

/// Many pairs per expert and more experts than one workgroup's thread count, one format per
/// tile: the sort pass's scans cover several experts per thread.
#[test]
fn routed_many_experts_and_pairs() {
    let gpu = gpu();
    let mut rng = Rng(77);
    let (experts, o, i, tokens, top_k) = (300usize, 9usize, 40usize, 64usize, 6usize);
    let enc = Encoding::parse("int4-g32").unwrap();
    let m = mats(&mut rng, enc, experts, o, i);
    let w = GpuWeights::upload(&gpu, &m).unwrap();
    let x_rows = rows(&mut rng, tokens, i);
    let pairs: Vec<(u32, u32, u32)> = (0..tokens * top_k)
        .map(|p| {
            // a few hot experts and a long tail
            let e = if p % 2 == 0 {
                rng.below(4)
            } else {
                rng.below(experts as u64)
            };
            (e as u32, (p / top_k) as u32, NO_GAMMA)
        })
        .collect();
    let pr = Problem {
        x_rows: &x_rows,
        x_stride: i,
        x_offset: 0,
        pairs: &pairs,
        gammas: &[],
        x_per_pair: false,
        y_stride: o,
        y_offset: 0,
    };
    for tile in ALL_TILES {
        let (y, ran) = run(&gpu, &w, &pr, GemmChoice::Always(tile));
        assert!(ran);
        let worst = check(&format!("{tile:?}"), &m, &pr, &y);
        eprintln!("300 experts, {tile:?}: max rel err {worst:.2e}");
    }
}

/// The automatic choice: the GEMM from the format's gemm_min_pairs pairs per used expert on
/// (MIN_PAIRS_PER_EXPERT for bf16, more for int3-g64), the GEMV below, for forced tunings and
/// explicit reductions, and over more than EMAX experts.
#[test]
fn selection_rule() {
    use inkling_wgpu::gpu::linear::args::Reduction;
    use inkling_wgpu::gpu::linear::format::Tuning;
    let gpu = gpu();
    let mut rng = Rng(3);
    let enc = Encoding::BF16;
    let one = GpuWeights::upload(&gpu, &mats(&mut rng, enc, 1, 8, 16)).unwrap();
    let eight = GpuWeights::upload(&gpu, &mats(&mut rng, enc, 8, 8, 16)).unwrap();
    let x = gpu.storage_init("x", &[0u8; 4 * 16 * 64]);
    let pb = gpu.storage_init("p", &[0u8; 16 * 128]);
    let y = gpu.storage_init("y", &[0u8; 4 * 8 * 128]);
    let min = MIN_PAIRS_PER_EXPERT;
    // slabs of 8 rows launch a few workgroups: the engine's choice is its smallest tile
    let small = TILES[TILES.len() - 1];
    let pick = |w: &GpuWeights, n: u32| select(w, &GemvArgs::new(&x, 64, &pb, n, &y));
    assert_eq!(pick(&one, min - 1), None);
    assert_eq!(pick(&one, min), Some(small));
    assert_eq!(pick(&one, 64), Some(small));
    assert_eq!(pick(&eight, 8 * min - 1), None);
    assert_eq!(pick(&eight, 8 * min), Some(small));
    let a = GemvArgs::new(&x, 64, &pb, 64, &y);
    assert_eq!(select(&one, &a.reduction(Reduction::Shared)), None);
    assert_eq!(select(&one, &a.tuning(Tuning { tpr: 32, rpt: 1 })), None);
    assert_eq!(select(&one, &a.gemm(GemmChoice::Never)), None);
    let t = Tile { rm: 2, nq: 4 };
    let forced = a.reduction(Reduction::Shared).gemm(GemmChoice::Always(t));
    assert_eq!(select(&one, &forced), Some(t));
    // eight experts: the GEMM once each has `min` pairs
    let a8 = GemvArgs::new(&x, 64, &pb, 8 * min, &y);
    assert_eq!(select(&eight, &a8), Some(small));
    // engine-wide options: no GEMM tile keeps the GEMV, a forced tuning too, another tile wins
    let opts = |tuning, gemm| LinearOptions { tuning, gemm };
    let t2 = Tile { rm: 2, nq: 2 };
    assert_eq!(
        route(&one, &a, &opts(None, GemmTiles::Off)).gemm_tile(),
        None
    );
    let forced_tuning = Some(Tuning { tpr: 32, rpt: 1 });
    assert_eq!(
        route(&one, &a, &opts(forced_tuning, GemmTiles::Fixed(t2))).gemm_tile(),
        None
    );
    assert_eq!(
        route(&one, &a, &opts(None, GemmTiles::Fixed(t2))).gemm_tile(),
        Some(t2)
    );
    let call = eight.bind(&gpu, enc.format.ordinal(), a8).unwrap();
    assert_eq!(call.label.op, "gemm");
    // the grouping pass, then the GEMM
    assert_eq!(call.dispatches(), 2);
    // int3-g64 (slabs in the GPU bit order) takes the GEMM by the same rule
    let i3 = Encoding::parse("int3-g64").unwrap();
    let w3 = GpuWeights::upload(&gpu, &mats(&mut rng, i3, 1, 8, 128)).unwrap();
    let x3 = gpu.storage_init("x", &[0u8; 4 * 128 * 64]);
    let a3 = GemvArgs::new(&x3, 64, &pb, 64, &y);
    assert!(supported(i3));
    assert_eq!(select(&w3, &a3), Some(small));
    let call = w3.bind(&gpu, i3.format.ordinal(), a3).unwrap();
    assert_eq!(call.label.op, "gemm");
    // its own threshold, from the format table
    let min3 = inkling_wgpu::gpu::linear::format::row(i3.format).gemm_min_pairs;
    assert!(min3 > min, "int3-g64's GEMM needs more pairs than bf16's");
    let a3 = GemvArgs::new(&x3, min3 - 1, &pb, min3 - 1, &y);
    assert_eq!(
        select(&w3, &a3),
        None,
        "below int3-g64's threshold: the GEMV"
    );
    let a3 = GemvArgs::new(&x3, min3, &pb, min3, &y);
    assert_eq!(select(&w3, &a3), Some(small));
}

/// More tiles than one grid dimension holds (65,535 workgroups): the grid spreads over y, and
/// the last pairs are right (PITFALLS.md, workgroup counts).
#[test]
fn more_workgroups_than_one_grid_dimension() {
    let gpu = gpu();
    let mut rng = Rng(65_536);
    let (o, i, t) = (3usize, 5usize, 540_000usize);
    let enc = Encoding::parse("int4").unwrap();
    let m = mats(&mut rng, enc, 1, o, i);
    let w = GpuWeights::upload(&gpu, &m).unwrap();
    let x = rng.vec(t * i, 1.0);
    let x_rows: Vec<Vec<f32>> = x.chunks(i).map(|r| r.to_vec()).collect();
    let pairs: Vec<(u32, u32, u32)> = (0..t as u32).map(|k| (0, k, NO_GAMMA)).collect();
    let pr = Problem {
        x_rows: &x_rows,
        x_stride: i,
        x_offset: 0,
        pairs: &pairs,
        gammas: &[],
        x_per_pair: false,
        y_stride: o,
        y_offset: 0,
    };
    let tile = Tile { rm: 1, nq: 2 };
    assert!(t.div_ceil(tile.pairs() as usize) > 65_535);
    let (y, ran) = run(&gpu, &w, &pr, GemmChoice::Always(tile));
    assert!(ran);
    for p in [0, 1, t / 2, t - 2, t - 1] {
        let r = m[0].gemv_ref_f64(&x_rows[p]);
        let err = rel_err(&y[p * o..(p + 1) * o], &r);
        assert!(err <= TOL, "pair {p}: rel err {err:e}");
    }
    assert!(y.iter().all(|v| v.is_finite()), "a pair left unwritten");
}

/// The GEMM tile [`route`] picks for `args` over `w` under the default options (`None`: the GEMV).
fn select(w: &GpuWeights, args: &GemvArgs<'_>) -> Option<Tile> {
    route(w, args, &LinearOptions::default()).gemm_tile()
}

/// The kernel encodings with a GEMM kernel ([`supported`]).
fn gemm_encodings() -> Vec<Encoding> {
    kernel_encodings()
        .into_iter()
        .filter(|&e| supported(e))
        .collect()
}

/// A tile whose workgroup memory passes the device's limit (BN 32 needs 16.4 KiB; WebGPU's
/// default is 16 KiB) is refused with the sizes named; the same problem with the default tile
/// runs there, and BN 32 runs where the limit allows it (lavapipe's 32 KiB).
#[test]
fn a_tile_past_the_workgroup_memory_limit_is_refused() {
    use inkling_wgpu::gpu::limits::LimitProfile;
    let mut rng = Rng(0x7e1e);
    let enc = Encoding::parse("int4-g64").unwrap();
    let (o, i, t) = (70, 192, 40);
    let m = mats(&mut rng, enc, 1, o, i);
    let x_rows = rows(&mut rng, t, i);
    let pairs: Vec<(u32, u32, u32)> = (0..t as u32).map(|k| (0, k, NO_GAMMA)).collect();
    let pr = Problem {
        x_rows: &x_rows,
        x_stride: i,
        x_offset: 0,
        pairs: &pairs,
        gammas: &[],
        x_per_pair: false,
        y_stride: o,
        y_offset: 0,
    };
    let wide = Tile { rm: 2, nq: 8 };
    let big = gpu();
    assert!(big.limits.max_compute_workgroup_storage_size > 16384);
    let w = GpuWeights::upload(&big, &m).unwrap();
    let (y, ran) = run(&big, &w, &pr, GemmChoice::Always(wide));
    assert!(ran);
    assert!(check("BN 32", &m, &pr, &y) <= TOL);
    let web = Gpu::with_profile(Some(LimitProfile::WebGpu)).unwrap();
    let ww = GpuWeights::upload(&web, &m).unwrap();
    let (xb, pb, yb) = (
        web.storage("x", 4 * (t * i) as u64),
        web.storage("pairs", 16 * t as u64),
        web.storage("y", 4 * (t * o) as u64),
    );
    let args = GemvArgs::new(&xb, t as u32, &pb, t as u32, &yb).gemm(GemmChoice::Always(wide));
    let e = ww
        .bind(&web, enc.format.ordinal(), args)
        .err()
        .expect("refused");
    let e = format!("{e:#}");
    assert!(
        e.contains("tile 2x32 needs 16836 bytes of workgroup memory") && e.contains("allows 16384"),
        "{e}"
    );
    let (y, ran) = run(&web, &ww, &pr, GemmChoice::Always(TILES[0]));
    assert!(ran);
    assert!(check("default tile under WebGPU limits", &m, &pr, &y) <= TOL);
}
