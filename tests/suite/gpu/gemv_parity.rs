//! GPU GEMV parity against the f64 CPU reference on the SAME bytes, through the dispatcher.
//! Runs on lavapipe in CI: a missing adapter FAILS (no skip).

use crate::ops_util::{gpu, Rng};
use inkling_wgpu::formats::{quantize, Encoding, QMatrix};
use inkling_wgpu::gpu::dispatch::DispatchError;
use inkling_wgpu::gpu::gemv_pairs_with;
use inkling_wgpu::gpu::linear::args::{GemvArgs, Reduction, NO_GAMMA};
use inkling_wgpu::gpu::linear::format::kernel_encodings;
use inkling_wgpu::gpu::linear::slab::GpuWeights;
use inkling_wgpu::gpu::Gpu;
use std::borrow::Cow;

/// ‖y − ref‖ / ‖ref‖ in f64 (‖y − ref‖ when the reference is zero).
pub(crate) fn rel_err(y: &[f32], r: &[f64]) -> f64 {
    assert_eq!(y.len(), r.len());
    let num: f64 = y
        .iter()
        .zip(r)
        .map(|(&a, &b)| (a as f64 - b).powi(2))
        .sum::<f64>()
        .sqrt();
    let den: f64 = r.iter().map(|b| b * b).sum::<f64>().sqrt();
    if den == 0.0 {
        num
    } else {
        num / den
    }
}

/// Run one MoE problem and check every pair against the reference.
#[allow(clippy::too_many_arguments)]
fn check_problem(
    gpu: &Gpu,
    enc: Encoding,
    mats: &[QMatrix],
    w: &GpuWeights,
    x: &[f32],
    pairs: &[(u32, u32, u32)],
    gammas: &[f32],
    red: Reduction,
) {
    let (o, i) = (mats[0].rows, mats[0].cols);
    let y = gemv_pairs_with(gpu, enc.format.ordinal(), w, x, pairs, gammas, red).unwrap();
    assert_eq!(y.len(), pairs.len() * o);
    for (p, &(e, t, wi)) in pairs.iter().enumerate() {
        let g = if wi == NO_GAMMA {
            1.0
        } else {
            gammas[wi as usize] as f64
        };
        let r: Vec<f64> = mats[e as usize]
            .gemv_ref_f64(&x[t as usize * i..(t as usize + 1) * i])
            .into_iter()
            .map(|v| v * g)
            .collect();
        let got = &y[p * o..(p + 1) * o];
        assert!(
            got.iter().all(|v| v.is_finite()),
            "{} [{o},{i}] {red:?} pair {p}: NaN left (poison)",
            enc.spelling()
        );
        let err = rel_err(got, &r);
        assert!(
            err <= 1e-5,
            "{} [{o},{i}] {red:?} pair {p} = ({e},{t},{wi}): rel err {err:e}",
            enc.spelling()
        );
    }
}

/// The reductions `gpu` can run: the workgroup-memory tree, and subgroups where it has them.
pub(crate) fn reductions(gpu: &Gpu) -> Vec<Reduction> {
    let mut v = vec![Reduction::Shared];
    if gpu.has_subgroups() {
        v.push(Reduction::Subgroup);
    }
    v
}

#[test]
fn parity_every_format_odd_shapes_both_reductions() {
    parity_every_format(&gpu());
}

