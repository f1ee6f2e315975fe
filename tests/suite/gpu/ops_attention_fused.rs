//! The fused attention block (k/v short convs, q/k RMSNorms, attention, KV write; one dispatch per
//! one-token step, a prologue + attention for longer chunks) against the f64 chain and against the
//! unfused kernels (conv pair, two in-place norms, attention) on the same raw inputs.
use crate::gpu::ops_attention::{reference, shape, Cfg, Seq};
use crate::ops_util;
use inkling_wgpu::gpu::ops::{
    attention_consts, FusedAttention, FusedAttentionIo, PosBuffer, RmsNorm, ShortConvKernel,
};
use inkling_wgpu::gpu::{Call, Gpu};
use ops_util::*;

const EPS: f32 = 1e-5;

/// Raw projections of a sequence and the layer's small weights.
struct Raw {
    n: usize,
    /// Conv kernel size K.
    kk: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    r: Vec<f32>,
    proj: Vec<f32>,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    kw: Vec<f32>,
    vw: Vec<f32>,
}

fn make_raw(c: &Cfg, kk: usize, n: usize, seed: u64) -> Raw {
    let mut rng = Rng(seed);
    let ch = c.kvh * c.d;
    let norm_w = |rng: &mut Rng| (0..c.d).map(|_| 1.0 + 0.5 * rng.f()).collect::<Vec<f32>>();
    Raw {
        n,
        kk,
        q: rng.vec(n * c.h * c.d, 2.0),
        k: rng.vec(n * ch, 2.0),
        v: rng.vec(n * ch, 1.0),
        r: rng.vec(n * c.h * c.d_rel, 1.0),
        proj: rng.vec(c.d_rel * c.extent, 1.0),
        q_norm: norm_w(&mut rng),
        k_norm: norm_w(&mut rng),
        kw: rng.vec(ch * kk, 0.7),
        vw: rng.vec(ch * kk, 0.7),
    }
}

/// `x + Σ_k w[c,k]·x[t−(K−1)+k]` over the whole sequence, zeros before it, in f64.
fn conv_f64(x: &[f32], w: &[f32], ch: usize, kk: usize) -> Vec<f64> {
    let n = x.len() / ch;
    let mut out = vec![0.0; n * ch];
    for t in 0..n {
        for c in 0..ch {
            let mut s = x[t * ch + c] as f64;
            for k in 0..kk {
                let src = t as isize - (kk as isize - 1) + k as isize;
                if src >= 0 {
                    s += w[c * kk + k] as f64 * x[src as usize * ch + c] as f64;
                }
            }
            out[t * ch + c] = s;
        }
    }
    out
}

/// RMSNorm of every row of `d` values in f64.
fn norm_f64(x: &[f64], w: &[f32], d: usize) -> Vec<f64> {
    let mut out = x.to_vec();
    for row in out.chunks_mut(d) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / d as f64;
        let inv = 1.0 / (ms + EPS as f64).sqrt();
        for (v, &g) in row.iter_mut().zip(w) {
            *v = g as f64 * *v * inv;
        }
    }
    out
}

/// The f64 prologue (convs, norms), then the attention reference: out [n, H·D].
fn chain_reference(c: &Cfg, raw: &Raw) -> Vec<f64> {
    let ch = c.kvh * c.d;
    let to32 = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
    let q: Vec<f64> = raw.q.iter().map(|&x| x as f64).collect();
    let seq = Seq {
        n: raw.n,
        q: to32(norm_f64(&q, &raw.q_norm, c.d)),
        k: to32(norm_f64(
            &conv_f64(&raw.k, &raw.kw, ch, raw.kk),
            &raw.k_norm,
            c.d,
        )),
        v: to32(conv_f64(&raw.v, &raw.vw, ch, raw.kk)),
        r: raw.r.clone(),
        proj: raw.proj.clone(),
    };
    reference(c, &seq)
}

fn rows(v: &[f32], start: usize, len: usize, width: usize) -> &[f32] {
    &v[start * width..(start + len) * width]
}

/// Per-chunk input buffers (raw q/k/v/r); q is normalised in place by chunks of T > 1.
struct ChunkIn {
    q: wgpu::Buffer,
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    r: wgpu::Buffer,
}

