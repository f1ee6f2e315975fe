//! `inkling-wgpu smoke`: the GEMV of every kernel format on this adapter against the f64 CPU
//! reference, and each row's bandwidth (one expert GEMV at [1024, 4096] with the row's reduction,
//! at least 3 significant figures); a row that failed is not timed and reads `n/a` (the legend
//! under the table says so).
use super::output::outln;
use crate::formats::{quantize, Encoding, QMatrix};
use crate::gpu::dispatch::DispatchError;
use crate::gpu::linear::args::{GemvArgs, Reduction, NO_GAMMA};
use crate::gpu::linear::format::kernel_encodings;
use crate::gpu::linear::oneshot::gemv_pairs_with;
use crate::gpu::linear::slab::GpuWeights;
use crate::gpu::Gpu;
use std::process::ExitCode;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Push this format ordinal through the dispatcher and print the resulting (typed) error.
    #[arg(allow_negative_numbers = true, long, hide = true)]
    pub force_ordinal: Option<u32>,
}

/// splitmix64-based generator of values in [-1, 1).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        crate::model::sampling::splitmix64(&mut self.0)
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            .collect()
    }
}

const TOL: f64 = 1e-5;

/// ‖y − ref‖ / ‖ref‖ over every pair of one problem.
#[allow(clippy::too_many_arguments)]
fn problem_error(
    gpu: &Gpu,
    enc: Encoding,
    mats: &[QMatrix],
    w: &GpuWeights,
    x: &[f32],
    pairs: &[(u32, u32, u32)],
    gammas: &[f32],
    red: Reduction,
) -> Result<f64, DispatchError> {
    let (o, i) = (mats[0].rows, mats[0].cols);
    let y = gemv_pairs_with(gpu, enc.format.ordinal(), w, x, pairs, gammas, red)?;
    let mut worst = 0f64;
    for (p, &(e, t, wi)) in pairs.iter().enumerate() {
        let g = if wi == NO_GAMMA {
            1.0
        } else {
            gammas[wi as usize] as f64
        };
        let r = mats[e as usize].gemv_ref_f64(&x[t as usize * i..(t as usize + 1) * i]);
        let (mut num, mut den) = (0f64, 0f64);
        for (k, rv) in r.iter().enumerate() {
            let yv = y[p * o + k] as f64;
            num += (yv - g * rv).powi(2);
            den += (g * rv).powi(2);
        }
        let err = if den > 0.0 {
            (num / den).sqrt()
        } else {
            num.sqrt()
        };
        worst = worst.max(if err.is_nan() { f64::INFINITY } else { err });
    }
    Ok(worst)
}

