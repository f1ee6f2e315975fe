//! Fused one-token residual chain (`SconvRmsNorm`: conv input → short conv + state → `h +=` →
//! RMSNorm [÷ div]) and the paired k/v short conv, against f64 references over consecutive steps.
use crate::ops_util;
use inkling_wgpu::gpu::ops::{SconvInput, SconvRmsNorm, ShortConvKernel};
use inkling_wgpu::gpu::Gpu;
use ops_util::*;

/// Which conv input the case uses.
#[derive(Clone, Copy, Debug)]
enum Mode {
    Plain,
    Scaled(f32),
    /// (top_k, shared experts)
    Moe(usize, usize),
}

/// f64 state of the reference: conv window `[K−1][C]` (oldest first) and h.
struct RefState {
    win: Vec<Vec<f64>>,
    h: Vec<f64>,
}

/// One step of the reference; returns the normed row.
#[allow(clippy::too_many_arguments)]
fn ref_step(
    st: &mut RefState,
    xin: &[f64],
    w: &[f32],
    k: usize,
    nw: &[f32],
    eps: f32,
    div: Option<f32>,
) -> Vec<f64> {
    let c = xin.len();
    for ch in 0..c {
        let mut s = xin[ch];
        for kk in 0..k - 1 {
            s += w[ch * k + kk] as f64 * st.win[kk][ch];
        }
        s += w[ch * k + k - 1] as f64 * xin[ch];
        st.h[ch] += s;
    }
    if k > 1 {
        st.win.remove(0);
        st.win.push(xin.to_vec());
    }
    let ms = st.h.iter().map(|v| v * v).sum::<f64>() / c as f64;
    let inv = 1.0 / (ms + eps as f64).sqrt();
    st.h.iter()
        .zip(nw)
        .map(|(&v, &g)| g as f64 * v * inv / div.map_or(1.0, |d| d as f64))
        .collect()
}

fn case(gpu: &Gpu, c: usize, k: usize, mode: Mode, div: Option<f32>) {
    let what = format!("C={c} K={k} {mode:?} div={div:?}");
    let mut rng = Rng(c as u64 * 31 + k as u64 * 7 + div.is_some() as u64);
    let eps = 1e-6f32;
    let wv = rng.vec(c * k, 0.5);
    let nwv: Vec<f32> = (0..c).map(|_| 1.0 + 0.5 * rng.f()).collect();
    let h0 = rng.vec(c, 1.0);
    let state0 = rng.vec((k - 1) * c, 1.0);
    let (top_k, ns) = match mode {
        Mode::Moe(a, b) => (a, b),
        _ => (1, 0),
    };
    let rows = match mode {
        Mode::Moe(..) => top_k,
        _ => 1,
    };
    let x = poisoned(gpu, rows * c);
    let gam = poisoned(gpu, top_k);
    let ys = poisoned(gpu, ns.max(1) * c);
    let sg = poisoned(gpu, ns.max(1));
    let w = buf_f32(gpu, &wv);
    let nw = buf_f32(gpu, &nwv);
    let h = buf_f32(gpu, &h0);
    let state = buf_f32(gpu, &state0);
    let y = poisoned(gpu, c);
    let input = match mode {
        Mode::Plain => SconvInput::Plain(&x),
        Mode::Scaled(s) => SconvInput::Scaled(&x, s),
        Mode::Moe(..) => SconvInput::MoeCombine {
            routed: &x,
            gammas: &gam,
            top_k: top_k as u32,
            shared: (ns > 0).then_some((&ys, &sg, ns as u32)),
        },
    };
    let call = SconvRmsNorm {
        channels: c as u32,
        kernel: k as u32,
        eps,
        div,
    }
    .bind(gpu, input, &w, &state, &h, &nw, &y)
    .unwrap();
    let mut st = RefState {
        win: (0..k - 1)
            .map(|kk| {
                state0[kk * c..(kk + 1) * c]
                    .iter()
                    .map(|&v| v as f64)
                    .collect()
            })
            .collect(),
        h: h0.iter().map(|&v| v as f64).collect(),
    };
    // consecutive steps with one bound call: fresh inputs, y re-poisoned each time
    for step in 0..3 {
        let xv = rng.vec(rows * c, 1.0);
        let gv = rng.vec(top_k, 1.0);
        let ysv = rng.vec(ns * c, 1.0);
        let sgv = rng.vec(ns, 1.0);
        let q = &gpu.queue;
        q.write_buffer(&x, 0, bytemuck::cast_slice(&xv));
        q.write_buffer(&y, 0, bytemuck::cast_slice(&vec![f32::NAN; c]));
        let xin: Vec<f64> = match mode {
            Mode::Plain => xv.iter().map(|&v| v as f64).collect(),
            Mode::Scaled(s) => xv.iter().map(|&v| v as f64 * s as f64).collect(),
            Mode::Moe(..) => {
                q.write_buffer(&gam, 0, bytemuck::cast_slice(&gv));
                if ns > 0 {
                    q.write_buffer(&ys, 0, bytemuck::cast_slice(&ysv));
                    q.write_buffer(&sg, 0, bytemuck::cast_slice(&sgv));
                }
                (0..c)
                    .map(|ch| {
                        (0..top_k)
                            .map(|r| xv[r * c + ch] as f64 * gv[r] as f64)
                            .sum::<f64>()
                            + (0..ns)
                                .map(|j| ysv[j * c + ch] as f64 * sgv[j] as f64)
                                .sum::<f64>()
                    })
                    .collect()
            }
        };
        let r = ref_step(&mut st, &xin, &wv, k, &nwv, eps, div);
        call.run(gpu);
        assert_close(
            &format!("{what} step {step} y"),
            &read(gpu, &y, c),
            &r,
            1e-5,
        );
        assert_close(
            &format!("{what} step {step} h"),
            &read(gpu, &h, c),
            &st.h,
            1e-5,
        );
        if k > 1 {
            let sref: Vec<f64> = st.win.concat();
            let got = read(gpu, &state, (k - 1) * c);
            assert_close(&format!("{what} step {step} state"), &got, &sref, 1e-6);
        }
    }
}

