//! Token choice: greedy argmax or temperature / top-k / top-p / min-p sampling with a seeded PRNG
//! (splitmix64-seeded xoshiro256**; no external crate, reproducible across platforms), after the
//! optional penalties on the logits ([`penalize`]: llama.cpp's repeat penalty, OpenAI's presence
//! and frequency penalties).

/// One step of splitmix64 (Steele, Lea and Flood 2014): advances `state` and returns the next
/// value. Also the engine's generator of reproducible test and benchmark data.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut x = *state;
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// xoshiro256** seeded through splitmix64.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed;
        let mut next = || splitmix64(&mut z);
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Sampling settings. `temperature <= 0` means greedy; `top_k == 0`, `top_p >= 1`, `min_p <= 0`,
/// `repeat_penalty == 1` (or `repeat_last_n == 0`) and zero presence/frequency penalties disable
/// those.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    /// Keep only tokens whose probability is at least `min_p` × the most likely one's
    /// (transformers' `MinPLogitsWarper`, llama.cpp `--min-p`), in [0, 1].
    pub min_p: f32,
    /// llama.cpp's repeat penalty (> 0): each distinct token among the last `repeat_last_n` ids
    /// (prompt and generated) has its logit divided by it when positive, multiplied when not.
    pub repeat_penalty: f32,
    /// How many of the latest ids the repeat penalty looks at (0 = off; llama.cpp's default 64;
    /// [`WHOLE_SEQUENCE`]: all of them).
    pub repeat_last_n: usize,
    /// OpenAI's `presence_penalty`: subtracted once from the logit of every token generated so far
    /// (in [-2, 2]).
    pub presence_penalty: f32,
    /// OpenAI's `frequency_penalty`: subtracted from a token's logit once per time it was
    /// generated so far (in [-2, 2]).
    pub frequency_penalty: f32,
}

/// llama.cpp's default window of the repeat penalty.
pub const REPEAT_LAST_N: usize = 64;

/// The `repeat_last_n` of a window over the whole sequence (llama.cpp's `-1`; transformers'
/// `repetition_penalty` always looks at the whole sequence).
pub const WHOLE_SEQUENCE: usize = usize::MAX;

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: REPEAT_LAST_N,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
        }
    }
}

impl SamplingParams {
    /// Whether [`penalize`] changes any logit (then the engine needs the whole logit row).
    pub fn has_penalties(&self) -> bool {
        (self.repeat_penalty != 1.0 && self.repeat_last_n > 0)
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }
}

/// The penalties of `p` applied to one row of logits. `history` is every id the model has seen in
/// this run (prompt, then generated), the last `generated` of which it generated itself.
/// - repeat penalty (llama.cpp `llama_sampler_penalties`): each distinct id among the last
///   `repeat_last_n` of `history`: `l / r` when `l > 0`, else `l · r`;
/// - presence and frequency (OpenAI; llama.cpp's same-named penalties over its window): for each id
///   generated `c > 0` times, `l − c · frequency − presence`.
///
/// Ids past the row are ignored.
pub fn penalize(logits: &mut [f32], history: &[u32], generated: usize, p: &SamplingParams) {
    use std::collections::HashMap;
    if p.repeat_penalty != 1.0 && p.repeat_last_n > 0 {
        let window = &history[history.len().saturating_sub(p.repeat_last_n)..];
        let mut seen = std::collections::HashSet::new();
        for &id in window {
            if let Some(l) = logits.get_mut(id as usize) {
                if seen.insert(id) {
                    *l = if *l > 0.0 {
                        *l / p.repeat_penalty
                    } else {
                        *l * p.repeat_penalty
                    };
                }
            }
        }
    }
    if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &id in &history[history.len().saturating_sub(generated)..] {
            *counts.entry(id).or_default() += 1;
        }
        for (id, c) in counts {
            if let Some(l) = logits.get_mut(id as usize) {
                *l -= c as f32 * p.frequency_penalty + p.presence_penalty;
            }
        }
    }
}

/// Index of the largest logit; ties go to the lowest index (like torch.argmax). NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] || logits[best].is_nan() && !v.is_nan() {
            best = i;
        }
    }
    best as u32
}

/// The candidates [`sample`] draws from and their probabilities, in draw order (logit
/// descending, ties by index; NaN dropped): top-k first, then the softmax at `temperature`, then
/// the smallest prefix whose mass reaches `top_p` (at least one token), renormalised, then those
/// whose probability is at least `min_p` × the first's, renormalised. Greedy
/// settings (`temperature <= 0`, or one logit) give the argmax with probability 1.
pub fn distribution(logits: &[f32], p: &SamplingParams) -> Vec<(u32, f64)> {
    if p.temperature <= 0.0 || logits.len() <= 1 {
        return vec![(argmax(logits), 1.0)];
    }
    let mut idx: Vec<usize> = (0..logits.len()).filter(|&i| !logits[i].is_nan()).collect();
    if idx.is_empty() {
        return vec![(0, 1.0)];
    }
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if p.top_k > 0 && p.top_k < idx.len() {
        idx.truncate(p.top_k);
    }
    let max = logits[idx[0]] as f64;
    let t = p.temperature as f64;
    let mut probs: Vec<f64> = idx
        .iter()
        // the most likely tokens at exp(0) = 1 even when their logit is infinite (a tiny repeat
        // penalty can overflow one): ±inf − ±inf would make every probability NaN
        .map(|&i| {
            let l = logits[i] as f64;
            if l == max {
                1.0
            } else {
                ((l - max) / t).exp()
            }
        })
        .collect();
    let sum: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|x| *x /= sum);
    if p.top_p > 0.0 && p.top_p < 1.0 {
        // Keep the smallest prefix whose mass reaches top_p (at least one token).
        let mut acc = 0.0;
        let mut keep = probs.len();
        for (n, &q) in probs.iter().enumerate() {
            acc += q;
            if acc >= p.top_p as f64 {
                keep = n + 1;
                break;
            }
        }
        idx.truncate(keep);
        probs.truncate(keep);
        let s: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= s);
    }
    if p.min_p > 0.0 {
        // probabilities are in descending order: the kept ones are a prefix
        let floor = p.min_p as f64 * probs[0];
        let keep = probs.iter().take_while(|&&q| q >= floor).count().max(1);
        idx.truncate(keep);
        probs.truncate(keep);
        let s: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= s);
    }
    idx.into_iter().map(|i| i as u32).zip(probs).collect()
}

/// Choose the next token: the argmax for greedy settings, else one draw (one `rng.next_f64()`)
/// from [`distribution`].
pub fn sample(logits: &[f32], p: &SamplingParams, rng: &mut Rng) -> u32 {
    if p.temperature <= 0.0 || logits.len() <= 1 {
        return argmax(logits);
    }
    if logits.iter().all(|x| x.is_nan()) {
        return 0;
    }
    let d = distribution(logits, p);
    let u = rng.next_f64();
    let mut acc = 0.0;
    for &(id, q) in &d {
        acc += q;
        if u < acc {
            return id;
        }
    }
    d.last().unwrap().0
}

/// A fresh seed for a sampled run without `--seed` (as llama.cpp and mlx-lm draw one): the
/// standard library's per-process random hash keys, so no two runs share it. Commands print the
/// seed they used so that a run can be repeated with `--seed`.
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}
