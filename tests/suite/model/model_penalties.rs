//! Min-p, the repeat penalty (llama.cpp) and the presence and frequency penalties (OpenAI), each
//! against a reference written here from the definitions on fixed logits; and the decode loop
//! with a penalty equals a loop written here (full logits, the reference penalty, argmax) on the
//! tiny fixture.
use crate::model_common::{fixture, reference};
use inkling_wgpu::model::generate::{generate, GenerateParams};
use inkling_wgpu::model::sampling::{argmax, distribution, penalize, SamplingParams};
use inkling_wgpu::model::{Checkpoint, CpuModel, Weights};

const LOGITS: [f32; 8] = [1.5, -0.3, 0.7, 2.2, 0.7, -1.1, 0.0, 1.0];

/// Min-p's reference (transformers `MinPLogitsWarper` after the temperature): p ∝ exp(l/T) over
/// the top-k; kept where p ≥ min_p · max p; renormalised.
fn min_p_reference(logits: &[f32], t: f64, k: usize, min_p: f64) -> Vec<f64> {
    let mut rank: Vec<usize> = (0..logits.len()).collect();
    rank.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if k > 0 {
        rank.truncate(k);
    }
    let z: Vec<f64> = rank.iter().map(|&i| (logits[i] as f64 / t).exp()).collect();
    let max = z.iter().cloned().fold(0.0, f64::max);
    let kept: f64 = z.iter().filter(|&&q| q >= min_p * max).sum();
    let mut p = vec![0.0; logits.len()];
    for (n, &i) in rank.iter().enumerate() {
        if z[n] >= min_p * max {
            p[i] = z[n] / kept;
        }
    }
    p
}

#[test]
fn min_p_keeps_the_tokens_at_least_min_p_times_as_likely_as_the_best() {
    for (t, k, min_p, kept) in [
        (1.0, 0, 0.3, 3), // exp(1.5-2.2)=0.50, exp(1.0-2.2)=0.30, exp(0.7-2.2)=0.22
        (1.0, 0, 0.05, 7),
        (0.5, 0, 0.2, 2), // exp(2·(1.5−2.2)) = 0.25, then 0.09
        (2.0, 2, 0.1, 2),
        (1.0, 0, 1.0, 1),
    ] {
        let p = SamplingParams {
            temperature: t as f32,
            top_k: k,
            min_p: min_p as f32,
            ..Default::default()
        };
        let want = min_p_reference(&LOGITS, t, k, min_p);
        let got = distribution(&LOGITS, &p);
        assert_eq!(got.len(), kept, "{t} {k} {min_p}: {got:?}");
        for (id, q) in got {
            assert!(
                (q - want[id as usize]).abs() < 1e-12,
                "{t} {k} {min_p}: p[{id}] {q} vs {}",
                want[id as usize]
            );
        }
    }
}

/// The penalties' reference: llama.cpp's repeat penalty over the distinct ids of the last
/// `last_n`, then OpenAI's `l − c·frequency − [c > 0]·presence` over the generated ids, in f64.
fn penalty_reference(
    logits: &[f32],
    history: &[u32],
    generated: usize,
    (r, last_n, presence, frequency): (f64, usize, f64, f64),
) -> Vec<f64> {
    let mut l: Vec<f64> = logits.iter().map(|&x| x as f64).collect();
    let window = &history[history.len().saturating_sub(last_n)..];
    for (i, v) in l.iter_mut().enumerate() {
        if last_n > 0 && window.contains(&(i as u32)) {
            *v = if *v > 0.0 { *v / r } else { *v * r };
        }
        let c = history[history.len() - generated..]
            .iter()
            .filter(|&&h| h == i as u32)
            .count() as f64;
        *v -= c * frequency + if c > 0.0 { presence } else { 0.0 };
    }
    l
}

