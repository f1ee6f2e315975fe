//! Per-call tuning selection (`route::plan`) and the direct-x variant: every tuning the host can
//! pick, and both x variants, against the f64 CPU reference on the same weight bytes.
//! Fresh random inputs, NaN-poisoned outputs (and NaN in the x gaps), ‖y − ref‖/‖ref‖ ≤ 1e-5.

use crate::ops_util::{gpu, rel_err, Rng};
use inkling_wgpu::formats::{quantize, Encoding, QMatrix};
use inkling_wgpu::gpu::linear::args::{GemvArgs, Reduction, NO_GAMMA};
use inkling_wgpu::gpu::linear::format::Tuning;
use inkling_wgpu::gpu::linear::route::{
    candidates, direct_aligned, direct_candidates, min_workgroups, plan, Plan, DIRECT_MAX_RPW,
    DIRECT_MIN_WORKGROUPS,
};
use inkling_wgpu::gpu::linear::slab::GpuWeights;
use inkling_wgpu::gpu::Gpu;

const TOL: f64 = 1e-5;

/// Weights in [-0.75, 1.25) and x (see `run_and_check`) in [-0.5, 1): mixed signs, but a row's sum
/// (mean 0.0625 · I, spread ≈ 0.3 · √I) stays far from 0, so ‖y − ref‖/‖ref‖ measures the kernel
/// and not the cancellation of a one- or three-row output (U(-1, 1) data put a single 4096-term
/// dot product at 0.118 where its terms sum to ~1000 in magnitude: f32 rounding alone then gave
/// 3.5e-5).
fn weights(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.f() + 0.25).collect()
}

fn reductions(gpu: &Gpu) -> Vec<Reduction> {
    let mut v = vec![Reduction::Shared];
    if gpu.has_subgroups() {
        v.push(Reduction::Subgroup);
    }
    v
}

/// x layout of one run: `tokens` rows of `cols` values at `stride` f32 from `offset`; everything
/// else in the buffer is NaN (a read outside the rows poisons the result).
struct XLayout {
    tokens: usize,
    stride: usize,
    offset: usize,
}

/// One call on fresh inputs: pairs `(token, weighted)` over expert 0 of `m`; checks every pair
/// against the reference and returns the plans of the call's dispatches.
#[allow(clippy::too_many_arguments)]
fn run_and_check(
    gpu: &Gpu,
    m: &QMatrix,
    w: &GpuWeights,
    rng: &mut Rng,
    xl: &XLayout,
    pairs: &[(u32, bool)],
    red: Reduction,
    forced: Option<Tuning>,
) -> Vec<Plan> {
    let (o, i) = (m.rows, m.cols);
    let rows: Vec<Vec<f32>> = (0..xl.tokens)
        .map(|_| (0..i).map(|_| 0.75 * rng.f() + 0.25).collect())
        .collect();
    let mut x = vec![f32::NAN; xl.offset + xl.tokens * xl.stride.max(i) + 3];
    for (t, r) in rows.iter().enumerate() {
        x[xl.offset + t * xl.stride..][..i].copy_from_slice(r);
    }
    let gamma = [rng.f() * 2.0];
    let flat: Vec<u32> = pairs
        .iter()
        .flat_map(|&(t, g)| [0, t, if g { 0 } else { NO_GAMMA }, 0])
        .collect();
    let xb = gpu.storage_init("x", bytemuck::cast_slice(&x));
    let pb = gpu.storage_init("pairs", bytemuck::cast_slice(&flat));
    let gb = gpu.storage_init("gamma", bytemuck::cast_slice(&gamma));
    let yb = gpu.storage_init("y", bytemuck::cast_slice(&vec![f32::NAN; pairs.len() * o]));
    let mut args = GemvArgs::new(&xb, xl.tokens as u32, &pb, pairs.len() as u32, &yb)
        .gamma(&gb)
        .reduction(red);
    args.x_stride = xl.stride as u32;
    args.x_offset = xl.offset as u32;
    if let Some(t) = forced {
        args = args.tuning(t);
    }
    let call = w.bind(gpu, m.enc.format.ordinal(), args).unwrap();
    let mut e = gpu.device.create_command_encoder(&Default::default());
    call.record(&mut e);
    gpu.queue.submit([e.finish()]);
    let y = gpu.read_f32(&yb, pairs.len() * o).unwrap();
    let refs: Vec<Vec<f64>> = rows.iter().map(|r| m.gemv_ref_f64(r)).collect();
    let plans = w.plans(&args, &Default::default());
    for (p, &(t, g)) in pairs.iter().enumerate() {
        let f = if g { gamma[0] as f64 } else { 1.0 };
        let r: Vec<f64> = refs[t as usize].iter().map(|v| v * f).collect();
        let err = rel_err(&y[p * o..(p + 1) * o], &r);
        assert!(
            err <= TOL,
            "{} [{o}x{i}] {red:?} {plans:?} pair {p} of {}: rel err {err:e}",
            m.enc.spelling(),
            pairs.len()
        );
    }
    plans
}

