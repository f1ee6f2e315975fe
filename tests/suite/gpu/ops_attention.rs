//! Attention with a KV cache: one prefill, chunks and token by token must all equal the full recompute.
use crate::ops_util;
use inkling_wgpu::gpu::ops::{AttentionShape, PosBuffer};
use inkling_wgpu::gpu::Gpu;
use ops_util::*;

#[derive(Clone, Copy, Debug)]
pub struct Cfg {
    pub h: usize,
    pub kvh: usize,
    pub d: usize,
    pub d_rel: usize,
    pub extent: usize,
    pub window: Option<usize>,
    pub cap: usize,
    pub tau: Option<(f32, f32)>,
}

pub struct Seq {
    pub n: usize,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub r: Vec<f32>,
    pub proj: Vec<f32>,
}

fn make_seq(c: &Cfg, n: usize, seed: u64) -> Seq {
    let mut rng = Rng(seed);
    Seq {
        n,
        q: rng.vec(n * c.h * c.d, 2.0),
        k: rng.vec(n * c.kvh * c.d, 2.0),
        v: rng.vec(n * c.kvh * c.d, 1.0),
        r: rng.vec(n * c.h * c.d_rel, 1.0),
        proj: rng.vec(c.d_rel * c.extent, 1.0),
    }
}

/// Full recompute in f64: out [n, H*D].
pub fn reference(c: &Cfg, s: &Seq) -> Vec<f64> {
    let (h, kvh, d, dr, e) = (c.h, c.kvh, c.d, c.d_rel, c.extent);
    let mut out = vec![0.0f64; s.n * h * d];
    for i in 0..s.n {
        let tau = match c.tau {
            Some((alpha, nf)) => 1.0 + alpha as f64 * ((i as f64 + 1.0) / nf as f64).max(1.0).ln(),
            None => 1.0,
        };
        for hh in 0..h {
            let g = hh / (h / kvh);
            let lo = match c.window {
                Some(w) => (i + 1).saturating_sub(w),
                None => 0,
            };
            let qrow = &s.q[(i * h + hh) * d..][..d];
            let mut sc = Vec::new();
            for j in lo..=i {
                let krow = &s.k[(j * kvh + g) * d..][..d];
                let dot: f64 = qrow
                    .iter()
                    .zip(krow)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum();
                let dist = i - j;
                let bias: f64 = if dist < e {
                    (0..dr)
                        .map(|rr| s.r[(i * h + hh) * dr + rr] as f64 * s.proj[rr * e + dist] as f64)
                        .sum()
                } else {
                    0.0
                };
                sc.push(tau * (dot / d as f64 + bias));
            }
            let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
            let l: f64 = p.iter().sum();
            for (jj, j) in (lo..=i).enumerate() {
                let vrow = &s.v[(j * kvh + g) * d..][..d];
                for e2 in 0..d {
                    out[(i * h + hh) * d + e2] += p[jj] / l * vrow[e2] as f64;
                }
            }
        }
    }
    out
}

pub fn shape(c: &Cfg, t: usize) -> AttentionShape {
    AttentionShape {
        tokens: t as u32,
        heads: c.h as u32,
        kv_heads: c.kvh as u32,
        head_dim: c.d as u32,
        d_rel: c.d_rel as u32,
        extent: c.extent as u32,
        window: c.window.map(|w| w as u32),
        cache_capacity: c.cap as u32,
        tau: c.tau,
    }
}

fn rows(v: &[f32], start: usize, len: usize, width: usize) -> &[f32] {
    &v[start * width..(start + len) * width]
}

