//! The GEMV's short-conv epilogue (`GemvArgs::conv`: o_proj with the attention's residual short
//! conv in one dispatch) against the f64 CPU reference on the same bytes and against its separate
//! kernels (the plain GEMV into `o`, then the short conv of `wgsl/conv.wgsl`): every kernel format,
//! odd channel counts, kernel sizes 2 to 4, one token in a named slot and a decode batch of tokens
//! in distinct slots, both reductions, the residual and every slot's state compared; and the calls
//! it refuses. Runs on lavapipe in CI.

use crate::gpu::gemv_parity::{reductions, rel_err};
use crate::ops_util::{buf_f32, buf_u32, gpu, read, run, Rng};
use inkling_wgpu::formats::{quantize, Encoding, QMatrix};
use inkling_wgpu::gpu::linear::args::{ConvEpilogue, GemvArgs, Reduction, NO_GAMMA};
use inkling_wgpu::gpu::linear::format::kernel_encodings;
use inkling_wgpu::gpu::linear::route::LinearOptions;
use inkling_wgpu::gpu::linear::slab::GpuWeights;
use inkling_wgpu::gpu::ops::{PosBuffer, ShortConvKernel, SlotOf};
use inkling_wgpu::gpu::Gpu;

/// Sequence slots of the state.
const SLOTS: usize = 3;

/// One problem: `[c, i]` weights, the conv weights `[c, k]`, states `[SLOTS, k−1, c]`, the
/// residual `[tokens, c]`, x `[tokens, i]` and each token's slot.
struct Case {
    m: QMatrix<'static>,
    k: usize,
    cw: Vec<f32>,
    state: Vec<f32>,
    h: Vec<f32>,
    x: Vec<f32>,
    slots: Vec<u32>,
}

impl Case {
    /// `h` and the states after the epilogue, in f64: per token t (slot s), o = W x_t, then for
    /// channel c `h[t, c] += o_c + Σ_{q<k−1} w[c, q] · state[s, q, c] + w[c, k−1] · o_c`, and the
    /// slot's window moves on by one.
    fn reference(&self) -> (Vec<f64>, Vec<f64>) {
        let (c, i, k) = (self.m.rows, self.m.cols, self.k);
        let mut h: Vec<f64> = self.h.iter().map(|&v| v as f64).collect();
        let mut st: Vec<f64> = self.state.iter().map(|&v| v as f64).collect();
        for (t, &slot) in self.slots.iter().enumerate() {
            let o = self.m.gemv_ref_f64(&self.x[t * i..(t + 1) * i]);
            let sb = slot as usize * (k - 1) * c;
            for ch in 0..c {
                let mut s = 0.0;
                for q in 0..k - 1 {
                    s += self.cw[ch * k + q] as f64 * st[sb + q * c + ch];
                }
                s += self.cw[ch * k + k - 1] as f64 * o[ch];
                h[t * c + ch] += o[ch] + s;
                for q in 0..k - 1 {
                    st[sb + q * c + ch] = if q + 1 < k - 1 {
                        st[sb + (q + 1) * c + ch]
                    } else {
                        o[ch]
                    };
                }
            }
        }
        (h, st)
    }
}

/// The fused call and the separate kernels on fresh copies of the case's buffers: both equal
/// the f64 reference (‖·‖ relative ≤ 1e-5 for h, the states and each slot) and each other within
/// 1e-6.
fn check(gpu: &Gpu, case: &Case, red: Reduction, what: &str) {
    let c = case.m.rows;
    let tokens = case.slots.len();
    let w = GpuWeights::upload(gpu, std::slice::from_ref(&case.m)).unwrap();
    let ord = w.encoding().format.ordinal();
    let pb: Vec<u32> = (0..tokens as u32)
        .flat_map(|t| [0, t, NO_GAMMA, 0])
        .collect();
    let pairs = buf_u32(gpu, &pb);
    let x = buf_f32(gpu, &case.x);
    let cw = buf_f32(gpu, &case.cw);
    let batch = tokens > 1;
    let seq: Vec<u32> = case.slots.iter().flat_map(|&s| [7, s, 0, 0]).collect();
    let seq = buf_u32(gpu, &seq);
    let pos = PosBuffer::new(gpu, 7);
    pos.set(&gpu.queue, 7, case.slots[0]);
    let (slots, per_token, at) = if batch {
        (&seq, true, SlotOf::Batch(&seq))
    } else {
        (&pos.buffer, false, SlotOf::Pos(&pos))
    };
    let (want_h, want_st) = case.reference();
    // fused
    let h1 = buf_f32(gpu, &case.h);
    let st1 = buf_f32(gpu, &case.state);
    let conv = ConvEpilogue {
        w: &cw,
        state: &st1,
        slots,
        per_token,
        kernel: case.k as u32,
    };
    let args = GemvArgs::new(&x, tokens as u32, &pairs, tokens as u32, &h1)
        .reduction(red)
        .conv(conv);
    assert!(w.conv_fits(gpu, &args, &LinearOptions::default()), "{what}");
    let call = w.bind(gpu, ord, args).unwrap();
    assert_eq!(call.dispatches(), 1, "{what}");
    run(gpu, &call);
    // separate: the GEMV into o, then the conv
    let h2 = buf_f32(gpu, &case.h);
    let st2 = buf_f32(gpu, &case.state);
    let o = buf_f32(gpu, &vec![f32::NAN; tokens * c]);
    let plain = GemvArgs::new(&x, tokens as u32, &pairs, tokens as u32, &o).reduction(red);
    run(gpu, &w.bind(gpu, ord, plain).unwrap());
    let sc = ShortConvKernel {
        tokens: tokens as u32,
        channels: c as u32,
        kernel: case.k as u32,
        accumulate: true,
    }
    .bind_at(gpu, at, &o, &cw, &st2, &h2)
    .unwrap();
    run(gpu, &sc);
    let n_st = case.state.len();
    let (fh, fs) = (read(gpu, &h1, tokens * c), read(gpu, &st1, n_st));
    let (sh, ss) = (read(gpu, &h2, tokens * c), read(gpu, &st2, n_st));
    for (name, got, sep, want) in [("h", &fh, &sh, &want_h), ("state", &fs, &ss, &want_st)] {
        let err = rel_err(got, want);
        assert!(err <= 1e-5, "{what} {name}: rel err {err:e} against f64");
        let worst = got
            .iter()
            .zip(sep.iter())
            .map(|(a, b)| ((a - b).abs() / b.abs().max(1e-30)) as f64)
            .fold(0.0, f64::max);
        assert!(
            worst <= 1e-6,
            "{what} {name}: fused vs separate differ by {worst:e}"
        );
    }
    // the slot no token ran is untouched
    let blk = (case.k - 1) * c;
    for s in (0..SLOTS).filter(|s| !case.slots.contains(&(*s as u32))) {
        assert_eq!(
            &fs[s * blk..(s + 1) * blk],
            &case.state[s * blk..(s + 1) * blk],
            "{what}: slot {s} changed"
        );
    }
}