/// `n` pairs over tokens 0 and 1 alternately, every third one weighted.
fn pairs(n: usize) -> Vec<(u32, bool)> {
    (0..n).map(|p| ((p % 2) as u32, p % 3 == 1)).collect()
}

fn packed(tokens: usize, cols: usize) -> XLayout {
    XLayout {
        tokens,
        stride: cols,
        offset: 0,
    }
}

/// (a) small-row shapes with I = 4096 that select each candidate tuning: direct x for f32/bf16
/// (DIRECT_MIN_WORKGROUPS = 1024: rows per workgroup 8, 4, 2, 1), staged for int4 (128 rows per
/// workgroup from 384 workgroups, 64 from 96, 16, 4, 2 from 256, else 1) and int3-g64 (64 and 16
/// from 96, 4, 2 from 256, else 1).
#[test]
fn each_candidate_tuning_selected_and_exact() {
    let gpu = gpu();
    let mut rng = Rng(0x7a11);
    let i = 4096;
    // (rows, pairs, rows per workgroup expected: direct f32/bf16, staged int4, staged int3-g64)
    let table: &[(usize, usize, [u32; 3])] = &[
        (4096, 12, [8, 128, 64]),
        (4096, 2, [8, 64, 64]),
        (4096, 1, [4, 16, 16]),
        (1024, 2, [2, 4, 16]),
        (1024, 1, [1, 4, 4]),
        (256, 2, [1, 2, 2]),
        (256, 1, [1, 1, 1]),
        (3, 1, [1, 1, 1]),
        (1, 2, [1, 1, 1]),
    ];
    for spelling in ["f32", "bf16", "int4", "int4-g64", "int3-g64"] {
        let enc = Encoding::parse(spelling).unwrap();
        let direct = matches!(spelling, "f32" | "bf16");
        let col = match spelling {
            "f32" | "bf16" => 0,
            "int3-g64" => 2,
            _ => 1,
        };
        let mut seen = Vec::new();
        let mut o_prev = 0;
        let mut mw: Option<(QMatrix, GpuWeights)> = None;
        for &(o, n, rpw) in table {
            if o != o_prev {
                let m = quantize(enc, &weights(&mut rng, o * i), o, i).unwrap();
                let w = GpuWeights::upload(&gpu, std::slice::from_ref(&m)).unwrap();
                mw = Some((m, w));
                o_prev = o;
            }
            let (m, w) = mw.as_ref().unwrap();
            for red in reductions(&gpu) {
                let plans =
                    run_and_check(&gpu, m, w, &mut rng, &packed(2, i), &pairs(n), red, None);
                assert_eq!(plans.len(), 1);
                let p = plans[0];
                assert_eq!(
                    p.tuning.rows_per_workgroup(),
                    rpw[col],
                    "{spelling} [{o}x{i}] × {n} pairs: {p:?}"
                );
                assert_eq!(p, plan(enc, n as u32, o as u32, i as u32, 0, 0));
                assert_eq!(p.direct, direct, "{spelling} {p:?}");
                seen.push(p.tuning);
            }
        }
        // every candidate of the format's variant was exercised
        let list = if direct {
            direct_candidates()
        } else {
            candidates(enc.format)
        };
        for t in list {
            assert!(seen.contains(t), "{spelling}: {t:?} never selected");
        }
    }
}

