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