fn case(rng: &mut Rng, enc: Encoding, c: usize, i: usize, k: usize, slots: &[u32]) -> Case {
    let t = slots.len();
    Case {
        m: quantize(enc, &rng.vec(c * i, 1.0), c, i).unwrap(),
        k,
        cw: rng.vec(c * k, 1.0),
        state: rng.vec(SLOTS * (k - 1) * c, 1.0),
        h: rng.vec(t * c, 1.0),
        x: rng.vec(t * i, 1.0),
        slots: slots.to_vec(),
    }
}

/// Every kernel format, odd channel counts, kernel sizes 2-4, one token in slot 2 and a batch of
/// two tokens in slots 1 and 0 (slot 2 untouched), both reductions.
#[test]
fn conv_epilogue_equals_f64_and_the_separate_kernels() {
    let gpu = gpu();
    let mut rng = Rng(0xc0a7);
    for enc in kernel_encodings() {
        for (c, i, k) in [(37usize, 192usize, 4usize), (130, 320, 2), (64, 128, 3)] {
            for slots in [&[2u32][..], &[1, 0]] {
                let cs = case(&mut rng, enc, c, i, k, slots);
                for red in reductions(&gpu) {
                    let what =
                        format!("{} [{c}x{i}] K={k} slots {slots:?} {red:?}", enc.spelling());
                    check(&gpu, &cs, red, &what);
                }
            }
        }
    }
}

/// What the epilogue refuses, each naming it: several experts, gammas, several tokens
/// without per-token slots, a kernel size past 8, a short state buffer; and `conv_fits` is false
/// for a call that runs as the GEMM.
#[test]
fn conv_epilogue_refusals() {
    let gpu = gpu();
    let mut rng = Rng(0xc0a8);
    let enc = Encoding::parse("bf16").unwrap();
    let (c, i) = (64usize, 128usize);
    let mats: Vec<QMatrix> = (0..2)
        .map(|_| quantize(enc, &rng.vec(c * i, 1.0), c, i).unwrap())
        .collect();
    let one = GpuWeights::upload(&gpu, &mats[..1]).unwrap();
    let two = GpuWeights::upload(&gpu, &mats).unwrap();
    let x = buf_f32(&gpu, &rng.vec(16 * i, 1.0));
    let pb: Vec<u32> = (0..16).flat_map(|t| [0, t, NO_GAMMA, 0]).collect();
    let pairs = buf_u32(&gpu, &pb);
    let h = buf_f32(&gpu, &vec![0.0; 16 * c]);
    let cw = buf_f32(&gpu, &vec![0.0; c * 4]);
    let st = buf_f32(&gpu, &vec![0.0; 3 * c]);
    let short = buf_f32(&gpu, &vec![0.0; c]);
    let seq = buf_u32(&gpu, &[0u32; 64]);
    let gamma = buf_f32(&gpu, &[1.0; 16]);
    let conv = ConvEpilogue {
        w: &cw,
        state: &st,
        slots: &seq,
        per_token: false,
        kernel: 4,
    };
    let ord = enc.format.ordinal();
    let base = |t: u32| GemvArgs::new(&x, t, &pairs, t, &h);
    let cases: Vec<(&GpuWeights, GemvArgs, &str)> = vec![
        (&two, base(1).conv(conv), "dense GEMV"),
        (&one, base(1).gamma(&gamma).conv(conv), "gamma"),
        (&one, base(2).conv(conv), "one token per slot"),
        (
            &one,
            base(1).conv(ConvEpilogue { kernel: 9, ..conv }),
            "kernel size 9",
        ),
        (
            &one,
            base(1).conv(ConvEpilogue {
                state: &short,
                ..conv
            }),
            "state buffer",
        ),
    ];
    for (w, args, want) in cases {
        let Err(err) = w.bind(&gpu, ord, args) else {
            panic!("{want}: bound");
        };
        let err = err.to_string();
        assert!(
            err.contains("short-conv epilogue") && err.contains(want),
            "{want}: {err}"
        );
    }
    // 16 tokens in their own slots: the plain call would run as the GEMM, so no epilogue
    let batch = ConvEpilogue {
        per_token: true,
        ..conv
    };
    assert!(!one.conv_fits(&gpu, &base(16).conv(batch), &LinearOptions::default()));
    assert!(one.conv_fits(&gpu, &base(1).conv(conv), &LinearOptions::default()));
}
