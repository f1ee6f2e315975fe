//! CPU quantisation throughput (MiB/s of f32 source weights) of one [2048, 2048] gaussian matrix
//! per kernel format (f32 aside) and scale rule, through `formats::quantize_with` (all CPU
//! threads): the median of 10 timed runs after one warm-up. Run with
//! `cargo bench --bench quantize`. A plain `harness = false` bench rather than criterion:
//! criterion as a dev-dependency turns on features of shared dependencies, which would make
//! `cargo test` rebuild wgpu instead of reusing the build of `cargo run`.
use inkling_wgpu::formats::{quantize_with, Encoding, ScaleRule};
use inkling_wgpu::gpu::linear::kernel_encodings;
use std::time::Instant;

const RUNS: usize = 10;

fn main() {
    let (o, i) = (2048, 2048);
    // splitmix64, sum of four uniforms: roughly gaussian
    let mut z = 1u64;
    let mut u = || {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut x = z;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((x ^ (x >> 31)) >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let w: Vec<f32> = (0..o * i).map(|_| (u() + u() + u() + u()) * 0.02).collect();
    let mib = (4 * w.len()) as f64 / (1 << 20) as f64;
    println!("quantize_2048x2048: median of {RUNS} runs, MiB/s of f32 source");
    // every format with a kernel except f32 (a copy)
    for enc in kernel_encodings()
        .into_iter()
        .filter(|e| *e != Encoding::F32)
    {
        for rule in [ScaleRule::Absmax, ScaleRule::Mse] {
            if enc.scale_count(1, i) == 0 && rule == ScaleRule::Mse {
                continue;
            }
            quantize_with(enc, &w, o, i, rule).expect("quantize");
            let mut secs: Vec<f64> = (0..RUNS)
                .map(|_| {
                    let t = Instant::now();
                    std::hint::black_box(quantize_with(enc, &w, o, i, rule).expect("quantize"));
                    t.elapsed().as_secs_f64()
                })
                .collect();
            secs.sort_by(f64::total_cmp);
            let med = secs[RUNS / 2];
            println!(
                "{:>10}/{:<6} {:>8.1} MiB/s",
                enc.spelling(),
                rule.name(),
                mib / med
            );
        }
    }
}
