//! Expert cache planning (rounds, hits, LRU, pinning; a simulated GPU checked at every dispatch,
//! fixed and randomized, against a naive reference) and the usage file (round trip, errors,
//! ranking, fingerprint).
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use inkling_wgpu::model::expert_cache::{Assign, CacheCounters, ExpertCache, Round};
use inkling_wgpu::model::usage::{
    fingerprint, load_or_warn, Usage, UsageErrorKind, USAGE_FILE, USAGE_FORMAT,
};

type Gpu = Vec<Option<(usize, u32)>>;

/// Plan `experts` for `layer`, run the rounds on the simulated `gpu` (each round: its loads, then
/// its "dispatch"), and check every invariant that does not need a reference model. Returns the
/// rounds.
fn run_batch(cache: &mut ExpertCache, gpu: &mut Gpu, layer: usize, experts: &[u32]) -> Vec<Round> {
    assert_eq!(&cache.slot_keys(), gpu, "the simulated GPU starts in sync");
    let before = cache.counters();
    let need: BTreeSet<u32> = experts.iter().copied().collect();
    let hits: BTreeSet<u32> = need
        .iter()
        .copied()
        .filter(|&e| gpu.contains(&Some((layer, e))))
        .collect();
    let pinned = (0..cache.slots() as u32)
        .filter(|&s| cache.is_pinned(s))
        .count();
    let unpinned_hits = hits
        .iter()
        .filter(|&&e| !cache.is_pinned(cache.slot_of(layer, e).unwrap()))
        .count();
    let pinned_keys: Vec<_> = (0..cache.slots())
        .filter(|&s| cache.is_pinned(s as u32))
        .map(|s| (s, gpu[s]))
        .collect();

    let rounds = cache.plan_layer(layer, experts).unwrap();
    let mut seen = BTreeSet::new();
    let mut evictions = 0u64;
    for (r, round) in rounds.iter().enumerate() {
        assert!(!round.assign.is_empty(), "round {r} is empty");
        let slots: BTreeSet<u32> = round.assign.iter().map(|a| a.slot).collect();
        assert_eq!(
            slots.len(),
            round.assign.len(),
            "round {r}: slots not distinct"
        );
        // Hits first (ascending), then loads (ascending).
        let n_hits = round.assign.iter().take_while(|a| !a.load).count();
        assert!(round.assign[n_hits..].iter().all(|a| a.load));
        for part in [&round.assign[..n_hits], &round.assign[n_hits..]] {
            assert!(part.windows(2).all(|w| w[0].expert < w[1].expert));
        }
        if r == 0 {
            let got: BTreeSet<u32> = round.assign[..n_hits].iter().map(|a| a.expert).collect();
            assert_eq!(got, hits, "round 0 must hold exactly the hits");
            // Round 0 takes as many misses as there are free or evictable slots.
            if rounds.len() > 1 {
                assert_eq!(
                    round.assign.len() - n_hits,
                    cache.slots() - pinned - unpinned_hits
                );
            }
        } else {
            assert_eq!(n_hits, 0, "round {r} has a hit");
            assert!(round.assign.len() <= cache.slots() - pinned);
            if r + 1 < rounds.len() {
                assert_eq!(round.assign.len(), cache.slots() - pinned);
            }
        }
        for a in &round.assign {
            assert!(seen.insert(a.expert), "expert {} in two rounds", a.expert);
            if a.load {
                assert!(!hits.contains(&a.expert), "hit {} reloaded", a.expert);
                if gpu[a.slot as usize].is_some() {
                    evictions += 1;
                }
                gpu[a.slot as usize] = Some((layer, a.expert));
            }
        }
        // Dispatch: every slot handed out in the round holds exactly its expert.
        for a in &round.assign {
            assert_eq!(
                gpu[a.slot as usize],
                Some((layer, a.expert)),
                "round {r}: slot {} was overwritten before dispatch",
                a.slot
            );
        }
    }
    assert_eq!(seen, need, "every needed expert exactly once");
    for (s, key) in pinned_keys {
        assert_eq!(gpu[s], key, "pinned slot {s} changed");
    }
    assert_eq!(&cache.slot_keys(), gpu, "the cache's view is the GPU's");
    check_maps(cache);
    let after = cache.counters();
    assert_eq!(after.hits - before.hits, hits.len() as u64);
    assert_eq!(
        after.misses - before.misses,
        (need.len() - hits.len()) as u64
    );
    assert_eq!(after.evictions - before.evictions, evictions);
    rounds
}