/// Every candidate tuning forced on odd shapes (partial row blocks, tail units), both x variants
/// where the rules allow, both reductions.
#[test]
fn every_candidate_tuning_on_odd_shapes() {
    let gpu = gpu();
    let mut rng = Rng(0x0dd5);
    for spelling in ["f32", "bf16", "int4", "int4-g32", "int3-g64"] {
        let enc = Encoding::parse(spelling).unwrap();
        for &(o, i) in &[(67usize, 200usize), (5, 129), (130, 64)] {
            let m = quantize(enc, &weights(&mut rng, o * i), o, i).unwrap();
            let w = GpuWeights::upload(&gpu, std::slice::from_ref(&m)).unwrap();
            let direct: &[Tuning] = if matches!(spelling, "f32" | "bf16") {
                direct_candidates()
            } else {
                &[]
            };
            for &t in candidates(enc.format).iter().chain(direct) {
                for red in reductions(&gpu) {
                    let plans = run_and_check(
                        &gpu,
                        &m,
                        &w,
                        &mut rng,
                        &packed(2, i),
                        &pairs(3),
                        red,
                        Some(t),
                    );
                    assert_eq!(plans[0].tuning, t);
                }
            }
        }
    }
}

/// (b) direct x chosen when the alignment rules hold, refused (staged, still exact) otherwise.
#[test]
fn direct_x_chosen_and_refused() {
    let gpu = gpu();
    let mut rng = Rng(0xd12ec7);
    let o = 256; // one pair: the smallest tuning of each variant
                 // (format, I, x stride (0 = packed), x offset, direct expected)
    let cases: &[(&str, usize, usize, usize, bool)] = &[
        ("bf16", 4096, 0, 0, true),
        ("bf16", 4095, 0, 0, false),    // not whole 8-column units
        ("bf16", 4092, 0, 0, false),    // a multiple of 4, not of 8: the second x vec4
        ("bf16", 4096, 0, 3, false),    // x offset not on a vec4
        ("bf16", 4096, 0, 4, true),     // x offset on a vec4
        ("bf16", 4096, 4098, 0, false), // x stride not on a vec4
        ("bf16", 4096, 4100, 8, true),
        ("f32", 4092, 0, 0, true),
        ("f32", 4094, 0, 0, false),
        ("f32", 4096, 4101, 0, false),
        ("f32", 4096, 4104, 12, true),
        ("f32", 4096, 0, 2, false),
        ("int4", 4096, 0, 0, false), // int4/int3 always stage x (pre-scaled)
        ("int4-g64", 4096, 0, 0, false),
        ("int3-g64", 4096, 0, 0, false),
    ];
    for &(spelling, i, stride, offset, want) in cases {
        let enc = Encoding::parse(spelling).unwrap();
        let p = plan(enc, 1, o as u32, i as u32, stride as u32, offset as u32);
        // f32/bf16 (either variant) reach one row per workgroup; int4/int3 stop at their last
        // candidate
        let smallest = match spelling {
            "f32" | "bf16" => 1,
            _ => candidates(enc.format).last().unwrap().rows_per_workgroup(),
        };
        assert_eq!(p.tuning.rows_per_workgroup(), smallest, "{spelling}");
        assert_eq!(
            p.direct, want,
            "{spelling} I={i} stride {stride} offset {offset}"
        );
        let m = quantize(enc, &weights(&mut rng, o * i), o, i).unwrap();
        let w = GpuWeights::upload(&gpu, std::slice::from_ref(&m)).unwrap();
        let xl = XLayout {
            tokens: 2,
            stride: if stride == 0 { i } else { stride },
            offset,
        };
        for red in reductions(&gpu) {
            // pairs on token 1 read x through the stride
            let plans = run_and_check(&gpu, &m, &w, &mut rng, &xl, &pairs(1), red, None);
            assert_eq!(plans, vec![p]);
            let plans = run_and_check(
                &gpu,
                &m,
                &w,
                &mut rng,
                &xl,
                &[(1, true), (0, false)],
                red,
                None,
            );
            assert_eq!(plans[0].direct, want);
        }
        // the same problem forced onto the other x variant's tuning range agrees too
        let t = if want {
            candidates(enc.format)[0] // 64 rows per workgroup: staged
        } else {
            Tuning { tpr: 64, rpt: 1 }
        };
        let plans = run_and_check(
            &gpu,
            &m,
            &w,
            &mut rng,
            &xl,
            &pairs(2),
            Reduction::Auto,
            Some(t),
        );
        assert!(!plans[0].direct || t.rows_per_workgroup() <= DIRECT_MAX_RPW);
    }
}

