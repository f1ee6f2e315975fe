//! The sampling flags every generating command shares beyond temperature, top-k and top-p:
//! `--min-p`, `--repeat-penalty` and `--repeat-last-n` (llama.cpp's names and meanings; defaults
//! from generation_config.json as transformers reads it, else off). They are flattened into `generate`, `chat` and `serve` (there: the defaults of requests
//! that do not set `min_p` / `repetition_penalty`).
use super::values::{parse_min_p, parse_repeat_last_n, parse_repeat_penalty};
use crate::model::config::GenerationConfig;
use crate::model::sampling::{SamplingParams, REPEAT_LAST_N, WHOLE_SEQUENCE};
use anyhow::bail;

#[derive(clap::Args, Debug, Clone, Default)]
pub struct PenaltyArgs {
    /// Drop tokens less likely than MIN_P × the most likely one, in [0, 1] (0 = off; default:
    /// generation_config.json's min_p when it sets do_sample, else 0).
    #[arg(allow_negative_numbers = true, long, value_parser = parse_min_p)]
    pub min_p: Option<f32>,
    /// Repeat penalty > 0 over the last --repeat-last-n ids, as llama.cpp: a seen token's logit is
    /// divided by it when positive, multiplied when not (1 = off; default: generation_config.json's
    /// repetition_penalty, else 1).
    #[arg(allow_negative_numbers = true, long, value_parser = parse_repeat_penalty)]
    pub repeat_penalty: Option<f32>,
    /// How many of the latest ids (prompt and generated) the repeat penalty looks at; 0 = off, -1 =
    /// the whole sequence (default: 64 with --repeat-penalty, as llama.cpp; the whole sequence for
    /// generation_config.json's repetition_penalty, as transformers).
    #[arg(long, allow_negative_numbers = true, value_parser = parse_repeat_last_n)]
    pub repeat_last_n: Option<usize>,
}

impl PenaltyArgs {
    /// `p` with the penalties of these flags, each one not given taken from `generation`
    /// (`dir`/generation_config.json) as transformers 5.24.0 does: `min_p` only when it sets
    /// `do_sample` (a warper), `repetition_penalty` always (a logits processor) over the whole
    /// sequence unless `--repeat-last-n` says otherwise. Prints [`PenaltyArgs::warning`] on stderr
    /// when there is one. Errors: a file's `min_p` outside [0, 1] or `repetition_penalty` not a
    /// finite number > 0 (transformers' own checks), naming the file and field.
    pub fn apply(
        &self,
        p: SamplingParams,
        dir: &std::path::Path,
        generation: &GenerationConfig,
    ) -> anyhow::Result<SamplingParams> {
        let file = |field: &str| super::load::generation_field(dir, field);
        let file_min_p = generation.min_p.filter(|_| generation.do_sample);
        if let Some(m) = file_min_p.filter(|_| self.min_p.is_none()) {
            if !(0.0..=1.0).contains(&m) {
                bail!("{} must be in [0, 1] (0 = off), got {m}", file("min_p"));
            }
        }
        let from_file = self.repeat_penalty.is_none() && generation.repetition_penalty.is_some();
        if let Some(r) = generation.repetition_penalty.filter(|_| from_file) {
            if !(r.is_finite() && r > 0.0) {
                bail!(
                    "{} must be a finite number > 0 (1 = off), got {r}",
                    file("repetition_penalty")
                );
            }
        }
        if let Some(w) = self.warning() {
            eprintln!("{w}");
        }
        let window = if from_file {
            WHOLE_SEQUENCE
        } else {
            REPEAT_LAST_N
        };
        Ok(SamplingParams {
            min_p: self.min_p.or(file_min_p).unwrap_or(0.0),
            repeat_penalty: self
                .repeat_penalty
                .or(generation.repetition_penalty)
                .unwrap_or(1.0),
            repeat_last_n: self.repeat_last_n.unwrap_or(window),
            ..p
        })
    }

    /// The warning for a repeat penalty that `--repeat-last-n 0` turns off (llama.cpp's meaning of
    /// 0 here: no window, so no penalty); `None` when the flags do what they say.
    pub fn warning(&self) -> Option<String> {
        let r = self.repeat_penalty?;
        (r != 1.0 && self.repeat_last_n == Some(0)).then(|| {
            format!(
                "warning: --repeat-penalty {r} has no effect: --repeat-last-n 0 turns the penalty \
                 off; give --repeat-last-n N (default {REPEAT_LAST_N}) to penalise the last N ids"
            )
        })
    }