#[test]
fn sconv_rms_norm_steps_match_reference() {
    let gpu = shared_gpu();
    // 37: scalar; 4100: scalar past the register-held units (> 8 per invocation); 4096: vec4 (the
    // real hidden size); 8196: vec4 past the register-held units; 12: vec4 with idle invocations.
    for (c, k) in [(37, 4), (4100, 4), (4096, 4), (8196, 3), (12, 1), (4096, 8)] {
        case(&gpu, c, k, Mode::Plain, None);
    }
    for c in [37, 4096, 4100] {
        case(&gpu, c, 4, Mode::Scaled(0.37), None);
        case(&gpu, c, 4, Mode::Moe(6, 2), None);
        case(&gpu, c, 3, Mode::Moe(6, 0), Some(2.5));
        case(&gpu, c, 4, Mode::Plain, Some(0.75));
    }
}

#[test]
fn sconv_rms_norm_reset_clears_state() {
    let gpu = shared_gpu();
    let (c, k) = (4100usize, 4usize);
    let mut rng = Rng(9);
    let wv = rng.vec(c * k, 0.5);
    let nwv = vec![1.0f32; c];
    let (w, nw) = (buf_f32(&gpu, &wv), buf_f32(&gpu, &nwv));
    let state = poisoned(&gpu, (k - 1) * c);
    let h = buf_f32(&gpu, &vec![0.0; c]);
    let xv = rng.vec(c, 1.0);
    let x = buf_f32(&gpu, &xv);
    let y = poisoned(&gpu, c);
    let call = SconvRmsNorm {
        channels: c as u32,
        kernel: k as u32,
        eps: 1e-6,
        div: None,
    }
    .bind(&gpu, SconvInput::Plain(&x), &w, &state, &h, &nw, &y)
    .unwrap();
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    enc.clear_buffer(&state, 0, None);
    gpu.queue.submit([enc.finish()]);
    call.run(&gpu);
    let mut st = RefState {
        win: vec![vec![0.0; c]; k - 1],
        h: vec![0.0; c],
    };
    let xin: Vec<f64> = xv.iter().map(|&v| v as f64).collect();
    let r = ref_step(&mut st, &xin, &wv, k, &nwv, 1e-6, None);
    assert_close("after reset", &read(&gpu, &y, c), &r, 1e-5);
}

/// Causal conv reference over a whole sequence `[n, c]` from zero state.
fn conv_ref(x: &[f32], w: &[f32], c: usize, k: usize) -> Vec<f64> {
    let n = x.len() / c;
    let mut out = vec![0.0; n * c];
    for t in 0..n {
        for ch in 0..c {
            let mut s = x[t * c + ch] as f64;
            for kk in 0..k {
                let src = t as isize - (k as isize - 1) + kk as isize;
                if src >= 0 {
                    s += w[ch * k + kk] as f64 * x[src as usize * c + ch] as f64;
                }
            }
            out[t * c + ch] = s;
        }
    }
    out
}

