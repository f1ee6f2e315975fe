//! GEMV output segments (`GemvArgs::segments`: rows of each expert written to up to four packed
//! matrices, the joint q/k/v/r projection) against the f64 CPU reference on the same bytes, every
//! output poisoned, and the column split of prompt chunks. Runs on lavapipe in CI.

use crate::gpu::gemv_parity::rel_err;
use crate::ops_util::{gpu, Rng};
use inkling_wgpu::formats::{quantize, Encoding, QMatrix};
use inkling_wgpu::gpu::dispatch::DispatchError;
use inkling_wgpu::gpu::limits::LimitProfile;
use inkling_wgpu::gpu::linear::args::{GemvArgs, Reduction, NO_GAMMA};
use inkling_wgpu::gpu::linear::format::{kernel_encodings, Tuning};
use inkling_wgpu::gpu::linear::route::candidates;
use inkling_wgpu::gpu::linear::slab::GpuWeights;
use inkling_wgpu::gpu::ops::SplitColumns;
use inkling_wgpu::gpu::{Call, Gpu};

/// Guard floats after each output matrix: still NaN after the call.
const GUARD: usize = 4;

fn run(gpu: &Gpu, call: &Call) {
    let mut e = gpu.device.create_command_encoder(&Default::default());
    call.record(&mut e);
    gpu.queue.submit([e.finish()]);
}

/// A buffer of `n` NaN floats plus the guard.
fn poisoned(gpu: &Gpu, n: usize) -> wgpu::Buffer {
    gpu.storage_init("poisoned", bytemuck::cast_slice(&vec![f32::NAN; n + GUARD]))
}

/// Check `y` (read back, `rows` floats per pair then the guard) against the reference rows.
fn check_segment(y: &[f32], refs: &[Vec<f64>], rows: std::ops::Range<usize>, what: &str) {
    let n = rows.len();
    for (p, r) in refs.iter().enumerate() {
        let got = &y[p * n..(p + 1) * n];
        assert!(
            got.iter().all(|v| v.is_finite()),
            "{what} pair {p}: NaN left (poison)"
        );
        let err = rel_err(got, &r[rows.clone()]);
        assert!(err <= 1e-5, "{what} pair {p}: rel err {err:e}");
    }
    assert!(
        y[refs.len() * n..].iter().all(|v| v.is_nan()),
        "{what}: written past its segment"
    );
}

/// One segmented GEMV of `pairs` over `mats` (uploaded as `w`), with `tuning` forced or not,
/// checked segment by segment.
#[allow(clippy::too_many_arguments)]
fn check_case(
    gpu: &Gpu,
    mats: &[QMatrix],
    w: &GpuWeights,
    x: &[f32],
    pairs: &[(u32, u32, u32)],
    gammas: &[f32],
    segs: &[u32],
    red: Reduction,
    tuning: Option<Tuning>,
) {
    let (o, i) = (mats[0].rows, mats[0].cols);
    let enc = mats[0].enc;
    let tokens = x.len() / i;
    let xb = gpu.storage_init("x", bytemuck::cast_slice(x));
    let pv: Vec<u32> = pairs.iter().flat_map(|&(e, t, g)| [e, t, g, 0]).collect();
    let pb = gpu.storage_init("pairs", bytemuck::cast_slice(&pv));
    let gb = gpu.storage_init("gammas", bytemuck::cast_slice(gammas));
    let np = pairs.len();
    let outs: Vec<wgpu::Buffer> = segs
        .iter()
        .map(|&r| poisoned(gpu, np * r as usize))
        .collect();
    let seg_args: Vec<(u32, &wgpu::Buffer)> = segs.iter().copied().zip(&outs).collect();
    let mut args = GemvArgs::new(&xb, tokens as u32, &pb, np as u32, &outs[0])
        .gamma(&gb)
        .reduction(red)
        .segments(&seg_args);
    if let Some(t) = tuning {
        args = args.tuning(t);
    }
    run(gpu, &w.bind(gpu, enc.format.ordinal(), args).unwrap());
    let refs: Vec<Vec<f64>> = pairs
        .iter()
        .map(|&(e, t, wi)| {
            let g = if wi == NO_GAMMA {
                1.0
            } else {
                gammas[wi as usize] as f64
            };
            let xt = &x[t as usize * i..(t as usize + 1) * i];
            let r = mats[e as usize].gemv_ref_f64(xt);
            r.into_iter().map(|v| v * g).collect()
        })
        .collect();
    assert_eq!(segs.iter().sum::<u32>() as usize, o);
    let mut r0 = 0;
    for (k, (&rows, b)) in segs.iter().zip(&outs).enumerate() {
        let n = rows as usize;
        let y = gpu.read_f32(b, np * n + GUARD).unwrap();
        let what = format!(
            "{} [{o},{i}] {red:?} {tuning:?} segments {segs:?}: segment {k}",
            enc.spelling()
        );
        check_segment(&y, &refs, r0..r0 + n, &what);
        r0 += n;
    }
}

