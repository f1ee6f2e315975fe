//! Expert slots (`GpuWeights::empty_with_limit` + `write_expert` / `stage_expert` + `run_staged`):
//! the slab the expert cache fills one expert at a time. Experts written into slots, out of order,
//! through the direct path, the staged (multi-threaded) path and the padded-row path, over chunked
//! slabs, then overwritten, give the f64 reference GEMV of the expert each slot holds *now*.
//! Fresh random inputs, NaN-poisoned outputs (through `gemv_pairs`), relative error ≤ 1e-5.
//! A missing adapter FAILS.

use crate::ops_util::{gpu, Rng};
use inkling_wgpu::formats::{quantize, Encoding, QMatrix};
use inkling_wgpu::gpu::gemv_pairs;
use inkling_wgpu::gpu::linear::args::NO_GAMMA;
use inkling_wgpu::gpu::linear::slab::GpuWeights;
use inkling_wgpu::gpu::linear::staging::{run_staged, Stager, StagingRing};
use inkling_wgpu::gpu::Gpu;
use std::borrow::Cow;

fn random(rng: &mut Rng, enc: Encoding, o: usize, i: usize) -> QMatrix<'static> {
    let w: Vec<f32> = (0..o * i).map(|_| rng.f()).collect();
    quantize(enc, &w, o, i).unwrap().into_owned()
}

/// Check every slot of `slab` against the matrix it should hold, for two tokens each.
fn check(gpu: &Gpu, slab: &GpuWeights, held: &[&QMatrix<'_>], rng: &mut Rng, what: &str) {
    let i = slab.cols();
    let x: Vec<f32> = (0..2 * i).map(|_| rng.f()).collect();
    let pairs: Vec<(u32, u32, u32)> = (0..held.len() as u32)
        .rev()
        .flat_map(|s| [(s, 0, NO_GAMMA), (s, 1, NO_GAMMA)])
        .collect();
    let ord = slab.encoding().format.ordinal();
    let y = gemv_pairs(gpu, ord, slab, &x, &pairs, &[]).unwrap();
    let o = slab.rows();
    for (p, &(s, t, _)) in pairs.iter().enumerate() {
        let want = held[s as usize].gemv_ref_f64(&x[t as usize * i..(t as usize + 1) * i]);
        let got = &y[p * o..(p + 1) * o];
        let num: f64 = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (*g as f64 - w).powi(2))
            .sum();
        let den: f64 = want.iter().map(|w| w * w).sum();
        let rel = (num / den).sqrt();
        assert!(rel <= 1e-5, "{what}: slot {s} token {t}: rel err {rel:e}");
    }
}

/// Rows split into two pieces (as gate rows then up rows are).
fn pieces(m: &QMatrix<'_>, split: usize) -> ([Vec<u8>; 2], [Vec<u8>; 2]) {
    let rb = m.row_bytes();
    let sb = m.scales.len() / m.rows;
    (
        [m.data[..split * rb].to_vec(), m.data[split * rb..].to_vec()],
        [
            m.scales[..split * sb].to_vec(),
            m.scales[split * sb..].to_vec(),
        ],
    )
}

