//! Criterion bench: CPU quantisation throughput (MB/s of f32 source weights) of one [2048, 2048]
//! gaussian matrix per kernel format (f32 aside) and scale rule, through `formats::quantize_with` (all CPU threads).
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use inkling_wgpu::formats::{quantize_with, Encoding, ScaleRule};
use inkling_wgpu::gpu::gemv::kernel_encodings;

fn bench(c: &mut Criterion) {
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
    let mut g = c.benchmark_group("quantize_2048x2048");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(4 * w.len() as u64));
    // every format with a kernel except f32 (a copy)
    for enc in kernel_encodings()
        .into_iter()
        .filter(|e| *e != Encoding::F32)
    {
        let spelling = enc.spelling();
        for rule in [ScaleRule::Absmax, ScaleRule::Mse] {
            if enc.scale_count(1, i) == 0 && rule == ScaleRule::Mse {
                continue;
            }
            g.bench_function(format!("{spelling}/{}", rule.name()), |b| {
                b.iter(|| quantize_with(enc, &w, o, i, rule).unwrap())
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
