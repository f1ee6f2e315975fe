//! Criterion bench: one GEMV per kernel format at [1024, 1024] (wall clock, submit + wait).
use criterion::{criterion_group, criterion_main, Criterion};
use inkling_wgpu::formats::quantize;
use inkling_wgpu::gpu::gemv::{kernel_encodings, GemvArgs, GemvCall, GpuWeights, NO_GAMMA};
use inkling_wgpu::gpu::Gpu;

fn bench(c: &mut Criterion) {
    let gpu = Gpu::new().expect("the GEMV bench needs a GPU adapter");
    let (o, i) = (1024, 1024);
    let w: Vec<f32> = (0..o * i)
        .map(|k| ((k * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    let x = gpu.storage_init("x", bytemuck::cast_slice(&vec![0.5f32; i]));
    let p = gpu.storage_init("pairs", bytemuck::cast_slice(&[0u32, 0, NO_GAMMA, 0]));
    let y = gpu.storage("y", 4 * o as u64);
    let mut g = c.benchmark_group("gemv_1024x1024");
    g.sample_size(10);
    for enc in kernel_encodings() {
        let q = quantize(enc, &w, o, i).unwrap();
        let gw = GpuWeights::upload(&gpu, &[q]).unwrap();
        let call = GemvCall::new(
            &gpu,
            enc.format.ordinal(),
            &gw,
            GemvArgs::new(&x, 1, &p, 1, &y),
        )
        .unwrap();
        g.bench_function(enc.spelling(), |b| {
            b.iter(|| {
                let mut e = gpu.device.create_command_encoder(&Default::default());
                call.record(&mut e);
                gpu.queue.submit([e.finish()]);
                gpu.device
                    .poll(wgpu::PollType::wait_indefinitely())
                    .unwrap();
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