/// `slot_of` and `slot_keys` agree, in both directions.
fn check_maps(cache: &ExpertCache) {
    let keys = cache.slot_keys();
    for (s, key) in keys.iter().enumerate() {
        if let Some((l, e)) = *key {
            assert_eq!(cache.slot_of(l, e), Some(s as u32));
        } else {
            assert!(!cache.is_pinned(s as u32), "pinned slot {s} is empty");
        }
    }
}

fn a(expert: u32, slot: u32, load: bool) -> Assign {
    Assign { expert, slot, load }
}

fn plan(assign: Vec<Assign>) -> Round {
    Round { assign }
}

#[test]
fn expert_cache_two_slots_five_experts_take_three_rounds() {
    let mut cache = ExpertCache::new(1, 8, 2).unwrap();
    let mut gpu = vec![None; 2];
    let rounds = run_batch(&mut cache, &mut gpu, 0, &[4, 1, 3, 1, 0, 2, 4]);
    let sizes: Vec<usize> = rounds.iter().map(|r| r.assign.len()).collect();
    assert_eq!(sizes, [2, 2, 1]);
    assert_eq!(
        rounds,
        vec![
            plan(vec![a(0, 0, true), a(1, 1, true)]),
            // Expert 0 was stamped before expert 1, so slot 0 is the LRU one.
            plan(vec![a(2, 0, true), a(3, 1, true)]),
            plan(vec![a(4, 0, true)]),
        ]
    );
    assert_eq!(cache.slot_keys(), vec![Some((0, 4)), Some((0, 3))]);
    assert_eq!(
        cache.counters(),
        CacheCounters {
            hits: 0,
            misses: 5,
            evictions: 3
        }
    );
    assert_eq!(cache.slot_of(0, 0), None, "evicted keys leave the map");
    assert_eq!(cache.plan_layer(0, &[]).unwrap(), vec![]);
}

#[test]
fn expert_cache_hits_go_to_round_zero_and_are_not_reloaded() {
    let mut cache = ExpertCache::new(2, 16, 4).unwrap();
    let mut gpu = vec![None; 4];
    run_batch(&mut cache, &mut gpu, 0, &[2, 0, 1]);
    assert_eq!(
        cache.slot_keys(),
        vec![Some((0, 0)), Some((0, 1)), Some((0, 2)), None]
    );
    let rounds = run_batch(&mut cache, &mut gpu, 0, &[8, 2, 5, 1, 7, 2]);
    assert_eq!(
        rounds,
        vec![
            // Hits 1, 2 stay; room for two misses: the free slot 3, then the LRU slot 0.
            plan(vec![
                a(1, 1, false),
                a(2, 2, false),
                a(5, 3, true),
                a(7, 0, true)
            ]),
            // Round 1 may evict anything unpinned: the LRU is expert 1's slot.
            plan(vec![a(8, 1, true)]),
        ]
    );
    assert_eq!(
        cache.counters(),
        CacheCounters {
            hits: 2,
            misses: 6,
            evictions: 2
        }
    );
    // All hits: one round, no loads, nothing changes.
    let keys = cache.slot_keys();
    let rounds = run_batch(&mut cache, &mut gpu, 0, &[2, 7, 2]);
    assert_eq!(rounds, vec![plan(vec![a(2, 2, false), a(7, 0, false)])]);
    assert_eq!(cache.slot_keys(), keys);
    // The same expert id of another layer is a miss.
    let rounds = run_batch(&mut cache, &mut gpu, 1, &[2]);
    assert_eq!(
        rounds,
        vec![plan(vec![a(2, 3, true)])],
        "slot 3 (expert 5) was the LRU"
    );
    assert_eq!(cache.slot_of(0, 5), None);
}