    /// The warning for a `--repeat-last-n` window with no repeat penalty to apply (neither
    /// `--repeat-penalty` nor `generation`'s repetition_penalty, or either at 1), for the commands
    /// that decode with these values (`serve`'s requests may still set a penalty).
    pub fn window_warning(&self, generation: &GenerationConfig) -> Option<String> {
        let n = self.repeat_last_n.filter(|&n| n != 0)?;
        let r = self.repeat_penalty.or(generation.repetition_penalty);
        r.is_none_or(|r| r == 1.0).then(|| {
            let n = if n == WHOLE_SEQUENCE {
                "-1".to_string()
            } else {
                n.to_string()
            };
            format!(
                "warning: --repeat-last-n {n} has no effect: no repeat penalty is set; give \
                 --repeat-penalty R (e.g. 1.1) to penalise repeated ids"
            )
        })
    }
}

/// The sampling of a command that decodes with its own flags (`generate`, `chat`; `serve`'s
/// requests set their own): [`super::load::sampling`] with the penalties of `penalties` applied
/// ([`PenaltyArgs::apply`]), after one `warning:` line for a `--repeat-last-n` with no penalty
/// ([`PenaltyArgs::window_warning`]) and, when decoding is greedy, one for the sampling flags that
/// then change nothing (the values that mean off are not named).
/// Errors: those of [`super::load::sampling`] and [`PenaltyArgs::apply`].
pub fn command_sampling(
    dir: &std::path::Path,
    generation: &GenerationConfig,
    temperature: Option<f32>,
    top_k: Option<usize>,
    top_p: Option<f32>,
    seed: Option<u64>,
    penalties: &PenaltyArgs,
) -> anyhow::Result<SamplingParams> {
    if let Some(w) = penalties.window_warning(generation) {
        eprintln!("{w}");
    }
    let p = penalties.apply(
        super::load::sampling(dir, generation, temperature, top_k, top_p)?,
        dir,
        generation,
    )?;
    if p.temperature == 0.0 {
        let given = [
            ("--top-k", top_k.is_some_and(|k| k != 0)),
            ("--top-p", top_p.is_some_and(|p| p != 1.0)),
            ("--min-p", penalties.min_p.is_some_and(|m| m != 0.0)),
            ("--seed", seed.is_some()),
        ];
        if let Some(w) = greedy_flags_warning(given, temperature.is_some()) {
            eprintln!("{w}");
        }
    }
    Ok(p)
}

/// The warning for sampling flags (`given`: each flag's name and whether it was given) under
/// greedy decoding, `None` when no flag was given; `temperature_given`: `--temperature 0` was
/// given, else the greedy default comes from generation_config.json.
fn greedy_flags_warning(given: [(&str, bool); 4], temperature_given: bool) -> Option<String> {
    let given: Vec<&str> = given.iter().filter(|f| f.1).map(|f| f.0).collect();
    let names = match given.split_last()? {
        (last, []) => last.to_string(),
        (last, rest) => format!("{} and {last}", rest.join(", ")),
    };
    Some(format!(
        "warning: {names} {} no effect: the temperature is 0, so decoding is greedy{}; \
         add --temperature T (e.g. 0.8) to sample",
        if given.len() == 1 { "has" } else { "have" },
        if temperature_given {
            ""
        } else {
            " (generation_config.json does not set do_sample)"
        }
    ))
}