/// Run the sequence through the GPU in chunks of the given sizes (fresh caches, poisoned); returns [n, H*D].
fn run_chunks(gpu: &Gpu, c: &Cfg, s: &Seq, chunks: &[usize]) -> Vec<f32> {
    assert_eq!(chunks.iter().sum::<usize>(), s.n);
    let cache_n = c.cap * c.kvh * c.d;
    let k_cache = poisoned(gpu, cache_n);
    let v_cache = poisoned(gpu, cache_n);
    let proj = buf_f32(gpu, &s.proj);
    let pos = PosBuffer::new(gpu, 0);
    let mut out = Vec::new();
    let mut p0 = 0;
    for &t in chunks {
        let kern = shape(c, t);
        let q = buf_f32(gpu, rows(&s.q, p0, t, c.h * c.d));
        let k = buf_f32(gpu, rows(&s.k, p0, t, c.kvh * c.d));
        let v = buf_f32(gpu, rows(&s.v, p0, t, c.kvh * c.d));
        let r = buf_f32(gpu, rows(&s.r, p0, t, c.h * c.d_rel));
        let o = poisoned(gpu, t * c.h * c.d);
        pos.set(&gpu.queue, p0 as u32, 0);
        kern.bind(gpu, &pos, &q, &k, &v, &r, &proj, &k_cache, &v_cache, &o)
            .unwrap()
            .run(gpu);
        out.extend(read(gpu, &o, t * c.h * c.d));
        p0 += t;
    }
    out
}