/// Every kernel encoding at odd shapes (x tiles of one and several 512-column steps), 3 experts,
/// 2 tokens, with and without gammas, each reduction `gpu` has, against the f64 reference.
pub fn parity_every_format(gpu: &Gpu) {
    eprintln!(
        "adapter: {}; subgroups: {}",
        gpu.describe(),
        gpu.has_subgroups()
    );
    let mut rng = Rng(0x5eed);
    let shapes = [
        (1, 1),
        (3, 7),
        (33, 63),
        (257, 65),
        (1, 100),
        (33, 129),
        (3, 256),
        (257, 1),
        (5, 384),
        (9, 2113),
        (2, 4160),
    ];
    for enc in kernel_encodings() {
        for &(o, i) in &shapes {
            let experts = 3;
            let tokens = 2;
            let mats: Vec<QMatrix> = (0..experts)
                .map(|_| quantize(enc, &rng.vec(o * i, 1.0), o, i).unwrap())
                .collect();
            let w = GpuWeights::upload(gpu, &mats).unwrap();
            // fresh inputs for each reduction, drawn for both whatever the device has, so the
            // random stream (and so each input) is the same on every device and limit profile
            let xs = [rng.vec(tokens * i, 1.0), rng.vec(tokens * i, 1.0)];
            for red in reductions(gpu) {
                let x = &xs[(red == Reduction::Subgroup) as usize];
                let pairs = [(2, 1, NO_GAMMA), (0, 0, 0), (2, 0, 1), (1, 1, NO_GAMMA)];
                check_problem(gpu, enc, &mats, &w, x, &pairs, &[0.75, -1.5], red);
            }
        }
    }
}

#[test]
fn many_pairs_one_dispatch() {
    let gpu = gpu();
    let mut rng = Rng(42);
    let (experts, o, i, tokens) = (8, 96, 320, 5);
    for enc in kernel_encodings() {
        let mats: Vec<QMatrix> = (0..experts)
            .map(|_| quantize(enc, &rng.vec(o * i, 1.0), o, i).unwrap())
            .collect();
        let w = GpuWeights::upload(&gpu, &mats).unwrap();
        // every token routed to 4 experts (repeats across tokens), gammas on, plus unweighted pairs
        let mut pairs = Vec::new();
        let mut gammas = Vec::new();
        for t in 0..tokens {
            for _ in 0..4 {
                pairs.push(((rng.below(experts as u64) as u32), t, gammas.len() as u32));
                gammas.push(rng.f());
            }
            pairs.push((t % experts, t, NO_GAMMA));
        }
        pairs.push((3, 0, NO_GAMMA));
        pairs.push((3, 0, NO_GAMMA)); // the same pair twice
        let x = rng.vec(tokens as usize * i, 1.0);
        for red in reductions(&gpu) {
            check_problem(&gpu, enc, &mats, &w, &x, &pairs, &gammas, red);
        }
    }
}

#[test]
fn dense_gemv_is_e1_and_respects_strides_and_offsets() {
    let gpu = gpu();
    let mut rng = Rng(9);
    let (o, i, tokens) = (33, 65, 3);
    let enc = Encoding::parse("int4-g64").unwrap();
    let m = quantize(enc, &rng.vec(o * i, 1.0), o, i).unwrap();
    let w = GpuWeights::upload(&gpu, std::slice::from_ref(&m)).unwrap();
    // x tokens at stride 70 starting at element 3; y pairs at stride 40 starting at element 5
    let (xs, xo, ys, yo) = (70usize, 3usize, 40usize, 5usize);
    let mut x = vec![f32::NAN; xo + tokens * xs];
    let xt: Vec<Vec<f32>> = (0..tokens).map(|_| rng.vec(i, 1.0)).collect();
    for t in 0..tokens {
        x[xo + t * xs..xo + t * xs + i].copy_from_slice(&xt[t]);
    }
    let xb = gpu.storage_init("x", bytemuck::cast_slice(&x));
    let pairs: Vec<u32> = (0..tokens as u32)
        .flat_map(|t| [0, t, NO_GAMMA, 0])
        .collect();
    let pb = gpu.storage_init("pairs", bytemuck::cast_slice(&pairs));
    let ylen = yo + tokens * ys;
    let yb = gpu.storage_init("y", bytemuck::cast_slice(&vec![-7.0f32; ylen]));
    let mut args = GemvArgs::new(&xb, tokens as u32, &pb, tokens as u32, &yb);
    args.x_stride = xs as u32;
    args.x_offset = xo as u32;
    args.y_stride = ys as u32;
    args.y_offset = yo as u32;
    let call = w.bind(&gpu, 4, args).unwrap();
    for _ in 0..2 {
        let mut e = gpu.device.create_command_encoder(&Default::default());
        call.record(&mut e); // recorded twice: the call is reusable
        gpu.queue.submit([e.finish()]);
    }
    let y = gpu.read_f32(&yb, ylen).unwrap();
    for t in 0..tokens {
        let r = m.gemv_ref_f64(&xt[t]);
        assert!(rel_err(&y[yo + t * ys..yo + t * ys + o], &r) <= 1e-5);
        // untouched gaps
        assert!(y[yo + t * ys + o..yo + (t + 1) * ys]
            .iter()
            .all(|&v| v == -7.0));
    }
    assert!(y[..yo].iter().all(|&v| v == -7.0));
}

