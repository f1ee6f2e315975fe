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
    /// `p` with these settings.
    pub fn apply(&self, p: SamplingParams) -> SamplingParams {
        SamplingParams {
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            ..p
        }
    }
}