#[test]
fn expert_cache_lru_evicts_the_least_recently_used_across_layers() {
    let mut cache = ExpertCache::new(3, 8, 3).unwrap();
    let mut gpu = vec![None; 3];
    for e in 0..3 {
        run_batch(&mut cache, &mut gpu, 0, &[e]);
    }
    run_batch(&mut cache, &mut gpu, 0, &[0]); // touch expert 0: now 1 is the LRU
    let rounds = run_batch(&mut cache, &mut gpu, 2, &[6]);
    assert_eq!(rounds, vec![plan(vec![a(6, 1, true)])]);
    assert_eq!(cache.slot_of(0, 1), None);
    let rounds = run_batch(&mut cache, &mut gpu, 1, &[3]);
    assert_eq!(rounds, vec![plan(vec![a(3, 2, true)])], "then expert 2");
    let rounds = run_batch(&mut cache, &mut gpu, 1, &[4]);
    assert_eq!(rounds, vec![plan(vec![a(4, 0, true)])], "then expert 0");
    assert_eq!(
        cache.slot_keys(),
        vec![Some((1, 4)), Some((2, 6)), Some((1, 3))]
    );
    assert_eq!(cache.counters().evictions, 3);
}

#[test]
fn expert_cache_pinned_slots_are_never_evicted_and_pin_clamps() {
    let mut cache = ExpertCache::new(2, 10, 3).unwrap();
    // Duplicates and out-of-range keys are skipped; at most slots - 1 = 2 pins.
    let loads = cache.pin(
        &[(0, 0), (0, 0), (9, 9), (0, 10), (1, 4), (0, 2), (0, 3)],
        100,
    );
    assert_eq!(loads, vec![(0, a(0, 0, true)), (1, a(4, 1, true))]);
    assert!(cache.is_pinned(0) && cache.is_pinned(1) && !cache.is_pinned(2));
    assert!(!cache.is_pinned(99));
    assert_eq!(cache.pinned_count(), 2);
    assert!(
        cache.pin(&[(0, 5)], 100).is_empty(),
        "no room for more pins"
    );
    let mut gpu = vec![Some((0, 0)), Some((1, 4)), None];
    // Pinned hits stay in round 0; one unpinned slot takes one miss per round.
    let rounds = run_batch(&mut cache, &mut gpu, 0, &[6, 0, 5]);
    assert_eq!(
        rounds,
        vec![
            plan(vec![a(0, 0, false), a(5, 2, true)]),
            plan(vec![a(6, 2, true)]),
        ]
    );
    for layer in 0..2 {
        run_batch(&mut cache, &mut gpu, layer, &[1, 2, 3, 4, 7, 8, 9]);
    }
    assert_eq!(cache.slot_of(0, 0), Some(0));
    assert_eq!(cache.slot_of(1, 4), Some(1));

    // max_pinned below the clamp; a resident key is pinned in place (no load); a single slot
    // cannot be pinned at all.
    let mut cache = ExpertCache::new(1, 10, 4).unwrap();
    let mut gpu = vec![None; 4];
    run_batch(&mut cache, &mut gpu, 0, &[3, 7]);
    let loads = cache.pin(&[(0, 7), (0, 1), (0, 2)], 2);
    assert_eq!(loads, vec![(0, a(1, 2, true))]);
    assert!(cache.is_pinned(1) && cache.is_pinned(2));
    assert!(!cache.is_pinned(0) && !cache.is_pinned(3));
    let mut one = ExpertCache::new(1, 4, 1).unwrap();
    assert!(one.pin(&[(0, 0)], 5).is_empty());
    assert!(!one.is_pinned(0));
    assert_eq!(one.plan_layer(0, &[0, 1]).unwrap().len(), 2);
}