#[test]
fn dispatcher_refuses_unknown_and_kernel_less_ordinals_and_mismatches() {
    let gpu = gpu();
    let m = quantize(Encoding::F32, &[1.0; 8], 2, 4).unwrap();
    let w = GpuWeights::upload(&gpu, &[m]).unwrap();
    let x = [1.0f32; 4];
    let pairs = [(0, 0, NO_GAMMA)];
    for ord in [10u32, 42, 99, 100, u32::MAX] {
        let e = gemv_pairs_with(&gpu, ord, &w, &x, &pairs, &[], Reduction::Auto).unwrap_err();
        assert!(
            matches!(e, DispatchError::UnknownOrdinal(o) if o == ord),
            "{ord}: {e}"
        );
    }
    for ord in [1u32, 3, 6, 7, 8] {
        let e = gemv_pairs_with(&gpu, ord, &w, &x, &pairs, &[], Reduction::Auto).unwrap_err();
        assert!(
            matches!(e, DispatchError::NoKernel { ordinal, .. } if ordinal == ord),
            "{ord}: {e}"
        );
    }
    for ord in [2u32, 4, 5, 9] {
        let e = gemv_pairs_with(&gpu, ord, &w, &x, &pairs, &[], Reduction::Auto).unwrap_err();
        assert!(
            matches!(e, DispatchError::EncodingMismatch { ordinal, .. } if ordinal == ord),
            "{ord}: {e}"
        );
    }
    // the same refusals building a reusable call
    let xb = gpu.storage_init("x", bytemuck::cast_slice(&x));
    let pb = gpu.storage_init("p", bytemuck::cast_slice(&[0u32, 0, NO_GAMMA, 0]));
    let yb = gpu.storage("y", 8);
    let args = GemvArgs::new(&xb, 1, &pb, 1, &yb);
    assert!(matches!(
        w.bind(&gpu, 42, args),
        Err(DispatchError::UnknownOrdinal(42))
    ));
    assert!(matches!(
        w.bind(&gpu, 6, args),
        Err(DispatchError::NoKernel { ordinal: 6, .. })
    ));
    assert!(matches!(
        w.bind(&gpu, 9, args),
        Err(DispatchError::EncodingMismatch { .. })
    ));
    assert!(w.bind(&gpu, 0, args).is_ok());
    // uploads of kernel-less formats are refused by the dispatcher too
    let e = GpuWeights::from_slab_bytes(
        &gpu,
        Encoding {
            format: inkling_wgpu::formats::Format::Mxfp4,
            group_size: 32,
        },
        1,
        1,
        32,
        &[0; 17],
        &[],
    )
    .unwrap_err();
    assert!(
        matches!(e, DispatchError::NoKernel { ordinal: 7, .. }),
        "{e}"
    );
}

