//! Progress bars on stderr (indicatif), shared by every long command (`convert`, `synth`,
//! `info --verify`, `perplexity`, `bench`): drawn only when stderr is a terminal, and with an ETA
//! that reads `?` until there is a rate to estimate it from (indicatif's own `{eta}` shows days
//! while the first bytes are still being prepared).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use std::time::Duration;

/// A bar of `total` units on stderr with `template` (indicatif's template syntax; `{eta}` is
/// this module's estimate), or a hidden bar when `show` is false or stderr is not a terminal.
/// Panics only on a malformed `template`, a programming error.
pub fn bar(show: bool, total: u64, template: &str) -> ProgressBar {
    if !show || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(template)
        .expect("a valid progress template")
        .with_key("eta", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = w.write_str(&eta_text(s.pos(), s.len(), s.elapsed()));
        });
    pb.set_style(style);
    pb
}

/// A spinner on stderr saying `msg` (ticking every 100 ms) until it is cleared, for a wait of
/// unknown length such as the first token of a process (model upload, kernel compilation); hidden
/// when `show` is false or stderr is not a terminal.
pub fn spinner(show: bool, msg: &str) -> ProgressBar {
    if !show || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("a valid template"),
    );
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(Duration::from_millis(100));
    pb
}

/// The remaining time of `pos` of `len` units done in `elapsed`, at the mean rate so far, as
/// `1h02m`, `3m05s` or `12s`; `?` before one second or the first unit, or without a length.
pub fn eta_text(pos: u64, len: Option<u64>, elapsed: Duration) -> String {
    let Some(len) = len else {
        return "?".into();
    };
    if pos == 0 || elapsed < Duration::from_secs(1) {
        return "?".into();
    }
    let left = len.saturating_sub(pos) as f64 * elapsed.as_secs_f64() / pos as f64;
    let s = left.round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eta_waits_for_a_rate_then_extrapolates_the_mean() {
        let sec = Duration::from_secs;
        assert_eq!(eta_text(0, Some(100), sec(30)), "?");
        assert_eq!(eta_text(10, Some(100), Duration::from_millis(500)), "?");
        assert_eq!(eta_text(10, None, sec(5)), "?");
        // 10 of 100 in 5 s: 90 more at 2 per second
        assert_eq!(eta_text(10, Some(100), sec(5)), "45s");
        assert_eq!(eta_text(1, Some(100), sec(5)), "8m15s");
        assert_eq!(eta_text(1, Some(1000), sec(10)), "2h46m");
        assert_eq!(eta_text(100, Some(100), sec(10)), "0s");
    }
}
