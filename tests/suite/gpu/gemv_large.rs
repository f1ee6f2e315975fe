//! Large problems: a weight slab larger than the storage-binding limit (128 MiB on lavapipe), and
//! a head-sized row count (201,024 rows, more workgroups than one dispatch dimension allows).
//! The LAST rows are checked. A missing adapter FAILS.

use crate::ops_util::{gpu, Rng};
use inkling_wgpu::formats::{quantize, Encoding, QMatrix};
use inkling_wgpu::gpu::gemv_pairs;
use inkling_wgpu::gpu::linear::args::NO_GAMMA;
use inkling_wgpu::gpu::linear::slab::GpuWeights;
use std::borrow::Cow;

fn close(got: f32, want: f64, scale: f64) -> bool {
    (got as f64 - want).abs() <= 1e-5 * scale.max(1e-30)
}

#[test]
fn slab_larger_than_binding_limit_last_rows() {
    let gpu = gpu();
    let limit = inkling_wgpu::gpu::linear::slab::default_limit(&gpu);
    // bf16 rows of 32 KiB; two experts that together exceed the binding limit
    let i = 16384usize;
    let row = 2 * i as u64;
    let o = (limit / row / 2 + 64) as usize; // each expert a bit over half the limit
    let experts = 2;
    let total = experts as u64 * o as u64 * row;
    assert!(
        total > limit,
        "slab {total} bytes must exceed the limit {limit}"
    );
    eprintln!("slab {experts}×[{o}, {i}] bf16 = {total} bytes, binding limit {limit}");
    let mut rng = Rng(1);
    let mut slab = Vec::with_capacity(total as usize);
    for _ in 0..experts * o * i {
        slab.extend_from_slice(&((rng.f().to_bits() >> 16) as u16).to_le_bytes());
    }
    let w = GpuWeights::from_slab_bytes(&gpu, Encoding::BF16, experts, o, i, &slab, &[]).unwrap();
    assert!(
        w.chunks().len() >= 2,
        "expected a split, got {} chunk(s)",
        w.chunks().len()
    );
    let x: Vec<f32> = (0..i).map(|_| rng.f()).collect();
    let y = gemv_pairs(&gpu, 9, &w, &x, &[(1, 0, NO_GAMMA), (0, 0, NO_GAMMA)], &[]).unwrap();
    let eb = o * 2 * i;
    for (p, e) in [(0usize, 1usize), (1, 0)] {
        let m = QMatrix::new(
            Encoding::BF16,
            o,
            i,
            Cow::Borrowed(&slab[e * eb..(e + 1) * eb]),
            Cow::Borrowed(&[][..]),
        )
        .unwrap();
        for r in [0, 1, o / 2, o - 2, o - 1] {
            let want = m.rows_view(r, r + 1).gemv_ref_f64(&x)[0];
            let got = y[p * o + r];
            assert!(
                close(got, want, (i as f64).sqrt()),
                "expert {e} row {r}: {got} vs {want}"
            );
        }
    }
    // one expert alone larger than the limit: split by rows inside the expert
    drop(w);
    let o1 = (limit / row + 40) as usize;
    let one = &slab[..o1 * 2 * i];
    let w1 = GpuWeights::from_slab_bytes(&gpu, Encoding::BF16, 1, o1, i, one, &[]).unwrap();
    assert!(w1.chunks().len() >= 2);
    let y1 = gemv_pairs(&gpu, 9, &w1, &x, &[(0, 0, NO_GAMMA)], &[]).unwrap();
    let m1 = QMatrix::new(
        Encoding::BF16,
        o1,
        i,
        Cow::Borrowed(one),
        Cow::Borrowed(&[][..]),
    )
    .unwrap();
    for r in [0, o1 - 41, o1 - 40, o1 - 1] {
        let want = m1.rows_view(r, r + 1).gemv_ref_f64(&x)[0];
        assert!(
            close(y1[r], want, (i as f64).sqrt()),
            "row {r}: {} vs {want}",
            y1[r]
        );
    }
}

#[test]
fn head_sized_rows_spread_over_dispatch_dimensions() {
    let gpu = gpu();
    let (o, i) = (201_024usize, 64usize);
    let mut rng = Rng(2);
    let w: Vec<f32> = (0..o * i).map(|_| rng.f()).collect();
    let q = quantize(Encoding::parse("int4-g64").unwrap(), &w, o, i).unwrap();
    let gw = GpuWeights::upload(&gpu, std::slice::from_ref(&q)).unwrap();
    // enough pairs that pairs × row blocks > 65,535 workgroups → spread over y
    let rpw = inkling_wgpu::gpu::linear::route::rows_per_workgroup(q.enc) as usize;
    let n_pairs = 65_536 / o.div_ceil(rpw) + 2;
    assert!(n_pairs * o.div_ceil(rpw) > 65_535);
    // so many workgroups keep the default tuning
    let plan =
        inkling_wgpu::gpu::linear::route::plan(q.enc, n_pairs as u32, o as u32, i as u32, 0, 0);
    assert_eq!(plan.tuning.rows_per_workgroup() as usize, rpw);
    let tokens = 3;
    let x: Vec<f32> = (0..tokens * i).map(|_| rng.f()).collect();
    let pairs: Vec<(u32, u32, u32)> = (0..n_pairs as u32)
        .map(|p| (0, p % tokens as u32, if p % 2 == 1 { 0 } else { NO_GAMMA }))
        .collect();
    let y = gemv_pairs(&gpu, 4, &gw, &x, &pairs, &[2.0]).unwrap();
    for (p, &(_, t, wi)) in pairs.iter().enumerate() {
        let t = t as usize;
        let g = if wi == 0 { 2.0 } else { 1.0 };
        let rows: &[usize] = if p + 2 >= n_pairs || p < 2 {
            &[0, 1, 65_535, 100_000, o - 8, o - 2, o - 1]
        } else {
            &[o - 1]
        };
        for &r in rows {
            let want = g * q.rows_view(r, r + 1).gemv_ref_f64(&x[t * i..(t + 1) * i])[0];
            assert!(
                close(y[p * o + r], want, 8.0),
                "pair {p} row {r}: {} vs {want}",
                y[p * o + r]
            );
        }
    }
    assert!(y.iter().all(|v| v.is_finite()));
}