/// Same bytes, two interpretations that differ: the dispatcher always runs the weights' own decode.
#[test]
fn ordinal_5_runs_int3_and_9_runs_bf16() {
    let gpu = gpu();
    let mut rng = Rng(3);
    // int3-g64 [4, 64] is 24 bytes/row, like int4 [4, 48]
    let o = 4;
    let q3 = quantize(
        Encoding::parse("int3-g64").unwrap(),
        &rng.vec(o * 64, 1.0),
        o,
        64,
    )
    .unwrap();
    let q4 = QMatrix::new(
        Encoding::parse("int4").unwrap(),
        o,
        48,
        Cow::Borrowed(&q3.data[..]),
        Cow::Borrowed(&q3.scales[..]),
    )
    .unwrap();
    let x = rng.vec(64, 1.0);
    let r3 = q3.gemv_ref_f64(&x);
    let r4 = q4.gemv_ref_f64(&x[..48]);
    assert!(
        rel_err(&r4.iter().map(|&v| v as f32).collect::<Vec<_>>(), &r3) > 0.1,
        "test bytes must disagree"
    );
    let w3 = GpuWeights::upload(&gpu, std::slice::from_ref(&q3)).unwrap();
    let w4 = GpuWeights::upload(&gpu, std::slice::from_ref(&q4)).unwrap();
    let y = gemv_pairs_with(&gpu, 5, &w3, &x, &[(0, 0, NO_GAMMA)], &[], Reduction::Auto).unwrap();
    assert!(rel_err(&y, &r3) <= 1e-5);
    let y4 = gemv_pairs_with(
        &gpu,
        2,
        &w4,
        &x[..48],
        &[(0, 0, NO_GAMMA)],
        &[],
        Reduction::Auto,
    )
    .unwrap();
    assert!(rel_err(&y4, &r4) <= 1e-5);
    assert!(matches!(
        gemv_pairs_with(&gpu, 2, &w3, &x, &[(0, 0, NO_GAMMA)], &[], Reduction::Auto),
        Err(DispatchError::EncodingMismatch { ordinal: 2, .. })
    ));
    // bf16 [3, 10] = 20 bytes/row, like f32 [3, 5]
    let qb = quantize(Encoding::BF16, &rng.vec(30, 1.0), 3, 10).unwrap();
    let qf = QMatrix::new(
        Encoding::F32,
        3,
        5,
        Cow::Borrowed(&qb.data[..]),
        Cow::Borrowed(&[][..]),
    )
    .unwrap();
    let xb = rng.vec(10, 1.0);
    let wb = GpuWeights::upload(&gpu, std::slice::from_ref(&qb)).unwrap();
    let y = gemv_pairs_with(&gpu, 9, &wb, &xb, &[(0, 0, NO_GAMMA)], &[], Reduction::Auto).unwrap();
    assert!(rel_err(&y, &qb.gemv_ref_f64(&xb)) <= 1e-5);
    let rf = qf.gemv_ref_f64(&xb[..5]);
    assert!(rel_err(&y, &rf) > 0.1);
    assert!(matches!(
        gemv_pairs_with(&gpu, 0, &wb, &xb, &[(0, 0, NO_GAMMA)], &[], Reduction::Auto),
        Err(DispatchError::EncodingMismatch { ordinal: 0, .. })
    ));
}

#[test]
fn from_slab_bytes_accepts_unaligned_input() {
    let gpu = gpu();
    let mut rng = Rng(11);
    let (e, o, i) = (3, 5, 7); // bf16 rows of 14 bytes
    let mats: Vec<QMatrix> = (0..e)
        .map(|_| quantize(Encoding::BF16, &rng.vec(o * i, 1.0), o, i).unwrap())
        .collect();
    let mut raw = vec![0u8; 1]; // start the slab at an odd address
    for m in &mats {
        raw.extend_from_slice(&m.data);
    }
    let w = GpuWeights::from_slab_bytes(&gpu, Encoding::BF16, e, o, i, &raw[1..], &[]).unwrap();
    let x = rng.vec(i, 1.0);
    check_problem(
        &gpu,
        Encoding::BF16,
        &mats,
        &w,
        &x,
        &[(2, 0, NO_GAMMA), (1, 0, NO_GAMMA)],
        &[],
        Reduction::Auto,
    );
    assert!(GpuWeights::from_slab_bytes(&gpu, Encoding::BF16, e, o, i, &raw, &[]).is_err());
}