fn chunk_in(gpu: &Gpu, c: &Cfg, raw: &Raw, p0: usize, t: usize) -> ChunkIn {
    let ch = c.kvh * c.d;
    ChunkIn {
        q: buf_f32(gpu, rows(&raw.q, p0, t, c.h * c.d)),
        k: buf_f32(gpu, rows(&raw.k, p0, t, ch)),
        v: buf_f32(gpu, rows(&raw.v, p0, t, ch)),
        r: buf_f32(gpu, rows(&raw.r, p0, t, c.h * c.d_rel)),
    }
}

/// Caches of `rows` rows of which the first `cap` are NaN and the rest (the conv ring) zero.
fn caches(gpu: &Gpu, c: &Cfg, rows: usize) -> [wgpu::Buffer; 2] {
    let ch = c.kvh * c.d;
    let mut v = vec![f32::NAN; c.cap * ch];
    v.resize(rows * ch, 0.0);
    [buf_f32(gpu, &v), buf_f32(gpu, &v)]
}

fn consts(gpu: &Gpu, c: &Cfg, raw: &Raw) -> wgpu::Buffer {
    let v = attention_consts(
        &shape(c, 1),
        raw.kk as u32,
        [&raw.proj, &raw.q_norm, &raw.k_norm, &raw.kw, &raw.vw],
    );
    buf_f32(gpu, &v)
}

/// The fused kernels over `chunks`; chunks of one token after the first reuse ONE bound call (as
/// a recorded decode step), with its inputs and position rewritten by queue writes.
fn run_fused(gpu: &Gpu, c: &Cfg, raw: &Raw, chunks: &[usize]) -> Vec<f32> {
    let fa = |t: usize| FusedAttention::new(shape(c, t), raw.kk as u32, EPS);
    let ch = c.kvh * c.d;
    let [kc, vc] = caches(gpu, c, fa(1).cache_rows() as usize);
    let cb = consts(gpu, c, raw);
    let pos = PosBuffer::new(gpu, 0);
    let dec = chunk_in(gpu, c, raw, 0, 1);
    let dec_out = poisoned(gpu, c.h * c.d);
    let scratch = [poisoned(gpu, ch), poisoned(gpu, ch)];
    let mut decode: Option<Call> = None;
    let mut out = Vec::new();
    let mut p0 = 0;
    for &t in chunks {
        pos.set(&gpu.queue, p0 as u32, 0);
        if t == 1 {
            let q = &gpu.queue;
            q.write_buffer(
                &dec.q,
                0,
                bytemuck::cast_slice(rows(&raw.q, p0, 1, c.h * c.d)),
            );
            q.write_buffer(&dec.k, 0, bytemuck::cast_slice(rows(&raw.k, p0, 1, ch)));
            q.write_buffer(&dec.v, 0, bytemuck::cast_slice(rows(&raw.v, p0, 1, ch)));
            q.write_buffer(
                &dec.r,
                0,
                bytemuck::cast_slice(rows(&raw.r, p0, 1, c.h * c.d_rel)),
            );
            q.write_buffer(
                &dec_out,
                0,
                bytemuck::cast_slice(&vec![f32::NAN; c.h * c.d]),
            );
            let call = decode.get_or_insert_with(|| {
                let io = FusedAttentionIo {
                    q: &dec.q,
                    k_raw: &dec.k,
                    v_raw: &dec.v,
                    r: &dec.r,
                    consts: &cb,
                    k_cache: &kc,
                    v_cache: &vc,
                    out: &dec_out,
                    k_new: &scratch[0],
                    v_new: &scratch[1],
                };
                let call = fa(1).bind(gpu, &pos, &io).unwrap();
                assert_eq!(call.dispatches(), 1, "one-token fused attention");
                call
            });
            call.run(gpu);
            out.extend(read(gpu, &dec_out, c.h * c.d));
        } else {
            let x = chunk_in(gpu, c, raw, p0, t);
            let o = poisoned(gpu, t * c.h * c.d);
            let (kn, vn) = (poisoned(gpu, t * ch), poisoned(gpu, t * ch));
            let io = FusedAttentionIo {
                q: &x.q,
                k_raw: &x.k,
                v_raw: &x.v,
                r: &x.r,
                consts: &cb,
                k_cache: &kc,
                v_cache: &vc,
                out: &o,
                k_new: &kn,
                v_new: &vn,
            };
            let call = fa(t).bind(gpu, &pos, &io).unwrap();
            assert_eq!(call.dispatches(), 3, "prologue, attention, KV append");
            call.run(gpu);
            out.extend(read(gpu, &o, t * c.h * c.d));
        }
        p0 += t;
    }
    out
}