#[test]
fn expert_cache_pin_evicts_the_lru_when_no_slot_is_free() {
    let mut cache = ExpertCache::new(1, 10, 3).unwrap();
    let mut gpu = vec![None; 3];
    run_batch(&mut cache, &mut gpu, 0, &[0, 1, 2]);
    run_batch(&mut cache, &mut gpu, 0, &[0]);
    let loads = cache.pin(&[(0, 9)], 1);
    assert_eq!(loads, vec![(0, a(9, 1, true))], "expert 1 was the LRU");
    assert_eq!(cache.slot_of(0, 1), None);
    assert_eq!(cache.counters().evictions, 1);
    check_maps(&cache);
}

#[test]
fn expert_cache_rejects_bad_arguments_without_changing_state() {
    assert!(ExpertCache::new(0, 4, 4).is_err());
    assert!(ExpertCache::new(4, 0, 4).is_err());
    assert!(ExpertCache::new(4, 4, 0).is_err());
    let mut cache = ExpertCache::new(2, 4, 2).unwrap();
    cache.plan_layer(0, &[1]).unwrap();
    let (keys, counters) = (cache.slot_keys(), cache.counters());
    let err = cache.plan_layer(2, &[0]).unwrap_err().to_string();
    assert!(err.contains("layer 2"), "{err}");
    let err = cache.plan_layer(1, &[0, 3, 4]).unwrap_err().to_string();
    assert!(err.contains("expert 4"), "{err}");
    assert_eq!(cache.slot_keys(), keys);
    assert_eq!(cache.counters(), counters);
    assert_eq!(cache.slot_of(5, 0), None);
    assert_eq!(cache.slot_of(0, 99), None);
}

/// xorshift64*.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The rules of `plan_layer` written the slow, obvious way: a last-use time per slot and a linear
/// scan for the minimum.
struct Reference {
    keys: Gpu,
    pinned: Vec<bool>,
    /// `None`: never used (free).
    last_use: Vec<Option<u64>>,
    clock: u64,
}

impl Reference {
    fn plan(&mut self, layer: usize, experts: &[u32]) -> Vec<Round> {
        let need: BTreeSet<u32> = experts.iter().copied().collect();
        if need.is_empty() {
            return Vec::new();
        }
        let slot_of = |keys: &Gpu, e: u32| keys.iter().position(|k| *k == Some((layer, e)));
        let mut rounds = Vec::new();
        let mut assign: Vec<Assign> = need
            .iter()
            .filter_map(|&e| slot_of(&self.keys, e).map(|s| a(e, s as u32, false)))
            .collect();
        let mut misses: Vec<u32> = need
            .iter()
            .copied()
            .filter(|&e| slot_of(&self.keys, e).is_none())
            .collect();
        loop {
            let mut used: Vec<bool> = vec![false; self.keys.len()];
            for x in &assign {
                used[x.slot as usize] = true;
            }
            while !misses.is_empty() {
                let candidates = (0..self.keys.len()).filter(|&s| !self.pinned[s] && !used[s]);
                let free = candidates.clone().find(|&s| self.last_use[s].is_none());
                let Some(s) = free.or_else(|| candidates.min_by_key(|&s| self.last_use[s])) else {
                    break;
                };
                let e = misses.remove(0);
                used[s] = true;
                self.keys[s] = Some((layer, e));
                assign.push(a(e, s as u32, true));
            }
            for x in &assign {
                self.clock += 1;
                self.last_use[x.slot as usize] = Some(self.clock);
            }
            rounds.push(plan(std::mem::take(&mut assign)));
            if misses.is_empty() {
                return rounds;
            }
        }
    }
}