/// Token by token with ONE bound call reused: inputs and position updated with queue writes.
fn run_decode_reused(gpu: &Gpu, c: &Cfg, s: &Seq, prefill: usize) -> Vec<f32> {
    let cache_n = c.cap * c.kvh * c.d;
    let k_cache = poisoned(gpu, cache_n);
    let v_cache = poisoned(gpu, cache_n);
    let proj = buf_f32(gpu, &s.proj);
    let pos = PosBuffer::new(gpu, 0);
    let mut out = Vec::new();
    if prefill > 0 {
        out = run_prefix(gpu, c, s, prefill, &pos, &proj, &k_cache, &v_cache);
    }
    let kern = shape(c, 1);
    let q = poisoned(gpu, c.h * c.d);
    let k = poisoned(gpu, c.kvh * c.d);
    let v = poisoned(gpu, c.kvh * c.d);
    let r = poisoned(gpu, c.h * c.d_rel);
    let o = poisoned(gpu, c.h * c.d);
    let call = kern
        .bind(gpu, &pos, &q, &k, &v, &r, &proj, &k_cache, &v_cache, &o)
        .unwrap();
    for i in prefill..s.n {
        gpu.queue
            .write_buffer(&q, 0, bytemuck::cast_slice(rows(&s.q, i, 1, c.h * c.d)));
        gpu.queue
            .write_buffer(&k, 0, bytemuck::cast_slice(rows(&s.k, i, 1, c.kvh * c.d)));
        gpu.queue
            .write_buffer(&v, 0, bytemuck::cast_slice(rows(&s.v, i, 1, c.kvh * c.d)));
        gpu.queue
            .write_buffer(&r, 0, bytemuck::cast_slice(rows(&s.r, i, 1, c.h * c.d_rel)));
        gpu.queue
            .write_buffer(&o, 0, bytemuck::cast_slice(&vec![f32::NAN; c.h * c.d]));
        pos.set(&gpu.queue, i as u32, 0);
        call.run(gpu);
        out.extend(read(gpu, &o, c.h * c.d));
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn run_prefix(
    gpu: &Gpu,
    c: &Cfg,
    s: &Seq,
    t: usize,
    pos: &PosBuffer,
    proj: &wgpu::Buffer,
    kc: &wgpu::Buffer,
    vc: &wgpu::Buffer,
) -> Vec<f32> {
    let kern = shape(c, t);
    let q = buf_f32(gpu, rows(&s.q, 0, t, c.h * c.d));
    let k = buf_f32(gpu, rows(&s.k, 0, t, c.kvh * c.d));
    let v = buf_f32(gpu, rows(&s.v, 0, t, c.kvh * c.d));
    let r = buf_f32(gpu, rows(&s.r, 0, t, c.h * c.d_rel));
    let o = poisoned(gpu, t * c.h * c.d);
    pos.set(&gpu.queue, 0, 0);
    kern.bind(gpu, pos, &q, &k, &v, &r, proj, kc, vc, &o)
        .unwrap()
        .run(gpu);
    read(gpu, &o, t * c.h * c.d)
}

fn check_all(gpu: &Gpu, c: Cfg, n: usize, seed: u64) {
    let s = make_seq(&c, n, seed);
    let r = reference(&c, &s);
    let tag = format!("{c:?} n={n}");
    assert_close(
        &format!("{tag} one prefill"),
        &run_chunks(gpu, &c, &s, &[n]),
        &r,
        1e-5,
    );
    for cs in [2usize, 3, 7] {
        let mut chunks = vec![cs; n / cs];
        if !n.is_multiple_of(cs) {
            chunks.push(n % cs);
        }
        assert_close(
            &format!("{tag} chunks of {cs}"),
            &run_chunks(gpu, &c, &s, &chunks),
            &r,
            1e-5,
        );
    }
    assert_close(
        &format!("{tag} token by token"),
        &run_chunks(gpu, &c, &s, &vec![1; n]),
        &r,
        1e-5,
    );
    assert_close(
        &format!("{tag} reused decode call"),
        &run_decode_reused(gpu, &c, &s, 0),
        &r,
        1e-5,
    );
    let pre = n / 2;
    assert_close(
        &format!("{tag} prefill {pre} + decode"),
        &run_decode_reused(gpu, &c, &s, pre),
        &r,
        1e-5,
    );
}

#[test]
fn sliding_window_prompts_around_w() {
    let gpu = gpu();
    let w = 5;
    // GQA group 2, head_dim 16, extent = window.
    let c = Cfg {
        h: 6,
        kvh: 3,
        d: 16,
        d_rel: 4,
        extent: w,
        window: Some(w),
        cap: w,
        tau: None,
    };
    for n in [w - 1, w, w + 1, 3 * w + 2] {
        check_all(&gpu, c, n, 100 + n as u64);
    }
}

#[test]
fn sliding_window_larger_than_a_block() {
    let gpu = gpu();
    // W = 70 > 64 keys per block; prompts W-1, W, W+1 and a prefill of 2W+3 (longer than the ring).
    let w = 70;
    let c = Cfg {
        h: 4,
        kvh: 2,
        d: 8,
        d_rel: 3,
        extent: w,
        window: Some(w),
        cap: w,
        tau: None,
    };
    for n in [w - 1, w, w + 1, 2 * w + 3] {
        let s = make_seq(&c, n, 7 + n as u64);
        let r = reference(&c, &s);
        assert_close(
            &format!("W=70 n={n} one prefill"),
            &run_chunks(&gpu, &c, &s, &[n]),
            &r,
            1e-5,
        );
        let mut chunks = vec![33; n / 33];
        if n % 33 != 0 {
            chunks.push(n % 33);
        }
        assert_close(
            &format!("W=70 n={n} chunks of 33"),
            &run_chunks(&gpu, &c, &s, &chunks),
            &r,
            1e-5,
        );
        assert_close(
            &format!("W=70 n={n} prefill+decode"),
            &run_decode_reused(&gpu, &c, &s, n - 3),
            &r,
            1e-5,
        );
    }
}

#[test]
fn full_attention_tau_on_group1_d8() {
    let gpu = gpu();
    let c = Cfg {
        h: 4,
        kvh: 4,
        d: 8,
        d_rel: 4,
        extent: 7,
        window: None,
        cap: 64,
        tau: Some((0.2, 3.0)),
    };
    check_all(&gpu, c, 19, 1);
}

#[test]
fn full_attention_tau_off_group3_d128() {
    let gpu = gpu();
    // 70 tokens: more keys than one 64-key block; extent 9 < sequence (bias zero beyond).
    let c = Cfg {
        h: 6,
        kvh: 2,
        d: 128,
        d_rel: 8,
        extent: 9,
        window: None,
        cap: 80,
        tau: None,
    };
    let n = 70;
    let s = make_seq(&c, n, 2);
    let r = reference(&c, &s);
    assert_close(
        "d128 one prefill",
        &run_chunks(&gpu, &c, &s, &[n]),
        &r,
        1e-5,
    );
    assert_close(
        "d128 chunks",
        &run_chunks(&gpu, &c, &s, &[1, 2, 3, 64]),
        &r,
        1e-5,
    );
    assert_close(
        "d128 prefill+decode",
        &run_decode_reused(&gpu, &c, &s, 60),
        &r,
        1e-5,
    );
}

#[test]
fn full_attention_tau_on_group2_d16_sliding_heads_differ() {
    let gpu = gpu();
    // Like the fixture: full layers with tau, extent 7; GQA group 2, head_dim 16.
    let c = Cfg {
        h: 4,
        kvh: 2,
        d: 16,
        d_rel: 4,
        extent: 7,
        window: None,
        cap: 32,
        tau: Some((0.2, 3.0)),
    };
    check_all(&gpu, c, 12, 3);
    // Sliding with group 3, head_dim 8 (sliding and full layers have different shapes).
    let c = Cfg {
        h: 6,
        kvh: 2,
        d: 8,
        d_rel: 4,
        extent: 5,
        window: Some(5),
        cap: 5,
        tau: None,
    };
    check_all(&gpu, c, 11, 4);
}

#[test]
fn key_counts_around_the_block_and_head_dims() {
    // 1, 63, 64, 65 and 200 keys (blocks of 64), head dims 64/128/256 (vec4 variant) and 6/10 (f32
    // variant, tail of a vec4 column masked), d_rel not a multiple of the 4 lanes per key. The last
    // token is a decode step over all the keys, the rest one prefill of n-1 tokens.
    let gpu = gpu();
    for (d, h, kvh, d_rel) in [
        (64, 4, 2, 5),
        (128, 3, 1, 33),
        (256, 2, 2, 16),
        (6, 4, 2, 3),
        (10, 2, 1, 7),
    ] {
        for n in [1usize, 63, 64, 65, 200] {
            let c = Cfg {
                h,
                kvh,
                d,
                d_rel,
                extent: 90,
                window: None,
                cap: 208,
                tau: Some((0.15, 5.0)),
            };
            let s = make_seq(&c, n, 1000 + n as u64 + d as u64);
            let r = reference(&c, &s);
            assert_close(
                &format!("d={d} n={n} prefill n-1 + decode"),
                &run_decode_reused(&gpu, &c, &s, n - 1),
                &r,
                1e-5,
            );
            if n == 65 {
                assert_close(
                    &format!("d={d} n={n} chunks"),
                    &run_chunks(&gpu, &c, &s, &[30, 1, 34]),
                    &r,
                    1e-5,
                );
            }
        }
    }
}

#[test]
fn sliding_window_shorter_than_the_ring() {
    // Ring capacity 70 > window 50: slots p % 70, keys i-49..=i; vec4 and f32 variants.
    let gpu = gpu();
    for d in [32, 12, 7] {
        let c = Cfg {
            h: 4,
            kvh: 2,
            d,
            d_rel: 6,
            extent: 50,
            window: Some(50),
            cap: 70,
            tau: None,
        };
        let n = 150;
        let s = make_seq(&c, n, 77 + d as u64);
        let r = reference(&c, &s);
        assert_close(
            &format!("W=50 cap=70 d={d} prefill+decode"),
            &run_decode_reused(&gpu, &c, &s, 60),
            &r,
            1e-5,
        );
        assert_close(
            &format!("W=50 cap=70 d={d} chunks of 33"),
            &run_chunks(&gpu, &c, &s, &[33, 33, 33, 33, 18]),
            &r,
            1e-5,
        );
    }
}
