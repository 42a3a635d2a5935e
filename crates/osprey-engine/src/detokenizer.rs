//! Streaming text out of tokens: whole UTF-8 characters only, and never a partial stop string.

/// Turns a stream of token bytes into text, holding back an incomplete UTF-8 sequence until
/// the bytes that complete it arrive.
#[derive(Default)]
pub struct IncrementalDecoder {
    pending: Vec<u8>,
}

impl IncrementalDecoder {
    /// Adds a token's bytes; returns the text that is now complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The first `valid_up_to` bytes are valid UTF-8 by definition.
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                    match e.error_len() {
                        // Incomplete sequence at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        // Invalid bytes: replace them, as a lossy decode would.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Whatever is held back, replaced lossily (at the end of the stream).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

/// What a [`StopMatcher`] lets through.
#[derive(Debug, PartialEq, Eq)]
pub enum StopOutcome {
    /// Text safe to emit (may be empty while a possible stop string is held back).
    Continue(String),
    /// A stop string matched; this is the text before it. Nothing more is emitted.
    Stopped(String),
}

/// Finds stop strings in streamed text, holding back any suffix that could begin one.
#[derive(Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Feeds newly decoded text.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stops.is_empty() {
            return StopOutcome::Continue(text.to_owned());
        }
        self.held.push_str(text);
        if let Some(pos) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            let before = self.held[..pos].to_owned();
            self.held.clear();
            return StopOutcome::Stopped(before);
        }
        let hold_from = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let emit = self.held[..hold_from].to_owned();
        self.held.drain(..hold_from);
        StopOutcome::Continue(emit)
    }

    /// Held-back text, released when the stream ends without a match.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_characters_wait_for_their_last_byte() {
        let mut d = IncrementalDecoder::default();
        let eagle = "🦅".as_bytes();
        assert_eq!(d.push(&eagle[..1]), "");
        assert_eq!(d.push(&eagle[1..3]), "");
        assert_eq!(d.push(&eagle[3..]), "🦅");
        assert_eq!(d.push(b"ok"), "ok");
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut d = IncrementalDecoder::default();
        assert_eq!(d.push(&[b'a', 0xff, b'b']), "a\u{fffd}b");
        assert_eq!(d.push(&[0xe2, 0x82]), "");
        assert_eq!(d.finish(), "\u{fffd}");
    }

    #[test]
    fn stop_strings_are_never_partially_emitted() {
        let mut m = StopMatcher::new(&["<END>".into()]);
        assert_eq!(m.push("hello <"), StopOutcome::Continue("hello ".into()));
        assert_eq!(m.push("EN"), StopOutcome::Continue(String::new()));
        assert_eq!(m.push("D> tail"), StopOutcome::Stopped("".into()));
    }

    #[test]
    fn false_alarm_releases_held_text() {
        let mut m = StopMatcher::new(&["stop".into()]);
        assert_eq!(m.push("a st"), StopOutcome::Continue("a ".into()));
        assert_eq!(m.push("ep"), StopOutcome::Continue("step".into()));
        assert_eq!(m.push("s"), StopOutcome::Continue(String::new()));
        assert_eq!(m.finish(), "s");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let mut m = StopMatcher::new(&["cd".into(), "b".into()]);
        assert_eq!(m.push("abcd"), StopOutcome::Stopped("a".into()));
    }
}
