//! The values of a synthetic container: what each tensor is drawn from ([`Dist`], [`Gen`]) and
//! the generator that draws them, reproducibly from (seed, tensor name, chunk) and on many threads
//! ([`generate_batch`]).

use crate::formats::{Encoding, Format};

/// How the values of one tensor are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dist {
    pub mean: f32,
    pub std: f32,
}

pub(super) const fn dist(mean: f32, std: f32) -> Dist {
    Dist { mean, std }
}

/// One tensor to generate: a stamped matrix (`stamped`) or a plain `F32`/`BF16` tensor.
#[derive(Clone, Debug)]
pub(super) struct Gen {
    pub(super) name: String,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) enc: Encoding,
    pub(super) dist: Dist,
}

// ---------------------------------------------------------------------------------------------
// Random numbers

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// wyrand: fast, good enough for weights.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(splitmix(seed))
    }
    #[inline]
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = (self.0 as u128).wrapping_mul((self.0 ^ 0xe703_7ed1_a0b4_28db) as u128);
        ((t >> 64) ^ t) as u64
    }
    /// Uniform in [0, 1).
    #[inline]
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }
    /// Approximately N(0, 1): the sum of four 16-bit uniforms, centred and scaled.
    #[inline]
    fn normal(&mut self) -> f32 {
        let r = self.next();
        let s = (r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48);
        // mean 4 · 32767.5, variance 4 · (65536² − 1)/12
        (s as f32 - 131_070.0) * (1.0 / 37_837.2)
    }
}

/// The int4 byte drawn from 16 random bits `x`: nibbles `1 + (b · 15 >> 8)` of its low byte (low
/// nibble) and its high byte (high nibble), each uniform over 1..=15 within 1/256.
static INT4_BYTE: [u8; 1 << 16] = {
    let mut t = [0u8; 1 << 16];
    let mut x = 0;
    while x < 1 << 16 {
        let lo = 1 + (((x & 0xff) * 15) >> 8) as u8;
        let hi = 1 + (((x >> 8) * 15) >> 8) as u8;
        t[x] = lo | hi << 4;
        x += 1;
    }
    t
};

/// Rows per generation chunk, so that a chunk is about 1 MiB of output.
fn chunk_rows(row_bytes: usize) -> usize {
    ((1 << 20) / row_bytes.max(1)).max(1)
}

/// Standard deviation of a level drawn uniformly from −q..=q.
fn level_std(q: usize) -> f32 {
    let q = q as f32;
    (q * (q + 1.0) / 3.0).sqrt()
}

/// Fill rows `[r0, r0 + data.len()/row_bytes)` of `g` (weight bytes and, for quantised
/// encodings, f32 scale bytes) from `rng`.
fn fill_chunk(g: &Gen, rng: &mut Rng, data: &mut [u8], scales: &mut [u8]) {
    let cols = g.cols;
    let d = g.dist;
    match g.enc.format {
        Format::F32 => {
            for b in data.chunks_exact_mut(4) {
                b.copy_from_slice(&(d.mean + d.std * rng.normal()).to_le_bytes());
            }
        }
        Format::Bf16 => {
            for b in data.chunks_exact_mut(2) {
                let v = half::bf16::from_f32(d.mean + d.std * rng.normal());
                b.copy_from_slice(&v.to_bits().to_le_bytes());
            }
        }
        Format::Int4 | Format::Int4Grouped => {
            // Nibbles 1..=15: levels −7..=7, symmetric about zero.
            let rb = g.enc.bytes_per_row(cols);
            let byte = |r: u64, k: usize| INT4_BYTE[((r >> (16 * k)) & 0xffff) as usize];
            for row in data.chunks_exact_mut(rb) {
                let mut quads = row.chunks_exact_mut(4);
                for q in &mut quads {
                    let r = rng.next();
                    q.copy_from_slice(&[byte(r, 0), byte(r, 1), byte(r, 2), byte(r, 3)]);
                }
                let tail = quads.into_remainder();
                if !tail.is_empty() {
                    let r = rng.next();
                    for (k, b) in tail.iter_mut().enumerate() {
                        *b = byte(r, k);
                    }
                }
                if cols % 2 == 1 {
                    row[rb - 1] &= 0x0f;
                }
            }
            fill_scales(rng, scales, d.std / level_std(7));
        }
        Format::Int3G64 => {
            // Levels 1..=7 (u − 4 in −3..=3); tail padding u = 4.
            let rb = g.enc.bytes_per_row(cols);
            for row in data.chunks_exact_mut(rb) {
                for (gi, grp) in row.chunks_exact_mut(24).enumerate() {
                    grp.fill(0);
                    let mut r = 0u64;
                    for k in 0..64 {
                        let u = if gi * 64 + k < cols {
                            if k % 8 == 0 {
                                r = rng.next();
                            }
                            1 + ((((r >> (8 * (k % 8))) & 0xff) * 7) >> 8) as u8
                        } else {
                            4
                        };
                        grp[k >> 2] |= (u & 3) << (2 * (k & 3));
                        grp[16 + (k >> 3)] |= (u >> 2) << (k & 7);
                    }
                }
            }
            fill_scales(rng, scales, d.std / level_std(3));
        }
        other => unreachable!("synth has no generator for {other:?}"),
    }
}

