//! The CPU-side bookkeeping of a GPU expert cache (no GPU code here).
//!
//! A model larger than GPU memory keeps its routed experts in the mapped container and streams the
//! ones a batch needs into a fixed pool of GPU *slots*. Every routed expert of the model has the same
//! shape, so one slot can hold any `(layer, expert)` key. [`ExpertCache`] decides which slot each
//! needed expert uses and which slots must be (re)loaded first; the GPU side performs the copies and
//! the dispatches.
//!
//! State:
//! - per layer, a map expert id → slot of the resident experts;
//! - per slot, the key it holds (or none) and whether it is *pinned* (a hot set loaded once by
//!   [`ExpertCache::pin`] and never evicted);
//! - one global LRU order over the unpinned resident slots (a [`BTreeMap`] from a monotonically
//!   increasing stamp to the slot, so finding the least recently used slot is `O(log slots)`).
//!
//! The key safety property ([`ExpertCache::plan_layer`]): a batch that needs more experts than the
//! cache can hold at once is split into *rounds*; within one round no slot that was handed out in
//! that round is evicted by a later load of the same round. Evicting a handed-out slot would
//! silently compute with the wrong expert.
use std::collections::BTreeMap;

/// One expert of a round: which slot it uses and whether that slot must be loaded first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Assign {
    /// The routed expert id (within the planned layer).
    pub expert: u32,
    /// The slot index, `0..slots`.
    pub slot: u32,
    /// true: the slot must be (re)loaded with this expert before the round's dispatch
    pub load: bool,
}

/// One dispatch round of a layer's batch: the slots it uses are all distinct, and after the round's
/// loads each [`Assign::slot`] holds its expert until the round has been dispatched.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// the round's experts: hits first (ascending expert id), then loads (ascending expert id)
    pub assign: Vec<Assign>,
}

/// Running totals since [`ExpertCache::new`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounters {
    /// Distinct experts of a planned batch that were already resident (pinned or not).
    pub hits: u64,
    /// Distinct experts of a planned batch that had to be loaded.
    pub misses: u64,
    /// Loads (by [`ExpertCache::plan_layer`] or [`ExpertCache::pin`]) that replaced a resident key.
    pub evictions: u64,
}

/// Errors of [`ExpertCache`]. Nothing in the cache panics on bad input; it reports one of these and
/// leaves the state unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    /// `new` was given zero layers, experts or slots.
    #[error("expert cache: {what} must be at least 1")]
    Zero {
        /// `"n_layers"`, `"n_experts"` or `"slots"`.
        what: &'static str,
    },
    /// A slot count that does not fit a `u32` slot index.
    #[error("expert cache: {slots} slots do not fit a u32 slot index")]
    TooManySlots { slots: usize },
    /// A layer index `>= n_layers`.
    #[error("expert cache: layer {layer} out of range (the model has {n_layers} layers)")]
    Layer { layer: usize, n_layers: usize },
    /// No slot could be handed out although the round had capacity (a broken invariant; the
    /// caller must treat the layer as failed, never compute a partial plan).
    #[error("expert cache: no loadable slot for layer {layer} (internal invariant broken)")]
    NoSlot { layer: usize },
    /// An expert id `>= n_experts`.
    #[error("expert cache: layer {layer}: expert {expert} out of range (the model has {n_experts} routed experts per layer)")]
    Expert {
        layer: usize,
        expert: u32,
        n_experts: usize,
    },
}

