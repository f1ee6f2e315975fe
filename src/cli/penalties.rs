//! The sampling flags every generating command shares beyond temperature, top-k and top-p:
//! `--min-p`, `--repeat-penalty` and `--repeat-last-n` (llama.cpp's names and meanings; defaults
//! off). They are flattened into `generate`, `chat` and `serve` (there: the defaults of requests
//! that do not set `min_p` / `repetition_penalty`).
use super::values::{parse_min_p, parse_repeat_penalty};
use crate::model::sampling::{SamplingParams, REPEAT_LAST_N};

#[derive(clap::Args, Debug, Clone)]
pub struct PenaltyArgs {
    /// Drop tokens less likely than MIN_P × the most likely one, in [0, 1] (0 = off).
    #[arg(long, default_value_t = 0.0, value_parser = parse_min_p)]
    pub min_p: f32,
    /// Repeat penalty > 0 over the last --repeat-last-n ids, as llama.cpp: a seen token's logit is
    /// divided by it when positive, multiplied when not (1 = off).
    #[arg(long, default_value_t = 1.0, value_parser = parse_repeat_penalty)]
    pub repeat_penalty: f32,
    /// How many of the latest ids (prompt and generated) the repeat penalty looks at (0 = off).
    #[arg(long, default_value_t = REPEAT_LAST_N)]
    pub repeat_last_n: usize,
}

impl PenaltyArgs {
    /// `p` with these settings; prints [`PenaltyArgs::warning`] on stderr when there is one.
    pub fn apply(&self, p: SamplingParams) -> SamplingParams {
        if let Some(w) = self.warning() {
            eprintln!("{w}");
        }
        SamplingParams {
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            ..p
        }
    }

    /// The warning for a repeat penalty that `--repeat-last-n 0` turns off (llama.cpp's meaning of
    /// 0 here: no window, so no penalty); `None` when the flags do what they say.
    pub fn warning(&self) -> Option<String> {
        (self.repeat_penalty != 1.0 && self.repeat_last_n == 0).then(|| {
            format!(
                "warning: --repeat-penalty {} has no effect: --repeat-last-n 0 turns the penalty \
                 off; give --repeat-last-n N (default {REPEAT_LAST_N}) to penalise the last N ids",
                self.repeat_penalty
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_penalty_without_a_window_is_warned_about() {
        let a = |repeat_penalty, repeat_last_n| PenaltyArgs {
            min_p: 0.0,
            repeat_penalty,
            repeat_last_n,
        };
        let w = a(1.1, 0).warning().expect("a warning");
        assert!(
            w.starts_with("warning: --repeat-penalty 1.1 has no effect"),
            "{w}"
        );
        assert!(w.contains("--repeat-last-n"), "{w}");
        assert_eq!(a(1.0, 0).warning(), None);
        assert_eq!(a(1.1, 64).warning(), None);
    }
}
