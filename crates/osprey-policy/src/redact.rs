//! PII replaced by typed placeholders (`<EMAIL_1>`, `<PHONE_2>`), numbered per kind in order of
//! first appearance, the same value always getting the same placeholder across every text of
//! one [`Redactor`] (all the messages of a request). The redactor remembers what it replaced, so
//! the answer can be given back with the values restored, for the same caller only, where the
//! tenant's policy allows.

use std::collections::HashMap;

use crate::pii::{self, PiiKind};

/// Redacts texts and restores them, keeping the placeholders consistent.
#[derive(Clone, Debug, Default)]
pub struct Redactor {
    by_value: HashMap<(PiiKind, String), String>,
    counts: HashMap<PiiKind, usize>,
    /// Placeholder → original, in the order made.
    originals: Vec<(String, String)>,
}

impl Redactor {
    /// `text` with every piece of PII of `kinds` (all when `None`) replaced by its placeholder.
    pub fn redact(&mut self, text: &str, kinds: Option<&[PiiKind]>) -> String {
        let found = pii::find(text);
        if found.is_empty() {
            return text.to_owned();
        }
        let chars: Vec<char> = text.chars().collect();
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        for m in found {
            if kinds.is_some_and(|ks| !ks.contains(&m.kind)) {
                continue;
            }
            out.extend(&chars[at..m.span.start]);
            let value: String = chars[m.span.start..m.span.end].iter().collect();
            out.push_str(&self.placeholder(m.kind, value));
            at = m.span.end;
        }
        out.extend(&chars[at..]);
        out
    }

    fn placeholder(&mut self, kind: PiiKind, value: String) -> String {
        if let Some(p) = self.by_value.get(&(kind, value.clone())) {
            return p.clone();
        }
        let n = self.counts.entry(kind).or_default();
        *n += 1;
        let p = format!("<{}_{n}>", kind.placeholder());
        self.originals.push((p.clone(), value.clone()));
        self.by_value.insert((kind, value), p.clone());
        p
    }

    /// `text` with every placeholder this redactor made replaced by its original value.
    pub fn restore(&self, text: &str) -> String {
        let mut out = text.to_owned();
        // Longest first: `<EMAIL_12>` before `<EMAIL_1>` cannot clash (the `>` closes them), but
        // keep the order stable anyway.
        for (p, original) in &self.originals {
            if out.contains(p.as_str()) {
                out = out.replace(p.as_str(), original);
            }
        }
        out
    }

    /// How many distinct values were replaced.
    pub fn len(&self) -> usize {
        self.originals.len()
    }

    /// Whether nothing was replaced.
    pub fn is_empty(&self) -> bool {
        self.originals.is_empty()
    }

    /// The longest placeholder made, in characters (what a stream restoring them must hold
    /// back); 0 if none.
    pub fn longest_placeholder(&self) -> usize {
        (self.originals.iter())
            .map(|(p, _)| p.chars().count())
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_is_typed_consistent_and_restorable() {
        let mut r = Redactor::default();
        let a = r.redact(
            "Email jane@example.com or call +44 20 7946 0958; again: jane@example.com",
            None,
        );
        assert_eq!(a, "Email <EMAIL_1> or call <PHONE_1>; again: <EMAIL_1>");
        let b = r.redact("Cc bob@example.org and jane@example.com", None);
        assert_eq!(
            b, "Cc <EMAIL_2> and <EMAIL_1>",
            "one numbering across texts"
        );
        let answer = "I wrote to <EMAIL_1> and <EMAIL_2>, and will ring <PHONE_1>.";
        assert_eq!(
            r.restore(answer),
            "I wrote to jane@example.com and bob@example.org, and will ring +44 20 7946 0958."
        );
        assert_eq!(r.len(), 3);
        assert_eq!(r.longest_placeholder(), "<EMAIL_1>".len());
    }

    #[test]
    fn only_the_kinds_asked_for_are_redacted() {
        let mut r = Redactor::default();
        let text = "jane@example.com from 10.0.0.7";
        let out = r.redact(text, Some(&[PiiKind::Email]));
        assert_eq!(out, "<EMAIL_1> from 10.0.0.7");
        assert_eq!(
            Redactor::default().redact("nothing here", None),
            "nothing here"
        );
    }
}
