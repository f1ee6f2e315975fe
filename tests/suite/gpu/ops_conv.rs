//! Short convolution: chunked (1, 2, 3 tokens, K = 4 and 3) equals the full sequence; reset does not leak;
//! the MoE-combine input (`bind_combine`) equals the combine then the conv in f64; sequence slots
//! (a chunk in the slot `pos.y` names, decode batches over a slot table) keep each sequence's
//! state apart.
use crate::ops_util;
use inkling_wgpu::gpu::ops::{PosBuffer, ShortConvKernel, SlotOf};
use inkling_wgpu::gpu::Gpu;
use ops_util::*;

fn reference(x: &[f32], w: &[f32], c: usize, k: usize) -> Vec<f64> {
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

/// Runs x through in chunks with one state buffer; returns the outputs concatenated.
fn run(
    gpu: &Gpu,
    x: &[f32],
    w: &wgpu::Buffer,
    state: &wgpu::Buffer,
    c: usize,
    k: usize,
    chunks: &[usize],
) -> Vec<f32> {
    let mut out = Vec::new();
    let mut t0 = 0;
    for &t in chunks {
        let kern = ShortConvKernel {
            tokens: t as u32,
            channels: c as u32,
            kernel: k as u32,
            accumulate: false,
        };
        let xb = buf_f32(gpu, &x[t0 * c..(t0 + t) * c]);
        let yb = poisoned(gpu, t * c);
        kern.bind(gpu, &xb, w, state, &yb).unwrap().run(gpu);
        out.extend(read(gpu, &yb, t * c));
        t0 += t;
    }
    out
}

fn fresh_state(gpu: &Gpu, c: usize, k: usize) -> wgpu::Buffer {
    buf_f32(gpu, &vec![0.0; (k - 1) * c])
}

#[test]
fn chunks_equal_full_sequence() {
    let gpu = gpu();
    for (k, c, n) in [
        (4usize, 37usize, 11usize),
        (3, 130, 9),
        (4, 6144 + 5, 5),
        (1, 5, 4),
        (2, 70, 6),
        (8, 65, 12),
    ] {
        let mut rng = Rng(k as u64 * 1000 + c as u64);
        let x = rng.vec(n * c, 1.0);
        let wv = rng.vec(c * k, 1.0);
        let w = buf_f32(&gpu, &wv);
        let r = reference(&x, &wv, c, k);
        let patterns: Vec<Vec<usize>> = vec![
            vec![n],
            vec![1; n],
            [vec![2; n / 2], vec![n % 2]].concat(),
            [vec![3; n / 3], vec![n % 3]].concat(),
            vec![1, 2, 1, n - 4],
        ];
        for p in patterns {
            let p: Vec<usize> = p.into_iter().filter(|&t| t > 0).collect();
            let st = fresh_state(&gpu, c, k);
            let y = run(&gpu, &x, &w, &st, c, k, &p);
            assert_close(&format!("K={k} C={c} chunks {p:?}"), &y, &r, 1e-5);
        }
    }
}

#[test]
fn reset_state_does_not_leak_and_accumulate() {
    let gpu = gpu();
    let (k, c) = (4, 21);
    let mut rng = Rng(5);
    let wv = rng.vec(c * k, 1.0);
    let w = buf_f32(&gpu, &wv);
    let a = rng.vec(6 * c, 1.0);
    let b = rng.vec(5 * c, 1.0);
    // Poisoned state, cleared before the first prompt.
    let st = poisoned(&gpu, (k - 1) * c);
    let kern = ShortConvKernel {
        tokens: 1,
        channels: c as u32,
        kernel: k as u32,
        accumulate: false,
    };
    let x1 = buf_f32(&gpu, &a[..c]);
    let y1 = poisoned(&gpu, c);
    let call = kern.bind(&gpu, &x1, &w, &st, &y1).unwrap();
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    enc.clear_buffer(&st, 0, None);
    gpu.queue.submit([enc.finish()]);
    // prompt A token by token with one reused call
    let mut ya = Vec::new();
    for t in 0..6 {
        gpu.queue
            .write_buffer(&x1, 0, bytemuck::cast_slice(&a[t * c..(t + 1) * c]));
        call.run(&gpu);
        ya.extend(read(&gpu, &y1, c));
    }
    assert_close("prompt A", &ya, &reference(&a, &wv, c, k), 1e-5);
    // reset, prompt B: must equal B alone
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    enc.clear_buffer(&st, 0, None);
    gpu.queue.submit([enc.finish()]);
    let yb = run(&gpu, &b, &w, &st, c, k, &[2, 3]);
    assert_close("prompt B after reset", &yb, &reference(&b, &wv, c, k), 1e-5);

    // accumulate: y += out
    let kern = ShortConvKernel {
        tokens: 5,
        channels: c as u32,
        kernel: k as u32,
        accumulate: true,
    };
    let base = rng.vec(5 * c, 1.0);
    let yb2 = buf_f32(&gpu, &base);
    let xb = buf_f32(&gpu, &b);
    let st2 = fresh_state(&gpu, c, k);
    kern.bind(&gpu, &xb, &w, &st2, &yb2).unwrap().run(&gpu);
    let r: Vec<f64> = reference(&b, &wv, c, k)
        .iter()
        .zip(&base)
        .map(|(a, &b)| a + b as f64)
        .collect();
    assert_close("accumulate", &read(&gpu, &yb2, 5 * c), &r, 1e-5);
}

/// `bind_combine`: the conv of `Σ_s g·yr + Σ_j sg·ys` (with and without shared experts), chunked
/// over one state, `h +=`, against the f64 combine then the f64 conv; h starts random and the
/// state poisoned-then-cleared.
#[test]
fn combine_input_equals_combine_then_conv() {
    let gpu = gpu();
    for (k, c, n, top_k, ns) in [
        (4usize, 37usize, 5usize, 3usize, 1usize),
        (3, 130, 4, 2, 0),
        (4, 4096 + 3, 3, 6, 2),
    ] {
        let mut rng = Rng(31 * c as u64 + top_k as u64);
        let yr = rng.vec(n * top_k * c, 1.0);
        let g = rng.vec(n * top_k, 1.0);
        let ys = rng.vec(n * ns.max(1) * c, 1.0);
        let sg = rng.vec(n * ns.max(1), 1.0);
        let wv = rng.vec(c * k, 1.0);
        let h0 = rng.vec(n * c, 1.0);
        // the combine in f64, rounded to f32 as the conv's x (the reference conv takes f32 x)
        let comb: Vec<f64> = (0..n * c)
            .map(|i| {
                let (t, ch) = (i / c, i % c);
                let mut s = 0f64;
                for q in 0..top_k {
                    let row = t * top_k + q;
                    s += yr[row * c + ch] as f64 * g[row] as f64;
                }
                for j in 0..ns {
                    let row = t * ns + j;
                    s += ys[row * c + ch] as f64 * sg[row] as f64;
                }
                s
            })
            .collect();
        let comb32: Vec<f32> = comb.iter().map(|&v| v as f32).collect();
        let want: Vec<f64> = reference(&comb32, &wv, c, k)
            .iter()
            .zip(&h0)
            .map(|(a, &b)| a + b as f64)
            .collect();
        let w = buf_f32(&gpu, &wv);
        let st = poisoned(&gpu, (k - 1) * c);
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        enc.clear_buffer(&st, 0, None);
        gpu.queue.submit([enc.finish()]);
        let mut got = Vec::new();
        let mut t0 = 0;
        for t in [1, n - 1] {
            let kern = ShortConvKernel {
                tokens: t as u32,
                channels: c as u32,
                kernel: k as u32,
                accumulate: true,
            };
            let yrb = buf_f32(&gpu, &yr[t0 * top_k * c..(t0 + t) * top_k * c]);
            let gb = buf_f32(&gpu, &g[t0 * top_k..(t0 + t) * top_k]);
            let ysb = buf_f32(&gpu, &ys[t0 * ns * c..(t0 + t) * ns * c]);
            let sgb = buf_f32(&gpu, &sg[t0 * ns..(t0 + t) * ns]);
            let hb = buf_f32(&gpu, &h0[t0 * c..(t0 + t) * c]);
            let shared = (ns > 0).then_some((&ysb, &sgb, ns as u32));
            kern.bind_combine(&gpu, &yrb, &gb, top_k as u32, shared, &w, &st, &hb)
                .unwrap()
                .run(&gpu);
            got.extend(read(&gpu, &hb, t * c));
            t0 += t;
        }
        let what = format!("K={k} C={c} T={n} top-{top_k} shared {ns}");
        assert_close(&what, &got, &want, 1e-5);
    }
}

/// Sequences of `lens` tokens in the slots of one state buffer (`[slots, K−1, C]`, poisoned then
/// cleared): each prefilled with its first half in its slot (`SlotOf::Pos`), then one token per
/// sequence per step in decode batches (`SlotOf::Batch`; sequences leave as they end, the first
/// batch in reverse slot order), `y +=` on random `y`; with `combine` the input is the MoE
/// combine of two routed rows and one shared row. Each sequence against its own f64 conv.
fn check_slots(gpu: &Gpu, k: usize, c: usize, lens: &[usize], combine: bool, seed: u64) {
    let mut rng = Rng(seed);
    let (top_k, ns) = (2usize, 1usize);
    let width = if combine { top_k + ns } else { 1 };
    // per sequence: its input rows (the combine's parts when `combine`), gammas, start y
    let xs: Vec<Vec<f32>> = lens.iter().map(|&n| rng.vec(n * width * c, 1.0)).collect();
    let gs: Vec<Vec<f32>> = lens.iter().map(|&n| rng.vec(n * width, 1.0)).collect();
    let h0: Vec<Vec<f32>> = lens.iter().map(|&n| rng.vec(n * c, 1.0)).collect();
    let wv = rng.vec(c * k, 1.0);
    let w = buf_f32(gpu, &wv);
    let st = poisoned(gpu, lens.len() * ((k - 1) * c).max(1));
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    enc.clear_buffer(&st, 0, None);
    gpu.queue.submit([enc.finish()]);
    // token t of sequence s: (its x rows, its gammas) as the kernel reads them
    let tok = |s: usize, t: usize| -> (Vec<f32>, Vec<f32>) {
        (
            xs[s][t * width * c..(t + 1) * width * c].to_vec(),
            gs[s][t * width..(t + 1) * width].to_vec(),
        )
    };
    let pos = PosBuffer::new(gpu, 0);
    let run = |rows: &[(usize, usize)], at: SlotOf<'_>| -> Vec<f32> {
        let n = rows.len();
        let kern = ShortConvKernel {
            tokens: n as u32,
            channels: c as u32,
            kernel: k as u32,
            accumulate: true,
        };
        let hb = buf_f32(
            gpu,
            &rows
                .iter()
                .flat_map(|&(s, t)| h0[s][t * c..(t + 1) * c].to_vec())
                .collect::<Vec<_>>(),
        );
        if combine {
            let (mut yr, mut g, mut ys, mut sg) = (vec![], vec![], vec![], vec![]);
            for &(s, t) in rows {
                let (x, gm) = tok(s, t);
                yr.extend_from_slice(&x[..top_k * c]);
                ys.extend_from_slice(&x[top_k * c..]);
                g.extend_from_slice(&gm[..top_k]);
                sg.extend_from_slice(&gm[top_k..]);
            }
            let (yrb, gb, ysb, sgb) = (
                buf_f32(gpu, &yr),
                buf_f32(gpu, &g),
                buf_f32(gpu, &ys),
                buf_f32(gpu, &sg),
            );
            kern.bind_combine_at(
                gpu,
                Some(at),
                &yrb,
                &gb,
                top_k as u32,
                Some((&ysb, &sgb, ns as u32)),
                [&w, &st, &hb],
            )
            .unwrap()
            .run(gpu);
        } else {
            let xb = buf_f32(
                gpu,
                &rows
                    .iter()
                    .flat_map(|&(s, t)| tok(s, t).0)
                    .collect::<Vec<_>>(),
            );
            kern.bind_at(gpu, at, &xb, &w, &st, &hb).unwrap().run(gpu);
        }
        read(gpu, &hb, n * c)
    };
    let mut got: Vec<Vec<f32>> = vec![vec![]; lens.len()];
    for (s, &n) in lens.iter().enumerate() {
        pos.set(&gpu.queue, 0, s as u32);
        let rows: Vec<(usize, usize)> = (0..n / 2).map(|t| (s, t)).collect();
        if !rows.is_empty() {
            got[s] = run(&rows, SlotOf::Pos(&pos));
        }
    }
    // the uniform names the last slot: batches must not read it
    pos.set(&gpu.queue, 0, (lens.len() - 1) as u32);
    let mut at: Vec<usize> = lens.iter().map(|n| n / 2).collect();
    let mut first = true;
    loop {
        let mut live: Vec<usize> = (0..lens.len()).filter(|&s| at[s] < lens[s]).collect();
        if live.is_empty() {
            break;
        }
        if first {
            live.reverse();
            first = false;
        }
        let table: Vec<u32> = live
            .iter()
            .flat_map(|&s| [at[s] as u32, s as u32, 0, 0])
            .collect();
        let seq = gpu.storage_init("slot table", bytemuck::cast_slice(&table));
        let rows: Vec<(usize, usize)> = live.iter().map(|&s| (s, at[s])).collect();
        let out = run(&rows, SlotOf::Batch(&seq));
        for (i, &s) in live.iter().enumerate() {
            got[s].extend_from_slice(&out[i * c..(i + 1) * c]);
            at[s] += 1;
        }
    }
    for (s, &n) in lens.iter().enumerate() {
        // the conv's input in f32 (the combine in f64, rounded), then the f64 conv + y
        let input: Vec<f32> = (0..n * c)
            .map(|i| {
                let (t, ch) = (i / c, i % c);
                if !combine {
                    return xs[s][i];
                }
                (0..width)
                    .map(|q| xs[s][(t * width + q) * c + ch] as f64 * gs[s][t * width + q] as f64)
                    .sum::<f64>() as f32
            })
            .collect();
        let want: Vec<f64> = reference(&input, &wv, c, k)
            .iter()
            .zip(&h0[s])
            .map(|(a, &b)| a + b as f64)
            .collect();
        let what = format!("K={k} C={c} combine {combine} slot {s} of {lens:?}");
        assert_close(&what, &got[s], &want, 1e-5);
    }
}

#[test]
fn sequence_slots_and_decode_batches_keep_states_apart() {
    let gpu = gpu();
    for (k, c, lens, combine) in [
        (4usize, 37usize, vec![7usize, 2, 5, 1], false),
        (3, 130, vec![4, 9], false),
        (1, 5, vec![3, 3], false),
        (8, 65, vec![12, 3, 6], false),
        (4, 70, vec![5, 2, 4], true),
    ] {
        check_slots(&gpu, k, c, &lens, combine, 7 * k as u64 + c as u64);
    }
}