/// The unfused chain over `chunks`: conv pair, q and k norms in place, attention.
fn run_unfused(gpu: &Gpu, c: &Cfg, raw: &Raw, chunks: &[usize]) -> Vec<f32> {
    let ch = c.kvh * c.d;
    let [kc, vc] = caches(gpu, c, c.cap);
    let proj = buf_f32(gpu, &raw.proj);
    let (qn, kn) = (buf_f32(gpu, &raw.q_norm), buf_f32(gpu, &raw.k_norm));
    let (kw, vw) = (buf_f32(gpu, &raw.kw), buf_f32(gpu, &raw.vw));
    let state = |_| buf_f32(gpu, &vec![0.0; ((raw.kk - 1) * ch).max(1)]);
    let [ks, vs] = [0, 1].map(state);
    let pos = PosBuffer::new(gpu, 0);
    let mut out = Vec::new();
    let mut p0 = 0;
    for &t in chunks {
        let x = chunk_in(gpu, c, raw, p0, t);
        let (k_new, v_new) = (poisoned(gpu, t * ch), poisoned(gpu, t * ch));
        let o = poisoned(gpu, t * c.h * c.d);
        pos.set(&gpu.queue, p0 as u32, 0);
        let conv = ShortConvKernel {
            tokens: t as u32,
            channels: ch as u32,
            kernel: raw.kk as u32,
            accumulate: false,
        };
        let calls = [
            conv.bind_pair(gpu, [&x.k, &kw, &ks, &k_new], [&x.v, &vw, &vs, &v_new])
                .unwrap(),
            RmsNorm::rows((t * c.h) as u32, c.d as u32, EPS)
                .bind_inplace(gpu, &x.q, &qn)
                .unwrap(),
            RmsNorm::rows((t * c.kvh) as u32, c.d as u32, EPS)
                .bind_inplace(gpu, &k_new, &kn)
                .unwrap(),
            shape(c, t)
                .bind(gpu, &pos, &x.q, &k_new, &v_new, &x.r, &proj, &kc, &vc, &o)
                .unwrap(),
        ];
        for call in &calls {
            call.run(gpu);
        }
        out.extend(read(gpu, &o, t * c.h * c.d));
        p0 += t;
    }
    out
}

/// Every chunking against the f64 chain (≤ 1e-5) and against the unfused kernels (≤ 2e-6).
fn check(gpu: &Gpu, c: Cfg, kk: usize, n: usize, seed: u64) {
    let raw = make_raw(&c, kk, n, seed);
    let want = chain_reference(&c, &raw);
    let pre = n / 2;
    let mut mixed = vec![pre.max(2)];
    mixed.resize(n - pre.max(2) + 1, 1);
    let mut threes = vec![3; n / 3];
    if !n.is_multiple_of(3) {
        threes.push(n % 3);
    }
    for chunks in [vec![n], vec![1; n], mixed, threes] {
        let tag = format!("{c:?} K={kk} n={n} chunks {chunks:?}");
        let fused = run_fused(gpu, &c, &raw, &chunks);
        assert_close(&format!("{tag}: fused vs f64"), &fused, &want, 1e-5);
        let plain = run_unfused(gpu, &c, &raw, &chunks);
        let plain64: Vec<f64> = plain.iter().map(|&x| x as f64).collect();
        assert_close(&format!("{tag}: fused vs unfused"), &fused, &plain64, 2e-6);
        eprintln!(
            "{tag}: fused vs f64 {:.2e}, unfused vs f64 {:.2e}, fused vs unfused {:.2e}",
            rel_err(&fused, &want),
            rel_err(&plain, &want),
            rel_err(&fused, &plain64)
        );
    }
}

#[test]
fn fused_full_attention_vec4_across_key_blocks() {
    // head_dim 128 (vec4 variant), GQA group 2, K = 4, tau on, 70 keys (> one 64-key block)
    let c = Cfg {
        h: 4,
        kvh: 2,
        d: 128,
        d_rel: 5,
        extent: 9,
        window: None,
        cap: 72,
        tau: Some((0.2, 3.0)),
    };
    check(&gpu(), c, 4, 70, 11);
}

