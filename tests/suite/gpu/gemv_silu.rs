//! The GEMV's silu·up epilogue (`GemvArgs::silu_mul`: gate rows then up rows in, `silu(g)·u`
//! out) against the f64 CPU reference on the same bytes and against its separate kernels (the
//! plain GEMV into `[P, 2I]`, then `silu_mul`), for every kernel format, every tuning that can
//! take it, both reductions, odd shapes, poisoned outputs and slabs of several weight chunks;
//! and the calls it refuses. Runs on lavapipe in CI.

use crate::gpu::gemv_parity::{reductions, rel_err};
use crate::ops_util::{gpu, poisoned, read, run, Rng};
use inkling_wgpu::formats::{quantize, Encoding, QMatrix};
use inkling_wgpu::gpu::dispatch::DispatchError;
use inkling_wgpu::gpu::linear::args::{GemvArgs, Reduction, NO_GAMMA};
use inkling_wgpu::gpu::linear::format::{kernel_encodings, Tuning};
use inkling_wgpu::gpu::linear::route::{candidates, direct_candidates, silu_tuning, LinearOptions};
use inkling_wgpu::gpu::linear::slab::GpuWeights;
use inkling_wgpu::gpu::ops::{SiluMul, SiluMulLayout};
use inkling_wgpu::gpu::{Call, Gpu};

/// Guard floats after the output: still NaN after the call.
const GUARD: usize = 5;

/// `silu(g)·u` of pair (e, t) in f64: gate = rows `[0, I')` of expert e, up = rows `[I', 2I')`.
fn reference(m: &QMatrix, x: &[f64]) -> Vec<f64> {
    let xf: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let r = m.gemv_ref_f64(&xf);
    let n = m.rows / 2;
    (0..n)
        .map(|i| {
            let (g, u) = (r[i], r[n + i]);
            g / (1.0 + (-g).exp()) * u
        })
        .collect()
}

/// One fused call of `pairs` over `w` (uploaded from `mats`), `tuning` forced or not, checked
/// against f64 and against the separate kernels with the same tuning.
#[allow(clippy::too_many_arguments)]
fn check_case(
    gpu: &Gpu,
    mats: &[QMatrix],
    w: &GpuWeights,
    x: &[f32],
    pairs: &[(u32, u32)],
    red: Reduction,
    tuning: Option<Tuning>,
    what: &str,
) {
    let (o, i) = (mats[0].rows, mats[0].cols);
    let n = o / 2;
    let np = pairs.len();
    let ord = w.encoding().format.ordinal();
    let pb: Vec<u32> = pairs
        .iter()
        .flat_map(|&(e, t)| [e, t, NO_GAMMA, 0])
        .collect();
    let tokens = (x.len() / i) as u32;
    let xb = gpu.storage_init("x", bytemuck::cast_slice(x));
    let pbuf = gpu.storage_init("pairs", bytemuck::cast_slice(&pb));
    fn with_opts<'a>(a: GemvArgs<'a>, red: Reduction, tuning: Option<Tuning>) -> GemvArgs<'a> {
        let a = a.reduction(red);
        match tuning {
            Some(t) => a.tuning(t),
            None => a,
        }
    }
    let with = |a| with_opts(a, red, tuning);
    // fused
    let act = poisoned(gpu, np * n + GUARD);
    let args = with(GemvArgs::new(&xb, tokens, &pbuf, np as u32, &act).silu_mul(true));
    let call = w.bind(gpu, ord, args).unwrap();
    assert_eq!(call.dispatches(), w.chunks().len().div_ceil(2), "{what}");
    run(gpu, &call);
    let fused = read(gpu, &act, np * n + GUARD);
    // separate: the plain GEMV into [P, 2I'], then silu_mul
    let gu = poisoned(gpu, np * o);
    let act2 = poisoned(gpu, np * n);
    let plain = w
        .bind(
            gpu,
            ord,
            with(GemvArgs::new(&xb, tokens, &pbuf, np as u32, &gu)),
        )
        .unwrap();
    let silu = SiluMul {
        rows: np as u32,
        i: n as u32,
        layout: SiluMulLayout::fused(n as u32),
    }
    .bind(gpu, &gu, &gu, &act2)
    .unwrap();
    run(gpu, &plain);
    run(gpu, &silu);
    let separate = read(gpu, &act2, np * n);
    for (p, &(e, t)) in pairs.iter().enumerate() {
        let xt: Vec<f64> = x[t as usize * i..(t as usize + 1) * i]
            .iter()
            .map(|&v| v as f64)
            .collect();
        let r = reference(&mats[e as usize], &xt);
        let got = &fused[p * n..(p + 1) * n];
        assert!(
            got.iter().all(|v| v.is_finite()),
            "{what} pair {p}: NaN left (poison)"
        );
        let err = rel_err(got, &r);
        assert!(err <= 1e-5, "{what} pair {p} = ({e},{t}): rel err {err:e}");
        let sep = &separate[p * n..(p + 1) * n];
        let worst = got
            .iter()
            .zip(sep)
            .map(|(a, b)| ((a - b).abs() / b.abs().max(1e-30)) as f64)
            .fold(0.0, f64::max);
        assert!(
            worst <= 1e-6,
            "{what} pair {p}: fused vs separate kernels differ by {worst:e}"
        );
    }
    assert!(
        fused[np * n..].iter().all(|v| v.is_nan()),
        "{what}: written past the [P, I'] output"
    );
}