#[test]
fn slots_written_staged_and_overwritten_compute_the_expert_they_hold() {
    let gpu = gpu();
    let mut rng = Rng(7);
    // (encoding, rows, cols, binding limit): staged whole rows (≥ 4 MiB per expert, so the copies
    // run on several threads), padded rows (int4 with odd I, int3-g64 with I = 100), row-split chunks
    let cases = [
        (Encoding::F32, 1030, 1024, None),
        (
            Encoding::parse("int4-g64").unwrap(),
            515,
            2048,
            Some(64 * 1024),
        ),
        (Encoding::parse("int4").unwrap(), 37, 101, None),
        (Encoding::parse("int3-g64").unwrap(), 33, 100, None),
        // unpadded int3-g64 rows: a ring stages them as stored and reorders them on the GPU
        (Encoding::parse("int3-g64").unwrap(), 40, 256, None),
        (
            Encoding::parse("int3-g64").unwrap(),
            70,
            384,
            Some(24 * 1024),
        ),
        (Encoding::BF16, 300, 72, Some(16 * 1024)),
    ];
    for (enc, o, i, limit) in cases {
        let what = format!("{} [{o}, {i}] limit {limit:?}", enc.spelling());
        let slots = 3;
        let lim = limit.unwrap_or(u64::MAX);
        let slab = GpuWeights::empty_with_limit(&gpu, enc, slots, o, i, lim).unwrap();
        if limit.is_some() {
            assert!(slab.chunks().len() > 1, "{what}: expected several chunks");
        }
        let a = random(&mut rng, enc, o, i);
        let b = random(&mut rng, enc, o, i);
        let c = random(&mut rng, enc, o, i);
        let d = random(&mut rng, enc, o, i);
        // slot 2 staged (threads), slot 0 direct in two pieces, slot 1 staged in two pieces
        let mut copies = Vec::new();
        let n = slab
            .stage_expert(
                &mut Stager::Queue(&gpu.queue),
                2,
                &[&a.data],
                &[&a.scales],
                1 << 20,
                &mut copies,
            )
            .unwrap();
        assert_eq!(n as usize, a.data.len() + a.scales.len());
        let (bd, bs) = pieces(&b, o / 3);
        slab.write_expert(&gpu.queue, 0, &[&bd[0], &bd[1]], &[&bs[0], &bs[1]])
            .unwrap();
        let (cd, cs) = pieces(&c, o / 2);
        slab.stage_expert(
            &mut Stager::Queue(&gpu.queue),
            1,
            &[&cd[0], &cd[1]],
            &[&cs[0], &cs[1]],
            4096,
            &mut copies,
        )
        .unwrap();
        run_staged(copies, 4);
        check(&gpu, &slab, &[&b, &c, &a], &mut rng, &what);
        // overwrite slot 2 (the slot a GEMV just read): the next dispatch sees the new expert
        let mut copies = Vec::new();
        slab.stage_expert(
            &mut Stager::Queue(&gpu.queue),
            2,
            &[&d.data],
            &[&d.scales],
            1 << 16,
            &mut copies,
        )
        .unwrap();
        run_staged(copies, 3);
        check(
            &gpu,
            &slab,
            &[&b, &c, &d],
            &mut rng,
            &format!("{what}, overwritten"),
        );
        // the same through a ring of two staging buffers, one expert per batch, three batches
        // (the third waits for the first buffer to come back): slots 0, 1, 2 get d, a, b
        let mut ring = StagingRing::new(&gpu, 2, slab.slot_bytes() + 64 * 256);
        for (slot, m) in [(0, &d), (1, &a), (2, &b)] {
            ring.begin(&gpu).unwrap();
            let mut copies = Vec::new();
            slab.stage_expert(
                &mut Stager::Ring(&mut ring),
                slot,
                &[&m.data],
                &[&m.scales],
                1 << 16,
                &mut copies,
            )
            .unwrap();
            run_staged(copies, 3);
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            ring.finish(&gpu, &mut enc);
            let idx = gpu.queue.submit([enc.finish()]);
            ring.submitted(idx);
        }
        check(
            &gpu,
            &slab,
            &[&d, &a, &b],
            &mut rng,
            &format!("{what}, through a staging ring"),
        );
        // a batch larger than the ring's buffer is an error
        let mut tiny = StagingRing::new(&gpu, 1, 256);
        tiny.begin(&gpu).unwrap();
        let mut none = Vec::new();
        assert!(slab
            .stage_expert(
                &mut Stager::Ring(&mut tiny),
                0,
                &[&a.data],
                &[&a.scales],
                1 << 20,
                &mut none
            )
            .is_err());
        drop(none);
        // wrong sizes and slots are errors, not panics or silent garbage
        let half = &a.data[..a.data.len() / 2];
        assert!(
            slab.write_expert(&gpu.queue, 0, &[half], &[&a.scales])
                .is_err(),
            "{what}"
        );
        assert!(
            slab.write_expert(&gpu.queue, 3, &[&a.data], &[&a.scales])
                .is_err(),
            "{what}"
        );
        let mut none = Vec::new();
        assert!(slab
            .stage_expert(
                &mut Stager::Queue(&gpu.queue),
                0,
                &[half],
                &[&a.scales],
                1 << 20,
                &mut none
            )
            .is_err());
        assert!(none.is_empty());
    }
    // nothing leaks into the checks from Cow borrowing
    let _ = Cow::<[u8]>::Borrowed(&[]);
}
