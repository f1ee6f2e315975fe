//! Which scale each quantisation unit (a row of int4, a group of int4-grouped and int3-g64) gets.
//!
//! Both rules store the levels `q = clamp(round(w / s), lo, hi)` of the chosen `s` and decode as
//! `w' = q·s` (f32), so only the value of `s` differs and every container stays decodable by the
//! same kernels (FORMATS.md, section Quantisation).
//!
//! - [`ScaleRule::Absmax`]: `s = absmax / hi` (no value is clipped; the level `lo` is never used).
//! - [`ScaleRule::Mse`]: the `s` of smallest squared error `Σ (w − q·s)²` found by a search over
//!   clip ratios in the spirit of llama.cpp's `make_qx_quants` (ggml/src/ggml-quants.c): scales
//!   `±r·absmax/hi` for r = 0.5, 0.6, …, 1.1 (a negative `s` maps the largest magnitude onto the
//!   extra level `lo`), a bisection around the best ratio (±0.05, ±0.025, ±0.0125), then two
//!   least-squares refits `s = Σwq / Σq²` of the levels (each re-rounded). The absmax scale is
//!   always a candidate and the final comparison uses the exact decoded error, so `Mse` never has
//!   larger squared error than `Absmax` on any unit.

/// The signed level range of a format: int4 `[-8, 7]`, int3 `[-4, 3]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Levels {
    pub lo: i32,
    pub hi: i32,
}

impl Levels {
    pub const INT4: Levels = Levels { lo: -8, hi: 7 };
    pub const INT3: Levels = Levels { lo: -4, hi: 3 };
}

/// How [`crate::formats::quantize_with`] chooses each unit's scale.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ScaleRule {
    /// `s = absmax / hi`.
    Absmax,
    /// The scale of smallest squared error (module docs).
    #[default]
    Mse,
}

impl ScaleRule {
    /// `absmax` or `mse`.
    pub fn name(self) -> &'static str {
        match self {
            ScaleRule::Absmax => "absmax",
            ScaleRule::Mse => "mse",
        }
    }
}

impl std::str::FromStr for ScaleRule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "absmax" => Ok(ScaleRule::Absmax),
            "mse" => Ok(ScaleRule::Mse),
            _ => Err(format!("unknown scale rule {s:?} (expected absmax or mse)")),
        }
    }
}

/// 1.5·2²³: for |x| < 2²², `(x + MAGIC) − MAGIC` is x rounded to an integer, ties to even.
const MAGIC: f32 = 12_582_912.0;

/// The stored level of `v` for scale `s`: `clamp(round(v / s), lo, hi)` (round half away from
/// zero, as `f32::round`), 0 when `s` is 0 or the quotient is NaN.
#[inline]
pub fn level(v: f32, s: f32, lv: Levels) -> i32 {
    level_f32(v, s, lv) as i32
}

/// [`level`] as an f32 (an exact small integer), branch-free so that loops over a unit vectorise.
#[inline]
fn level_f32(v: f32, s: f32, lv: Levels) -> f32 {
    let x = v / s;
    // NaN (also 0/0 when s = 0) becomes 0; ±inf and |x| > hi+1 are clamped first, which changes
    // no clamped result since rounding is monotone.
    let x = if x.is_nan() || s == 0.0 { 0.0 } else { x };
    let c = x.max(lv.lo as f32 - 1.0).min(lv.hi as f32 + 1.0);
    // round half away from zero = t + trunc(2·(c − t)) with t = trunc(c) (c − t is exact and in
    // (−1, 1), so the second term is ±1 exactly when |c − t| ≥ 0.5); `as i32` truncates.
    let t = c as i32;
    let n = (t + (2.0 * (c - t as f32)) as i32) as f32;
    n.max(lv.lo as f32).min(lv.hi as f32)
}