/// The slot bookkeeping of a GPU expert cache; see the module docs.
///
/// Invariants (checked by the tests after every operation):
/// - a slot holds at most one key, and `slot_of(layer, expert) == Some(s)` exactly when slot `s`
///   holds `(layer, expert)`;
/// - the pinned slots all hold a key and number at most `slots - 1`, so at least one slot can
///   always be loaded;
/// - every unpinned slot is either free (never loaded) or in the LRU order, never both.
///
/// Cost per operation: `O(k log k + k log slots)` for a batch of `k` experts; memory
/// `O(n_layers × n_experts + slots)`.
#[derive(Debug, Clone)]
pub struct ExpertCache {
    n_layers: usize,
    n_experts: usize,
    /// `map[layer][expert]`: the slot holding that key.
    map: Vec<Vec<Option<u32>>>,
    /// The key each slot holds.
    keys: Vec<Option<(usize, u32)>>,
    pinned: Vec<bool>,
    n_pinned: usize,
    /// The stamp of each slot's entry in `lru` (meaningful only while it is there).
    stamp: Vec<u64>,
    /// Unpinned resident slots by last use, oldest first.
    lru: BTreeMap<u64, u32>,
    next_stamp: u64,
    /// Never-loaded unpinned slots, highest index first (so `pop` hands out the lowest).
    free: Vec<u32>,
    counters: CacheCounters,
}

impl ExpertCache {
    /// An empty cache of `slots` slots for a model of `n_layers` layers with `n_experts` routed
    /// experts each.
    ///
    /// Errors: [`CacheError::Zero`] when any argument is 0; [`CacheError::TooManySlots`] when
    /// `slots` exceeds `u32::MAX`.
    pub fn new(n_layers: usize, n_experts: usize, slots: usize) -> Result<ExpertCache, CacheError> {
        for (what, v) in [
            ("n_layers", n_layers),
            ("n_experts", n_experts),
            ("slots", slots),
        ] {
            if v == 0 {
                return Err(CacheError::Zero { what });
            }
        }
        if u32::try_from(slots).is_err() {
            return Err(CacheError::TooManySlots { slots });
        }
        Ok(ExpertCache {
            n_layers,
            n_experts,
            map: vec![vec![None; n_experts]; n_layers],
            keys: vec![None; slots],
            pinned: vec![false; slots],
            n_pinned: 0,
            stamp: vec![0; slots],
            lru: BTreeMap::new(),
            next_stamp: 0,
            free: (0..slots as u32).rev().collect(),
            counters: CacheCounters::default(),
        })
    }

    /// The number of slots in the pool.
    pub fn slots(&self) -> usize {
        self.keys.len()
    }

    /// The number of pinned slots (at most `slots - 1`).
    pub fn pinned_count(&self) -> usize {
        self.n_pinned
    }

    /// Pin the given `(layer, expert)` keys, in order, skipping duplicates, keys already pinned and
    /// keys out of range, until `max_pinned` slots in total are pinned. `max_pinned` is clamped to
    /// `slots - 1` so at least one slot stays loadable; pins accumulate over calls (there is no
    /// unpin).
    ///
    /// Returns the loads to perform before the next dispatch, with the layer of each: one
    /// `(layer, Assign { load: true, .. })` per newly pinned key that was not resident. A key that
    /// was already resident is pinned in place and needs no load, so it is not returned. Slots for
    /// loads come from the free slots first (lowest index first), then from the least recently
    /// used unpinned slot (an eviction: its key leaves its layer's map and is counted).
    ///
    /// Call it between batches: a slot evicted here may have been handed out by an earlier
    /// [`ExpertCache::plan_layer`] whose rounds were not dispatched yet.
    pub fn pin(&mut self, hot: &[(usize, usize)], max_pinned: usize) -> Vec<(usize, Assign)> {
        let limit = max_pinned.min(self.slots() - 1);
        let mut loads = Vec::new();
        for &(layer, expert) in hot {
            if self.n_pinned >= limit {
                break;
            }
            if layer >= self.n_layers || expert >= self.n_experts {
                continue;
            }
            let expert = expert as u32;
            let slot = match self.map[layer][expert as usize] {
                Some(slot) if self.pinned[slot as usize] => continue,
                Some(slot) => {
                    self.lru_remove(slot);
                    slot
                }
                None => {
                    // At least one unpinned slot exists (n_pinned < limit <= slots - 1), and every
                    // unpinned slot is free or in the LRU, so this cannot fail.
                    let Some(slot) = self.take_slot() else { break };
                    self.install(slot, layer, expert);
                    loads.push((
                        layer,
                        Assign {
                            expert,
                            slot,
                            load: true,
                        },
                    ));
                    slot
                }
            };
            self.pinned[slot as usize] = true;
            self.n_pinned += 1;
        }
        loads
    }