#[test]
fn expert_cache_randomized_rounds_match_a_reference_and_never_clobber_a_slot() {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut batches = 0;
    let mut multi_round = 0;
    let mut all_hits = 0;
    let mut all_evictions = 0;
    for case in 0..300 {
        let slots = 1 + rng.below(7);
        let n_layers = 1 + rng.below(6);
        let n_experts = 1 + rng.below(24);
        let mut cache = ExpertCache::new(n_layers, n_experts, slots).unwrap();
        let mut gpu: Gpu = vec![None; slots];
        let mut reference = Reference {
            keys: vec![None; slots],
            pinned: vec![false; slots],
            last_use: vec![None; slots],
            clock: 0,
        };
        let mut warmup = 0;
        if case % 2 == 0 {
            // Warm up a little so pinning meets resident keys and evictions too.
            warmup = rng.below(3);
        }
        let mut total = CacheCounters::default();
        for step in 0..40 {
            if step == warmup && case % 2 == 0 {
                let hot: Vec<(usize, usize)> = (0..rng.below(2 * slots + 1))
                    .map(|_| (rng.below(n_layers + 1), rng.below(n_experts + 1)))
                    .collect();
                let max = rng.below(slots + 2);
                let before = cache.counters();
                let pinned_before: Vec<bool> =
                    (0..slots as u32).map(|s| cache.is_pinned(s)).collect();
                let loads = cache.pin(&hot, max);
                let n_pinned = (0..slots as u32).filter(|&s| cache.is_pinned(s)).count();
                assert!(n_pinned <= max.min(slots - 1));
                for (layer, x) in &loads {
                    assert!(x.load && cache.is_pinned(x.slot));
                    assert!(!pinned_before[x.slot as usize]);
                    if gpu[x.slot as usize].is_some() {
                        total.evictions += 1;
                    }
                    gpu[x.slot as usize] = Some((*layer, x.expert));
                    reference.keys[x.slot as usize] = Some((*layer, x.expert));
                }
                for s in 0..slots {
                    reference.pinned[s] = cache.is_pinned(s as u32);
                }
                assert_eq!(cache.counters().hits, before.hits);
                assert_eq!(cache.counters().misses, before.misses);
                assert_eq!(cache.slot_keys(), gpu);
                check_maps(&cache);
            }
            let layer = rng.below(n_layers);
            let len = rng.below(2 * slots + 3);
            // Skewed ids so hits happen, with duplicates.
            let experts: Vec<u32> = (0..len)
                .map(|_| {
                    let top = 1 + rng.below(n_experts);
                    rng.below(top) as u32
                })
                .collect();
            let before = cache.counters();
            let rounds = run_batch(&mut cache, &mut gpu, layer, &experts);
            let expected = reference.plan(layer, &experts);
            assert_eq!(rounds, expected, "case {case} step {step}: {experts:?}");
            assert_eq!(reference.keys, gpu);
            let after = cache.counters();
            total.hits += after.hits - before.hits;
            total.misses += after.misses - before.misses;
            total.evictions += after.evictions - before.evictions;
            batches += 1;
            multi_round += usize::from(rounds.len() > 1);
        }
        assert_eq!(cache.counters(), total, "case {case}: counters add up");
        all_hits += total.hits;
        all_evictions += total.evictions;
    }
    assert_eq!(batches, 300 * 40);
    assert!(multi_round > 1000, "only {multi_round} multi-round batches");
    assert!(
        all_hits > 1000 && all_evictions > 1000,
        "{all_hits} hits, {all_evictions} evictions"
    );
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "inkling-wgpu-test-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn sample_usage() -> Usage {
    let mut u = Usage::new("0123456789abcdef", 2, 3);
    for (l, e, n) in [(0, 1, 3), (1, 0, 5), (1, 2, 3), (0, 2, 1)] {
        for _ in 0..n {
            u.record(l, e);
        }
    }
    u
}

