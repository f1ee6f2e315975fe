//! The decode step with the RMSNorms and silu·up folded into the GEMVs' x staging
//! (`GpuModel::set_gemv_prologues`, off by default): the exact dispatches of each layer, with and
//! without the fused residual chains, against the step with separate kernels, and the same
//! logits either way (the default path's tokens and logits against transformers and the CPU are
//! `model_gpu_reference`'s and `model_gpu_fused`'s tests).
use crate::model_common::*;
use crate::ops_util::shared_gpu as gpu;
use inkling_wgpu::model::weights::Mlp;
use inkling_wgpu::model::{Checkpoint, CpuModel, GpuModel, GpuModelOptions, Weights};

/// Dispatches of one decode layer with the fused attention: the q/k/v/r GEMV (row segments),
/// attention, o_proj; the attention residual (conv, or the fused residual chain); the MLP (dense:
/// gate_up, down, × global_scale; MoE: router, top-k, shared gate_up and down, routed gate_up and
/// down); the MLP residual (dense: conv, or the fused chain folding the × global_scale in; MoE:
/// the conv of the combine, or the fused chain). Separate kernels add the input norm (unless a
/// fused residual wrote it), the post-attention norm (likewise) and one silu·up per FFN.
fn expected(mlp: &Mlp<'_>, layer: usize, (norm, silu): (bool, bool), residual: bool) -> usize {
    let r = residual as usize;
    let (mlp_calls, ffns) = match mlp {
        Mlp::Dense(_) => (4 - r, 1),
        Mlp::Moe(m) => {
            let s = !m.shared.is_empty() as usize;
            (5 + 2 * s, 1 + s)
        }
    };
    let mut n = 3 + 1 + mlp_calls;
    if !norm {
        n += (!residual || layer == 0) as usize + !residual as usize;
    }
    if !silu {
        n += ffns;
    }
    n
}

#[test]
fn folded_norms_and_silu_save_their_dispatches_and_keep_the_logits() {
    for name in FIXTURES {
        let ck = Checkpoint::open(&fixture(name)).unwrap();
        let w = Weights::load(&ck).unwrap();
        let cpu = CpuModel::new(&w).forward_all(&[5, 9, 2, 7]).unwrap();
        let residual = false;
        for prologues in [(true, true), (false, false), (false, true)] {
            let mut m = GpuModel::new(&gpu(), &w, GpuModelOptions::new(64)).unwrap();
            m.set_gemv_prologues(prologues.0, prologues.1);
            let mut got = m.forward_all(&[5, 9]).unwrap();
            for &t in &[2, 7] {
                got.push(m.forward(&[t]).unwrap());
            }
            let tag = format!("{name} residual {residual} prologues (norm, silu) {prologues:?}");
            for (p, (g, c)) in got.iter().zip(&cpu).enumerate() {
                let e = rel_err(g, c);
                assert!(e < 1e-5, "{tag}: position {p} rel err {e:.3e} vs CPU");
            }
            let (step, layers) = m.dispatches_per_step().unwrap();
            for (l, (&n, lw)) in layers.iter().zip(&w.layers).enumerate() {
                let want = expected(&lw.mlp, l, prologues, residual);
                assert_eq!(n, want, "{tag}: layer {l} dispatches");
            }
            eprintln!("{tag}: {step} dispatches per step, per layer {layers:?}");
        }
    }
}