#[test]
fn chunked_slabs_small_limit() {
    // splitting logic with a tiny chunk limit: by experts, and by rows inside one expert
    let gpu = gpu();
    let mut rng = Rng(77);
    for (enc, limit) in [
        ("int4-g32", 4096u64),
        ("int3-g64", 4096),
        ("f32", 1 << 15),
        ("bf16", 3000),
    ] {
        let enc = Encoding::parse(enc).unwrap();
        let (experts, o, i) = (4, 70, 200);
        let mats: Vec<QMatrix> = (0..experts)
            .map(|_| quantize(enc, &rng.vec(o * i, 1.0), o, i).unwrap())
            .collect();
        let w = GpuWeights::upload_with_limit(&gpu, &mats, limit).unwrap();
        assert!(
            w.chunks().len() > 1,
            "{}: {} chunks",
            enc.spelling(),
            w.chunks().len()
        );
        let x = rng.vec(2 * i, 1.0);
        let pairs = [
            (3, 1, NO_GAMMA),
            (0, 0, 0),
            (1, 1, NO_GAMMA),
            (2, 0, NO_GAMMA),
            (3, 0, 0),
        ];
        for red in reductions(&gpu) {
            check_problem(&gpu, enc, &mats, &w, &x, &pairs, &[0.5], red);
        }
    }
}

#[test]
fn auto_picks_subgroups_when_available_and_no_gamma_buffer_ignores_weight_idx() {
    let gpu = gpu();
    let mut rng = Rng(5);
    let (o, i) = (40, 96);
    let m = quantize(
        Encoding::parse("int3-g64").unwrap(),
        &rng.vec(o * i, 1.0),
        o,
        i,
    )
    .unwrap();
    let w = GpuWeights::upload(&gpu, std::slice::from_ref(&m)).unwrap();
    let x = rng.vec(i, 1.0);
    let xb = gpu.storage_init("x", bytemuck::cast_slice(&x));
    // weight_idx 7 but no gamma buffer: the pair is unweighted (and nothing reads out of bounds)
    let pb = gpu.storage_init("p", bytemuck::cast_slice(&[0u32, 0, 7, 0]));
    let yb = gpu.storage_init("y", bytemuck::cast_slice(&vec![f32::NAN; o]));
    let call = w.bind(&gpu, 5, GemvArgs::new(&xb, 1, &pb, 1, &yb)).unwrap();
    assert_eq!(
        Reduction::Auto.subgroups(&gpu).unwrap(),
        gpu.has_subgroups()
    );
    assert_eq!(call.dispatches(), 1);
    let mut e = gpu.device.create_command_encoder(&Default::default());
    call.record(&mut e);
    gpu.queue.submit([e.finish()]);
    let y = gpu.read_f32(&yb, o).unwrap();
    assert!(rel_err(&y, &m.gemv_ref_f64(&x)) <= 1e-5);
    // pairs are 16 bytes (the router's `Pair`): a 12-byte pair buffer is refused
    let pb12 = gpu.storage_init("p12", bytemuck::cast_slice(&[0u32, 0, 7]));
    assert!(matches!(
        w.bind(&gpu, 5, GemvArgs::new(&xb, 1, &pb12, 1, &yb)),
        Err(DispatchError::Shape(_))
    ));
    // a too-small output buffer is refused before anything is recorded
    let small = gpu.storage("y small", 4 * (o as u64 - 1));
    assert!(matches!(
        w.bind(&gpu, 5, GemvArgs::new(&xb, 1, &pb, 1, &small)),
        Err(DispatchError::Shape(_))
    ));
}