/// Exact squared error of a unit for scale `s`: `Σ (v − level(v, s)·s)²`, the decoded value
/// computed in f32 as the decoders do, the differences and sums in f64 (four partial sums, added
/// in a fixed order).
pub fn squared_error(vals: &[f32], s: f32, lv: Levels) -> f64 {
    let err = |v: f32| {
        let d = v as f64 - (level_f32(v, s, lv) * s) as f64;
        d * d
    };
    let mut acc = [0f64; 4];
    let chunks = vals.chunks_exact(4);
    let tail: f64 = chunks.remainder().iter().map(|&v| err(v)).sum();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += err(v);
        }
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

/// `absmax / hi` (0 for an all-zero unit).
pub fn absmax_scale(vals: &[f32], lv: Levels) -> f32 {
    vals.iter().fold(0f32, |m, v| m.max(v.abs())) / lv.hi as f32
}

/// The scale `rule` gives the unit `vals`.
pub fn choose_scale(rule: ScaleRule, vals: &[f32], lv: Levels) -> f32 {
    match rule {
        ScaleRule::Absmax => absmax_scale(vals, lv),
        ScaleRule::Mse => mse_scale(vals, lv),
    }
}

/// Approximate squared error for the search: multiply by 1/s instead of dividing, round ties to
/// even (`MAGIC`, exact for the clamped |x| ≤ 8), f32 sums in 8 lanes.
#[inline]
fn search_error(vals: &[f32], s: f32, lv: Levels) -> f32 {
    let inv = 1.0 / s;
    let (lo, hi) = (lv.lo as f32, lv.hi as f32);
    let err = |v: f32| {
        let q = ((v * inv).max(lo).min(hi) + MAGIC) - MAGIC;
        let d = v - q * s;
        d * d
    };
    let mut acc = [0f32; 8];
    let chunks = vals.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().map(|&v| err(v)).sum();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += err(v);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Least-squares scale `Σwq / Σq²` of the (search-rounded) levels of `s`; None when every level
/// is 0.
fn refit(vals: &[f32], s: f32, lv: Levels) -> Option<f32> {
    let inv = 1.0 / s;
    let (lo, hi) = (lv.lo as f32, lv.hi as f32);
    let (mut wq, mut qq) = (0f32, 0f32);
    for &v in vals {
        let q = ((v * inv).max(lo).min(hi) + MAGIC) - MAGIC;
        wq += v * q;
        qq += q * q;
    }
    let r = wq / qq;
    (qq > 0.0 && r.is_finite() && r != 0.0).then_some(r)
}

/// Coarse grid of clip ratios r in |s| = r·absmax/hi.
const RATIOS: [f32; 7] = [1.1, 1.0, 0.9, 0.8, 0.7, 0.6, 0.5];

/// The scale of smallest squared error found by the search of the module docs.
pub fn mse_scale(vals: &[f32], lv: Levels) -> f32 {
    let s0 = absmax_scale(vals, lv);
    if s0 == 0.0 || !s0.is_finite() {
        return s0;
    }
    let mut best = (search_error(vals, s0, lv), s0, 1.0f32, 1.0f32);
    for sign in [1.0f32, -1.0] {
        for r in RATIOS {
            if sign == 1.0 && r == 1.0 {
                continue; // s0 itself
            }
            let s = sign * r * s0;
            let e = search_error(vals, s, lv);
            if e < best.0 {
                best = (e, s, r, sign);
            }
        }
    }
    let mut h = 0.05f32;
    for _ in 0..3 {
        let (_, _, r, sign) = best;
        for rr in [r - h, r + h] {
            let s = sign * rr * s0;
            let e = search_error(vals, s, lv);
            if e < best.0 {
                best = (e, s, rr, sign);
            }
        }
        h *= 0.5;
    }
    // Each refit keeps the levels and minimises over s, so its squared error is no larger
    // before re-rounding, and re-rounding to the nearest levels can only lower it further.
    let mut s_best = best.1;
    for _ in 0..2 {
        match refit(vals, s_best, lv) {
            Some(s) => s_best = s,
            None => break,
        }
    }
    if s_best != s0 && squared_error(vals, s_best, lv) < squared_error(vals, s0, lv) {
        s_best
    } else {
        s0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// splitmix64 → gaussian-ish (sum of 4 uniforms), scaled.
    struct Rng(u64);
    impl Rng {
        fn u(&mut self) -> f32 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
        fn g(&mut self) -> f32 {
            (self.u() + self.u() + self.u() + self.u()) * 0.87
        }
    }

    #[test]
    fn mse_never_worse_than_absmax_on_random_groups() {
        let mut rng = Rng(7);
        let mut total = [0f64; 2];
        for case in 0..3000 {
            let lv = if case % 2 == 0 {
                Levels::INT4
            } else {
                Levels::INT3
            };
            let n = [1, 2, 5, 32, 64, 128, 700][case % 7];
            let mag = [1e-3f32, 0.02, 1.0, 300.0][case % 4];
            let mut v: Vec<f32> = (0..n).map(|_| rng.g() * mag).collect();
            if case % 11 == 0 {
                v[0] *= 8.0; // an outlier
            }
            if case % 13 == 0 {
                for x in v.iter_mut().skip(1).step_by(2) {
                    *x = 0.0;
                }
            }
            let (sa, sm) = (absmax_scale(&v, lv), mse_scale(&v, lv));
            let (ea, em) = (squared_error(&v, sa, lv), squared_error(&v, sm, lv));
            assert!(
                em <= ea,
                "case {case}: mse {em} > absmax {ea} (s {sm} vs {sa})"
            );
            if n >= 32 && mag == 1.0 {
                total[0] += ea;
                total[1] += em;
            }
        }
        // on gaussian groups of ≥ 32 the search lowers the squared error clearly
        assert!(total[1] < 0.85 * total[0], "{total:?}");
    }

    #[test]
    fn level_is_clamped_f32_round() {
        let mut rng = Rng(3);
        let specials = [
            0.5f32,
            -0.5,
            1.5,
            -2.5,
            7.5,
            -8.5,
            0.49999997,
            -0.49999997,
            1e30,
            -1e30,
        ];
        for lv in [Levels::INT4, Levels::INT3] {
            for i in 0..20000 {
                let v = if i < specials.len() {
                    specials[i]
                } else {
                    rng.g() * [0.1f32, 1.0, 10.0][i % 3]
                };
                for s in [1.0f32, 0.37, -0.37, 1e-30] {
                    let want = ((v / s).round() as i32).clamp(lv.lo, lv.hi);
                    assert_eq!(level(v, s, lv), want, "v {v} s {s} {lv:?}");
                }
            }
            assert_eq!(level(f32::NAN, 1.0, lv), 0);
            assert_eq!(level(1.0, 0.0, lv), 0);
        }
    }

    #[test]
    fn all_zero_and_constant_units() {
        assert_eq!(mse_scale(&[0.0; 64], Levels::INT4), 0.0);
        // a constant unit: absmax is exact up to f32 rounding of s, the search no worse
        let v = [0.5f32; 64];
        for lv in [Levels::INT4, Levels::INT3] {
            let ea = squared_error(&v, absmax_scale(&v, lv), lv);
            let em = squared_error(&v, mse_scale(&v, lv), lv);
            assert!(ea < 1e-12 && em <= ea, "{lv:?}: {em} vs {ea}");
        }
    }

    #[test]
    fn rule_spellings() {
        assert_eq!("mse".parse::<ScaleRule>(), Ok(ScaleRule::Mse));
        assert_eq!("absmax".parse::<ScaleRule>(), Ok(ScaleRule::Absmax));
        assert!("max".parse::<ScaleRule>().is_err());
        assert_eq!(ScaleRule::default().name(), "mse");
    }
}
