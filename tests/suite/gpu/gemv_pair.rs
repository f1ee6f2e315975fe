//! Two GEMVs in one dispatch (`gemv_pair::bind_pair`) against the f64 CPU reference on the same
//! bytes and against each GEMV alone: every kernel format in either half beside another, odd
//! shapes, gammas on one half, the silu·up epilogue, x per pair, two-chunk slabs, both reductions,
//! poisoned outputs with guards; and the calls it leaves apart (the GEMM, dependent halves). Runs
//! on lavapipe in CI.

use crate::gpu::gemv_parity::{reductions, rel_err};
use crate::ops_util::{gpu, poisoned, read, run, Rng};
use inkling_wgpu::formats::{quantize, Encoding, QMatrix};
use inkling_wgpu::gpu::linear::args::{GemvArgs, Reduction, NO_GAMMA};
use inkling_wgpu::gpu::linear::format::kernel_encodings;
use inkling_wgpu::gpu::linear::gemv_pair::{bind_pair, Half};
use inkling_wgpu::gpu::linear::route::LinearOptions;
use inkling_wgpu::gpu::linear::slab::GpuWeights;
use inkling_wgpu::gpu::Gpu;

/// Guard floats after each output: still NaN after the call.
const GUARD: usize = 5;

/// One half's problem: experts of `[o, i]` in `enc`, `tokens` x rows, its pairs `(e, t, gamma
/// index)`, gammas or not, the silu·up epilogue or not.
struct Side {
    mats: Vec<QMatrix<'static>>,
    w: GpuWeights,
    x: Vec<f32>,
    pairs: Vec<(u32, u32, u32)>,
    gammas: Option<Vec<f32>>,
    silu: bool,
    /// x row p for pair p (the down projections' layout), not x row `token(p)`.
    x_per_pair: bool,
}

impl Side {
    fn new(gpu: &Gpu, rng: &mut Rng, enc: Encoding, shape: (usize, usize), silu: bool) -> Side {
        let (o, i) = shape;
        let mats: Vec<QMatrix<'static>> = (0..3)
            .map(|_| quantize(enc, &rng.vec(o * i, 1.0), o, i).unwrap())
            .collect();
        let w = GpuWeights::upload(gpu, &mats).unwrap();
        let x = rng.vec(2 * i, 2.0);
        // gammas only without the epilogue (it takes none)
        let gammas = (!silu).then(|| rng.vec(4, 1.5));
        let g = |k: u32| if silu { NO_GAMMA } else { k };
        let pairs = vec![(2, 1, g(0)), (0, 0, g(3)), (1, 1, NO_GAMMA), (2, 0, g(1))];
        Side {
            mats,
            w,
            x,
            pairs,
            gammas,
            silu,
            x_per_pair: false,
        }
    }

    /// The same side reading x row p for pair p (one x row per pair, fresh values).
    fn per_pair(mut self, rng: &mut Rng) -> Side {
        self.x = rng.vec(self.pairs.len() * self.mats[0].cols, 2.0);
        self.x_per_pair = true;
        self
    }

    /// The same side with its slab uploaded as two chunks (two experts, then one): its one
    /// dispatch binds both.
    fn two_chunks(mut self, gpu: &Gpu) -> Side {
        let stride = self.w.expert_bytes();
        self.w = GpuWeights::upload_with_limit(gpu, &self.mats, 2 * stride).unwrap();
        assert_eq!(self.w.chunks().len(), 2);
        self
    }

    /// Outputs per pair.
    fn width(&self) -> usize {
        self.mats[0].rows / if self.silu { 2 } else { 1 }
    }

    /// The f64 reference of pair p.
    fn reference(&self, p: usize) -> Vec<f64> {
        let (e, t, wi) = self.pairs[p];
        let i = self.mats[0].cols;
        let row = if self.x_per_pair { p } else { t as usize };
        let xt = &self.x[row * i..(row + 1) * i];
        let r = self.mats[e as usize].gemv_ref_f64(xt);
        if self.silu {
            let n = r.len() / 2;
            return (0..n)
                .map(|k| r[k] / (1.0 + (-r[k]).exp()) * r[n + k])
                .collect();
        }
        let g = match (&self.gammas, wi) {
            (Some(gs), wi) if wi != NO_GAMMA => gs[wi as usize] as f64,
            _ => 1.0,
        };
        r.iter().map(|v| v * g).collect()
    }
}

/// The device buffers of one side.
struct Bufs {
    x: wgpu::Buffer,
    pairs: wgpu::Buffer,
    gammas: Option<wgpu::Buffer>,
    y: wgpu::Buffer,
}

impl Bufs {
    fn new(gpu: &Gpu, s: &Side) -> Bufs {
        let pb: Vec<u32> = s.pairs.iter().flat_map(|&(e, t, g)| [e, t, g, 0]).collect();
        Bufs {
            x: gpu.storage_init("x", bytemuck::cast_slice(&s.x)),
            pairs: gpu.storage_init("pairs", bytemuck::cast_slice(&pb)),
            gammas: s
                .gammas
                .as_ref()
                .map(|g| gpu.storage_init("gammas", bytemuck::cast_slice(g))),
            y: poisoned(gpu, s.pairs.len() * s.width() + GUARD),
        }
    }

