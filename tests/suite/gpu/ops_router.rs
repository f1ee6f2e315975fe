//! Router: E = 300 routed + 2 shared, top-6; experts past the workgroup size are selectable; ties → lower.
use crate::ops_util;
use inkling_wgpu::gpu::ops::{Pair, RouterShape};
use ops_util::*;

fn sig(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// f64 log(sigmoid(x)) = min(x, 0) − log1p(exp(−|x|)).
fn log_sig(x: f64) -> f64 {
    x.min(0.0) - (-x.abs()).exp().ln_1p()
}

/// Weights over `sel` (chosen routed logits, then the shared ones), transformers' formula in f64:
/// `exp(logsigmoid(l) − logsumexp(logsigmoid(l))) · scale`.
fn weights(sel: &[f32], scale: f64) -> Vec<f64> {
    let ls: Vec<f64> = sel.iter().map(|&v| log_sig(v as f64)).collect();
    let m = ls.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + ls.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
    ls.iter().map(|v| (v - lse).exp() * scale).collect()
}

/// Reference: (chosen experts in selection order, gammas, shared gammas), f64.
fn reference(
    l: &[f32],
    bias: &[f32],
    e: usize,
    s: usize,
    k: usize,
    scale: f64,
) -> (Vec<u32>, Vec<f64>, Vec<f64>) {
    let score: Vec<f64> = (0..e).map(|i| sig(l[i] as f64) + bias[i] as f64).collect();
    let mut idx: Vec<usize> = (0..e).collect();
    idx.sort_by(|&a, &b| score[b].partial_cmp(&score[a]).unwrap().then(a.cmp(&b)));
    let chosen: Vec<usize> = idx[..k].to_vec();
    let sel: Vec<f32> = chosen
        .iter()
        .map(|&i| l[i])
        .chain(l[e..e + s].iter().copied())
        .collect();
    let w = weights(&sel, scale);
    (
        chosen.iter().map(|&i| i as u32).collect(),
        w[..k].to_vec(),
        w[k..].to_vec(),
    )
}

#[test]
fn e300_top6_two_shared() {
    let gpu = gpu();
    let (e, s, k, t) = (300usize, 2usize, 6usize, 9usize);
    let scale = 2.5f32 * 0.7;
    let mut rng = Rng(42);
    // Logits on a grid (distinct scores; no near-ties to make exact comparison meaningful).
    let mut l = Vec::new();
    for _ in 0..t {
        let mut perm: Vec<usize> = (0..e).collect();
        for i in (1..e).rev() {
            perm.swap(i, rng.below(i as u64 + 1) as usize);
        }
        l.extend(perm.iter().map(|&p| (p as f32 / e as f32) * 6.0 - 3.0));
        l.push(rng.f() * 2.0);
        l.push(rng.f() * 2.0);
    }
    let bias = vec![0.0f32; e];
    let ne = e + s;
    // token 1: the last expert wins by its logit
    l[ne + e - 1] = 9.0;
    // token 2: all routed logits equal -> ties choose 0..6
    for i in 0..e {
        l[2 * ne + i] = 0.5;
    }
    // token 3: experts 256..300 are the top ones
    for i in 0..e {
        l[3 * ne + i] = if i >= 256 {
            2.0 + i as f32 * 0.01
        } else {
            -2.0
        };
    }
    let lb = buf_f32(&gpu, &l);
    let bb = buf_f32(&gpu, &bias);
    let pairs = poisoned_u32(&gpu, t * k * 4);
    let gam = poisoned(&gpu, t * k);
    let sgam = poisoned(&gpu, t * s);
    let router = RouterShape {
        tokens: t as u32,
        n_routed: e as u32,
        n_shared: s as u32,
        top_k: k as u32,
        scale,
    };
    router
        .bind(&gpu, &lb, &bb, &pairs, &gam, &sgam)
        .unwrap()
        .run(&gpu);
    let pv: Vec<Pair> = bytemuck::cast_slice(&gpu.read_u32(&pairs, t * k * 4).unwrap()).to_vec();
    let gv = read(&gpu, &gam, t * k);
    let sv = read(&gpu, &sgam, t * s);
    for tt in 0..t {
        let (ch, g, sg) = reference(&l[tt * ne..(tt + 1) * ne], &bias, e, s, k, scale as f64);
        // compare as sets (order of top-k does not matter), gammas matched by expert
        let mut got: Vec<(u32, f32)> = (0..k)
            .map(|ss| (pv[tt * k + ss].expert, gv[tt * k + ss]))
            .collect();
        let mut want: Vec<(u32, f64)> = ch.iter().cloned().zip(g).collect();
        got.sort_by_key(|x| x.0);
        want.sort_by_key(|x| x.0);
        assert_eq!(
            got.iter().map(|x| x.0).collect::<Vec<_>>(),
            want.iter().map(|x| x.0).collect::<Vec<_>>(),
            "token {tt}"
        );
        let gg: Vec<f32> = got.iter().map(|x| x.1).collect();
        let ww: Vec<f64> = want.iter().map(|x| x.1).collect();
        assert_close(&format!("gammas token {tt}"), &gg, &ww, 1e-5);
        assert_close(
            &format!("shared gammas token {tt}"),
            &sv[tt * s..(tt + 1) * s],
            &sg,
            1e-5,
        );
        for ss in 0..k {
            let p = pv[tt * k + ss];
            assert_eq!(
                (p.token, p.weight_idx),
                (tt as u32, (tt * k + ss) as u32),
                "pair fields token {tt}"
            );
        }
    }
    assert!(
        pv[k..2 * k].iter().any(|p| p.expert == 299),
        "last expert not selected"
    );
    let mut tie: Vec<u32> = pv[2 * k..3 * k].iter().map(|p| p.expert).collect();
    tie.sort();
    assert_eq!(
        tie,
        vec![0, 1, 2, 3, 4, 5],
        "ties must choose lower indices"
    );
    assert!(
        pv[3 * k..4 * k].iter().all(|p| p.expert >= 294),
        "experts past the workgroup size"
    );
}

#[test]
fn bias_changes_selection_only() {
    let gpu = gpu();
    let (e, s, k) = (16usize, 1usize, 2usize);
    let mut rng = Rng(3);
    let l: Vec<f32> = (0..e + s)
        .map(|i| i as f32 * 0.1 + rng.f() * 0.01)
        .collect();
    let mut bias = vec![0.0f32; e];
    bias[0] = 5.0; // expert 0 selected by its bias, its weight still uses only its logit
    let lb = buf_f32(&gpu, &l);
    let bb = buf_f32(&gpu, &bias);
    let pairs = poisoned_u32(&gpu, k * 4);
    let gam = poisoned(&gpu, k);
    let sgam = poisoned(&gpu, s);
    RouterShape {
        tokens: 1,
        n_routed: e as u32,
        n_shared: s as u32,
        top_k: k as u32,
        scale: 1.0,
    }
    .bind(&gpu, &lb, &bb, &pairs, &gam, &sgam)
    .unwrap()
    .run(&gpu);
    let pv: Vec<Pair> = bytemuck::cast_slice(&gpu.read_u32(&pairs, k * 4).unwrap()).to_vec();
    let (ch, g, sg) = reference(&l, &bias, e, s, k, 1.0);
    assert_eq!(pv.iter().map(|p| p.expert).collect::<Vec<_>>(), ch);
    assert_close("gammas", &read(&gpu, &gam, k), &g, 1e-5);
    assert_close("shared", &read(&gpu, &sgam, s), &sg, 1e-5);
}

#[test]
fn selection_order_sizes_and_no_shared() {
    // 256 experts top-6 (inkling-small), 2048 top-32 (the limits), 7 top-7 (k = E); no shared
    // experts; distinct random scores plus a block of exact ties. Pairs must come in selection order
    // (best first, ties to the lower index), as the reference sorts them.
    let gpu = shared_gpu();
    for (e, k, t) in [(256usize, 6usize, 3usize), (2048, 32, 2), (7, 7, 2)] {
        let mut rng = Rng(e as u64 + 17);
        let mut l = rng.vec(t * e, 4.0);
        // token 1: the top scores tie across 10 experts spread over the range
        for j in 0..10 {
            l[e + (j * e / 10)] = 5.0;
        }
        let bias = rng.vec(e, 0.01);
        let (lb, bb) = (buf_f32(&gpu, &l), buf_f32(&gpu, &bias));
        let pairs = poisoned_u32(&gpu, t * k * 4);
        let gam = poisoned(&gpu, t * k);
        let sgam = poisoned(&gpu, 1);
        RouterShape {
            tokens: t as u32,
            n_routed: e as u32,
            n_shared: 0,
            top_k: k as u32,
            scale: 1.3,
        }
        .bind(&gpu, &lb, &bb, &pairs, &gam, &sgam)
        .unwrap()
        .run(&gpu);
        let pv: Vec<Pair> =
            bytemuck::cast_slice(&gpu.read_u32(&pairs, t * k * 4).unwrap()).to_vec();
        let gv = read(&gpu, &gam, t * k);
        for tt in 0..t {
            let (ch, g, _) = reference(&l[tt * e..(tt + 1) * e], &bias, e, 0, k, 1.3);
            let got: Vec<u32> = pv[tt * k..(tt + 1) * k].iter().map(|p| p.expert).collect();
            assert_eq!(got, ch, "E={e} k={k} token {tt}");
            assert_close(
                &format!("E={e} gammas token {tt}"),
                &gv[tt * k..(tt + 1) * k],
                &g,
                1e-5,
            );
        }
    }
}

#[test]
fn nan_scores_and_ties_inside_the_top_k() {
    // NaN scores rank below every number (ties among them to the lower index); exact ties that
    // straddle or sit inside the top k take the exact-rank path; distinct scores the counting path.
    // Pairs must come in selection order, gammas as the f64 reference.
    let gpu = shared_gpu();
    let (e, s, k) = (256usize, 1usize, 6usize);
    let ne = e + s;
    let mut rng = Rng(1234);
    let mut l = Vec::new();
    for tok in 0..6 {
        let mut row = rng.vec(ne, 3.0);
        match tok {
            // NaN everywhere but seven experts, two of them very low: NaN ranks below them
            0 => {
                for (i, v) in row.iter_mut().enumerate().take(e) {
                    if ![10, 200, 3, 77, 150, 255, 0].contains(&i) {
                        *v = f32::NAN;
                    }
                }
                row[255] = -20.0;
                row[0] = -30.0;
            }
            // a tie of three straddling the 6th place
            1 => {
                for i in [5, 40, 250] {
                    row[i] = 3.0;
                }
                for i in [1, 2, 3, 4, 9] {
                    row[i] = 6.0 + i as f32;
                }
            }
            // a tie of two inside the top k
            2 => {
                row[100] = 8.0;
                row[20] = 8.0;
            }
            // some NaN among random scores
            3 => {
                for i in (0..e).step_by(7) {
                    row[i] = f32::NAN;
                }
            }
            // all routed equal
            4 => row[..e].iter_mut().for_each(|v| *v = -1.0),
            _ => {}
        }
        l.extend(row);
    }
    let t = l.len() / ne;
    let bias = vec![0.0f32; e];
    let (lb, bb) = (buf_f32(&gpu, &l), buf_f32(&gpu, &bias));
    let pairs = poisoned_u32(&gpu, t * k * 4);
    let gam = poisoned(&gpu, t * k);
    let sgam = poisoned(&gpu, t * s);
    RouterShape {
        tokens: t as u32,
        n_routed: e as u32,
        n_shared: s as u32,
        top_k: k as u32,
        scale: 0.9,
    }
    .bind(&gpu, &lb, &bb, &pairs, &gam, &sgam)
    .unwrap()
    .run(&gpu);
    let pv: Vec<Pair> = bytemuck::cast_slice(&gpu.read_u32(&pairs, t * k * 4).unwrap()).to_vec();
    let gv = read(&gpu, &gam, t * k);
    let sv = read(&gpu, &sgam, t * s);
    for tt in 0..t {
        let row = &l[tt * ne..(tt + 1) * ne];
        let score: Vec<f64> = (0..e)
            .map(|i| {
                let v = sig(row[i] as f64) + bias[i] as f64;
                if v.is_nan() {
                    f64::NEG_INFINITY
                } else {
                    v
                }
            })
            .collect();
        let mut idx: Vec<usize> = (0..e).collect();
        idx.sort_by(|&a, &b| score[b].partial_cmp(&score[a]).unwrap().then(a.cmp(&b)));
        let ch: Vec<u32> = idx[..k].iter().map(|&i| i as u32).collect();
        let got: Vec<u32> = pv[tt * k..(tt + 1) * k].iter().map(|p| p.expert).collect();
        assert_eq!(got, ch, "token {tt}");
        let sel: Vec<f32> = ch
            .iter()
            .map(|&i| row[i as usize])
            .chain(row[e..].iter().copied())
            .collect();
        let w = weights(&sel, 0.9);
        if sel.iter().any(|v| v.is_nan()) {
            // a chosen NaN logit makes every weight NaN, as in the reference formula
            assert!(
                gv[tt * k..(tt + 1) * k].iter().all(|v| v.is_nan()),
                "token {tt}"
            );
            continue;
        }
        let g = w[..k].to_vec();
        assert_close(
            &format!("gammas token {tt}"),
            &gv[tt * k..(tt + 1) * k],
            &g,
            1e-5,
        );
        let sg = w[k..].to_vec();
        assert_close(
            &format!("shared token {tt}"),
            &sv[tt * s..(tt + 1) * s],
            &sg,
            1e-5,
        );
    }
}

#[test]
fn underflow_saturation_and_non_finite_logits() {
    // token 0: every logit below −88 (each sigmoid is 0 in f32; the bias alone chooses, and the
    // weights are softmax(logits) over the chosen and shared ones); token 1: every logit above 17
    // (each sigmoid is 1); token 2: a NaN score and a −inf score (bias −inf): NaN ranks last;
    // token 3: finite. The run-time status words name the first token with a non-finite logit
    // (token 2, at absolute position 40 + 2) and the layer; a later layer does not overwrite them.
    let gpu = shared_gpu();
    let (e, s, k, t) = (8usize, 2usize, 3usize, 4usize);
    let ne = e + s;
    let mut rng = Rng(77);
    let mut l = Vec::new();
    for tok in 0..t {
        let row: Vec<f32> = match tok {
            0 => (0..ne).map(|_| -150.0 + rng.f() * 20.0).collect(),
            1 => (0..ne).map(|_| 30.0 + rng.f() * 20.0).collect(),
            _ => rng.vec(ne, 2.0),
        };
        l.extend(row);
    }
    l[2 * ne + 1] = f32::NAN;
    let mut bias: Vec<f32> = (0..e).map(|i| 0.01 * i as f32).collect();
    bias[6] = f32::NEG_INFINITY;
    let (lb, bb) = (buf_f32(&gpu, &l), buf_f32(&gpu, &bias));
    let pairs = poisoned_u32(&gpu, t * k * 4);
    let gam = poisoned(&gpu, t * k);
    let sgam = poisoned(&gpu, t * s);
    let status = buf_u32(&gpu, &[7, 0, 0, 0]);
    let pos = inkling_wgpu::gpu::ops::PosBuffer::new(&gpu, 40);
    let router = RouterShape {
        tokens: t as u32,
        n_routed: e as u32,
        n_shared: s as u32,
        top_k: k as u32,
        scale: 1.7,
    };
    router
        .bind_checked(
            &gpu,
            &lb,
            &bb,
            &pairs,
            &gam,
            &sgam,
            (&status, &pos.buffer),
            5,
        )
        .unwrap()
        .run(&gpu);
    // a later layer (9) with a bad token 0 leaves the words of layer 5 alone
    router
        .bind_checked(
            &gpu,
            &buf_f32(&gpu, &[f32::INFINITY; 40]),
            &bb,
            &poisoned_u32(&gpu, t * k * 4),
            &poisoned(&gpu, t * k),
            &poisoned(&gpu, t * s),
            (&status, &pos.buffer),
            9,
        )
        .unwrap()
        .run(&gpu);
    assert_eq!(
        gpu.read_u32(&status, 4).unwrap(),
        vec![7, 0, 6, u32::MAX - 42],
        "status words"
    );
    let pv: Vec<Pair> = bytemuck::cast_slice(&gpu.read_u32(&pairs, t * k * 4).unwrap()).to_vec();
    let gv = read(&gpu, &gam, t * k);
    let sv = read(&gpu, &sgam, t * s);
    for tt in [0usize, 1, 3] {
        let row = &l[tt * ne..(tt + 1) * ne];
        let (ch, g, sg) = reference(row, &bias, e, s, k, 1.7);
        let got: Vec<u32> = pv[tt * k..(tt + 1) * k].iter().map(|p| p.expert).collect();
        assert_eq!(got, ch, "token {tt}");
        assert!(gv[tt * k..(tt + 1) * k].iter().all(|v| v.is_finite()));
        assert_close(
            &format!("gammas token {tt}"),
            &gv[tt * k..(tt + 1) * k],
            &g,
            1e-5,
        );
        assert_close(
            &format!("shared token {tt}"),
            &sv[tt * s..(tt + 1) * s],
            &sg,
            1e-5,
        );
    }
    // token 0: the bias alone chose 7, 5, 4 (6 is −inf)
    assert_eq!(
        &pv[..k].iter().map(|p| p.expert).collect::<Vec<_>>(),
        &[7, 5, 4]
    );
    // token 2 with k = 8 would rank −inf (6) above NaN (1); with k = 3 neither is chosen, so check
    // the full order with k = E
    let full = RouterShape {
        tokens: 1,
        n_routed: e as u32,
        n_shared: s as u32,
        top_k: e as u32,
        scale: 1.0,
    };
    let row = buf_f32(&gpu, &l[2 * ne..3 * ne]);
    let p8 = poisoned_u32(&gpu, e * 4);
    full.bind(&gpu, &row, &bb, &p8, &poisoned(&gpu, e), &poisoned(&gpu, s))
        .unwrap()
        .run(&gpu);
    let order: Vec<u32> = bytemuck::cast_slice::<u32, Pair>(&gpu.read_u32(&p8, e * 4).unwrap())
        .iter()
        .map(|p| p.expert)
        .collect();
    assert_eq!(&order[6..], &[6, 1], "−inf, then NaN, last");
}
