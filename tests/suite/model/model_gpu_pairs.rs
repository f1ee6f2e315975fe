//! The two GEMV pair options the GPU forward relies on: 16-byte router `Pair`s
//! and `x_per_pair` (pair p reads x row p: the routed down projection), for every kernel encoding,
//! with gammas, against the f64 CPU reference: fresh random weights and inputs (the suite's
//! splitmix Rng), two shapes (odd row counts, a column count that is not a multiple of 64 and one
//! of several groups), every pair's output within 1e-5 relative (‖y − ref‖ / ‖ref‖) of the
//! reference. A missing adapter FAILS (no skip).
use crate::ops_util::{gpu, rel_err, Rng};
use inkling_wgpu::formats::quantize;
use inkling_wgpu::gpu::linear::args::GemvArgs;
use inkling_wgpu::gpu::linear::format::kernel_encodings;
use inkling_wgpu::gpu::linear::slab::GpuWeights;
use inkling_wgpu::gpu::ops::Pair;

#[test]
fn router_pairs_and_x_per_pair_match_the_reference() {
    let gpu = gpu();
    let mut rng = Rng(29);
    for (e, o, i, tokens, k) in [
        (5usize, 40usize, 136usize, 3usize, 2usize),
        (7, 33, 320, 4, 3),
    ] {
        for enc in kernel_encodings() {
            let mats: Vec<_> = (0..e)
                .map(|_| quantize(enc, &rng.vec(o * i, 1.0), o, i).unwrap())
                .collect();
            let gw = GpuWeights::upload(&gpu, &mats).unwrap();
            let ordinal = enc.format.ordinal();
            // pairs as the router writes them: p = t·k + s, expert chosen per token
            let pairs: Vec<Pair> = (0..tokens * k)
                .map(|p| Pair {
                    expert: rng.pick(e) as u32,
                    token: (p / k) as u32,
                    weight_idx: p as u32,
                    _pad: 0xdead_beef,
                })
                .collect();
            let gammas: Vec<f32> = (0..tokens * k).map(|p| 0.5 + p as f32 * 0.25).collect();
            let pb = gpu.storage_init("pairs", bytemuck::cast_slice(&pairs));
            let gb = gpu.storage_init("gammas", bytemuck::cast_slice(&gammas));
            for x_per_pair in [false, true] {
                let rows = if x_per_pair { tokens * k } else { tokens };
                let x = rng.vec(rows * i, 1.0);
                let xb = gpu.storage_init("x", bytemuck::cast_slice(&x));
                let yb =
                    gpu.storage_init("y", bytemuck::cast_slice(&vec![f32::NAN; tokens * k * o]));
                let args = GemvArgs::new(&xb, rows as u32, &pb, (tokens * k) as u32, &yb)
                    .gamma(&gb)
                    .x_per_pair(x_per_pair);
                let call = gw.bind(&gpu, ordinal, args).unwrap();
                let mut ce = gpu.device.create_command_encoder(&Default::default());
                call.record(&mut ce);
                gpu.queue.submit([ce.finish()]);
                let y = gpu.read_f32(&yb, tokens * k * o).unwrap();
                for (p, pr) in pairs.iter().enumerate() {
                    let row = if x_per_pair { p } else { pr.token as usize };
                    let want: Vec<f64> = mats[pr.expert as usize]
                        .gemv_ref_f64(&x[row * i..(row + 1) * i])
                        .iter()
                        .map(|v| v * gammas[p] as f64)
                        .collect();
                    let err = rel_err(&y[p * o..(p + 1) * o], &want);
                    assert!(
                    err <= 1e-5,
                    "{} [{o}x{i}] x_per_pair={x_per_pair} pair {p} (expert {}): rel err {err:e}",
                    enc.spelling(),
                    pr.expert
                );
                }
            }
            // x_per_pair needs an x row per pair;
            let xb = gpu.storage("x", 4 * (tokens * i) as u64);
            let yb = gpu.storage("y", 4 * (tokens * k * o) as u64);
            let too_few =
                GemvArgs::new(&xb, tokens as u32, &pb, (tokens * k) as u32, &yb).x_per_pair(true);
            assert!(gw.bind(&gpu, ordinal, too_few).is_err());
        }
    }
}
