//! Output filtering that holds on streams. An [`OutputFilter`] takes the model's text in
//! pieces (tokens) and gives back what may be sent: never a part of a deny-listed phrase, of a
//! secret or of other PII, and the caller's own values put back where the input was redacted.
//!
//! The filter holds back the last [`OutputFilter::window`] characters. A character is released
//! only once `window` characters have followed it; every rule's match is at most `window`
//! characters long (the window is at least the longest deny-listed phrase and placeholder, and
//! PII formats are shorter than its floor, [`MIN_WINDOW`]), so any match that could cover a
//! character is complete, and acted on, before that character leaves. A match still open at
//! the edge of the window holds back from its start. At the end, [`OutputFilter::finish`]
//! releases the rest. The delay this adds to safe text is at most `window` characters of output.

use std::sync::{Arc, LazyLock};

use regex::Regex;

use crate::Action;
use crate::pii;
use crate::redact::Redactor;

/// The smallest window: longer than every PII format but private keys, which are blocked when
/// their header is seen.
pub const MIN_WINDOW: usize = 96;

/// What the output of a tenant is filtered for.
#[derive(Clone, Debug, Default)]
pub struct OutputRules {
    /// Phrases never sent (case-insensitive, any whitespace between words).
    pub deny: Vec<String>,
    /// What is done with PII the model writes: `Redact` (placeholders) or `Block`.
    pub pii: Option<Action>,
}

impl OutputRules {
    /// Whether anything is filtered.
    pub fn is_active(&self) -> bool {
        !self.deny.is_empty() || self.pii.is_some()
    }
}

/// Why an answer was stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// A deny-listed phrase.
    Denied,
    /// PII, under a policy that blocks it.
    Pii(pii::PiiKind),
}

impl Stop {
    /// The rule's name.
    pub fn rule(self) -> &'static str {
        match self {
            Self::Denied => "deny_list",
            Self::Pii(kind) => kind.as_str(),
        }
    }
}

/// A stream's output filter.
pub struct OutputFilter {
    deny: Option<Regex>,
    pii: Option<Action>,
    restore: Option<Arc<Redactor>>,
    /// Placeholders of the model's own PII.
    redactor: Redactor,
    window: usize,
    /// Text not yet released.
    pending: String,
    stopped: Option<Stop>,
}

static PLACEHOLDER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"<[A-Z]+_\d+>").expect("a valid pattern"));

impl OutputFilter {
    /// A filter applying `rules`, and putting back the values `restore` replaced in the input.
    pub fn new(rules: &OutputRules, restore: Option<Arc<Redactor>>) -> Self {
        let phrases: Vec<String> = (rules.deny.iter())
            .map(|p| p.split_whitespace().map(regex::escape).collect::<Vec<_>>())
            .filter(|words| !words.is_empty())
            .map(|words| words.join(r"\s+"))
            .collect();
        let deny = (!phrases.is_empty()).then(|| {
            Regex::new(&format!(r"(?i)\b(?:{})\b", phrases.join("|"))).expect("escaped phrases")
        });
        let longest_phrase = rules.deny.iter().map(|p| p.chars().count()).max();
        let longest_placeholder = restore.as_ref().map(|r| r.longest_placeholder());
        let window = [Some(MIN_WINDOW), longest_phrase, longest_placeholder]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(MIN_WINDOW);
        Self {
            deny,
            pii: rules.pii,
            // Numbered on from the input's, so a new value never takes a caller's placeholder.
            redactor: restore.as_deref().cloned().unwrap_or_default(),
            restore,
            window,
            pending: String::new(),
            stopped: None,
        }
    }

    /// Characters held back.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Why the answer was stopped, if it was.
    pub fn stopped(&self) -> Option<Stop> {
        self.stopped
    }

    /// Takes `piece`; returns the text that may be sent now (`Err` once the answer is stopped:
    /// nothing more is sent).
    pub fn push(&mut self, piece: &str) -> Result<String, Stop> {
        if let Some(stop) = self.stopped {
            return Err(stop);
        }
        self.pending.push_str(piece);
        self.release(false)
    }

    /// The end of the answer: returns the rest that may be sent.
    pub fn finish(&mut self) -> Result<String, Stop> {
        if let Some(stop) = self.stopped {
            return Err(stop);
        }
        self.release(true)
    }

    /// Filters a whole answer at once.
    pub fn filter_all(&mut self, text: &str) -> Result<String, Stop> {
        let mut out = self.push(text)?;
        out.push_str(&self.finish()?);
        Ok(out)
    }