#[test]
fn usage_round_trip_and_missing_file() {
    let dir = TempDir::new("usage-rt");
    let path = dir.0.join(USAGE_FILE);
    assert!(Usage::load(&path, "0123456789abcdef", 2, 3)
        .unwrap()
        .is_none());
    assert!(load_or_warn(&path, "0123456789abcdef", 2, 3).is_none());
    let u = sample_usage();
    assert_eq!(u.counts, vec![vec![0, 3, 1], vec![5, 0, 3]]);
    u.save(&path).unwrap();
    assert!(!dir.0.join(format!("{USAGE_FILE}.tmp")).exists());
    let back = Usage::load(&path, "0123456789abcdef", 2, 3)
        .unwrap()
        .unwrap();
    assert_eq!(back, u);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(json["format"], USAGE_FORMAT);
    assert_eq!(json["counts"][1][0], 5);
    assert_eq!(
        load_or_warn(&path, "0123456789abcdef", 2, 3),
        Some(u.clone())
    );
    // Saving again replaces the file.
    let mut v = u.clone();
    v.record(0, 0);
    v.save(&path).unwrap();
    assert_eq!(
        Usage::load(&path, "0123456789abcdef", 2, 3).unwrap(),
        Some(v)
    );
}

#[test]
fn usage_bad_files_are_errors_and_load_or_warn_ignores_them() {
    let dir = TempDir::new("usage-bad");
    let path = dir.0.join(USAGE_FILE);
    let good = serde_json::json!({
        "format": USAGE_FORMAT, "fingerprint": "0123456789abcdef",
        "n_layers": 2, "n_experts": 3, "counts": [[0, 3, 1], [5, 0, 3]],
    });
    let with = |key: &str, value: serde_json::Value| {
        let mut v = good.clone();
        v[key] = value;
        v.to_string()
    };
    let cases: Vec<(&str, String)> = vec![
        (
            "corrupt",
            "{\"format\": \"inkling-wgpu-usage/1\", \"counts\": [[1,".into(),
        ),
        (
            "not a number",
            with("counts", serde_json::json!([[0, "x", 1], [5, 0, 3]])),
        ),
        (
            "format",
            with("format", serde_json::json!("inkling-wgpu-usage/2")),
        ),
        ("format missing", {
            let mut v = good.clone();
            v.as_object_mut().unwrap().remove("format");
            v.to_string()
        }),
        ("rows", with("counts", serde_json::json!([[0, 3, 1]]))),
        (
            "row length",
            with("counts", serde_json::json!([[0, 3, 1], [5, 0]])),
        ),
        (
            "fingerprint",
            with("fingerprint", serde_json::json!("fedcba9876543210")),
        ),
        ("n_layers", with("n_layers", serde_json::json!(3))),
        ("n_experts", with("n_experts", serde_json::json!(4))),
    ];
    for (what, text) in cases {
        std::fs::write(&path, &text).unwrap();
        let err = Usage::load(&path, "0123456789abcdef", 2, 3).unwrap_err();
        let ok = match (what, &err.kind) {
            ("corrupt" | "not a number", UsageErrorKind::Json(_)) => true,
            ("format" | "format missing", UsageErrorKind::Format { .. }) => true,
            ("rows" | "row length", UsageErrorKind::Shape(_)) => true,
            (_, UsageErrorKind::Mismatch { field, .. }) => *field == what,
            _ => false,
        };
        assert!(ok, "{what}: wrong error {err:?}");
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{what}: {msg}");
        assert!(
            load_or_warn(&path, "0123456789abcdef", 2, 3).is_none(),
            "{what}"
        );
    }
    // The good file itself loads (so the cases above fail for their own reason).
    std::fs::write(&path, good.to_string()).unwrap();
    assert_eq!(
        Usage::load(&path, "0123456789abcdef", 2, 3).unwrap(),
        Some(sample_usage())
    );
}