    /// Plan one layer's batch: `experts` are the routed expert ids the batch needs (any order,
    /// duplicates allowed; they are deduplicated). Returns the rounds to run in order (empty when
    /// `experts` is empty); perform each round's loads, then dispatch it, before the next round's
    /// loads.
    ///
    /// Rules:
    /// - every needed expert appears in exactly one round;
    /// - within a round all slots are distinct, and no slot handed out in the round is evicted by a
    ///   later load of the same round;
    /// - all hits (experts of this layer already resident, pinned or not) go into round 0 with
    ///   `load: false`;
    /// - misses (ascending id) fill round 0 up to the number of slots that are free or evictable
    ///   (not pinned, not holding a hit of this round), free slots first, then least recently used;
    ///   the remaining misses go to rounds 1, 2, … of at most `slots − pinned` misses each, where any
    ///   unpinned slot may be evicted (the previous round was already dispatched), LRU first;
    /// - a loaded slot's previous key leaves its layer's map ([`CacheCounters::evictions`]);
    /// - every expert used in a round becomes most recently used, so after the batch the maps reflect
    ///   the last round;
    /// - [`CacheCounters::hits`] / [`CacheCounters::misses`] count distinct experts of the batch.
    ///
    /// Errors (state unchanged): [`CacheError::Layer`] when `layer >= n_layers`,
    /// [`CacheError::Expert`] when an id is `>= n_experts`. Never panics.
    pub fn plan_layer(&mut self, layer: usize, experts: &[u32]) -> Result<Vec<Round>, CacheError> {
        if layer >= self.n_layers {
            return Err(CacheError::Layer {
                layer,
                n_layers: self.n_layers,
            });
        }
        if let Some(&expert) = experts.iter().find(|&&e| e as usize >= self.n_experts) {
            return Err(CacheError::Expert {
                layer,
                expert,
                n_experts: self.n_experts,
            });
        }
        let mut need = experts.to_vec();
        need.sort_unstable();
        need.dedup();
        if need.is_empty() {
            return Ok(Vec::new());
        }

        let mut round0 = Vec::new();
        let mut misses = Vec::new();
        let mut unpinned_hits = 0usize;
        for &expert in &need {
            match self.map[layer][expert as usize] {
                Some(slot) => {
                    if !self.pinned[slot as usize] {
                        // Out of the LRU for the round: a hit cannot be evicted by a load.
                        self.lru_remove(slot);
                        unpinned_hits += 1;
                    }
                    round0.push(Assign {
                        expert,
                        slot,
                        load: false,
                    });
                }
                None => misses.push(expert),
            }
        }
        self.counters.hits += round0.len() as u64;
        self.counters.misses += misses.len() as u64;

        let loadable = self.slots() - self.n_pinned;
        let mut cap = loadable - unpinned_hits;
        let mut rounds = Vec::new();
        let mut pending = misses.as_slice();
        let mut assign = round0;
        loop {
            let (now, rest) = pending.split_at(cap.min(pending.len()));
            for &expert in now {
                // The loads of this round are taken out of the LRU (or the free list) and put back
                // only after the round, so a later load of the round cannot evict them. `cap` is
                // the number of free + LRU slots at the round's start, so this never fails.
                let Some(slot) = self.take_slot() else {
                    unreachable_state();
                    return Err(CacheError::NoSlot { layer });
                };
                self.install(slot, layer, expert);
                assign.push(Assign {
                    expert,
                    slot,
                    load: true,
                });
            }
            pending = rest;
            // Every expert of the round becomes most recently used (hits first, then loads).
            for a in &assign {
                if !self.pinned[a.slot as usize] {
                    self.lru_push(a.slot);
                }
            }
            rounds.push(Round {
                assign: std::mem::take(&mut assign),
            });
            if pending.is_empty() {
                break;
            }
            cap = loadable;
        }
        Ok(rounds)
    }