/// Every kernel format, both reductions, the automatic plan and the format's largest tuning (up to
/// 64 rows per workgroup: row blocks straddle segments of odd sizes), 1 to 4 segments, two
/// experts and several tokens with and without gammas.
#[test]
fn segments_match_the_reference_in_every_format() {
    let gpu = gpu();
    let mut rng = Rng(0x5e65);
    let mut reds = vec![Reduction::Shared];
    if gpu.has_subgroups() {
        reds.push(Reduction::Subgroup);
    }
    // (cols, segment rows): 65 columns stage x; 136 (a whole number of bf16 units) reads it directly
    let shapes: [(usize, &[&[u32]]); 2] = [
        (65, &[&[37, 5, 67, 13], &[3], &[1, 1, 1]]),
        (136, &[&[9, 64, 1, 19], &[7, 26]]),
    ];
    for enc in kernel_encodings() {
        for &(i, seg_lists) in &shapes {
            for segs in seg_lists {
                let o: usize = segs.iter().map(|&r| r as usize).sum();
                let mats: Vec<QMatrix> = (0..2)
                    .map(|_| quantize(enc, &rng.vec(o * i, 1.0), o, i).unwrap())
                    .collect();
                let w = GpuWeights::upload(&gpu, &mats).unwrap();
                assert!(w.segments_fit(&gpu), "lavapipe binds 9 storage buffers");
                let tokens = 3;
                let x = rng.vec(tokens * i, 1.0);
                let pairs = [(1, 0, NO_GAMMA), (0, 2, 0), (1, 1, 1), (0, 0, NO_GAMMA)];
                // the plan (1 row per workgroup staged, 8 direct at 136 columns) and the largest
                let forced = [None, Some(candidates(enc.format)[0])];
                for red in &reds {
                    for t in forced {
                        check_case(&gpu, &mats, &w, &x, &pairs, &[0.5, -2.0], segs, *red, t);
                    }
                }
            }
        }
    }
}

/// One dense matrix at a decode shape, one token: the q/k/v/r layout of a layer.
#[test]
fn segments_at_a_projection_shape() {
    let gpu = gpu();
    let mut rng = Rng(77);
    let segs = [256, 64, 64, 96];
    let (o, i) = (480, 512);
    for enc in [Encoding::BF16, Encoding::parse("int4-g64").unwrap()] {
        let m = quantize(enc, &rng.vec(o * i, 1.0), o, i).unwrap();
        let w = GpuWeights::upload(&gpu, std::slice::from_ref(&m)).unwrap();
        let x = rng.vec(i, 1.0);
        let mats = [m];
        check_case(
            &gpu,
            &mats,
            &w,
            &x,
            &[(0, 0, NO_GAMMA)],
            &[],
            &segs,
            Reduction::Auto,
            None,
        );
    }
}

/// Bad segments are refused naming the problem; a multi-chunk slab or a device of 8 storage
/// buffers per stage has no segment variant (`segments_fit` false, `bind` refuses).
#[test]
fn segments_are_checked_and_refused_where_they_do_not_fit() {
    let gpu = gpu();
    let mut rng = Rng(5);
    let (o, i) = (12, 64);
    let enc = Encoding::F32;
    let m = quantize(enc, &rng.vec(o * i, 1.0), o, i).unwrap();
    let w = GpuWeights::upload(&gpu, std::slice::from_ref(&m)).unwrap();
    let xb = gpu.storage_init("x", bytemuck::cast_slice(&rng.vec(i, 1.0)));
    let pb = gpu.storage_init("pairs", bytemuck::cast_slice(&[0u32, 0, NO_GAMMA, 0]));
    let y = gpu.storage("y", 4 * o as u64);
    let small = gpu.storage("small", 4 * 3);
    let refuse = |w: &GpuWeights, gpu: &Gpu, segs: &[(u32, &wgpu::Buffer)], y_off: u32| {
        let mut args = GemvArgs::new(&xb, 1, &pb, 1, &y).segments(segs);
        args.y_offset = y_off;
        match w.bind(gpu, enc.format.ordinal(), args) {
            Err(DispatchError::Shape(m)) => m,
            Err(e) => panic!("{segs:?}: {e}"),
            Ok(_) => panic!(
                "{:?}: accepted",
                segs.iter().map(|s| s.0).collect::<Vec<_>>()
            ),
        }
    };
    let e = refuse(&w, &gpu, &[(5, &y), (6, &y)], 0);
    assert!(e.contains("add up to the 12 rows"), "{e}");
    let e = refuse(&w, &gpu, &[(12, &y), (0, &y)], 0);
    assert!(e.contains("non-empty"), "{e}");
    let five: Vec<(u32, &wgpu::Buffer)> = (0..5).map(|k| (if k < 4 { 2 } else { 4 }, &y)).collect();
    let e = refuse(&w, &gpu, &five, 0);
    assert!(e.contains("at most 4"), "{e}");
    let e = refuse(&w, &gpu, &[(8, &y), (4, &y)], 1);
    assert!(e.contains("must be 0"), "{e}");
    let e = refuse(&w, &gpu, &[(8, &y), (4, &small)], 0);
    assert!(e.contains("buffer 1 has 12 bytes"), "{e}");
    // a slab in two chunks: no segment variant
    let chunked = GpuWeights::upload_with_limit(&gpu, std::slice::from_ref(&m), 8 * 256).unwrap();
    assert!(chunked.chunks().len() > 1);
    assert!(!chunked.segments_fit(&gpu));
    let e = refuse(&chunked, &gpu, &[(8, &y), (4, &y)], 0);
    assert!(e.contains("one-chunk slab"), "{e}");
    // WebGPU's default limits: 8 storage buffers per stage
    let web = Gpu::with_profile(Some(LimitProfile::WebGpu)).unwrap();
    let ww = GpuWeights::upload(&web, std::slice::from_ref(&m)).unwrap();
    assert!(!ww.segments_fit(&web));
    let (xw, pw, yw) = (
        web.storage("x", 4 * i as u64),
        web.storage("pairs", 16),
        web.storage("y", 4 * o as u64),
    );
    let one = [(12, &yw)];
    let args = GemvArgs::new(&xw, 1, &pw, 1, &yw).segments(&one);
    let e = ww
        .bind(&web, enc.format.ordinal(), args)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("9 storage"), "{e}");
}