/// generation_config.json's sampling values and lengths (`g` of `dir`) checked as `generate`
/// checks them, for commands that decode nothing (`info --verify`, `convert`): the same errors,
/// naming the file and field.
pub fn check_generation_config(dir: &std::path::Path, g: &GenerationConfig) -> anyhow::Result<()> {
    let p = super::load::sampling(dir, g, None, None, None)?;
    PenaltyArgs::default().apply(p, dir, g)?;
    // the shortest prompt: one token
    super::load::new_tokens(None, g, dir, 1)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_penalty_without_a_window_is_warned_about() {
        let a = |repeat_penalty, repeat_last_n| PenaltyArgs {
            min_p: None,
            repeat_penalty: Some(repeat_penalty),
            repeat_last_n: Some(repeat_last_n),
        };
        let w = a(1.1, 0).warning().expect("a warning");
        assert!(
            w.starts_with("warning: --repeat-penalty 1.1 has no effect"),
            "{w}"
        );
        assert!(w.contains("--repeat-last-n"), "{w}");
        assert_eq!(a(1.0, 0).warning(), None);
        assert_eq!(a(1.1, 64).warning(), None);
        assert_eq!(PenaltyArgs::default().warning(), None);
        let g = GenerationConfig::default();
        let w = PenaltyArgs {
            repeat_last_n: Some(WHOLE_SEQUENCE),
            ..Default::default()
        };
        let text = w.window_warning(&g).expect("a warning");
        assert!(
            text.starts_with("warning: --repeat-last-n -1 has no effect: no repeat penalty"),
            "{text}"
        );
        let file = GenerationConfig {
            repetition_penalty: Some(1.2),
            ..Default::default()
        };
        assert_eq!(w.window_warning(&file), None);
        assert_eq!(a(1.1, 64).window_warning(&g), None);
        assert!(a(1.0, 64).window_warning(&g).is_some());
        assert_eq!(a(1.0, 0).window_warning(&g), None);
    }

    /// transformers 5.24.0 `_get_logits_processor`: `repetition_penalty` is a processor (greedy or
    /// sampled, over the whole sequence), `min_p` a warper (only with `do_sample`); flags win.
    #[test]
    fn penalties_follow_generation_config_then_flags() {
        let dir = std::path::Path::new("m");
        let file = |do_sample, min_p, repetition_penalty| GenerationConfig {
            do_sample,
            min_p,
            repetition_penalty,
            ..Default::default()
        };
        let got = |a: &PenaltyArgs, g: &GenerationConfig| {
            let p = a.apply(SamplingParams::default(), dir, g).unwrap();
            (p.min_p, p.repeat_penalty, p.repeat_last_n)
        };
        let none = PenaltyArgs::default();
        assert_eq!(
            got(&none, &file(false, None, None)),
            (0.0, 1.0, REPEAT_LAST_N)
        );
        // greedy: the file's penalty over the whole sequence, its min_p unused
        let g = file(false, Some(0.1), Some(1.2));
        assert_eq!(got(&none, &g), (0.0, 1.2, WHOLE_SEQUENCE));
        // sampled: min_p too
        let g = file(true, Some(0.1), Some(1.2));
        assert_eq!(got(&none, &g), (0.1, 1.2, WHOLE_SEQUENCE));
        // a flag's penalty has llama.cpp's window unless --repeat-last-n says otherwise
        let flags = PenaltyArgs {
            min_p: Some(0.05),
            repeat_penalty: Some(1.1),
            repeat_last_n: None,
        };
        assert_eq!(got(&flags, &g), (0.05, 1.1, REPEAT_LAST_N));
        let window = PenaltyArgs {
            repeat_last_n: Some(32),
            ..Default::default()
        };
        assert_eq!(got(&window, &g), (0.1, 1.2, 32));
        // a flag covers a bad file value: nothing of the file is used, nothing refused
        let bad = file(true, Some(2.0), Some(-1.0));
        assert_eq!(got(&flags, &bad), (0.05, 1.1, REPEAT_LAST_N));
        for (g, want) in [
            (
                file(true, Some(2.0), None),
                "m/generation_config.json: min_p must be in [0, 1]",
            ),
            (
                file(false, None, Some(0.0)),
                "m/generation_config.json: repetition_penalty must be a finite number > 0",
            ),
        ] {
            let e = none.apply(SamplingParams::default(), dir, &g).unwrap_err();
            assert!(e.to_string().starts_with(want), "{e}");
        }
        // greedy ignores the file's min_p entirely, as transformers does
        assert_eq!(got(&none, &file(false, Some(2.0), None)).0, 0.0);
    }

    #[test]
    fn greedy_flags_warning_names_each_given_flag() {
        let f = |k, p, m, s| {
            [
                ("--top-k", k),
                ("--top-p", p),
                ("--min-p", m),
                ("--seed", s),
            ]
        };
        assert_eq!(
            greedy_flags_warning(f(false, false, false, false), true),
            None
        );
        let w = greedy_flags_warning(f(true, false, false, false), true).unwrap();
        assert!(
            w.starts_with("warning: --top-k has no effect: the temperature is 0"),
            "{w}"
        );
        assert!(!w.contains("generation_config.json"), "{w}");
        let w = greedy_flags_warning(f(true, true, true, true), false).unwrap();
        assert!(
            w.starts_with("warning: --top-k, --top-p, --min-p and --seed have no effect"),
            "{w}"
        );
        assert!(
            w.contains("(generation_config.json does not set do_sample)"),
            "{w}"
        );
    }
}