    /// Empty `slot` (unpinning it if pinned): its key leaves its layer's map, so the next request
    /// for that expert is a miss. Used when a planned load did not happen (a failed upload): the
    /// slot's bytes are not the expert the plan installed. No-op for a slot out of range or
    /// already empty.
    pub fn forget(&mut self, slot: u32) {
        let s = slot as usize;
        if s >= self.keys.len() {
            return;
        }
        let Some((l, e)) = self.keys[s].take() else {
            return;
        };
        self.map[l][e as usize] = None;
        if self.pinned[s] {
            self.pinned[s] = false;
            self.n_pinned -= 1;
        } else {
            self.lru_remove(slot);
        }
        // keep `free` sorted highest first, so `pop` still hands out the lowest free slot
        let at = self.free.partition_point(|&f| f > slot);
        self.free.insert(at, slot);
    }

    /// [`ExpertCache::forget`] every slot holding an expert of `layer` (pinned or not): after a
    /// failed layer, none of its slots can be trusted to hold what the cache says.
    pub fn forget_layer(&mut self, layer: usize) {
        let Some(row) = self.map.get(layer) else {
            return;
        };
        let slots: Vec<u32> = row.iter().flatten().copied().collect();
        for s in slots {
            self.forget(s);
        }
    }

    /// The slot holding `(layer, expert)`, or `None` when it is not resident or out of range.
    pub fn slot_of(&self, layer: usize, expert: u32) -> Option<u32> {
        *self.map.get(layer)?.get(expert as usize)?
    }

    /// Whether `slot` is pinned (`false` for a slot out of range).
    pub fn is_pinned(&self, slot: u32) -> bool {
        self.pinned.get(slot as usize).copied().unwrap_or(false)
    }

    /// The running totals since [`ExpertCache::new`].
    pub fn counters(&self) -> CacheCounters {
        self.counters
    }

    /// Which key each slot holds (None = empty): for tests and debugging.
    pub fn slot_keys(&self) -> Vec<Option<(usize, u32)>> {
        self.keys.clone()
    }

    /// A slot to load: the lowest free slot, else the least recently used unpinned slot (its key
    /// is dropped from its layer's map and counted as an eviction). Removed from both lists.
    fn take_slot(&mut self) -> Option<u32> {
        if let Some(slot) = self.free.pop() {
            return Some(slot);
        }
        let (_, slot) = self.lru.pop_first()?;
        if let Some((l, e)) = self.keys[slot as usize].take() {
            self.map[l][e as usize] = None;
            self.counters.evictions += 1;
        }
        Some(slot)
    }

    /// Record that `slot` now holds `(layer, expert)` (its previous key was already dropped).
    fn install(&mut self, slot: u32, layer: usize, expert: u32) {
        self.keys[slot as usize] = Some((layer, expert));
        self.map[layer][expert as usize] = Some(slot);
    }

    fn lru_remove(&mut self, slot: u32) {
        self.lru.remove(&self.stamp[slot as usize]);
    }

    /// Insert `slot` as the most recently used.
    fn lru_push(&mut self, slot: u32) {
        let s = self.next_stamp;
        self.next_stamp += 1;
        self.stamp[slot as usize] = s;
        self.lru.insert(s, slot);
    }
}

/// Reached only if the free/LRU accounting were broken; debug builds stop, release builds plan a
/// shorter round rather than panic.
#[inline]
fn unreachable_state() {
    debug_assert!(
        false,
        "expert cache: no loadable slot although the round had capacity"
    );
}
