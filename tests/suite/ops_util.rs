//! Shared helpers for the `ops_*` GPU kernel tests (not a test target itself).

use inkling_wgpu::gpu::Gpu;

/// The GPU, or a clear failure (never a skip).
pub fn gpu() -> Gpu {
    Gpu::new().unwrap_or_else(|e| {
        panic!(
            "ops tests need a GPU adapter and none was found: {e}. On CI/lavapipe run with \
             WGPU_BACKEND=vulkan NODEVICE_SELECT=1 and Mesa's lavapipe installed."
        )
    })
}

/// One GPU for the whole test binary (built on first use), or a clear failure (never a skip).
pub fn shared_gpu() -> Gpu {
    static GPU: std::sync::OnceLock<Gpu> = std::sync::OnceLock::new();
    GPU.get_or_init(gpu).clone()
}

/// splitmix64 (the engine's own, `model::sampling::splitmix64`).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        inkling_wgpu::model::sampling::splitmix64(&mut self.0)
    }
    /// Uniform in [-1, 1).
    pub fn f(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) as f32
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// An index uniform in `0..n` (`n` > 0).
    pub fn pick(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }
}

pub fn buf_f32(gpu: &Gpu, data: &[f32]) -> wgpu::Buffer {
    gpu.storage_init("test", bytemuck::cast_slice(data))
}

pub fn buf_u32(gpu: &Gpu, data: &[u32]) -> wgpu::Buffer {
    gpu.storage_init("test", bytemuck::cast_slice(data))
}

/// A buffer of `n` f32 NaNs.
pub fn poisoned(gpu: &Gpu, n: usize) -> wgpu::Buffer {
    buf_f32(gpu, &vec![f32::NAN; n.max(1)])
}

/// A buffer of `n` u32 0xFFFFFFFF.
pub fn poisoned_u32(gpu: &Gpu, n: usize) -> wgpu::Buffer {
    buf_u32(gpu, &vec![u32::MAX; n.max(1)])
}

/// Record `call` in its own command buffer and submit it.
pub fn run(gpu: &Gpu, call: &inkling_wgpu::gpu::Call) {
    let mut e = gpu.device.create_command_encoder(&Default::default());
    call.record(&mut e);
    gpu.queue.submit([e.finish()]);
}

pub fn read(gpu: &Gpu, b: &wgpu::Buffer, n: usize) -> Vec<f32> {
    gpu.read_f32(b, n).expect("readback")
}

/// ‖y − ref‖ / ‖ref‖ in f64; NaN anywhere gives +inf.
pub fn rel_err(y: &[f32], r: &[f64]) -> f64 {
    assert_eq!(y.len(), r.len(), "length mismatch");
    let mut num = 0.0;
    let mut den = 0.0;
    for (&a, &b) in y.iter().zip(r) {
        if !a.is_finite() {
            return f64::INFINITY;
        }
        num += (a as f64 - b) * (a as f64 - b);
        den += b * b;
    }
    (num / den.max(1e-300)).sqrt()
}

pub fn assert_close(what: &str, y: &[f32], r: &[f64], tol: f64) {
    let e = rel_err(y, r);
    assert!(e <= tol, "{what}: relative error {e:e} > {tol:e}");
}
