//! What happens to one request on its way, noted by the stages it passes through, for its row
//! in the request log ([`crate::request_log`]). Every [`Caller`](crate::edge::Caller) carries
//! one; notes are cheap (a lock held for a push), and the row is written once the answer's last
//! byte has gone.

use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

/// A guard's verdict on the request or its answer.
#[derive(Clone, Debug, Serialize)]
pub struct GuardNote {
    /// `user`, `system`, `tool`, `retrieved` or `output`.
    pub source: String,
    /// What it found (`prompt_injection`, `pii.email`, ...).
    pub category: String,
    /// The rule or detector.
    pub rule: String,
    /// `flag`, `redact` or `block`.
    pub action: String,
    /// Its score.
    pub score: f32,
}

/// What retrieval put in the prompt.
#[derive(Clone, Debug, Serialize)]
pub struct RetrievalNote {
    /// The collection searched.
    pub collection: String,
    /// The chunks put in, best first.
    pub hits: Vec<String>,
    /// How long the search took, ms.
    pub ms: f64,
}

/// What speculative decoding drafted for the answer, and how much of it the model accepted.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct SpeculationNote {
    /// Tokens drafted.
    pub drafted: usize,
    /// Of those, accepted.
    pub accepted: usize,
}

/// The notes so far.
#[derive(Debug, Default, Serialize)]
pub struct Notes {
    /// Guard verdicts that acted (flagged, redacted or blocked).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub guards: Vec<GuardNote>,
    /// Retrieval, when the request asked for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retrieval: Option<RetrievalNote>,
    /// Tool calls the answer made (function names).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<String>,
    /// Speculative decoding, when the engine drafted tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculation: Option<SpeculationNote>,
    /// When the engine produced the first token.
    #[serde(skip)]
    pub first_token: Option<Instant>,
    /// When it produced the last so far.
    #[serde(skip)]
    pub last_token: Option<Instant>,
    /// Tokens generated (over all choices).
    #[serde(skip)]
    pub tokens: u64,
    /// The error the answer ended with.
    #[serde(skip)]
    pub error: Option<String>,
    /// The prompt's text, when the request is sampled for text.
    #[serde(skip)]
    pub prompt_text: Option<String>,
    /// The answer's text so far, likewise.
    #[serde(skip)]
    pub response_text: Option<String>,
}

/// One request's notes.
#[derive(Debug, Default)]
pub struct RequestRecord {
    notes: Mutex<Notes>,
}

impl RequestRecord {
    /// Changes the notes.
    pub fn note(&self, f: impl FnOnce(&mut Notes)) {
        f(&mut self.notes.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Reads the notes.
    pub fn read<T>(&self, f: impl FnOnce(&Notes) -> T) -> T {
        f(&self.notes.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Notes a generated token.
    pub fn token(&self, at: Instant) {
        self.note(|n| {
            n.first_token.get_or_insert(at);
            n.last_token = Some(at);
            n.tokens += 1;
        });
    }
}
