//! The one context rule of every command that runs the model (`chat`, `serve`, `perplexity`,
//! `bench`): how many positions a run may use, and [`BadArgument`], the error of a command-line
//! value that the parser could not judge alone (`main` exits 2 on it, as on a parser error).

/// The context used when neither `--ctx` nor the model's config names one, and the largest default
/// (llama.cpp's default context size): a KV cache of 4096 positions fits every GPU this engine
/// targets, while a model's full trained context may not.
pub const DEFAULT_CTX: usize = 4096;

/// A bad value on the command line found after parsing (it depends on the model, say). `main`
/// prints `error: {0}` and exits with status 2, the status of a command-line error.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadArgument(pub String);

/// The context of a run in positions (prompt and generated tokens together).
///
/// `flag` is `--ctx` when given; `model` the model's `max_position_embeddings` (config.json) when
/// it names one. Without the flag: the model's context, at most [`DEFAULT_CTX`] (the KV cache's
/// size on the GPU); [`DEFAULT_CTX`] when the config names none. With the flag: its value, which
/// must be at least 2 and no larger than the model's context: positions past the trained context
/// are not the model's output. Errors: [`BadArgument`] naming `--ctx`, its value and the model's.
pub fn context_length(flag: Option<usize>, model: Option<usize>) -> Result<usize, BadArgument> {
    match (flag, model) {
        (Some(n), _) if n < 2 => Err(BadArgument(format!(
            "--ctx {n}: a context needs at least 2 positions"
        ))),
        (Some(n), Some(max)) if n > max => Err(BadArgument(format!(
            "--ctx {n} is more than the model's context of {max} positions (config.json: \
             max_position_embeddings); use --ctx {max} or less"
        ))),
        (Some(n), _) => Ok(n),
        (None, Some(max)) => Ok(max.min(DEFAULT_CTX)),
        (None, None) => Ok(DEFAULT_CTX),
    }
}

/// `anyhow::ensure!` for command-line values: returns a [`BadArgument`] (exit 2) made of the
/// format arguments when `cond` is false.
macro_rules! ensure_arg {
    ($cond:expr, $($fmt:tt)*) => {
        if !$cond {
            return Err($crate::cli::context::BadArgument(format!($($fmt)*)).into());
        }
    };
}
pub(crate) use ensure_arg;

/// A value check's error as a [`BadArgument`] (exit 2), its text and causes kept.
pub trait OrBadArgument<T> {
    fn or_bad_argument(self) -> Result<T, BadArgument>;
}

impl<T, E: std::fmt::Display> OrBadArgument<T> for Result<T, E> {
    fn or_bad_argument(self) -> Result<T, BadArgument> {
        self.map_err(|e| BadArgument(format!("{e:#}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_is_the_models_capped_or_an_explicit_smaller_one() {
        assert_eq!(context_length(None, Some(512)).unwrap(), 512);
        assert_eq!(context_length(None, Some(131_072)).unwrap(), DEFAULT_CTX);
        assert_eq!(context_length(None, None).unwrap(), DEFAULT_CTX);
        assert_eq!(context_length(Some(100), Some(512)).unwrap(), 100);
        assert_eq!(context_length(Some(512), Some(512)).unwrap(), 512);
        assert_eq!(context_length(Some(9000), None).unwrap(), 9000);
        let e = context_length(Some(513), Some(512)).unwrap_err().0;
        assert!(
            e.starts_with("--ctx 513 is more than the model's context of 512 positions"),
            "{e}"
        );
        assert!(context_length(Some(1), None)
            .unwrap_err()
            .0
            .contains("at least 2"));
    }
}