/// The split policies of a slab over the binding limit (whole experts per chunk; each expert by
/// rows), each checked for its chunk shapes and against f64 with pairs on every chunk. (Row ranges
/// of every expert per chunk were measured slower on an H200: two half-size dispatches of all the
/// pairs took 50.0 µs per inkling-small routed gate_up, against 45.1 µs by whole experts.)
#[test]
fn every_chunk_policy_is_exact() {
    use inkling_wgpu::gpu::linear::slab::gpu_row_stride;
    let gpu = gpu();
    let mut rng = Rng(0xc4a7);
    for spelling in ["f32", "bf16", "int4", "int4-g64", "int3-g64"] {
        let enc = Encoding::parse(spelling).unwrap();
        let i = 192;
        let stride = gpu_row_stride(enc, i) as u64;
        // (experts, rows, limit, what the chunks must look like)
        type Check = fn(&[(u32, u32, u32, u32)], usize, usize) -> bool;
        let cases: [(usize, usize, u64, Check); 3] = [
            // whole experts: 6 experts × 40 rows, one expert per chunk
            (6, 40, 42 * stride, |c, e, o| {
                c.iter()
                    .all(|&(e0, e1, r0, r1)| e1 == e0 + 1 && r0 == 0 && r1 as usize == o)
                    && c.len() == e
            }),
            // whole experts: 11 experts × 3 rows, three per chunk
            (11, 3, 10 * stride, |c, _, o| {
                c.iter().all(|&(_, _, r0, r1)| r0 == 0 && r1 as usize == o) && c.len() == 4
            }),
            // each expert by rows: 20 experts × 40 rows, 16 rows per chunk
            (20, 40, 16 * stride, |c, _, _| {
                c.iter().all(|&(e0, e1, _, _)| e1 == e0 + 1) && c.len() == 60
            }),
        ];
        for (experts, o, limit, check) in cases {
            let mats: Vec<QMatrix> = (0..experts)
                .map(|_| quantize(enc, &rng.vec(o * i, 1.0), o, i).unwrap())
                .collect();
            let w = GpuWeights::upload_with_limit(&gpu, &mats, limit).unwrap();
            let shapes: Vec<(u32, u32, u32, u32)> = w
                .chunks()
                .iter()
                .map(|c| (c.e0, c.e1, c.r0, c.r1))
                .collect();
            assert!(
                check(&shapes, experts, o),
                "{spelling} {experts}x[{o}]: {shapes:?}"
            );
            let x = rng.vec(2 * i, 1.0);
            let pairs: Vec<(u32, u32, u32)> = (0..experts as u32)
                .rev()
                .chain([0, experts as u32 - 1])
                .enumerate()
                .map(|(p, e)| (e, (p % 2) as u32, if p % 3 == 0 { 0 } else { NO_GAMMA }))
                .collect();
            for red in reductions(&gpu) {
                check_problem(&gpu, enc, &mats, &w, &x, &pairs, &[-0.75], red);
            }
        }
    }
}

#[test]
fn two_weight_chunks_run_as_one_dispatch() {
    // a slab over the binding limit binds two chunks per dispatch: 2 chunks → 1 dispatch,
    // 3 chunks → 2 (the last one alone), both exact for pairs on every chunk
    let gpu = gpu();
    let mut rng = Rng(0x2c4);
    let enc = Encoding::parse("int4-g64").unwrap();
    let (o, i) = (24, 128);
    let expert_bytes = (o * enc.bytes_per_row(i)) as u64;
    for (experts, want_chunks, want_dispatches) in [(2usize, 2usize, 1usize), (3, 3, 2)] {
        let mats: Vec<QMatrix> = (0..experts)
            .map(|_| quantize(enc, &rng.vec(o * i, 1.0), o, i).unwrap())
            .collect();
        let w = GpuWeights::upload_with_limit(&gpu, &mats, expert_bytes).unwrap();
        assert_eq!(w.chunks().len(), want_chunks);
        let x = rng.vec(i, 1.0);
        let pairs: Vec<u32> = (0..experts as u32)
            .rev()
            .flat_map(|e| [e, 0, NO_GAMMA, 0])
            .collect();
        let xb = gpu.storage_init("x", bytemuck::cast_slice(&x));
        let pb = gpu.storage_init("pairs", bytemuck::cast_slice(&pairs));
        let yb = gpu.storage_init("y", bytemuck::cast_slice(&vec![f32::NAN; experts * o]));
        let n = experts as u32;
        let call = w.bind(&gpu, 4, GemvArgs::new(&xb, 1, &pb, n, &yb)).unwrap();
        assert_eq!(call.dispatches(), want_dispatches);
        let mut e = gpu.device.create_command_encoder(&Default::default());
        call.record(&mut e);
        gpu.queue.submit([e.finish()]);
        let y = gpu.read_f32(&yb, experts * o).unwrap();
        for p in 0..experts {
            let m = &mats[experts - 1 - p];
            assert!(rel_err(&y[p * o..(p + 1) * o], &m.gemv_ref_f64(&x)) <= 1e-5);
        }
    }
}