    fn release(&mut self, all: bool) -> Result<String, Stop> {
        if let Some(deny) = &self.deny
            && deny.is_match(&self.pending)
        {
            return Err(self.stop(Stop::Denied));
        }
        let chars = self.pending.chars().count();
        let mut cut = match all {
            true => chars,
            false => chars.saturating_sub(self.window),
        };
        if cut == 0 {
            return Ok(String::new());
        }
        let found = match self.pii {
            Some(_) => pii::find(&self.pending),
            None => Vec::new(),
        };
        // A match reaching past the cut holds back from its start.
        for m in &found {
            if m.span.start < cut && m.span.end > cut {
                cut = m.span.start;
            }
        }
        let byte = |c: usize| {
            (self.pending.char_indices())
                .nth(c)
                .map_or(self.pending.len(), |(b, _)| b)
        };
        for m in PLACEHOLDER.find_iter(&self.pending) {
            let (start, end) = (
                self.pending[..m.start()].chars().count(),
                self.pending[..m.end()].chars().count(),
            );
            if start < cut && end > cut {
                cut = start;
            }
        }
        let at = byte(cut);
        let released: String = self.pending.drain(..at).collect();
        let mut out = String::with_capacity(released.len());
        let chars: Vec<char> = released.chars().collect();
        let mut from = 0;
        for m in found.iter().filter(|m| m.span.end <= cut) {
            if self.pii == Some(Action::Block) {
                return Err(self.stop(Stop::Pii(m.kind)));
            }
            out.extend(&chars[from..m.span.start]);
            let value: String = chars[m.span.start..m.span.end].iter().collect();
            out.push_str(&self.redactor.redact(&value, Some(&[m.kind])));
            from = m.span.end;
        }
        out.extend(&chars[from..]);
        Ok(match &self.restore {
            Some(r) => r.restore(&out),
            None => out,
        })
    }

    fn stop(&mut self, stop: Stop) -> Stop {
        self.pending.clear();
        self.stopped = Some(stop);
        stop
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(deny: &[&str], pii: Option<Action>) -> OutputRules {
        OutputRules {
            deny: deny.iter().map(|s| s.to_string()).collect(),
            pii,
        }
    }

    /// Streams `text` through `filter` one character at a time; the text sent, and whether it
    /// was stopped. Also checks that no more than the window is ever held.
    fn stream(filter: &mut OutputFilter, text: &str) -> (String, Option<Stop>) {
        let mut sent = String::new();
        let mut taken = 0;
        for c in text.chars() {
            taken += 1;
            match filter.push(&c.to_string()) {
                Ok(s) => sent.push_str(&s),
                Err(stop) => return (sent, Some(stop)),
            }
            assert!(
                taken - sent.chars().count() <= filter.window() + 40,
                "held too long"
            );
        }
        match filter.finish() {
            Ok(s) => sent.push_str(&s),
            Err(stop) => return (sent, Some(stop)),
        }
        (sent, None)
    }

    #[test]
    fn a_denied_phrase_split_across_tokens_is_never_sent() {
        let text = format!(
            "{}The secret launch code is ALPHA   tango 42, as agreed.",
            "Some harmless text first. ".repeat(10)
        );
        let mut f = OutputFilter::new(&rules(&["launch code is alpha tango"], None), None);
        let (sent, stopped) = stream(&mut f, &text);
        assert_eq!(stopped, Some(Stop::Denied));
        let lower = sent.to_lowercase();
        for prefix in ["launch code", "launch c", "alpha"] {
            assert!(
                !lower.contains(prefix) || !lower.contains("launch code is"),
                "{sent}"
            );
        }
        assert!(!lower.contains("launch"), "not even its start: {sent}");
        assert!(sent.starts_with("Some harmless text first."), "{sent}");
    }

    #[test]
    fn safe_text_comes_through_whole_and_at_most_a_window_late() {
        let text = "A long, ordinary answer about the weather in Lima. ".repeat(20);
        let mut f = OutputFilter::new(&rules(&["forbidden words"], Some(Action::Redact)), None);
        let mut sent = String::new();
        for (i, c) in text.chars().enumerate() {
            sent.push_str(&f.push(&c.to_string()).unwrap());
            let behind = i + 1 - sent.chars().count();
            assert!(behind <= f.window(), "{behind} > {}", f.window());
        }
        sent.push_str(&f.finish().unwrap());
        assert_eq!(sent, text);
    }

    #[test]
    fn pii_the_model_writes_is_redacted_or_stops_the_answer() {
        let text = "Sure. Write to maria.lopez@example.com or call +1-202-555-0143 today.";
        let mut f = OutputFilter::new(&rules(&[], Some(Action::Redact)), None);
        let (sent, stopped) = stream(&mut f, text);
        assert_eq!(stopped, None);
        assert_eq!(sent, "Sure. Write to <EMAIL_1> or call <PHONE_1> today.");
        let mut f = OutputFilter::new(&rules(&[], Some(Action::Block)), None);
        let (sent, stopped) = stream(&mut f, text);
        assert_eq!(stopped, Some(Stop::Pii(pii::PiiKind::Email)));
        assert!(!sent.contains("maria"), "{sent}");
    }

    #[test]
    fn the_callers_own_values_are_put_back() {
        let mut input = Redactor::default();
        let redacted = input.redact("my email is jane@example.com", None);
        assert_eq!(redacted, "my email is <EMAIL_1>");
        let restore = Some(Arc::new(input));
        let mut f = OutputFilter::new(&rules(&[], Some(Action::Redact)), restore);
        let (sent, _) = stream(
            &mut f,
            "I will write to <EMAIL_1> tomorrow, and to bob@example.org.",
        );
        assert_eq!(
            sent,
            "I will write to jane@example.com tomorrow, and to <EMAIL_2>."
        );
    }
}