/// Every kernel format, odd I' and columns, several experts, pairs in any order with repeats,
/// each tuning that can run the epilogue forced and the engine's own choice, both reductions.
#[test]
fn silu_epilogue_equals_f64_and_the_separate_kernels() {
    let gpu = gpu();
    let mut rng = Rng(0x5117);
    for enc in kernel_encodings() {
        for (n, i) in [(37usize, 192usize), (130, 128)] {
            let o = 2 * n;
            let mats: Vec<QMatrix> = (0..3)
                .map(|_| quantize(enc, &rng.vec(o * i, 1.0), o, i).unwrap())
                .collect();
            let w = GpuWeights::upload(&gpu, &mats).unwrap();
            assert!(w.silu_mul_shape_fits());
            let x = rng.vec(2 * i, 2.0);
            let pairs = [(2, 1), (0, 0), (1, 1), (2, 0), (0, 1)];
            let mut tunings: Vec<Option<Tuning>> = vec![None];
            tunings.extend(candidates(enc.format).iter().copied().map(Some));
            tunings.extend(direct_candidates().iter().copied().map(Some));
            for t in tunings.into_iter().filter(|t| t.is_none_or(silu_tuning)) {
                for red in reductions(&gpu) {
                    let what = format!("{} [{o}x{i}] {red:?} tuning {t:?}", enc.spelling());
                    check_case(&gpu, &mats, &w, &x, &pairs, red, t, &what);
                }
            }
        }
    }
}

/// A slab over the binding limit (one expert per chunk: two chunks per dispatch, the last one
/// alone) with pairs on every chunk.
#[test]
fn silu_epilogue_over_several_weight_chunks() {
    use inkling_wgpu::gpu::linear::slab::gpu_row_stride;
    let gpu = gpu();
    let mut rng = Rng(0x5118);
    for spelling in ["bf16", "int4-g64", "int3-g64"] {
        let enc = Encoding::parse(spelling).unwrap();
        let (n, i) = (21, 128);
        let o = 2 * n;
        let limit = (o as u64 + 2) * gpu_row_stride(enc, i) as u64;
        let mats: Vec<QMatrix> = (0..3)
            .map(|_| quantize(enc, &rng.vec(o * i, 1.0), o, i).unwrap())
            .collect();
        let w = GpuWeights::upload_with_limit(&gpu, &mats, limit).unwrap();
        assert_eq!(w.chunks().len(), 3, "{spelling}");
        let x = rng.vec(i, 1.0);
        let pairs = [(2, 0), (0, 0), (1, 0), (2, 0)];
        for red in reductions(&gpu) {
            let what = format!("{spelling} 3 chunks {red:?}");
            check_case(&gpu, &mats, &w, &x, &pairs, red, None, &what);
        }
    }
}

