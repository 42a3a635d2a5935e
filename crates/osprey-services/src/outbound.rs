//! The way out: one chain of [`Step`]s over an answer's typed events, run by the writer that
//! writes it ([`crate::write`]), in the one task that writes it.
//!
//! Guard-out, cache keep, turn keep, citations and the request log's text each act on the
//! answer as it passes, in that order. Each delta passes the steps in order before it is
//! written: a step may change it, hold it back ([`Seen::Drop`]: the later steps do not see it),
//! or end the answer with it ([`Seen::Last`]). When the answer is complete (its usage came, or
//! a step ended it) every step's [`Step::end`] runs, before the client sees the end: what a step
//! adds there goes under the answer's `osprey` (a stream's last chunk before `[DONE]`), and a
//! step that fails there fails the answer (a stream ends with the error event instead of
//! `[DONE]`). An answer cut short (the backend failed, the client left) ends no step: nothing
//! half-done is kept. JSON or SSE is written once, by the writer, after the steps.

use axum::http::HeaderMap;
use futures_util::future::BoxFuture;
use osprey_core::Error;
use osprey_core::api::Usage;
use osprey_core::backend::ChoiceDelta;
use serde_json::{Map, Value};

/// What a step makes of a delta.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Pass it on to the next step.
    Send,
    /// Nothing in it is for the client yet: the later steps do not see it and it is not sent.
    Drop,
    /// Pass it on, and end the answer after it.
    Last,
}

/// A complete answer, as its steps' ends see it.
pub struct Complete<'a> {
    /// Its id, as written.
    pub id: &'a str,
    /// When it was made (Unix seconds).
    pub created: u64,
    /// The model it names.
    pub model: &'a str,
    /// Whether it is a chat answer (else a text completion).
    pub chat: bool,
    /// Its token counts; none for an answer a step ended before the backend did.
    pub usage: Option<&'a Usage>,
}

/// One step of the way out. Every method does nothing by default.
pub trait Step: Send {
    /// Marks the response's headers, before any of its body goes.
    fn headers(&mut self, _headers: &mut HeaderMap) {}

    /// Sees (and may change) a delta of the answer.
    fn delta(&mut self, _delta: &mut ChoiceDelta) -> Seen {
        Seen::Send
    }

    /// The answer failed halfway with `error`.
    fn error(&mut self, _error: &Error) {}

    /// The answer is complete: what the step adds under its `osprey`, if anything.
    fn end<'a>(&'a mut self, _answer: &'a Complete<'a>) -> BoxFuture<'a, Result<Added, Error>> {
        Box::pin(std::future::ready(Ok(None)))
    }
}

/// A field a step adds under an answer's `osprey`: its name and value.
pub type Added = Option<(&'static str, Value)>;

/// The steps an answer passes on its way out, in order.
#[derive(Default)]
pub struct Outbound {
    steps: Vec<Box<dyn Step>>,
}

impl Outbound {
    /// Adds `step` after the others.
    pub fn push(&mut self, step: impl Step + 'static) {
        self.steps.push(Box::new(step));
    }

    /// Adds `step`, if there is one, after the others.
    pub fn push_some(&mut self, step: Option<impl Step + 'static>) {
        if let Some(step) = step {
            self.push(step);
        }
    }

    /// Every step marks `headers`.
    pub fn headers(&mut self, headers: &mut HeaderMap) {
        self.steps.iter_mut().for_each(|s| s.headers(headers));
    }

    /// `delta` through the steps in order, until one holds it back.
    pub fn delta(&mut self, delta: &mut ChoiceDelta) -> Seen {
        let mut seen = Seen::Send;
        for step in &mut self.steps {
            match step.delta(delta) {
                Seen::Send => {}
                Seen::Drop => return Seen::Drop,
                Seen::Last => seen = Seen::Last,
            }
        }
        seen
    }

    /// Every step hears that the answer failed.
    pub fn error(&mut self, error: &Error) {
        self.steps.iter_mut().for_each(|s| s.error(error));
    }

    /// Every step's end, in order: what they add under `osprey`; the first failure.
    pub async fn end(&mut self, answer: &Complete<'_>) -> Result<Map<String, Value>, Error> {
        let mut osprey = Map::new();
        for step in &mut self.steps {
            if let Some((name, value)) = step.end(answer).await? {
                osprey.insert(name.to_owned(), value);
            }
        }
        Ok(osprey)
    }
}
