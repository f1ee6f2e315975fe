//! The one-token short conv with the RMSNorm after it in one dispatch (`wgsl/conv_norm.wgsl`, plain
//! input and MoE-combine input) against the f64 conv then the f64 RMSNorm, and against the separate
//! kernels (conv, then `RmsNorm`): y, the normed row and the updated state, fresh random inputs,
//! poisoned outputs, widths over several rounds of the workgroup and with a partial last round.
use crate::ops_util;
use inkling_wgpu::gpu::ops::conv::{norm_fits, NormAfter};
use inkling_wgpu::gpu::ops::{RmsNorm, ShortConvKernel};
use ops_util::*;

const EPS: f32 = 1e-6;
/// Floats past each output that must stay poisoned.
const GUARD: usize = 16;

/// One case: the conv input (plain x, or the combine of `top_k` routed rows and `ns` shared
/// rows), the f64 results (y, normed row, new state).
struct Case {
    c: usize,
    k: usize,
    /// (top_k, n_shared) for the combine input; None: plain x.
    combine: Option<(usize, usize)>,
}

#[test]
fn conv_then_norm_in_one_dispatch_equals_f64_and_the_separate_kernels() {
    let gpu = gpu();
    let cases = [
        Case {
            c: 148,
            k: 4,
            combine: None,
        },
        Case {
            c: 1200,
            k: 3,
            combine: None,
        },
        Case {
            c: 4096,
            k: 4,
            combine: None,
        },
        Case {
            c: 148,
            k: 4,
            combine: Some((3, 1)),
        },
        Case {
            c: 1204,
            k: 3,
            combine: Some((2, 0)),
        },
        Case {
            c: 4096,
            k: 4,
            combine: Some((6, 2)),
        },
    ];
    for Case { c, k, combine } in cases {
        assert!(norm_fits(c as u32));
        let what = format!("C={c} K={k} combine {combine:?}");
        let mut rng = Rng(7 * c as u64 + k as u64 + combine.map_or(0, |(a, b)| 10 * a + b) as u64);
        let (top_k, ns) = combine.unwrap_or((1, 0));
        let xr = rng.vec(top_k * c, 1.0);
        let g = rng.vec(top_k, 1.0);
        let ys = rng.vec(ns.max(1) * c, 1.0);
        let sg = rng.vec(ns.max(1), 1.0);
        let wv = rng.vec(c * k, 0.5);
        let st0 = rng.vec((k - 1) * c, 1.0);
        let h0 = rng.vec(c, 1.0);
        let gn = rng.vec(c, 1.0);
        // f64: the input row, the conv with the residual, the norm, the new state
        let xin: Vec<f64> = (0..c)
            .map(|ch| match combine {
                None => xr[ch] as f64,
                Some(_) => {
                    let mut s = 0f64;
                    for q in 0..top_k {
                        s += xr[q * c + ch] as f64 * g[q] as f64;
                    }
                    for j in 0..ns {
                        s += ys[j * c + ch] as f64 * sg[j] as f64;
                    }
                    s
                }
            })
            .collect();
        let y: Vec<f64> = (0..c)
            .map(|ch| {
                let mut s = xin[ch];
                for kk in 0..k - 1 {
                    s += wv[ch * k + kk] as f64 * st0[kk * c + ch] as f64;
                }
                s += wv[ch * k + k - 1] as f64 * xin[ch];
                h0[ch] as f64 + s
            })
            .collect();
        let ms = y.iter().map(|v| v * v).sum::<f64>() / c as f64;
        let inv = 1.0 / (ms + EPS as f64).sqrt();
        let xn: Vec<f64> = (0..c).map(|ch| gn[ch] as f64 * y[ch] * inv).collect();
        let mut st1 = vec![0f64; (k - 1) * c];
        for kk in 0..k - 1 {
            for ch in 0..c {
                st1[kk * c + ch] = if kk + 1 < k - 1 {
                    st0[(kk + 1) * c + ch] as f64
                } else {
                    xin[ch]
                };
            }
        }

        let kern = ShortConvKernel {
            tokens: 1,
            channels: c as u32,
            kernel: k as u32,
            accumulate: true,
        };
        let (xb, gb, ysb, sgb) = (
            buf_f32(&gpu, &xr),
            buf_f32(&gpu, &g),
            buf_f32(&gpu, &ys),
            buf_f32(&gpu, &sg),
        );
        let (w, gnb) = (buf_f32(&gpu, &wv), buf_f32(&gpu, &gn));
        // fused
        let st = buf_f32(&gpu, &st0);
        let hb = buf_f32(&gpu, &h0);
        let out = poisoned(&gpu, c + GUARD);
        let norm = NormAfter {
            weight: &gnb,
            eps: EPS,
            out: &out,
        };
        let call = match combine {
            None => kern.bind_norm(&gpu, [&xb, &w, &st, &hb], norm).unwrap(),
            Some(_) => {
                let shared = (ns > 0).then_some((&ysb, &sgb, ns as u32));
                let call = kern.bind_combine(
                    &gpu,
                    &xb,
                    &gb,
                    top_k as u32,
                    shared,
                    &w,
                    &st,
                    &hb,
                    Some(norm),
                );
                call.unwrap()
            }
        };
        assert_eq!(call.dispatches(), 1, "{what}");
        call.run(&gpu);
        let got_xn = read(&gpu, &out, c + GUARD);
        assert!(
            got_xn[c..].iter().all(|v| v.is_nan()),
            "{what}: written past the row"
        );
        assert_close(&format!("{what} y"), &read(&gpu, &hb, c), &y, 1e-5);
        assert_close(&format!("{what} normed"), &got_xn[..c], &xn, 1e-5);
        assert_close(
            &format!("{what} state"),
            &read(&gpu, &st, (k - 1) * c),
            &st1,
            1e-5,
        );

        // the separate kernels on the same inputs: the conv (y += sconv), then RmsNorm
        let st2 = buf_f32(&gpu, &st0);
        let hb2 = buf_f32(&gpu, &h0);
        let out2 = poisoned(&gpu, c);
        match combine {
            None => kern.bind(&gpu, &xb, &w, &st2, &hb2).unwrap().run(&gpu),
            Some(_) => {
                let shared = (ns > 0).then_some((&ysb, &sgb, ns as u32));
                kern.bind_combine(&gpu, &xb, &gb, top_k as u32, shared, &w, &st2, &hb2, None)
                    .unwrap()
                    .run(&gpu)
            }
        }
        RmsNorm::rows(1, c as u32, EPS)
            .bind(&gpu, &hb2, &gnb, &out2)
            .unwrap()
            .run(&gpu);
        let as64 = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<f64>>();
        let sep_y = as64(read(&gpu, &hb2, c));
        assert_close(
            &format!("{what} y vs the separate conv"),
            &read(&gpu, &hb, c),
            &sep_y,
            1e-6,
        );
        let sep_st = as64(read(&gpu, &st2, (k - 1) * c));
        let got_st = read(&gpu, &st, (k - 1) * c);
        assert_close(
            &format!("{what} state vs the separate conv"),
            &got_st,
            &sep_st,
            1e-6,
        );
        let sep_xn = read(&gpu, &out2, c);
        let worst = got_xn[..c]
            .iter()
            .zip(&sep_xn)
            .map(|(a, b)| ((a - b).abs() / b.abs().max(1e-30)) as f64)
            .fold(0.0, f64::max);
        assert!(
            worst <= 1e-5,
            "{what}: normed row vs RmsNorm differ by {worst:e}"
        );
    }
}