/// Positive scales uniform in 0.75..1.25 × `base`.
fn fill_scales(rng: &mut Rng, scales: &mut [u8], base: f32) {
    for b in scales.chunks_exact_mut(4) {
        let s = base * (0.75 + 0.5 * rng.unit());
        b.copy_from_slice(&s.to_le_bytes());
    }
}

/// Tensor bytes generated together (at least one tensor): the chunks of a batch's tensors are
/// shared among the threads, so that small tensors (one expert's projection) keep every core busy.
pub(super) const BATCH_BYTES: usize = 256 << 20;

/// Generate the weight bytes and scale bytes of every tensor of `gens`, its chunks taken in turn
/// by `threads` threads; each chunk is seeded from (seed, tensor name, chunk index) alone.
pub(super) fn generate_batch(gens: &[&Gen], seed: u64, threads: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out: Vec<(Vec<u8>, Vec<u8>)> = gens
        .iter()
        .map(|g| {
            let rb = g.enc.bytes_per_row(g.cols);
            let spr = g.enc.scales_per_row(g.cols);
            (vec![0u8; g.rows * rb], vec![0u8; g.rows * spr * 4])
        })
        .collect();
    type Job<'a> = (&'a Gen, u64, usize, &'a mut [u8], &'a mut [u8]);
    let mut jobs: Vec<Job<'_>> = Vec::new();
    for (g, (data, scales)) in gens.iter().zip(out.iter_mut()) {
        let rb = g.enc.bytes_per_row(g.cols);
        let spr = g.enc.scales_per_row(g.cols);
        let cr = chunk_rows(rb);
        let tseed = splitmix(seed ^ fnv1a(&g.name));
        let mut scale_chunks = scales.chunks_mut((cr * spr * 4).max(1));
        for (i, d) in data.chunks_mut(cr * rb).enumerate() {
            jobs.push((g, tseed, i, d, scale_chunks.next().unwrap_or_default()));
        }
    }
    let run = |(g, tseed, i, d, s): Job<'_>| {
        let mut rng = Rng::new(tseed ^ splitmix(i as u64 + 1));
        fill_chunk(g, &mut rng, d, s);
    };
    let threads = threads.clamp(1, jobs.len().max(1));
    if threads == 1 {
        jobs.into_iter().for_each(run);
    } else {
        let queue = std::sync::Mutex::new(jobs.into_iter());
        std::thread::scope(|sc| {
            for _ in 0..threads {
                sc.spawn(|| loop {
                    let job = queue.lock().expect("job queue").next();
                    match job {
                        Some(j) => run(j),
                        None => break,
                    }
                });
            }
        });
    }
    out
}
