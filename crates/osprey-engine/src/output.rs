//! A request's view of its sequence: engine events turned into text deltas.
//!
//! Detokenization and stop strings run here, on the request's task, so the engine thread only
//! ever deals in token ids. When a stop string matches, the stream ends and dropping it tells
//! the engine to free the sequence.

use osprey_core::{Error, FinishReason};

use crate::Engine;
use crate::detokenizer::{IncrementalDecoder, StopMatcher, StopOutcome};
use crate::request::{EventReceiver, SeqEvent};
use crate::sampler::{Sampled, TokenLogprob};

/// One increment of a generation.
#[derive(Clone, Debug, Default)]
pub struct Delta {
    /// Text that is now final (may be empty while a UTF-8 character or a possible stop
    /// string is incomplete).
    pub text: String,
    /// The token this delta came from.
    pub token: Option<Sampled>,
    /// Log-probabilities of a run of prompt tokens.
    pub prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
    /// Set on the last delta.
    pub finish: Option<FinishReason>,
}

/// The stream of one sequence's output. Dropping it cancels the sequence.
pub struct Generation {
    engine: Engine,
    events: EventReceiver,
    decoder: IncrementalDecoder,
    stops: StopMatcher,
    generated: usize,
    done: bool,
}

impl Generation {
    pub(crate) fn new(engine: Engine, events: EventReceiver, stop: &[String]) -> Self {
        Self {
            engine,
            events,
            decoder: IncrementalDecoder::default(),
            stops: StopMatcher::new(stop),
            generated: 0,
            done: false,
        }
    }

    /// Tokens generated so far (what `usage.completion_tokens` counts).
    pub fn generated_tokens(&self) -> usize {
        self.generated
    }

    /// The next delta; `None` after the last.
    pub async fn next(&mut self) -> Option<Result<Delta, Error>> {
        if self.done {
            return None;
        }
        let Some(event) = self.events.recv().await else {
            self.done = true;
            return Some(Err(Error::internal("the engine dropped the request")));
        };
        Some(Ok(match event {
            SeqEvent::PromptLogprobs(lps) => Delta {
                prompt_logprobs: Some(lps),
                ..Delta::default()
            },
            SeqEvent::Token(sampled) => {
                self.generated += 1;
                let text = self
                    .decoder
                    .push(self.engine.tokenizer().token_bytes(sampled.id));
                let (text, finish) = match self.stops.push(&text) {
                    StopOutcome::Continue(t) => (t, None),
                    StopOutcome::Stopped(t) => {
                        self.done = true;
                        (t, Some(FinishReason::Stop))
                    }
                };
                Delta {
                    text,
                    token: Some(sampled),
                    prompt_logprobs: None,
                    finish,
                }
            }
            SeqEvent::Finished(reason) => {
                self.done = true;
                let tail = self.decoder.finish();
                let (text, finish) = match self.stops.push(&tail) {
                    StopOutcome::Continue(t) => (t + &self.stops.finish(), reason),
                    StopOutcome::Stopped(t) => (t, FinishReason::Stop),
                };
                Delta {
                    text,
                    finish: Some(finish),
                    ..Delta::default()
                }
            }
            SeqEvent::Failed(e) => {
                self.done = true;
                return Some(Err(e));
            }
        }))
    }
}

impl Engine {
    /// Submits a validated request and returns its output stream.
    pub fn generate(&self, request: crate::ValidRequest) -> Result<Generation, Error> {
        let stop = request.request().params.stop.clone();
        let events = self.submit(request)?;
        Ok(Generation::new(self.clone(), events, &stop))
    }
}
