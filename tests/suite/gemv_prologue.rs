//! The GEMV's x prologues (`GemvArgs::rms_norm`, `GemvArgs::silu_mul`) against an f64 CPU
//! reference on the same weight bytes: every kernel format, odd shapes (columns not a whole
//! number of units, rows longer than one x tile), several experts and pairs, each reduction the
//! device has, fresh random inputs for every problem, outputs poisoned with NaN. Also: a prologue
//! always stages x and never runs as a GEMM, works over chunked slabs, and bad arguments are
//! refused before anything is recorded.
use crate::gemv_parity::{reductions, rel_err};
use crate::ops_util::{buf_f32, buf_u32, gpu, poisoned, read, Rng};
use inkling_wgpu::formats::{quantize, Encoding, QMatrix};
use inkling_wgpu::gpu::dispatch::DispatchError;
use inkling_wgpu::gpu::linear::args::GemmChoice;
use inkling_wgpu::gpu::linear::args::{GemvArgs, Reduction, NO_GAMMA};
use inkling_wgpu::gpu::linear::format::kernel_encodings;
use inkling_wgpu::gpu::linear::route::TILES;
use inkling_wgpu::gpu::linear::slab::GpuWeights;
use inkling_wgpu::gpu::Gpu;

/// What a problem stages as x.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Prologue {
    /// RMSNorm with eps `1e-5` and a random weight.
    Norm,
    /// silu(gate) · up of gate‖up rows.
    Silu,
}

const EPS: f32 = 1e-5;

/// `W_e · v` in f64 over the dequantized weights of `m`.
fn w_dot(m: &QMatrix, v: &[f64]) -> Vec<f64> {
    let w = m.dequantize();
    w.chunks_exact(m.cols)
        .map(|row| row.iter().zip(v).map(|(&a, &b)| a as f64 * b).sum())
        .collect()
}

/// The staged x of one row in f64: the RMSNorm of `row` with `weight`, or silu(gate) · up of a
/// gate‖up `row`.
fn staged_ref(p: Prologue, row: &[f32], weight: &[f32]) -> Vec<f64> {
    match p {
        Prologue::Norm => {
            let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / row.len() as f64;
            let inv = 1.0 / (ms + EPS as f64).sqrt();
            row.iter()
                .zip(weight)
                .map(|(&v, &w)| w as f64 * v as f64 * inv)
                .collect()
        }
        Prologue::Silu => {
            let i = row.len() / 2;
            (0..i)
                .map(|c| {
                    let g = row[c] as f64;
                    g / (1.0 + (-g).exp()) * row[i + c] as f64
                })
                .collect()
        }
    }
}

/// x rows for `p` over `i` columns: `rows` rows of I (norm) or 2·I (silu) values, each row at
/// its own scale (1/64 … 32) so an RMSNorm that is not applied cannot pass.
fn x_rows(rng: &mut Rng, p: Prologue, rows: usize, i: usize) -> Vec<f32> {
    let len = if p == Prologue::Silu { 2 * i } else { i };
    (0..rows)
        .flat_map(|r| rng.vec(len, [1.0 / 64.0, 32.0, 3.0][r % 3]))
        .collect()
}

/// One problem: `pairs` (expert, token) over `w` (the slab of `mats`), x rows from `x` (row
/// token(p), or row p with `per_pair`), checked pair by pair against the f64 reference.
#[allow(clippy::too_many_arguments)]
fn check(
    gpu: &Gpu,
    mats: &[QMatrix],
    w: &GpuWeights,
    p: Prologue,
    x: &[f32],
    weight: &[f32],
    pairs: &[(u32, u32)],
    per_pair: bool,
    red: Reduction,
) {
    let (o, i) = (mats[0].rows, mats[0].cols);
    let row = if p == Prologue::Silu { 2 * i } else { i };
    let n_rows = x.len() / row;
    let xb = buf_f32(gpu, x);
    let wb = buf_f32(gpu, weight);
    let flat: Vec<u32> = pairs
        .iter()
        .flat_map(|&(e, t)| [e, t, NO_GAMMA, 0])
        .collect();
    let pb = buf_u32(gpu, &flat);
    let yb = poisoned(gpu, pairs.len() * o);
    let n = pairs.len() as u32;
    let args = GemvArgs::new(&xb, n_rows as u32, &pb, n, &yb)
        .reduction(red)
        .x_per_pair(per_pair);
    let args = match p {
        Prologue::Norm => args.rms_norm(&wb, EPS),
        Prologue::Silu => args.silu_mul(),
    };
    assert!(w.plans(&args, &Default::default()).iter().all(|pl| !pl.direct), "x is staged");
    let enc = w.encoding();
    w.bind(gpu, enc.format.ordinal(), args).unwrap().run(gpu);
    let y = read(gpu, &yb, pairs.len() * o);
    for (k, &(e, t)) in pairs.iter().enumerate() {
        let r = if per_pair { k } else { t as usize };
        let v = staged_ref(p, &x[r * row..(r + 1) * row], weight);
        let want = w_dot(&mats[e as usize], &v);
        let got = &y[k * o..(k + 1) * o];
        let what = format!(
            "{} [{o},{i}] {p:?} {red:?} pair {k} = ({e},{t})",
            enc.spelling()
        );
        assert!(
            got.iter().all(|v| v.is_finite()),
            "{what}: NaN left (poison)"
        );
        let err = rel_err(got, &want);
        assert!(err <= 1e-5, "{what}: rel err {err:e}");
    }
}