/// The column split of a prompt chunk's joint projection: an exact copy into four poisoned
/// packed matrices, a zero-width block included.
#[test]
fn split_columns_copies_each_block_exactly() {
    let gpu = gpu();
    let mut rng = Rng(31);
    for (tokens, widths) in [
        (5u32, [7u32, 3, 0, 11]),
        (1, [256, 64, 64, 96]),
        (70, [1, 2, 3, 4]),
    ] {
        let c: u32 = widths.iter().sum();
        let x = rng.vec((tokens * c) as usize, 1.0);
        let xb = gpu.storage_init("x", bytemuck::cast_slice(&x));
        let outs: Vec<wgpu::Buffer> = widths
            .iter()
            .map(|&w| poisoned(&gpu, (tokens * w) as usize))
            .collect();
        let call = SplitColumns { tokens, widths }
            .bind(&gpu, &xb, [&outs[0], &outs[1], &outs[2], &outs[3]])
            .unwrap();
        run(&gpu, &call);
        let mut s0 = 0usize;
        for (k, (&w, b)) in widths.iter().zip(&outs).enumerate() {
            let w = w as usize;
            let y = gpu.read_f32(b, tokens as usize * w + GUARD).unwrap();
            for t in 0..tokens as usize {
                let want = &x[t * c as usize + s0..t * c as usize + s0 + w];
                let got = &y[t * w..(t + 1) * w];
                assert!(
                    want.iter()
                        .zip(got)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{widths:?} block {k} token {t}"
                );
            }
            assert!(
                y[tokens as usize * w..].iter().all(|v| v.is_nan()),
                "{widths:?} block {k}"
            );
            s0 += w;
        }
    }
    let xb = gpu.storage("x", 16);
    let e = SplitColumns {
        tokens: 2,
        widths: [1, 1, 1, 1],
    }
    .bind(&gpu, &xb, [&xb, &xb, &xb, &xb])
    .err()
    .expect("refused");
    assert!(e.to_string().contains("split x"), "{e}");
}

/// The segment variant binds three more outputs (9 storage buffers) and chooses the segment only
/// in `write_y`, the final write after the reduction: no other line of the kernel reads the
/// segment ends, so the hot loop is the plain one.
#[test]
fn the_segment_choice_is_only_in_the_final_write() {
    use inkling_wgpu::gpu::kernel::KernelSpec;
    use inkling_wgpu::gpu::linear::gemv::GemvKey;
    use inkling_wgpu::gpu::linear::route::tuning;
    for enc in kernel_encodings() {
        for sg in [false, true] {
            let key = GemvKey::new(enc, sg, tuning(enc.format), 2048, false);
            let plain = KernelSpec::of(&key);
            let seg = KernelSpec::of(&key.with_segments(true));
            assert_eq!(seg.storage_buffers(), plain.storage_buffers() + 3);
            assert_eq!(seg.storage_buffers(), 9);
            assert!(seg.key.ends_with(":seg") && !plain.key.contains(":seg"));
            assert!(!plain.source.contains("Y1[") && seg.source.contains("Y3["));
            let (head, rest) = seg.source.split_once("fn write_y(").unwrap();
            let (body, after) = rest.split_once("\n}\n").unwrap();
            assert_eq!(body.matches("prm.seg_end").count(), 1);
            assert_eq!(head.matches("prm.seg_end").count(), 0);
            assert_eq!(after.matches("prm.seg_end").count(), 0);
            // its definition and the one final write of the reduction kept
            assert_eq!(seg.source.matches("write_y(").count(), 2);
            assert!(!after.contains("Y1[") && !after.contains("Y["));
        }
    }
}