#[test]
fn short_conv_pair_equals_two_convs_over_chunks() {
    let gpu = shared_gpu();
    for (c, k) in [(37usize, 4usize), (1024, 4), (4100, 3), (65, 1)] {
        let n = 7;
        let mut rng = Rng(c as u64 + 100 * k as u64);
        let (xa, xb) = (rng.vec(n * c, 1.0), rng.vec(n * c, 1.0));
        let (wa, wb) = (rng.vec(c * k, 1.0), rng.vec(c * k, 1.0));
        let (wab, wbb) = (buf_f32(&gpu, &wa), buf_f32(&gpu, &wb));
        // poisoned states, cleared by the call's reset (both of them)
        let (sa, sb) = (poisoned(&gpu, (k - 1) * c), poisoned(&gpu, (k - 1) * c));
        let (mut ya, mut yb) = (Vec::new(), Vec::new());
        let mut t0 = 0;
        for (i, t) in [1usize, 1, 3, 2].into_iter().enumerate() {
            let xab = buf_f32(&gpu, &xa[t0 * c..(t0 + t) * c]);
            let xbb = buf_f32(&gpu, &xb[t0 * c..(t0 + t) * c]);
            let (oa, ob) = (poisoned(&gpu, t * c), poisoned(&gpu, t * c));
            let call = ShortConvKernel {
                tokens: t as u32,
                channels: c as u32,
                kernel: k as u32,
                accumulate: false,
            }
            .bind_pair(&gpu, [&xab, &wab, &sa, &oa], [&xbb, &wbb, &sb, &ob])
            .unwrap();
            if i == 0 {
                let mut enc = gpu.device.create_command_encoder(&Default::default());
                enc.clear_buffer(&sa, 0, None);
                enc.clear_buffer(&sb, 0, None);
                gpu.queue.submit([enc.finish()]);
            }
            call.run(&gpu);
            ya.extend(read(&gpu, &oa, t * c));
            yb.extend(read(&gpu, &ob, t * c));
            t0 += t;
        }
        assert_close(
            &format!("pair a C={c} K={k}"),
            &ya,
            &conv_ref(&xa, &wa, c, k),
            1e-5,
        );
        assert_close(
            &format!("pair b C={c} K={k}"),
            &yb,
            &conv_ref(&xb, &wb, c, k),
            1e-5,
        );
    }
}

#[test]
fn short_conv_pair_accumulates() {
    let gpu = shared_gpu();
    let (c, k, t) = (4100usize, 4usize, 2usize);
    let mut rng = Rng(77);
    let (xa, xb) = (rng.vec(t * c, 1.0), rng.vec(t * c, 1.0));
    let (wa, wb) = (rng.vec(c * k, 1.0), rng.vec(c * k, 1.0));
    let (ba, bb) = (rng.vec(t * c, 1.0), rng.vec(t * c, 1.0));
    let (oa, ob) = (buf_f32(&gpu, &ba), buf_f32(&gpu, &bb));
    let zero = vec![0.0f32; (k - 1) * c];
    let (sa, sb) = (buf_f32(&gpu, &zero), buf_f32(&gpu, &zero));
    let (xab, xbb) = (buf_f32(&gpu, &xa), buf_f32(&gpu, &xb));
    let (wab, wbb) = (buf_f32(&gpu, &wa), buf_f32(&gpu, &wb));
    ShortConvKernel {
        tokens: t as u32,
        channels: c as u32,
        kernel: k as u32,
        accumulate: true,
    }
    .bind_pair(&gpu, [&xab, &wab, &sa, &oa], [&xbb, &wbb, &sb, &ob])
    .unwrap()
    .run(&gpu);
    for (x, w, base, out, name) in [(&xa, &wa, &ba, &oa, "a"), (&xb, &wb, &bb, &ob, "b")] {
        let r: Vec<f64> = conv_ref(x, w, c, k)
            .iter()
            .zip(base)
            .map(|(v, &b)| v + b as f64)
            .collect();
        assert_close(
            &format!("accumulate {name}"),
            &read(&gpu, out, t * c),
            &r,
            1e-5,
        );
    }
}
