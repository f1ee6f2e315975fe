//! Sequence slots ([`crate::model::BatchForward`]) of the GPU model and the decode batch: one
//! token of each of several slots in one step.
use super::graph::{self, Head, PassLayout, StepKey};
use super::record::{words, Readback, STATUS_BYTES};
use super::GpuModel;
use crate::model::{status, BatchForward};
use anyhow::{ensure, Result};
use std::time::Instant;

impl GpuModel<'_> {
    /// One token for each `(slot, token)` of `batch` (sequence slots distinct, each holding a
    /// sequence), decoded in one step: every linear reads its weights once for all of them, the
    /// attention and the short convs read and write each token's own slot. The logits after each
    /// token, in `batch` order; the selected slot stays selected. A batch of one runs the
    /// one-token step of its slot.
    ///
    /// Errors: as [`crate::model::batch::check_batch`], a slot at `max_seq`, a token past the
    /// vocabulary, and non-finite router logits or logits (the slots of the batch must then be
    /// reset).
    pub fn decode_batch(&mut self, batch: &[(usize, u32)]) -> Result<Vec<Vec<f32>>> {
        crate::model::batch::check_batch(batch, self.parked.len(), |s| self.position_of(s))?;
        if batch.len() == 1 {
            let keep = self.seq_slot;
            let (slot, id) = batch[0];
            self.select(slot);
            let r = self.forward(&[id]);
            self.select(keep);
            return Ok(vec![r?]);
        }
        for &(s, id) in batch {
            if id as usize >= self.cfg.vocab_size {
                return Err(crate::model::ModelError::TokenOutOfRange {
                    id,
                    vocab: self.cfg.vocab_size,
                }
                .into());
            }
            let p = self.position_of(s);
            ensure!(
                p < self.max_seq,
                "sequence slot {s}: a sequence of {} tokens exceeds the GPU model's max_seq {}",
                p + 1,
                self.max_seq
            );
        }
        ensure!(
            batch.len() <= self.max_chunk,
            "a decode batch of {} tokens is more than a chunk of {}",
            batch.len(),
            self.max_chunk
        );
        self.clear_status();
        let n = batch.len();
        let key = StepKey {
            tokens: n as u32,
            head: Head::All,
            chained: false,
            batch: true,
        };
        if !self.steps.contains_key(&key) {
            let step = graph::build_step(&self.gpu, &self.cfg, &self.res, key, self.fusions)?;
            self.steps.insert(key, step);
        }
        let ids: Vec<u32> = batch.iter().map(|&(_, id)| id).collect();
        let table: Vec<u32> = batch
            .iter()
            .flat_map(|&(s, _)| [self.position_of(s) as u32, s as u32, 0, 0])
            .collect();
        let first = self.position_of(batch[0].0);
        let width = self.cfg.logits_width();
        let bytes = (n * width * 4) as u64;
        {
            let GpuModel {
                gpu,
                res,
                steps,
                rec,
                stream,
                ..
            } = self;
            let q = &gpu.queue;
            q.write_buffer(&res.acts.ids, 0, bytemuck::cast_slice(&ids));
            q.write_buffer(&res.acts.seq, 0, bytemuck::cast_slice(&table));
            // the router's status words name the first token's position
            res.pos.set(q, first as u32, batch[0].0 as u32);
            let enc = gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("inkling decode batch"),
                });
            let t_record = Instant::now();
            let step = &steps[&key];
            let mut cut = |layer, enc| match stream.as_mut() {
                Some(s) => s.cut(gpu, res, (layer, key.tokens, first), enc),
                None => unreachable!("a routed cut in a resident model"),
            };
            let mut enc = rec.record(enc, step, PassLayout::Single, None, &mut cut)?;
            rec.copy_readback(&mut enc, &res.acts, Readback::Logits(bytes));
            rec.submit(gpu, enc, t_record, false);
        }
        for &(s, _) in batch {
            if s == self.seq_slot {
                self.pos += 1;
                self.dirty = true;
            } else {
                let p = &mut self.parked[s];
                *p = (p.0 + 1, true);
            }
        }
        let b = self.rec.read_back(&self.gpu, bytes + STATUS_BYTES)?;
        status::check(&words(&b[bytes as usize..]), first)?;
        let v: Vec<f32> = b[..bytes as usize]
            .chunks_exact(4)
            .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
            .collect();
        let rows: Vec<Vec<f32>> = v.chunks_exact(width).map(|r| r.to_vec()).collect();
        for (row, &(s, _)) in rows.iter().zip(batch) {
            status::check_logits(row, width, self.position_of(s) - 1)?;
        }
        Ok(rows)
    }
}

impl BatchForward for GpuModel<'_> {
    fn slots(&self) -> usize {
        self.parked.len()
    }
    fn select(&mut self, slot: usize) {
        assert!(
            slot < self.parked.len(),
            "sequence slot {slot} out of range"
        );
        if slot != self.seq_slot {
            self.parked[self.seq_slot] = (self.pos, self.dirty);
            (self.pos, self.dirty) = self.parked[slot];
            self.seq_slot = slot;
        }
    }
    fn selected(&self) -> usize {
        self.seq_slot
    }
    fn position_of(&self, slot: usize) -> usize {
        if slot == self.seq_slot {
            self.pos
        } else {
            self.parked[slot].0
        }
    }
    fn decode_batch(&mut self, batch: &[(usize, u32)]) -> Result<Vec<Vec<f32>>> {
        GpuModel::decode_batch(self, batch)
    }
}