#[test]
fn fused_sliding_rings_odd_head_dims_and_kernel_sizes() {
    let gpu = gpu();
    // f32 variant (head_dim 6, 10), group 2 and 3, ring = window and ring > window, K = 3, 1, 2
    for (c, kk, n) in [
        (
            Cfg {
                h: 6,
                kvh: 3,
                d: 6,
                d_rel: 3,
                extent: 5,
                window: Some(5),
                cap: 5,
                tau: None,
            },
            3,
            13,
        ),
        (
            Cfg {
                h: 3,
                kvh: 1,
                d: 10,
                d_rel: 7,
                extent: 6,
                window: Some(6),
                cap: 9,
                tau: None,
            },
            1,
            17,
        ),
        (
            Cfg {
                h: 4,
                kvh: 2,
                d: 16,
                d_rel: 4,
                extent: 5,
                window: Some(5),
                cap: 7,
                tau: None,
            },
            2,
            12,
        ),
    ] {
        check(&gpu, c, kk, n, 20 + kk as u64);
    }
}

#[test]
fn fused_widest_head_and_longest_conv() {
    // head_dim 256 (every invocation owns a channel), group 1, K = 8 (the largest), full layer
    let c = Cfg {
        h: 2,
        kvh: 2,
        d: 256,
        d_rel: 16,
        extent: 4,
        window: None,
        cap: 12,
        tau: Some((0.1, 2.0)),
    };
    check(&gpu(), c, 8, 11, 5);
}

#[test]
fn fused_attention_refuses_caches_without_the_ring() {
    let gpu = gpu();
    let c = Cfg {
        h: 2,
        kvh: 1,
        d: 8,
        d_rel: 2,
        extent: 3,
        window: None,
        cap: 6,
        tau: None,
    };
    let raw = make_raw(&c, 4, 1, 1);
    let x = chunk_in(&gpu, &c, &raw, 0, 1);
    let [kc, vc] = caches(&gpu, &c, c.cap);
    let cb = consts(&gpu, &c, &raw);
    let o = poisoned(&gpu, c.h * c.d);
    let io = FusedAttentionIo {
        q: &x.q,
        k_raw: &x.k,
        v_raw: &x.v,
        r: &x.r,
        consts: &cb,
        k_cache: &kc,
        v_cache: &vc,
        out: &o,
        k_new: &o,
        v_new: &o,
    };
    let e = FusedAttention::new(shape(&c, 1), 4, EPS)
        .bind(&gpu, &PosBuffer::new(&gpu, 0), &io)
        .err()
        .expect("a cache of cap rows has no room for the conv ring");
    assert!(e.to_string().contains("fused attention k_cache"), "{e}");
}