    fn args<'a>(&'a self, s: &Side, red: Reduction) -> GemvArgs<'a> {
        let tokens = (s.x.len() / s.mats[0].cols) as u32;
        let a = GemvArgs::new(&self.x, tokens, &self.pairs, s.pairs.len() as u32, &self.y)
            .silu_mul(s.silu)
            .x_per_pair(s.x_per_pair)
            .reduction(red);
        match &self.gammas {
            Some(g) => a.gamma(g),
            None => a,
        }
    }
}

/// Both sides in one dispatch: each equals f64 within 1e-5 and its GEMV alone within 1e-6, and
/// nothing past either output is written.
fn check_pair(gpu: &Gpu, a: &Side, b: &Side, red: Reduction, what: &str) {
    let opts = LinearOptions::default();
    let (ba, bb) = (Bufs::new(gpu, a), Bufs::new(gpu, b));
    let pair = bind_pair(
        gpu,
        half(a, ba.args(a, red), &opts),
        half(b, bb.args(b, red), &opts),
    );
    let call = pair
        .unwrap()
        .unwrap_or_else(|| panic!("{what}: the pair does not fit this device"));
    assert_eq!(call.dispatches(), 1, "{what}");
    run(gpu, &call);
    for (side, bufs, name) in [(a, &ba, "a"), (b, &bb, "b")] {
        let n = side.width();
        let np = side.pairs.len();
        let got = read(gpu, &bufs.y, np * n + GUARD);
        // the same GEMV alone
        let alone_bufs = Bufs::new(gpu, side);
        let ord = side.w.encoding().format.ordinal();
        let alone = side.w.bind(gpu, ord, alone_bufs.args(side, red)).unwrap();
        run(gpu, &alone);
        let sep = read(gpu, &alone_bufs.y, np * n);
        for p in 0..np {
            let y = &got[p * n..(p + 1) * n];
            assert!(
                y.iter().all(|v| v.is_finite()),
                "{what} half {name} pair {p}: NaN left (poison)"
            );
            let err = rel_err(y, &side.reference(p));
            assert!(err <= 1e-5, "{what} half {name} pair {p}: rel err {err:e}");
            let worst = y
                .iter()
                .zip(&sep[p * n..(p + 1) * n])
                .map(|(u, v)| ((u - v).abs() / v.abs().max(1e-30)) as f64)
                .fold(0.0, f64::max);
            assert!(
                worst <= 1e-6,
                "{what} half {name} pair {p}: pair vs alone differ by {worst:e}"
            );
        }
        assert!(
            got[np * n..].iter().all(|v| v.is_nan()),
            "{what} half {name}: written past its output"
        );
    }
}

/// Side `s` as a half of a pair with `args`.
fn half<'a>(s: &'a Side, args: GemvArgs<'a>, opts: &'a LinearOptions) -> Half<'a> {
    Half {
        w: &s.w,
        ordinal: s.w.encoding().format.ordinal(),
        args,
        opts,
    }
}

/// Every kernel format in half b beside each of f32, bf16, int4-g64 and int3-g64 in half a (the
/// decode's router and shared down are bf16, the routed gate_up any format), the epilogue on
/// either half, odd rows and columns, both reductions.
#[test]
fn a_pair_equals_f64_and_each_gemv_alone() {
    let gpu = gpu();
    let mut rng = Rng(0x9a12);
    let firsts = ["f32", "bf16", "int4-g64", "int3-g64"].map(|s| Encoding::parse(s).unwrap());
    for (k, eb) in kernel_encodings().into_iter().enumerate() {
        for (j, &ea) in firsts.iter().enumerate() {
            let silu_b = (k + j) % 2 == 0;
            // the epilogue needs an even row count
            let silu_a = !silu_b && j == 1;
            let a = Side::new(&gpu, &mut rng, ea, (37 + silu_a as usize, 192), silu_a);
            let b = Side::new(&gpu, &mut rng, eb, (2 * 65, 320), silu_b);
            for red in reductions(&gpu) {
                let what = format!(
                    "a {} [{}x192]{} | b {} [130x320]{} {red:?}",
                    ea.spelling(),
                    a.mats[0].rows,
                    if a.silu { " silu" } else { "" },
                    eb.spelling(),
                    if b.silu { " silu" } else { "" },
                );
                check_pair(&gpu, &a, &b, red, &what);
            }
        }
    }
}

