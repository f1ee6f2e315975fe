//! Stop strings over streamed text: text that could still become a stop string is held back, so
//! no partial stop string is ever emitted, and nothing after a stop string is.

/// Matches up to a few stop strings against a text stream.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// Empty strings are ignored.
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Whether a stop string was found (nothing more is emitted after it).
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Add `text`; returns the text that can be emitted now. After a stop, always empty.
    pub fn push(&mut self, text: &str) -> String {
        if self.stopped {
            return String::new();
        }
        self.held.push_str(text);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            self.stopped = true;
            let out = self.held[..at].to_string();
            self.held.clear();
            return out;
        }
        // the longest suffix of `held` that is a proper prefix of a stop string stays held
        let keep = self
            .stops
            .iter()
            .map(|s| longest_suffix_prefix(&self.held, s))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        out
    }

    /// At the end of the stream: the held-back text (it never became a stop string).
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        std::mem::take(&mut self.held)
    }
}

/// Length in bytes of the longest suffix of `text` that is a proper prefix of `stop` (on
/// character boundaries of both).
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    let max = text.len().min(stop.len().saturating_sub(1));
    (1..=max)
        .rev()
        .find(|&n| {
            let start = text.len() - n;
            text.is_char_boundary(start) && stop.is_char_boundary(n) && text[start..] == stop[..n]
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], chunks: &[&str]) -> (Vec<String>, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out: Vec<String> = chunks.iter().map(|c| m.push(c)).collect();
        out.push(m.finish());
        (out, m.stopped())
    }

    #[test]
    fn stop_across_chunks_is_held_then_dropped() {
        let (out, stopped) = run(&["END"], &["abc E", "N", "D tail"]);
        assert_eq!(out, ["abc ", "", "", ""]);
        assert!(stopped);
    }

    #[test]
    fn false_start_is_released() {
        let (out, stopped) = run(&["END"], &["abc EN", "x", " more"]);
        assert_eq!(out.concat(), "abc ENx more");
        assert_eq!(out[0], "abc ");
        assert!(!stopped);
    }

    #[test]
    fn earliest_of_several_stops_and_multibyte() {
        let (out, stopped) = run(&["ü!", "b"], &["aé", "ü", "!b"]);
        assert_eq!(out.concat(), "aé");
        assert!(stopped);
        let (out, _) = run(&["xyz"], &["héllo x", "y"]);
        assert_eq!(out, ["héllo ", "", "xy"]);
    }
}
