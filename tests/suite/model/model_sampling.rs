//! Sampling: greedy ties, top-k / top-p limits, seeded reproducibility, rough distribution.
use inkling_wgpu::model::sampling::{argmax, sample, Rng, SamplingParams};

#[test]
fn greedy_and_ties() {
    assert_eq!(
        argmax(&[1.0, 3.0, 3.0, 2.0]),
        1,
        "ties go to the lowest index"
    );
    assert_eq!(argmax(&[f32::NAN, 0.5, 0.2]), 1, "NaN never wins");
    let mut rng = Rng::new(1);
    assert_eq!(
        sample(&[0.1, 0.9, 0.3], &SamplingParams::default(), &mut rng),
        1
    );
}

#[test]
fn top_k_and_top_p_restrict_the_candidates() {
    let logits = [2.0f32, 1.9, 1.8, -5.0, 1.7];
    let mut rng = Rng::new(42);
    for _ in 0..500 {
        let k1 = SamplingParams {
            temperature: 5.0,
            top_k: 1,
            top_p: 1.0,
        };
        assert_eq!(sample(&logits, &k1, &mut rng), 0);
        let k2 = SamplingParams {
            temperature: 5.0,
            top_k: 2,
            top_p: 1.0,
        };
        assert!(sample(&logits, &k2, &mut rng) < 2);
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.01,
        };
        assert_eq!(sample(&logits, &p, &mut rng), 0);
    }
}

#[test]
fn seeded_and_roughly_right() {
    let logits = [0.0f32, (3f32).ln()]; // p = 0.25, 0.75
    let p = SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
    };
    let draw = |seed| {
        let mut rng = Rng::new(seed);
        (0..4000)
            .map(|_| sample(&logits, &p, &mut rng))
            .collect::<Vec<u32>>()
    };
    let a = draw(9);
    assert_eq!(a, draw(9));
    assert_ne!(a, draw(10));
    let ones = a.iter().filter(|&&x| x == 1).count() as f64 / a.len() as f64;
    assert!((ones - 0.75).abs() < 0.03, "frequency {ones}");
}
