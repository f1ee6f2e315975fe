//! silu·up (three layouts), scaling, argmax (V = 201024, last index).
use crate::ops_util;
use inkling_wgpu::gpu::ops::{Argmax, DivConst, MulConst, SiluMul, SiluMulLayout};
use ops_util::*;

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

#[test]
fn silu_mul_layouts() {
    let gpu = gpu();
    let (p, i) = (5usize, 333usize);
    let mut rng = Rng(1);
    let g = rng.vec(p * i, 4.0);
    let u = rng.vec(p * i, 2.0);
    let r: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&a, &b)| silu(a as f64) * b as f64)
        .collect();
    // separate
    let (gb, ub, ob) = (buf_f32(&gpu, &g), buf_f32(&gpu, &u), poisoned(&gpu, p * i));
    SiluMul {
        rows: p as u32,
        i: i as u32,
        layout: SiluMulLayout::separate(i as u32),
    }
    .bind(&gpu, &gb, &ub, &ob)
    .unwrap()
    .run(&gpu);
    assert_close("separate", &read(&gpu, &ob, p * i), &r, 1e-5);
    // fused [P, 2I]: gate first
    let fused: Vec<f32> = (0..p)
        .flat_map(|rr| [&g[rr * i..(rr + 1) * i], &u[rr * i..(rr + 1) * i]].concat())
        .collect();
    let fb = buf_f32(&gpu, &fused);
    let ob = poisoned(&gpu, p * i);
    SiluMul {
        rows: p as u32,
        i: i as u32,
        layout: SiluMulLayout::fused(i as u32),
    }
    .bind(&gpu, &fb, &fb, &ob)
    .unwrap()
    .run(&gpu);
    assert_close("fused", &read(&gpu, &ob, p * i), &r, 1e-5);
    // interleaved
    let inter: Vec<f32> = (0..p * i).flat_map(|k| [g[k], u[k]]).collect();
    let ib = buf_f32(&gpu, &inter);
    let ob = poisoned(&gpu, p * i);
    SiluMul {
        rows: p as u32,
        i: i as u32,
        layout: SiluMulLayout::interleaved(i as u32),
    }
    .bind(&gpu, &ib, &ib, &ob)
    .unwrap()
    .run(&gpu);
    assert_close("interleaved", &read(&gpu, &ob, p * i), &r, 1e-5);
}

#[test]
fn scales() {
    let gpu = gpu();
    // 17_000_003 elements: 66407 workgroups, so the grid spreads over y = 2.
    let n = 17_000_003usize;
    let mut rng = Rng(2);
    let x = rng.vec(n, 1.0);
    let xb = buf_f32(&gpu, &x);
    MulConst {
        n: n as u32,
        c: 3.0,
    }
    .bind(&gpu, &xb)
    .unwrap()
    .run(&gpu);
    let got = read(&gpu, &xb, n);
    assert_eq!(got[n - 1], x[n - 1] * 3.0, "last element");

    let m = 1001usize;
    let x = rng.vec(m, 1.0);
    let xb = buf_f32(&gpu, &x);
    DivConst {
        n: m as u32,
        c: 16.0,
    }
    .bind(&gpu, &xb)
    .unwrap()
    .run(&gpu);
    let got = read(&gpu, &xb, m);
    assert!(
        got.iter().zip(&x).all(|(&a, &b)| a == b / 16.0),
        "div_const exact"
    );
    let xb = buf_f32(&gpu, &x);
    MulConst {
        n: m as u32,
        c: 3.0,
    }
    .bind(&gpu, &xb)
    .unwrap()
    .run(&gpu);
    let r: Vec<f64> = x.iter().map(|&a| a as f64 * 3.0).collect();
    assert_close("mul_const", &read(&gpu, &xb, m), &r, 1e-6);
}