/// (c) the selection rule on the decode step's shapes and the MoE layers, every kernel format:
/// the first candidate of the variant (most rows per workgroup) reaching its workgroup minimum,
/// else the last.
#[test]
fn plan_reaches_min_workgroups_or_the_smallest_tuning() {
    // (rows, pairs): q/o_proj, k/v_proj, router, 2 shared experts, 8-expert layers, inkling-small
    // down, one token's 4 routed experts
    let shapes: &[(u32, u32)] = &[
        (4096, 1),
        (1024, 1),
        (256, 1),
        (4096, 2),
        (12288, 8),
        (6144, 8),
        (4096, 4),
        (1, 1),
    ];
    for enc in inkling_wgpu::gpu::linear::format::kernel_encodings() {
        let direct = direct_aligned(enc, 4096, 0, 0);
        let (list, mins) = if direct {
            (
                direct_candidates(),
                vec![DIRECT_MIN_WORKGROUPS; direct_candidates().len()],
            )
        } else {
            (candidates(enc.format), min_workgroups(enc.format).to_vec())
        };
        for &(rows, n) in shapes {
            let p = plan(enc, n, rows, 4096, 0, 0);
            assert_eq!(p.direct, direct, "{}", enc.spelling());
            let wg = |t: Tuning| n as u64 * rows.div_ceil(t.rows_per_workgroup()) as u64;
            let k = list.iter().position(|&t| t == p.tuning).unwrap();
            assert!(
                wg(p.tuning) >= mins[k] || k == list.len() - 1,
                "{} [{rows}] × {n}: {p:?} gives {} workgroups",
                enc.spelling(),
                wg(p.tuning)
            );
            // no candidate with more rows per workgroup reached its own minimum
            for (j, &t) in list[..k].iter().enumerate() {
                assert!(
                    wg(t) < mins[j],
                    "{} [{rows}] × {n}: {t:?} also reaches {}",
                    enc.spelling(),
                    mins[j]
                );
            }
            // rows per workgroup never grow along the list
            assert!(list
                .windows(2)
                .all(|w| w[0].rows_per_workgroup() > w[1].rows_per_workgroup()));
        }
    }
    assert!(direct_candidates()
        .iter()
        .all(|t| t.rows_per_workgroup() <= DIRECT_MAX_RPW));
    // concrete numbers for bf16 (decode step of inkling-small) and int4-g64 (its experts)
    let bf16 = Encoding::BF16;
    let direct = |tpr| Plan {
        tuning: Tuning { tpr, rpt: 1 },
        direct: true,
    };
    assert_eq!(plan(bf16, 1, 4096, 4096, 0, 0), direct(64));
    assert_eq!(plan(bf16, 1, 1024, 4096, 0, 0), direct(256));
    assert_eq!(plan(bf16, 8, 6144, 6144, 0, 0), direct(32));
    let int4 = Encoding::parse("int4-g64").unwrap();
    let staged = |tpr, rpt| Plan {
        tuning: Tuning { tpr, rpt },
        direct: false,
    };
    assert_eq!(plan(int4, 8, 6144, 6144, 0, 0), staged(8, 4));
    assert_eq!(plan(int4, 6, 4096, 4096, 0, 0), staged(8, 2));
    assert_eq!(plan(int4, 1, 6144, 6144, 0, 0), staged(8, 2));
    assert_eq!(plan(int4, 1, 4096, 4096, 0, 0), staged(32, 2));
    assert_eq!(plan(int4, 2, 4096, 4096, 0, 0), staged(8, 2));
    let int3 = Encoding::parse("int3-g64").unwrap();
    assert_eq!(plan(int3, 8, 6144, 6144, 0, 0), staged(4, 1));
    assert_eq!(plan(int3, 1, 6144, 6144, 0, 0), staged(4, 1));
    assert_eq!(plan(int3, 1, 4096, 4096, 0, 0), staged(16, 1));
    assert_eq!(plan(int3, 1, 1024, 4096, 0, 0), staged(64, 1));
    assert_eq!(plan(int4, 1, 1024, 4096, 0, 0), staged(64, 1));
    assert_eq!(plan(int4, 1, 256, 4096, 0, 0), staged(256, 1));
}
