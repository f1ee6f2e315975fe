//! Calls built once and recorded into ONE compute pass, reused over several steps: argmax writes the
//! token id that the embedding gather of the same submission reads (no CPU round trip).
use crate::ops_util;
use inkling_wgpu::gpu::ops::{Argmax, EmbedNorm, EmbedShard};
use ops_util::*;

#[test]
fn argmax_feeds_embedding_in_one_pass() {
    let gpu = gpu();
    let (vocab, hidden) = (300usize, 40usize);
    let mut rng = Rng(8);
    let table = rng.vec(vocab * hidden, 1.0);
    let w = vec![1.0f32; hidden];
    let (tb, wb) = (buf_f32(&gpu, &table), buf_f32(&gpu, &w));
    let logits = poisoned(&gpu, vocab);
    let ids = poisoned_u32(&gpu, 1);
    let y = poisoned(&gpu, hidden);
    let argmax = Argmax {
        vocab: vocab as u32,
        out_idx: 0,
    }
    .bind(&gpu, &logits, &ids)
    .unwrap();
    let shard = EmbedShard {
        buffer: &tb,
        first_row: 0,
        n_rows: vocab as u32,
        bf16: false,
    };
    let embed = EmbedNorm {
        tokens: 1,
        hidden: hidden as u32,
        eps: 1e-6,
        ids_off: 0,
    }
    .bind(&gpu, &ids, &[shard], &wb, &y)
    .unwrap();
    for step in 0..4 {
        let l = rng.vec(vocab, 1.0);
        let want = (0..vocab)
            .max_by(|&a, &b| l[a].partial_cmp(&l[b]).unwrap().then(b.cmp(&a)))
            .unwrap();
        gpu.queue.write_buffer(&logits, 0, bytemuck::cast_slice(&l));
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            argmax.record_in_pass(&mut pass);
            embed.record_in_pass(&mut pass);
        }
        gpu.queue.submit([enc.finish()]);
        assert_eq!(
            gpu.read_u32(&ids, 1).unwrap()[0],
            want as u32,
            "step {step}"
        );
        let row = &table[want * hidden..][..hidden];
        let inv = 1.0
            / (row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / hidden as f64 + 1e-6).sqrt();
        let r: Vec<f64> = row.iter().map(|&v| v as f64 * inv).collect();
        assert_close(
            &format!("step {step} embedding"),
            &read(&gpu, &y, hidden),
            &r,
            1e-5,
        );
    }
}