/// A call that runs as the GEMM (16 tokens of a dense matrix) is never paired: `None`, and the
/// caller records the two calls.
#[test]
fn a_gemm_call_is_left_apart() {
    let gpu = gpu();
    let mut rng = Rng(0x9a13);
    let enc = Encoding::parse("int4-g64").unwrap();
    let m = quantize(enc, &rng.vec(64 * 128, 1.0), 64, 128).unwrap();
    let w = GpuWeights::upload(&gpu, std::slice::from_ref(&m)).unwrap();
    let tokens = 16u32;
    let x = gpu.storage_init("x", bytemuck::cast_slice(&rng.vec(16 * 128, 1.0)));
    let pb: Vec<u32> = (0..tokens).flat_map(|t| [0, t, NO_GAMMA, 0]).collect();
    let pairs = gpu.storage_init("pairs", bytemuck::cast_slice(&pb));
    let (y1, y2) = (poisoned(&gpu, 16 * 64), poisoned(&gpu, 16 * 64));
    let opts = LinearOptions::default();
    let ord = enc.format.ordinal();
    let half = |y| Half {
        w: &w,
        ordinal: ord,
        args: GemvArgs::new(&x, tokens, &pairs, tokens, y),
        opts: &opts,
    };
    assert!(bind_pair(&gpu, half(&y1), half(&y2)).unwrap().is_none());
    // one token each: the GEMV, paired
    let one = |y| Half {
        args: GemvArgs::new(&x, 1, &pairs, 1, y),
        ..half(y)
    };
    assert!(bind_pair(&gpu, one(&y1), one(&y2)).unwrap().is_some());
}

/// The decode's second pair in both of its forms: a bf16 down projection with x per pair (the
/// shared experts' activations) beside a gate_up with the silu·up epilogue, and beside a down
/// projection with x per pair (the routed experts' activations); then halves whose slabs are two
/// chunks each, in every kernel format.
#[test]
fn x_per_pair_and_two_chunk_halves() {
    let gpu = gpu();
    let mut rng = Rng(0x9a14);
    let bf16 = Encoding::BF16;
    for eb in kernel_encodings() {
        let a = Side::new(&gpu, &mut rng, bf16, (41, 96), false).per_pair(&mut rng);
        let b = Side::new(&gpu, &mut rng, eb, (2 * 33, 160), true);
        let what = format!("a bf16 x per pair | b {} silu", eb.spelling());
        check_pair(&gpu, &a, &b, Reduction::Auto, &what);
        let a = Side::new(&gpu, &mut rng, bf16, (43, 96), false).per_pair(&mut rng);
        let b = Side::new(&gpu, &mut rng, eb, (35, 192), false).per_pair(&mut rng);
        let what = format!("a bf16 x per pair | b {} x per pair", eb.spelling());
        check_pair(&gpu, &a, &b, Reduction::Auto, &what);
        let a = Side::new(&gpu, &mut rng, eb, (29, 128), false)
            .per_pair(&mut rng)
            .two_chunks(&gpu);
        let b = Side::new(&gpu, &mut rng, bf16, (2 * 19, 72), true).two_chunks(&gpu);
        let what = format!(
            "a {} two chunks, x per pair | b bf16 two chunks silu",
            eb.spelling()
        );
        check_pair(&gpu, &a, &b, Reduction::Auto, &what);
    }
}

/// Halves that are not independent are left apart (`None`: the caller's two calls in order are
/// what it means): b reads a's output, b writes a's x, both write one output. Independent halves
/// that share their x (the router beside the shared gate_up) are paired.
#[test]
fn dependent_halves_are_left_apart() {
    let gpu = gpu();
    let mut rng = Rng(0x9a15);
    let enc = Encoding::parse("int4-g64").unwrap();
    let s = Side::new(&gpu, &mut rng, enc, (64, 64), false);
    let (ba, bb) = (Bufs::new(&gpu, &s), Bufs::new(&gpu, &s));
    let opts = LinearOptions::default();
    let red = Reduction::Auto;
    let pair = |a: GemvArgs<'_>, b: GemvArgs<'_>| {
        bind_pair(&gpu, half(&s, a, &opts), half(&s, b, &opts))
            .unwrap()
            .is_some()
    };
    fn with_x<'a>(bufs: &'a Bufs, x: &'a wgpu::Buffer) -> GemvArgs<'a> {
        GemvArgs::new(x, 2, &bufs.pairs, 4, &bufs.y).gamma(bufs.gammas.as_ref().unwrap())
    }
    // y of a is as large as 4 x rows of 64: bind it as b's x
    assert!(
        !pair(ba.args(&s, red), with_x(&bb, &ba.y)),
        "b reads a's output"
    );
    assert!(
        !pair(with_x(&ba, &bb.y), bb.args(&s, red)),
        "a reads b's output"
    );
    let same_y = GemvArgs::new(&bb.x, 2, &bb.pairs, 4, &ba.y);
    assert!(!pair(ba.args(&s, red), same_y), "both write one output");
    assert!(
        pair(ba.args(&s, red), with_x(&bb, &ba.x)),
        "a shared x is read only"
    );
    assert!(pair(ba.args(&s, red), bb.args(&s, red)));
}