/// What the epilogue refuses, before anything is recorded: an expert split by rows over chunks,
/// an odd row count, a gamma, output segments, a too-small output; and a call the GEMM would
/// run never takes it (`silu_mul_fits`).
#[test]
fn silu_epilogue_refusals() {
    use inkling_wgpu::gpu::linear::slab::gpu_row_stride;
    let gpu = gpu();
    let mut rng = Rng(0x5119);
    let enc = Encoding::parse("int4-g64").unwrap();
    let (o, i) = (40, 128);
    let m = quantize(enc, &rng.vec(o * i, 1.0), o, i).unwrap();
    let ord = enc.format.ordinal();
    let x = gpu.storage_init("x", bytemuck::cast_slice(&rng.vec(64 * i, 1.0)));
    let pb: Vec<u32> = (0..64).flat_map(|t| [0u32, t, NO_GAMMA, 0]).collect();
    let pairs = gpu.storage_init("pairs", bytemuck::cast_slice(&pb));
    let y = poisoned(&gpu, 64 * o);
    let shape = |r: Result<Call, DispatchError>, what: &str| match r {
        Err(DispatchError::Shape(msg)) => assert!(msg.contains("silu"), "{what}: {msg}"),
        Err(e) => panic!("{what}: {e}"),
        Ok(_) => panic!("{what}: accepted"),
    };
    // an expert split by rows over chunks
    let split = GpuWeights::upload_with_limit(
        &gpu,
        std::slice::from_ref(&m),
        16 * gpu_row_stride(enc, i) as u64,
    )
    .unwrap();
    assert!(split.chunks().len() > 1 && !split.silu_mul_shape_fits());
    shape(
        split.bind(
            &gpu,
            ord,
            GemvArgs::new(&x, 1, &pairs, 1, &y).silu_mul(true),
        ),
        "rows split over chunks",
    );
    // an odd row count
    let odd = quantize(enc, &rng.vec(39 * i, 1.0), 39, i).unwrap();
    let w_odd = GpuWeights::upload(&gpu, std::slice::from_ref(&odd)).unwrap();
    shape(
        w_odd.bind(
            &gpu,
            ord,
            GemvArgs::new(&x, 1, &pairs, 1, &y).silu_mul(true),
        ),
        "odd rows",
    );
    let w = GpuWeights::upload(&gpu, std::slice::from_ref(&m)).unwrap();
    // a gamma
    let g = gpu.storage_init("g", bytemuck::cast_slice(&[0.5f32]));
    let args = GemvArgs::new(&x, 1, &pairs, 1, &y).silu_mul(true).gamma(&g);
    assert!(!w.silu_mul_fits(&args, &LinearOptions::default()));
    shape(w.bind(&gpu, ord, args), "gamma");
    // output segments
    let y2 = poisoned(&gpu, o);
    let segs = [(20u32, &y), (20u32, &y2)];
    let args = GemvArgs::new(&x, 1, &pairs, 1, &y)
        .segments(&segs)
        .silu_mul(true);
    shape(w.bind(&gpu, ord, args), "segments");
    // the output holds [P, O/2]: one float short is refused
    let small = gpu.storage("small", 4 * (o as u64 / 2 - 1));
    assert!(matches!(
        w.bind(
            &gpu,
            ord,
            GemvArgs::new(&x, 1, &pairs, 1, &small).silu_mul(true)
        ),
        Err(DispatchError::Shape(_))
    ));
    // one pair fits; 64 tokens of one expert are a GEMM, which keeps the separate silu_mul
    let opts = LinearOptions::default();
    assert!(w.silu_mul_fits(&GemvArgs::new(&x, 1, &pairs, 1, &y), &opts));
    assert!(!w.silu_mul_fits(&GemvArgs::new(&x, 64, &pairs, 64, &y), &opts));
}
