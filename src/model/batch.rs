//! Several sequences held at once (continuous batching): a backend with `slots()` sequence
//! slots, each with its own KV cache and conv states. [`crate::model::Forward`]'s methods act on
//! the selected slot; [`BatchForward::decode_batch`] feeds one token to each of several slots in
//! one step, so the weights are read once for all of them.
use super::cache::Cache;
use super::cpu::CpuModel;
use super::Forward;
use anyhow::{ensure, Result};

/// A forward backend with sequence slots.
pub trait BatchForward: Forward {
    /// How many sequences it holds (at least 1).
    fn slots(&self) -> usize;
    /// Make `slot` the sequence that [`Forward`]'s methods (forward, reset, position, the greedy
    /// pipeline) act on. Panics when `slot >= slots()` (a caller bug).
    fn select(&mut self, slot: usize);
    /// The selected slot.
    fn selected(&self) -> usize;
    /// Tokens consumed so far by `slot`'s sequence.
    fn position_of(&self, slot: usize) -> usize;
    /// Feed one token to each `(slot, token)` (slots distinct, each holding at least one token)
    /// and return the logits after each (`config.logits_width()` values), in the order given.
    /// The tokens of one call are decoded together (one GPU step); every slot's result equals
    /// feeding it alone. Errors: a repeated or unknown slot, a slot with an empty sequence, and
    /// what [`Forward::forward`] refuses.
    fn decode_batch(&mut self, batch: &[(usize, u32)]) -> Result<Vec<Vec<f32>>>;
}

/// Check `batch` against `slots` slots whose positions `pos` gives: slots distinct, known and
/// holding a sequence.
pub fn check_batch(
    batch: &[(usize, u32)],
    slots: usize,
    pos: impl Fn(usize) -> usize,
) -> Result<()> {
    ensure!(!batch.is_empty(), "a decode batch has no tokens");
    for (i, &(s, _)) in batch.iter().enumerate() {
        ensure!(
            s < slots,
            "decode batch: slot {s} of a model with {slots} slots"
        );
        ensure!(
            !batch[..i].iter().any(|&(o, _)| o == s),
            "decode batch: slot {s} given twice"
        );
        ensure!(
            pos(s) > 0,
            "decode batch: slot {s} holds no sequence (prefill it first)"
        );
    }
    Ok(())
}

/// The CPU forward with `n` slots: one [`Cache`] per slot, swapped into the [`CpuModel`] when
/// its slot is selected.
pub struct CpuSlots<'w, 'a> {
    model: CpuModel<'w, 'a>,
    /// The caches of the slots not selected (`parked[selected]` is a placeholder).
    parked: Vec<Cache>,
    selected: usize,
}

impl<'w, 'a> CpuSlots<'w, 'a> {
    /// `n` empty slots over `model`'s weights (slot 0 selected). Errors: `n` zero.
    pub fn new(model: CpuModel<'w, 'a>, n: usize) -> Result<CpuSlots<'w, 'a>> {
        ensure!(n >= 1, "a model needs at least one sequence slot");
        let cfg = &model.weights.config;
        let parked = (0..n).map(|_| Cache::new(cfg)).collect();
        let mut m = CpuSlots {
            model,
            parked,
            selected: 0,
        };
        m.model.reset();
        Ok(m)
    }
}

impl Forward for CpuSlots<'_, '_> {
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        Ok(self.model.forward(tokens)?)
    }
    fn forward_all(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        Ok(self.model.forward_all(tokens)?)
    }
    fn reset(&mut self) {
        self.model.reset()
    }
    fn position(&self) -> usize {
        self.model.position()
    }
    fn backend(&self) -> &'static str {
        "cpu"
    }
    fn adapter(&self) -> String {
        "host CPU (f32 reference forward)".into()
    }
}

impl BatchForward for CpuSlots<'_, '_> {
    fn slots(&self) -> usize {
        self.parked.len()
    }
    fn select(&mut self, slot: usize) {
        assert!(slot < self.parked.len(), "slot {slot} out of range");
        if slot != self.selected {
            std::mem::swap(&mut self.model.cache, &mut self.parked[self.selected]);
            std::mem::swap(&mut self.model.cache, &mut self.parked[slot]);
            self.selected = slot;
        }
    }
    fn selected(&self) -> usize {
        self.selected
    }
    fn position_of(&self, slot: usize) -> usize {
        if slot == self.selected {
            self.model.position()
        } else {
            self.parked[slot].pos
        }
    }
    fn decode_batch(&mut self, batch: &[(usize, u32)]) -> Result<Vec<Vec<f32>>> {
        check_batch(batch, self.slots(), |s| self.position_of(s))?;
        let keep = self.selected;
        let mut out = Vec::with_capacity(batch.len());
        for &(s, id) in batch {
            self.select(s);
            let r = self.model.forward(&[id]);
            match r {
                Ok(l) => out.push(l),
                Err(e) => {
                    self.select(keep);
                    return Err(e.into());
                }
            }
        }
        self.select(keep);
        Ok(out)
    }
}

/// Any [`Forward`] as a [`BatchForward`] of one slot (a batch is at most one token).
pub struct OneSlot<'m>(pub &'m mut dyn Forward);

impl Forward for OneSlot<'_> {
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.0.forward(tokens)
    }
    fn forward_all(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.0.forward_all(tokens)
    }
    fn forward_greedy(&mut self, tokens: &[u32]) -> Result<u32> {
        self.0.forward_greedy(tokens)
    }
    fn greedy_pipeline(&mut self) -> Option<&mut dyn super::GreedyPipeline> {
        self.0.greedy_pipeline()
    }
    fn reset(&mut self) {
        self.0.reset()
    }
    fn position(&self) -> usize {
        self.0.position()
    }
    fn backend(&self) -> &'static str {
        self.0.backend()
    }
    fn adapter(&self) -> String {
        self.0.adapter()
    }
    fn stream_stats(&self) -> Option<super::stream::StreamStats> {
        self.0.stream_stats()
    }
}

impl BatchForward for OneSlot<'_> {
    fn slots(&self) -> usize {
        1
    }
    fn select(&mut self, slot: usize) {
        assert_eq!(slot, 0, "slot {slot} of a model with one slot");
    }
    fn selected(&self) -> usize {
        0
    }
    fn position_of(&self, slot: usize) -> usize {
        assert_eq!(slot, 0, "slot {slot} of a model with one slot");
        self.0.position()
    }
    fn decode_batch(&mut self, batch: &[(usize, u32)]) -> Result<Vec<Vec<f32>>> {
        check_batch(batch, 1, |_| self.0.position())?;
        Ok(vec![self.0.forward(&[batch[0].1])?])
    }
}