#[test]
fn usage_ranked_record_and_merge() {
    let u = sample_usage();
    // 5 at (1,0); ties of 3 by key: (0,1) before (1,2); then 1 at (0,2); zeros left out.
    assert_eq!(u.ranked(), vec![(1, 0), (0, 1), (1, 2), (0, 2)]);
    let mut v = u.clone();
    v.record(2, 0);
    v.record(0, 3);
    assert_eq!(v, u, "out-of-range records are ignored");
    let mut other = Usage::new("0123456789abcdef", 2, 3);
    other.record(0, 0);
    other.counts[0][2] = 9;
    v.merge(&other);
    assert_eq!(v.counts, vec![vec![1, 3, 10], vec![5, 0, 3]]);
    assert_eq!(v.ranked(), vec![(0, 2), (1, 0), (0, 1), (1, 2), (0, 0)]);
    assert!(Usage::new("x", 2, 2).ranked().is_empty());
}

#[test]
fn usage_fingerprint_follows_config_and_shard_lengths() {
    let dir = TempDir::new("usage-fp");
    let d = dir.0.as_path();
    let err = fingerprint(d).unwrap_err();
    assert!(err.to_string().contains("config.json"), "{err}");
    // FNV-1a 64 reference values: "" and "a".
    std::fs::write(d.join("config.json"), "").unwrap();
    assert_eq!(fingerprint(d).unwrap(), "cbf29ce484222325");
    std::fs::write(d.join("config.json"), "a").unwrap();
    assert_eq!(fingerprint(d).unwrap(), "af63dc4c8601ec8c");

    let write = |name: &str, bytes: &[u8]| std::fs::write(d.join(name), bytes).unwrap();
    write("config.json", br#"{"num_experts": 8}"#);
    write("model-00002-of-00002.safetensors", &[0u8; 10]);
    write("model-00001-of-00002.safetensors", &[0u8; 20]);
    let fp = fingerprint(d).unwrap();
    assert_eq!(fp.len(), 16);
    assert!(fp.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(fingerprint(d).unwrap(), fp, "stable");
    write("README.md", b"not part of it");
    write(USAGE_FILE, b"{}");
    assert_eq!(fingerprint(d).unwrap(), fp, "other files do not count");
    // Same lengths, different contents: the same fingerprint (it reads no weights).
    write("model-00001-of-00002.safetensors", &[7u8; 20]);
    assert_eq!(fingerprint(d).unwrap(), fp);
    write("model-00001-of-00002.safetensors", &[0u8; 21]);
    let fp_len = fingerprint(d).unwrap();
    assert_ne!(fp_len, fp, "a shard length changes it");
    write("model-00001-of-00002.safetensors", &[0u8; 20]);
    assert_eq!(fingerprint(d).unwrap(), fp);
    write("config.json", br#"{"num_experts": 9}"#);
    assert_ne!(fingerprint(d).unwrap(), fp, "config.json changes it");
    write("config.json", br#"{"num_experts": 8}"#);
    assert_eq!(fingerprint(d).unwrap(), fp);
    std::fs::remove_file(d.join("model-00002-of-00002.safetensors")).unwrap();
    assert_ne!(fingerprint(d).unwrap(), fp, "a removed shard changes it");
    check_fp_manually(d, &fp);
}

/// The definition spelled out: config bytes, then (name, u64 LE length) per shard, sorted by name.
fn check_fp_manually(d: &Path, full: &str) {
    let fnv = |bytes: &[u8]| {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        format!("{h:016x}")
    };
    let mut bytes = br#"{"num_experts": 8}"#.to_vec();
    bytes.extend_from_slice(b"model-00001-of-00002.safetensors");
    bytes.extend_from_slice(&20u64.to_le_bytes());
    assert_eq!(fingerprint(d).unwrap(), fnv(&bytes));
    bytes.extend_from_slice(b"model-00002-of-00002.safetensors");
    bytes.extend_from_slice(&10u64.to_le_bytes());
    assert_eq!(fnv(&bytes), full, "the two-shard fingerprint");
}

#[test]
fn expert_cache_forget_turns_a_planned_load_back_into_a_miss() {
    let mut c = ExpertCache::new(2, 8, 3).unwrap();
    let pins = c.pin(&[(1, 7)], 1);
    assert_eq!(pins.len(), 1);
    let pinned_slot = pins[0].1.slot;
    let r = c.plan_layer(0, &[2, 3]).unwrap();
    assert_eq!(r.len(), 1);
    let s2 = c.slot_of(0, 2).unwrap();
    // the upload of expert 2 "failed": forget its slot
    c.forget(s2);
    assert_eq!(c.slot_of(0, 2), None);
    assert_eq!(c.slot_keys()[s2 as usize], None);
    // asking again is a miss that reloads (into the freed slot, the lowest free one)
    let r = c.plan_layer(0, &[2, 3]).unwrap();
    let got: Vec<Assign> = r[0].assign.clone();
    assert!(got.contains(&Assign {
        expert: 3,
        slot: c.slot_of(0, 3).unwrap(),
        load: false
    }));
    assert!(
        got.contains(&Assign {
            expert: 2,
            slot: s2,
            load: true
        }),
        "{got:?}"
    );
    // forgetting a pinned slot unpins it; out of range and empty slots are no-ops
    c.forget(pinned_slot);
    assert!(!c.is_pinned(pinned_slot));
    assert_eq!(c.slot_of(1, 7), None);
    c.forget(99);
    c.forget(pinned_slot);
    // all three slots usable again: three distinct experts of layer 1 fit one round
    let r = c.plan_layer(1, &[0, 1, 2]).unwrap();
    assert_eq!(r.len(), 1, "{r:?}");
}

#[test]
fn usage_save_never_replaces_what_is_not_a_usage_file_and_load_skips_non_files() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("inkling-usage-guard-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let u = sample_usage();
    // someone else's file
    let theirs = dir.join("notes.json");
    std::fs::write(&theirs, br#"{"format": "something else"}"#).unwrap();
    let e = u.save(&theirs).unwrap_err();
    assert!(matches!(e.kind, UsageErrorKind::NotOurs), "{e}");
    assert_eq!(
        std::fs::read(&theirs).unwrap(),
        br#"{"format": "something else"}"#
    );
    // not JSON at all
    std::fs::write(&theirs, b"plain text").unwrap();
    assert!(matches!(
        u.save(&theirs).unwrap_err().kind,
        UsageErrorKind::NotOurs
    ));
    assert_eq!(std::fs::read(&theirs).unwrap(), b"plain text");
    // a directory: neither read nor replaced
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    assert!(matches!(
        u.save(&sub).unwrap_err().kind,
        UsageErrorKind::NotAFile
    ));
    let e = Usage::load(&sub, &u.fingerprint, u.n_layers, u.n_experts).unwrap_err();
    assert!(matches!(e.kind, UsageErrorKind::NotAFile), "{e}");
    assert!(sub.is_dir());
    // the merging save refuses the same paths before it creates a lock file beside them
    for refused in [&sub, &theirs] {
        assert!(u.save_merged(refused, &u).is_err());
        let mut lock = refused.as_os_str().to_owned();
        lock.push(".lock");
        assert!(
            !std::path::Path::new(&lock).exists(),
            "{} was created",
            std::path::Path::new(&lock).display()
        );
    }
    // a named pipe is refused without being opened (opening it would block)
    #[cfg(unix)]
    {
        let fifo = dir.join("pipe");
        let ok = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(ok.success());
        let e = Usage::load(&fifo, &u.fingerprint, u.n_layers, u.n_experts).unwrap_err();
        assert!(matches!(e.kind, UsageErrorKind::NotAFile), "{e}");
        assert!(matches!(
            u.save(&fifo).unwrap_err().kind,
            UsageErrorKind::NotAFile
        ));
    }
    // a usage file (any model's) is replaced, and no temporary file is left behind
    let ours = dir.join(USAGE_FILE);
    let mut other = sample_usage();
    other.fingerprint = "another-model".into();
    other.save(&ours).unwrap();
    u.save(&ours).unwrap();
    let back = Usage::load(&ours, &u.fingerprint, u.n_layers, u.n_experts).unwrap();
    assert_eq!(back, Some(u.clone()));
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
    std::fs::remove_dir_all(&dir).ok();
}
