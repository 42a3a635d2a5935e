//! The latency of a request on the local engine, timed from its events: time to first
//! token, time per output token, end to end (labelled by model and priority), and what its
//! request record notes (every token's time, the tools it called, the error that ended it).

use std::time::Instant;

use futures_util::StreamExt;
use osprey_core::Priority;
use osprey_core::backend::{GenEvent, GenStream};
use osprey_core::metrics as names;

/// `events`, timed by `timer` as they pass.
pub fn timed(events: GenStream, mut timer: RequestTimer) -> GenStream {
    events
        .inspect(move |event| match event {
            Ok(GenEvent::Delta(delta)) => {
                (0..delta.tokens).for_each(|_| timer.token());
                let call = delta.tool_call.as_ref();
                if let Some(name) = call.and_then(|c| c.function.name.clone()) {
                    timer.note(|n| n.tool_calls.push(name));
                }
            }
            Ok(GenEvent::Usage(usage)) => {
                if let Some(d) = usage.completion_tokens_details {
                    let drafted = d.accepted_prediction_tokens + d.rejected_prediction_tokens;
                    timer.note(|n| {
                        n.speculation = Some(crate::record::SpeculationNote {
                            drafted,
                            accepted: d.accepted_prediction_tokens,
                        })
                    });
                }
                timer.finish(usage.prompt_tokens, usage.completion_tokens)
            }
            Err(e) => timer.note(|n| n.error = Some(e.message.clone())),
        })
        .boxed()
}

/// Latency metrics of one request: time to first token, time per output token, end to end,
/// labelled by model and priority.
pub struct RequestTimer {
    usage: std::sync::Arc<osprey_core::UsageReport>,
    /// Where the time to first token also goes (the degradation ladder watches it).
    ladder: Option<std::sync::Arc<osprey_router::degrade::Degradation>>,
    /// The request's record, which gets every token's time.
    record: Option<std::sync::Arc<crate::record::RequestRecord>>,
    model: String,
    priority: &'static str,
    /// The time-per-output-token histogram of the request's labels, resolved at its second
    /// token (tokens are timed on the hot path; a series appears only once it has a value).
    tpot: Option<metrics::Histogram>,
    start: Instant,
    last_token: Option<Instant>,
    /// The span open now: `engine.queue` until the first token (queueing and prefill), then
    /// `engine.decode` until the end.
    span: Option<tracing::Span>,
    /// The request's span, their parent (tokens are read outside it, as the body streams).
    parent: tracing::Span,
}

impl RequestTimer {
    /// Starts timing a request for `model` at `priority`; its token counts go to `usage`.
    pub fn new(
        model: &str,
        priority: Priority,
        usage: std::sync::Arc<osprey_core::UsageReport>,
    ) -> Self {
        Self {
            usage,
            ladder: None,
            record: None,
            model: model.to_owned(),
            priority: priority.as_str(),
            tpot: None,
            start: Instant::now(),
            last_token: None,
            span: Some(tracing::info_span!("engine.queue")),
            parent: tracing::Span::current(),
        }
    }

    /// The same timer, reporting the time to first token to `ladder` too.
    pub fn watched_by(
        mut self,
        ladder: std::sync::Arc<osprey_router::degrade::Degradation>,
    ) -> Self {
        self.ladder = Some(ladder);
        self
    }

    /// The same timer, noting tokens in the request's `record` too.
    pub fn recorded_in(mut self, record: std::sync::Arc<crate::record::RequestRecord>) -> Self {
        self.record = Some(record);
        self
    }

    /// Notes something about the request in its record, if it has one.
    pub fn note(&self, f: impl FnOnce(&mut crate::record::Notes)) {
        if let Some(r) = &self.record {
            r.note(f);
        }
    }

    /// Records a generated token.
    pub fn token(&mut self) {
        let now = Instant::now();
        if let Some(r) = &self.record {
            r.token(now);
        }
        match self.last_token {
            None => {
                let parent = &self.parent;
                let decode = tracing::info_span!(parent: parent, "engine.decode", tokens = tracing::field::Empty);
                self.span = Some(decode);
                metrics::histogram!(names::TIME_TO_FIRST_TOKEN, &self.labels())
                    .record((now - self.start).as_secs_f64());
                if let Some(ladder) = &self.ladder {
                    ladder.record_ttft(now - self.start);
                }
            }
            Some(prev) => {
                if self.tpot.is_none() {
                    let labels = self.labels();
                    self.tpot = Some(metrics::histogram!(names::TIME_PER_OUTPUT_TOKEN, &labels));
                }
                if let Some(tpot) = &self.tpot {
                    tpot.record((now - prev).as_secs_f64());
                }
            }
        }
        self.last_token = Some(now);
    }

    /// The request's metric labels.
    fn labels(&self) -> [(&'static str, String); 2] {
        [
            ("model", self.model.clone()),
            ("priority", self.priority.to_owned()),
        ]
    }

    /// Records the end of a request and its token counts.
    pub fn finish(&mut self, prompt_tokens: usize, completion_tokens: usize) {
        if let Some(span) = self.span.take() {
            span.record("tokens", completion_tokens);
        }
        self.usage
            .set(prompt_tokens as u64, completion_tokens as u64);
        metrics::histogram!(names::E2E_LATENCY, &self.labels())
            .record(self.start.elapsed().as_secs_f64());
        let model = self.model.clone();
        metrics::counter!(names::PROMPT_TOKENS, "model" => model.clone())
            .increment(prompt_tokens as u64);
        metrics::counter!(names::GENERATION_TOKENS, "model" => model)
            .increment(completion_tokens as u64);
    }
}