#[test]
fn argmax_last_index_ties_and_random() {
    let gpu = gpu();
    let v = 201_024usize;
    let mut rng = Rng(5);
    let mut l = rng.vec(v, 10.0);
    l[v - 1] = 11.0;
    let lb = buf_f32(&gpu, &l);
    let out = poisoned_u32(&gpu, 4);
    Argmax {
        vocab: v as u32,
        out_idx: 2,
    }
    .bind(&gpu, &lb, &out)
    .unwrap()
    .run(&gpu);
    let o = gpu.read_u32(&out, 4).unwrap();
    assert_eq!(o[2], (v - 1) as u32, "max at the last index");
    assert_eq!(
        (o[0], o[1], o[3]),
        (u32::MAX, u32::MAX, u32::MAX),
        "wrote outside out_idx"
    );
    // ties -> lowest index, across chunks
    l[v - 1] = 0.0;
    l[5000] = 12.0;
    l[190_000] = 12.0;
    l[100] = f32::NAN;
    let lb = buf_f32(&gpu, &l);
    Argmax {
        vocab: v as u32,
        out_idx: 0,
    }
    .bind(&gpu, &lb, &out)
    .unwrap()
    .run(&gpu);
    assert_eq!(gpu.read_u32(&out, 1).unwrap()[0], 5000);
    // truncated vocab: ignore logits past `vocab`
    let mut l2 = rng.vec(416, 1.0);
    l2[410] = 50.0;
    let want = (0..400)
        .max_by(|&a, &b| l2[a].partial_cmp(&l2[b]).unwrap().then(b.cmp(&a)))
        .unwrap();
    let lb = buf_f32(&gpu, &l2);
    Argmax {
        vocab: 400,
        out_idx: 0,
    }
    .bind(&gpu, &lb, &out)
    .unwrap()
    .run(&gpu);
    assert_eq!(gpu.read_u32(&out, 1).unwrap()[0], want as u32);
    // random
    for seed in 0..3 {
        let mut rng = Rng(100 + seed);
        let n = 65_536 * 3 + 17;
        let l = rng.vec(n, 5.0);
        let want = (0..n)
            .max_by(|&a, &b| l[a].partial_cmp(&l[b]).unwrap().then(b.cmp(&a)))
            .unwrap();
        let lb = buf_f32(&gpu, &l);
        Argmax {
            vocab: n as u32,
            out_idx: 0,
        }
        .bind(&gpu, &lb, &out)
        .unwrap()
        .run(&gpu);
        assert_eq!(
            gpu.read_u32(&out, 1).unwrap()[0],
            want as u32,
            "random seed {seed}"
        );
    }
}

/// First index of the maximum, NaNs skipped (0 when all are NaN).
fn ref_argmax(l: &[f32]) -> u32 {
    let mut best: Option<usize> = None;
    for (i, &v) in l.iter().enumerate() {
        if !v.is_nan() && best.is_none_or(|b| v > l[b]) {
            best = Some(i);
        }
    }
    best.unwrap_or(0) as u32
}

#[test]
fn argmax_ties_across_partials_both_variants() {
    // vocab % 4 == 0 (vec4 partials) and not (scalar partials), vocabs around the 1024-logit
    // partial, ties inside one vec4, across invocations and across partials, NaN poison.
    let gpu = shared_gpu();
    let out = poisoned_u32(&gpu, 1);
    for v in [1usize, 3, 4, 1023, 1024, 1025, 4100, 201_024, 201_027] {
        for case in 0..4 {
            let mut rng = Rng(v as u64 * 10 + case);
            let mut l = rng.vec(v, 4.0);
            match case {
                0 => {}
                1 => {
                    // ties: the same maximum at several places; the first must win
                    for k in [v / 2, v - 1, v / 3 + 1, v / 3] {
                        l[k.min(v - 1)] = 9.0;
                    }
                }
                2 => {
                    // NaN everywhere except a few, including a NaN before the max
                    for (i, x) in l.iter_mut().enumerate() {
                        if i % 5 != 2 {
                            *x = f32::NAN;
                        }
                    }
                }
                _ => l.iter_mut().for_each(|x| *x = f32::NAN),
            }
            let lb = buf_f32(&gpu, &l);
            Argmax {
                vocab: v as u32,
                out_idx: 0,
            }
            .bind(&gpu, &lb, &out)
            .unwrap()
            .run(&gpu);
            assert_eq!(
                gpu.read_u32(&out, 1).unwrap()[0],
                ref_argmax(&l),
                "vocab {v} case {case}"
            );
        }
    }
}

#[test]
fn argmax_flags_non_finite_logits() {
    // the flag word is set (never cleared) when any logit within the vocab is NaN or ±Inf, for the
    // vec4 (V % 4 == 0) and the scalar partials; logits past the vocab are not looked at
    let gpu = gpu();
    let mut rng = Rng(9);
    for (v, width) in [(4096usize, 4096usize), (401, 416)] {
        for (at, bad, flagged) in [
            (3, f32::NAN, 1),
            (v - 1, f32::INFINITY, 1),
            (1500 % v, f32::NEG_INFINITY, 1),
            (v + 5, f32::NAN, 0),
        ] {
            let mut l = rng.vec(width + 8, 1.0);
            if at < l.len() {
                l[at] = bad;
            }
            let lb = buf_f32(&gpu, &l);
            let out = buf_u32(&gpu, &[u32::MAX, 0, 5, 6]);
            Argmax {
                vocab: v as u32,
                out_idx: 0,
            }
            .bind_flagged(&gpu, &lb, &out, Some(1))
            .unwrap()
            .run(&gpu);
            let o = gpu.read_u32(&out, 4).unwrap();
            assert_eq!((o[1], o[2], o[3]), (flagged, 5, 6), "V={v}: {bad} at {at}");
            assert!((o[0] as usize) < v, "V={v}: id {}", o[0]);
        }
    }
}