#[test]
fn prologues_every_format_odd_shapes_both_reductions() {
    let gpu = gpu();
    let mut rng = Rng(0x9f05e);
    // (rows, cols): cols of one column, short of a unit, one and several 512-column steps, and
    // past the largest x tile (16384 columns), so the norm spans several staged tiles
    let shapes = [
        (1, 1),
        (3, 7),
        (33, 63),
        (257, 65),
        (5, 384),
        (9, 2113),
        (17, 4160),
        (2, 16900),
    ];
    let pairs = [(2, 1), (0, 0), (2, 0), (1, 1), (2, 1)];
    for enc in kernel_encodings() {
        for &(o, i) in &shapes {
            let mats: Vec<QMatrix> = (0..3)
                .map(|_| quantize(enc, &rng.vec(o * i, 1.0), o, i).unwrap())
                .collect();
            let w = GpuWeights::upload(&gpu, &mats).unwrap();
            for red in reductions(&gpu) {
                for p in [Prologue::Norm, Prologue::Silu] {
                    let weight: Vec<f32> = rng.vec(i, 0.5).iter().map(|v| 1.0 + v).collect();
                    // token rows, then one row per pair (the down projection's layout)
                    let x = x_rows(&mut rng, p, 2, i);
                    check(&gpu, &mats, &w, p, &x, &weight, &pairs, false, red);
                    let x = x_rows(&mut rng, p, pairs.len(), i);
                    check(&gpu, &mats, &w, p, &x, &weight, &pairs, true, red);
                }
            }
        }
    }
}

#[test]
fn prologues_over_chunked_slabs_and_never_as_gemm() {
    let gpu = gpu();
    let mut rng = Rng(0xc0ffee);
    let (experts, o, i) = (5, 24, 200);
    for spelling in ["bf16", "int4-g64", "int3-g64"] {
        let enc = Encoding::parse(spelling).unwrap();
        let mats: Vec<QMatrix> = (0..experts)
            .map(|_| quantize(enc, &rng.vec(o * i, 1.0), o, i).unwrap())
            .collect();
        // one expert per chunk (two chunks per dispatch, the last alone), and rows split
        let expert_bytes = (o * enc.bytes_per_row(i)) as u64;
        for limit in [expert_bytes, expert_bytes / 2] {
            let w = GpuWeights::upload_with_limit(&gpu, &mats, limit).unwrap();
            assert!(
                w.chunks().len() >= experts,
                "{spelling}: {} chunks",
                w.chunks().len()
            );
            let pairs: Vec<(u32, u32)> = (0..experts as u32).rev().map(|e| (e, e % 2)).collect();
            for p in [Prologue::Norm, Prologue::Silu] {
                let weight: Vec<f32> = rng.vec(i, 0.5).iter().map(|v| 1.0 + v).collect();
                let x = x_rows(&mut rng, p, 2, i);
                check(
                    &gpu,
                    &mats,
                    &w,
                    p,
                    &x,
                    &weight,
                    &pairs,
                    false,
                    Reduction::Auto,
                );
            }
        }
    }
    // a forced GEMM tile still runs the GEMV under a prologue (the GEMM stages no prologue)
    let enc = Encoding::BF16;
    let m = quantize(enc, &rng.vec(64 * 128, 1.0), 64, 128).unwrap();
    let w = GpuWeights::upload(&gpu, std::slice::from_ref(&m)).unwrap();
    let (x, nw) = (
        buf_f32(&gpu, &rng.vec(8 * 256, 1.0)),
        buf_f32(&gpu, &[1.0; 128]),
    );
    let pb = buf_u32(
        &gpu,
        &(0..8).flat_map(|t| [0, t, NO_GAMMA, 0]).collect::<Vec<_>>(),
    );
    let y = poisoned(&gpu, 8 * 64);
    let base = GemvArgs::new(&x, 8, &pb, 8, &y).gemm(GemmChoice::Always(TILES[0]));
    let ord = enc.format.ordinal();
    assert_eq!(w.bind(&gpu, ord, base).unwrap().label.op, "gemm");
    for args in [base.rms_norm(&nw, EPS), base.silu_mul()] {
        assert_eq!(w.bind(&gpu, ord, args).unwrap().label.op, "gemv");
    }
}

#[test]
fn bad_prologue_arguments_are_refused() {
    let gpu = gpu();
    let (o, i) = (4, 96);
    let m = quantize(Encoding::F32, &vec![0.5; o * i], o, i).unwrap();
    let w = GpuWeights::upload(&gpu, std::slice::from_ref(&m)).unwrap();
    let x = buf_f32(&gpu, &[1.0; 96]);
    let pb = buf_u32(&gpu, &[0, 0, 0, 0]);
    let y = poisoned(&gpu, o);
    let gamma = buf_f32(&gpu, &[2.0]);
    let nw = buf_f32(&gpu, &[1.0; 96]);
    let short = buf_f32(&gpu, &[1.0; 95]);
    let args = GemvArgs::new(&x, 1, &pb, 1, &y);
    let refused = |a: GemvArgs, what: &str| match w.bind(&gpu, 0, a) {
        Err(DispatchError::Shape(msg)) => assert!(msg.contains(what), "{msg}"),
        Err(e) => panic!("{what}: {e}"),
        Ok(_) => panic!("{what}: accepted"),
    };
    refused(args.gamma(&gamma).rms_norm(&nw, EPS), "gamma");
    refused(args.rms_norm(&short, EPS), "weight");
    refused(args.rms_norm(&nw, f32::NAN), "eps");
    // silu·mul reads rows of 2·I values: a 96-value x holds none
    refused(args.silu_mul(), "x buffer");
    assert!(w.bind(&gpu, 0, args.rms_norm(&nw, EPS)).is_ok());
}