/// Sequences of `lens` tokens in the slots of one pair of caches: each prefilled with its first
/// half as one chunk (slot in `pos.y`), then decoded one token per sequence per step in decode
/// batches (`bind_batch`, slot table in a storage buffer; sequences leave as they end, so the
/// batches shrink and mix positions). Each sequence's outputs against its own f64 chain (≤ 1e-5)
/// and against the one-token kernel alone (≤ 1e-6).
fn check_batch(gpu: &Gpu, c: Cfg, kk: usize, lens: &[usize], seed: u64) {
    let ch = c.kvh * c.d;
    let w0 = make_raw(&c, kk, 1, seed);
    let raws: Vec<Raw> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| Raw {
            // one layer: the same constants for every sequence
            proj: w0.proj.clone(),
            q_norm: w0.q_norm.clone(),
            k_norm: w0.k_norm.clone(),
            kw: w0.kw.clone(),
            vw: w0.vw.clone(),
            ..make_raw(&c, kk, n, seed + 1 + i as u64)
        })
        .collect();
    let fa = |t: usize| FusedAttention::new(shape(&c, t), kk as u32, EPS);
    let rows_per_slot = fa(1).cache_rows() as usize;
    let mut one = vec![f32::NAN; c.cap * ch];
    one.resize(rows_per_slot * ch, 0.0);
    let all: Vec<f32> = one.repeat(lens.len());
    let (kc, vc) = (buf_f32(gpu, &all), buf_f32(gpu, &all));
    let cb = consts(gpu, &c, &w0);
    let pos = PosBuffer::new(gpu, 0);
    let mut outs: Vec<Vec<f32>> = vec![vec![]; lens.len()];
    for (s, raw) in raws.iter().enumerate() {
        let t = raw.n / 2;
        let x = chunk_in(gpu, &c, raw, 0, t);
        let o = poisoned(gpu, t * c.h * c.d);
        let (kn, vn) = (poisoned(gpu, t * ch), poisoned(gpu, t * ch));
        let io = FusedAttentionIo {
            q: &x.q,
            k_raw: &x.k,
            v_raw: &x.v,
            r: &x.r,
            consts: &cb,
            k_cache: &kc,
            v_cache: &vc,
            out: &o,
            k_new: &kn,
            v_new: &vn,
        };
        pos.set(&gpu.queue, 0, s as u32);
        let call = fa(t).bind(gpu, &pos, &io).unwrap();
        call.run(gpu);
        outs[s] = read(gpu, &o, t * c.h * c.d);
    }
    let mut at: Vec<usize> = raws.iter().map(|r| r.n / 2).collect();
    // the slots of the first step in reverse order: table order is not slot order
    let mut step = 0;
    loop {
        let mut live: Vec<usize> = (0..lens.len()).filter(|&s| at[s] < lens[s]).collect();
        if live.is_empty() {
            break;
        }
        if step == 0 {
            live.reverse();
        }
        step += 1;
        let b = live.len();
        let pick = |f: &dyn Fn(&Raw) -> &Vec<f32>, width: usize| -> Vec<f32> {
            live.iter()
                .flat_map(|&s| rows(f(&raws[s]), at[s], 1, width).to_vec())
                .collect()
        };
        let q = buf_f32(gpu, &pick(&|r| &r.q, c.h * c.d));
        let k = buf_f32(gpu, &pick(&|r| &r.k, ch));
        let v = buf_f32(gpu, &pick(&|r| &r.v, ch));
        let r = buf_f32(gpu, &pick(&|r| &r.r, c.h * c.d_rel));
        let table: Vec<u32> = live
            .iter()
            .flat_map(|&s| [at[s] as u32, s as u32, 0, 0])
            .collect();
        let seq = gpu.storage_init("slot table", bytemuck::cast_slice(&table));
        let o = poisoned(gpu, b * c.h * c.d);
        let scratch = poisoned(gpu, b * ch);
        let io = FusedAttentionIo {
            q: &q,
            k_raw: &k,
            v_raw: &v,
            r: &r,
            consts: &cb,
            k_cache: &kc,
            v_cache: &vc,
            out: &o,
            k_new: &scratch,
            v_new: &scratch,
        };
        // the uniform names another slot and position: the batch must not read it
        pos.set(&gpu.queue, 1, (lens.len() - 1) as u32);
        let call = fa(b).bind_batch(gpu, &pos, &seq, &io).unwrap();
        assert_eq!(call.dispatches(), 1, "one dispatch per decode batch");
        call.run(gpu);
        let got = read(gpu, &o, b * c.h * c.d);
        for (i, &s) in live.iter().enumerate() {
            outs[s].extend_from_slice(&got[i * c.h * c.d..(i + 1) * c.h * c.d]);
            at[s] += 1;
        }
    }
    for (s, raw) in raws.iter().enumerate() {
        let tag = format!("{c:?} K={kk} slot {s} of {lens:?}");
        assert_close(
            &format!("{tag}: batch vs f64"),
            &outs[s],
            &chain_reference(&c, raw),
            1e-5,
        );
        let mut chunks = vec![raw.n / 2];
        chunks.resize(raw.n - raw.n / 2 + 1, 1);
        let alone = run_fused(gpu, &c, raw, &chunks);
        let alone64: Vec<f64> = alone.iter().map(|&x| x as f64).collect();
        assert_close(&format!("{tag}: batch vs alone"), &outs[s], &alone64, 1e-6);
    }
}

#[test]
fn fused_decode_batch_over_sequence_slots() {
    let gpu = gpu();
    // vec4, full layer, GQA 2, tau, sequences across a 64-key block
    let full = Cfg {
        h: 4,
        kvh: 2,
        d: 32,
        d_rel: 5,
        extent: 9,
        window: None,
        cap: 72,
        tau: Some((0.2, 3.0)),
    };
    check_batch(&gpu, full, 4, &[70, 9, 33, 4], 40);
    // f32 variant, sliding ring, K = 3, a sequence past its window
    let sliding = Cfg {
        h: 6,
        kvh: 3,
        d: 6,
        d_rel: 3,
        extent: 5,
        window: Some(5),
        cap: 5,
        tau: None,
    };
    check_batch(&gpu, sliding, 3, &[13, 2, 8], 50);
}