#[test]
fn penalties_equal_the_reference() {
    // ids 3 and 0 twice, 5 (negative logit) once; the last 4 ids are generated
    let history = [3u32, 0, 5, 3, 7, 0, 3, 2];
    for s in [
        (1.3, 64, 0.0, 0.0),
        (1.3, 3, 0.0, 0.0), // window [0, 3, 2]: 5 and 7 untouched
        (0.8, 64, 0.0, 0.0),
        (1.0, 64, 0.5, 0.0),
        (1.0, 64, 0.0, 0.25),
        (1.1, 5, -0.4, 0.7),
        (1.5, 0, 0.0, 0.0), // window 0: off
    ] {
        let p = SamplingParams {
            repeat_penalty: s.0 as f32,
            repeat_last_n: s.1,
            presence_penalty: s.2 as f32,
            frequency_penalty: s.3 as f32,
            ..Default::default()
        };
        let mut got = LOGITS.to_vec();
        penalize(&mut got, &history, 4, &p);
        let want = penalty_reference(&LOGITS, &history, 4, s);
        for i in 0..LOGITS.len() {
            assert!(
                (got[i] as f64 - want[i]).abs() < 1e-6,
                "{s:?}: logit {i} {} vs {}",
                got[i],
                want[i]
            );
        }
        assert_eq!(p.has_penalties(), got != LOGITS, "{s:?}");
    }
    // the values themselves, for one setting: 2.2/1.3, 1.5/1.3, -1.1*1.3, 0.7/1.3 (id 2), 1.0/1.3
    let mut l = LOGITS.to_vec();
    let p = SamplingParams {
        repeat_penalty: 1.3,
        ..Default::default()
    };
    penalize(&mut l, &history, 4, &p);
    let want = [
        1.5 / 1.3,
        -0.3,
        0.7 / 1.3,
        2.2 / 1.3,
        0.7,
        -1.1 * 1.3,
        0.0,
        1.0 / 1.3,
    ];
    for (g, w) in l.iter().zip(want) {
        assert!((*g as f64 - w).abs() < 1e-6, "{l:?}");
    }
}

/// Greedy decoding with a repeat penalty and a frequency penalty: `generate` equals a loop here
/// (whole-prompt forward, then one token at a time; the reference penalty on each row; argmax),
/// and differs from plain greedy decoding (so the penalty is not ignored).
#[test]
fn generate_applies_the_penalties_at_every_step() {
    let name = "tiny-causal-f32";
    let ck = Checkpoint::open(&fixture(name)).unwrap();
    let w = Weights::load(&ck).unwrap();
    let prompt = reference(name).cases[2].prompt_ids.clone();
    let s = (1.8, 16, 0.0, 0.6);
    let sampling = SamplingParams {
        repeat_penalty: s.0 as f32,
        repeat_last_n: s.1,
        frequency_penalty: s.3 as f32,
        ..Default::default()
    };
    let params = GenerateParams {
        max_new_tokens: 24,
        sampling,
        seed: 0,
        eos_ids: vec![],
    };
    let got = generate(&mut CpuModel::new(&w), &prompt, &params, &mut |_| Ok(()))
        .unwrap()
        .generated_ids;
    let mut m = CpuModel::new(&w);
    let mut history = prompt.clone();
    let mut feed = prompt.clone();
    let mut want = Vec::new();
    for _ in 0..24 {
        let logits = m.forward(&feed).unwrap();
        let pen = penalty_reference(&logits, &history, want.len(), s);
        let pen32: Vec<f32> = pen.iter().map(|&x| x as f32).collect();
        let id = argmax(&pen32);
        want.push(id);
        history.push(id);
        feed = vec![id];
    }
    assert_eq!(got, want);
    let plain = GenerateParams {
        sampling: SamplingParams::default(),
        ..params
    };
    let greedy = generate(&mut CpuModel::new(&w), &prompt, &plain, &mut |_| Ok(()))
        .unwrap()
        .generated_ids;
    assert_ne!(got, greedy, "the penalties changed nothing");
}