/// Wall-clock GB/s of one expert GEMV of `w` with reduction `red` (weights + scales read per
/// dispatch).
fn gbs(gpu: &Gpu, ordinal: u32, w: &GpuWeights, red: Reduction) -> anyhow::Result<f64> {
    let x = gpu.storage_init("x", bytemuck::cast_slice(&vec![0.5f32; w.cols()]));
    let p = gpu.storage_init("pairs", bytemuck::cast_slice(&[0u32, 0, NO_GAMMA, 0]));
    let y = gpu.storage("y", 4 * w.rows() as u64);
    let call = w.bind(gpu, ordinal, GemvArgs::new(&x, 1, &p, 1, &y).reduction(red))?;
    let run = |n: usize| -> anyhow::Result<f64> {
        let t0 = Instant::now();
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for _ in 0..n {
            call.record(&mut enc);
        }
        gpu.queue.submit([enc.finish()]);
        gpu.device.poll(wgpu::PollType::wait_indefinitely())?;
        Ok(t0.elapsed().as_secs_f64())
    };
    run(1)?; // warm up
    let n = if gpu.is_cpu() { 3 } else { 50 };
    let t = run(n)?;
    Ok(w.expert_bytes() as f64 * n as f64 / t / 1e9)
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let gpu = Gpu::new()?;
    outln!("adapter: {}", gpu.describe())?;
    outln!(
        "backend {:?}, name {:?}, driver {:?} {:?}; subgroups {}, timestamps {}, max storage binding {} MiB",
        gpu.info.backend,
        gpu.info.name,
        gpu.info.driver,
        gpu.info.driver_info,
        gpu.has_subgroups(),
        gpu.has_timestamps(),
        gpu.max_binding() >> 20
    )?;
    if let Some(ord) = args.force_ordinal {
        let m = quantize(Encoding::F32, &[1.0; 4], 1, 4)?;
        let w = GpuWeights::upload(&gpu, &[m])?;
        return match gemv_pairs_with(
            &gpu,
            ord,
            &w,
            &[1.0; 4],
            &[(0, 0, NO_GAMMA)],
            &[],
            Reduction::Auto,
        ) {
            Err(e) => {
                let kind = match e {
                    DispatchError::UnknownOrdinal(_) => "UnknownOrdinal",
                    DispatchError::NoKernel { .. } => "NoKernel",
                    DispatchError::EncodingMismatch { .. } => "EncodingMismatch",
                    _ => "other",
                };
                outln!("forced ordinal {ord}: DispatchError::{kind}: {e}")?;
                Ok(ExitCode::from(2))
            }
            Ok(y) => {
                outln!("forced ordinal {ord}: ran, y = {y:?}")?;
                Ok(ExitCode::SUCCESS)
            }
        };
    }
    let mut reds = vec![Reduction::Shared];
    if gpu.has_subgroups() {
        reds.insert(0, Reduction::Subgroup);
    }
    // (experts, O, I); pairs cover several experts and tokens, gammas on
    let shapes: &[(usize, usize, usize)] = &[
        (1, 1, 1),
        (1, 3, 7),
        (3, 33, 63),
        (3, 257, 65),
        (2, 100, 129),
        (8, 96, 1000),
        (4, 512, 2048),
        (2, 65, 4161),
    ];
    let mut rng = Rng(0x1d2c);
    let mut failed = 0;
    outln!(
        "{:<10} {:<10} {:>13}  {:<6} {:>9}",
        "format",
        "reduction",
        "max rel err",
        "result",
        "GB/s"
    )?;
    for enc in kernel_encodings() {
        for &red in &reds {
            let mut worst = 0f64;
            let mut err_msg = None;
            for &(e, o, i) in shapes {
                let mats: Vec<QMatrix> = (0..e)
                    .map(|_| quantize(enc, &rng.vec(o * i), o, i))
                    .collect::<Result<_, _>>()?;
                let w = GpuWeights::upload(&gpu, &mats)?;
                let tokens = 3;
                let x = rng.vec(tokens * i);
                let pairs: Vec<(u32, u32, u32)> = (0..2 * e as u32)
                    .map(|k| (k % e as u32, k % 3, if k % 2 == 0 { NO_GAMMA } else { 0 }))
                    .collect();
                match problem_error(&gpu, enc, &mats, &w, &x, &pairs, &[0.625], red) {
                    Ok(err) => worst = worst.max(err),
                    Err(e) => err_msg = Some(e.to_string()),
                }
            }
            let ok = err_msg.is_none() && worst <= TOL;
            failed += (!ok) as usize;
            let rate = if ok {
                let big = quantize(enc, &rng.vec(1024 * 4096), 1024, 4096)?;
                let w = GpuWeights::upload(&gpu, &[big])?;
                super::bench_calls::sig3(gbs(&gpu, enc.format.ordinal(), &w, red)?)
            } else {
                "n/a".into()
            };
            outln!(
                "{:<10} {:<10} {:>13.3e}  {:<6} {rate:>9}{}",
                enc.spelling(),
                format!("{red:?}").to_lowercase(),
                worst,
                if ok { "pass" } else { "FAIL" },
                err_msg.map(|m| format!("  ({m})")).unwrap_or_default()
            )?;
        }
    }
    outln!("shapes (experts×[O, I]): {shapes:?}; tolerance ‖y−ref‖/‖ref‖ ≤ {TOL:e}")?;
    outln!(
        "GB/s: one expert GEMV at [1024, 4096] with the row's reduction, weights + scales read, \
         wall clock; n/a: not timed, the row failed"
    )?;
    if failed > 0 {
        outln!("smoke: {failed} FAILED")?;
        Ok(ExitCode::FAILURE)
    } else {
        outln!("smoke: all passed")?;
        Ok(ExitCode::SUCCESS)
    }
}
