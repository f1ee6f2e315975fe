//! Value parsers of command-line arguments shared by several subcommands.

/// A buffer size in MiB: a whole number from 1 to 2^20.
pub fn parse_mib(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(v) if (1..=1 << 20).contains(&v) => Ok(v),
        _ => Err(format!(
            "expected a size in MiB from 1 to 1048576, got {s:?}"
        )),
    }
}

/// A repetition count: a whole number from 1 to 100000.
pub fn parse_iters(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if (1..=100_000).contains(&v) => Ok(v),
        _ => Err(format!("expected a count from 1 to 100000, got {s:?}")),
    }
}

/// A whole number of at least 1 (`--expert-slots`, `--ping-ms`); the message says so in words
/// rather than as clap's `1..18446744073709551615`.
pub fn parse_positive(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(v) if v >= 1 => Ok(v),
        _ => Err(format!("expected a whole number of at least 1, got {s:?}")),
    }
}

/// A number of sequence slots (`serve --parallel`): a whole number from 1 to 256.
pub fn parse_slots(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if (1..=256).contains(&v) => Ok(v),
        _ => Err(format!("expected a whole number from 1 to 256, got {s:?}")),
    }
}

/// Timed decode steps of a bench (`bench decode --tokens`, `bench batch --tokens`): a whole
/// number from 1 to 1048576, so that the probe prompt plus the steps cannot overflow.
pub fn parse_steps(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if (1..=1 << 20).contains(&v) => Ok(v),
        _ => Err(format!(
            "expected a whole number from 1 to 1048576, got {s:?}"
        )),
    }
}

/// A token count of at least 1 (`chat --max-tokens`).
pub fn parse_tokens(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if v >= 1 => Ok(v),
        _ => Err(format!("expected a whole number of at least 1, got {s:?}")),
    }
}

/// A sampling temperature: a finite number ≥ 0 (0 = greedy).
pub fn parse_temperature(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!(
            "expected a finite number ≥ 0 (0 = greedy), got {s:?}"
        )),
    }
}

/// A nucleus-sampling mass in (0, 1] (1 = off).
pub fn parse_top_p(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("expected a number in (0, 1] (1 = off), got {s:?}")),
    }
}

/// A min-p value: a number in [0, 1].
pub fn parse_min_p(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("expected a number in [0, 1] (0 = off), got {s:?}")),
    }
}

/// A repeat-penalty window (`--repeat-last-n`): a whole number of ids (0 = off), or -1 for the
/// whole sequence ([`crate::model::sampling::WHOLE_SEQUENCE`], llama.cpp's meaning of -1).
pub fn parse_repeat_last_n(s: &str) -> Result<usize, String> {
    match s.trim() {
        "-1" => Ok(crate::model::sampling::WHOLE_SEQUENCE),
        t => t.parse::<usize>().map_err(|_| {
            format!(
                "expected a whole number of ids (0 = off) or -1 (the whole sequence), got {s:?}"
            )
        }),
    }
}

/// A repeat penalty: a finite number > 0.
pub fn parse_repeat_penalty(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("expected a finite number > 0 (1 = off), got {s:?}")),
    }
}

/// A model id (`serve --model-id`): the name clients send as `model`, not empty or blank, and
/// without control characters.
pub fn parse_model_id(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err(
            "expected a name clients can send as \"model\", got an empty or blank one".into(),
        );
    }
    if s.chars().any(char::is_control) {
        return Err(format!(
            "expected a name without control characters, got {s:?}"
        ));
    }
    Ok(s.to_string())
}

/// A top-k: a whole number ≥ 0, 0 = off; -1 is off too, as in vLLM and `serve`'s requests.
pub fn parse_top_k(s: &str) -> Result<usize, String> {
    match s.parse::<i64>() {
        Ok(-1) => Ok(0),
        Ok(k) if k >= 0 => Ok(usize::try_from(k).unwrap_or(usize::MAX)),
        _ => Err(format!(
            "expected a whole number ≥ 0 (0 or -1 = off), got {s:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_parsers_accept_their_range_and_name_it() {
        assert_eq!(parse_positive("1"), Ok(1));
        assert!(parse_positive("0").unwrap_err().contains("at least 1"));
        assert!(parse_positive("-3").is_err());
        assert_eq!(parse_temperature("0"), Ok(0.0));
        assert_eq!(parse_temperature("0.7"), Ok(0.7));
        for bad in ["-1", "nan", "inf", "x"] {
            assert!(parse_temperature(bad).unwrap_err().contains("≥ 0"), "{bad}");
        }
        assert_eq!(parse_top_p("1"), Ok(1.0));
        assert_eq!(parse_top_p("0.5"), Ok(0.5));
        for bad in ["0", "1.5", "-0.1", "nan"] {
            assert!(parse_top_p(bad).unwrap_err().contains("(0, 1]"), "{bad}");
        }
    }

    #[test]
    fn penalty_parsers_accept_their_range() {
        assert_eq!(parse_min_p("0.05"), Ok(0.05));
        assert!(
            parse_min_p("1.5").is_err()
                && parse_min_p("-0.1").is_err()
                && parse_min_p("nan").is_err()
        );
        assert_eq!(parse_repeat_penalty("1.1"), Ok(1.1));
        assert!(parse_repeat_penalty("0").is_err() && parse_repeat_penalty("inf").is_err());
        assert_eq!(parse_repeat_last_n("0"), Ok(0));
        assert_eq!(parse_repeat_last_n("64"), Ok(64));
        assert_eq!(
            parse_repeat_last_n("-1"),
            Ok(crate::model::sampling::WHOLE_SEQUENCE)
        );
        for bad in ["-2", "1.5", "x"] {
            assert!(
                parse_repeat_last_n(bad)
                    .unwrap_err()
                    .contains("-1 (the whole sequence)"),
                "{bad}"
            );
        }
    }
}
