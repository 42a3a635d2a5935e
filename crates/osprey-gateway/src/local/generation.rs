//! Running a request's choices on the engine: starting them, merging their streams, timing
//! them, and turning engine tokens into OpenAI log-probability objects.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::Instant;

use futures_util::Stream;
use futures_util::stream::{self, StreamExt};
use osprey_core::api::{ChatTokenLogprob, CompletionLogprobs, TopLogprob};
use osprey_core::metrics as names;
use osprey_core::{Error, ErrorKind, Priority};
use osprey_engine::{Delta, Engine, GenerateRequest, Generation, TokenLogprob, Tokenizer};

/// A stream of `(choice index, delta)` from several generations, as they arrive.
pub type Deltas = Pin<Box<dyn Stream<Item = (usize, Result<Delta, Error>)> + Send>>;

/// Starts `n` choices of `request`, numbered from `first_index`. Each gets its own seed: the
/// request's seed plus the choice's number, or a random one.
pub fn start_choices(
    engine: &Engine,
    request: &GenerateRequest,
    n: usize,
    first_index: usize,
) -> Result<Vec<(usize, Generation)>, Error> {
    let valid = engine.validate(request.clone())?;
    (0..n)
        .map(|i| {
            let seed = request.params.seed;
            let seed = seed.map_or_else(rand::random, |s| s.wrapping_add(i as u64));
            let generation = engine.generate(valid.with_seed(seed)).inspect_err(|e| {
                if e.kind == ErrorKind::Unavailable {
                    metrics::counter!(names::REJECTED_OVERLOADED).increment(1);
                }
            })?;
            Ok((first_index + i, generation))
        })
        .collect()
}

/// Merges choices into one stream; dropping it cancels every choice still running.
pub fn merge(choices: Vec<(usize, Generation)>) -> Deltas {
    let streams = choices.into_iter().map(|(index, generation)| {
        stream::unfold(
            generation,
            |mut g| async move { g.next().await.map(|d| (d, g)) },
        )
        .map(move |d| (index, d))
        .boxed()
    });
    stream::select_all(streams).boxed()
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
        let labels = [
            ("model", self.model.clone()),
            ("priority", self.priority.to_owned()),
        ];
        match self.last_token {
            None => {
                let parent = &self.parent;
                let decode = tracing::info_span!(parent: parent, "engine.decode", tokens = tracing::field::Empty);
                self.span = Some(decode);
                metrics::histogram!(names::TIME_TO_FIRST_TOKEN, &labels)
                    .record((now - self.start).as_secs_f64());
                if let Some(ladder) = &self.ladder {
                    ladder.record_ttft(now - self.start);
                }
            }
            Some(prev) => metrics::histogram!(names::TIME_PER_OUTPUT_TOKEN, &labels)
                .record((now - prev).as_secs_f64()),
        }
        self.last_token = Some(now);
    }

    /// Records the end of a request and its token counts.
    pub fn finish(&mut self, prompt_tokens: usize, completion_tokens: usize) {
        if let Some(span) = self.span.take() {
            span.record("tokens", completion_tokens);
        }
        self.usage
            .set(prompt_tokens as u64, completion_tokens as u64);
        let labels = [
            ("model", self.model.clone()),
            ("priority", self.priority.to_owned()),
        ];
        metrics::histogram!(names::E2E_LATENCY, &labels).record(self.start.elapsed().as_secs_f64());
        let model = self.model.clone();
        metrics::counter!(names::PROMPT_TOKENS, "model" => model.clone())
            .increment(prompt_tokens as u64);
        metrics::counter!(names::GENERATION_TOKENS, "model" => model)
            .increment(completion_tokens as u64);
    }
}

/// A generated token in the chat API's log-probability format.
pub fn chat_logprob(tok: &Tokenizer, lp: &TokenLogprob) -> ChatTokenLogprob {
    ChatTokenLogprob {
        token: tok.token_text(lp.id),
        logprob: lp.logprob,
        bytes: tok.token_bytes(lp.id).to_vec(),
        top_logprobs: lp
            .top
            .iter()
            .map(|&(id, logprob)| TopLogprob {
                token: tok.token_text(id),
                logprob,
                bytes: tok.token_bytes(id).to_vec(),
            })
            .collect(),
    }
}

/// Appends tokens to a completions-API log-probability object, tracking text offsets.
pub struct CompletionLogprobsBuilder {
    /// The object built so far.
    pub logprobs: CompletionLogprobs,
    /// Characters of the choice's text so far.
    pub offset: usize,
}

impl CompletionLogprobsBuilder {
    /// An empty builder whose offsets start at `offset` characters.
    pub fn new(offset: usize) -> Self {
        Self {
            logprobs: CompletionLogprobs::default(),
            offset,
        }
    }

    /// Adds one token: its id, and its log-probability and alternatives if known.
    pub fn push(&mut self, tok: &Tokenizer, id: u32, lp: Option<&TokenLogprob>, top_n: usize) {
        let text = tok.token_text(id);
        let l = &mut self.logprobs;
        l.text_offset.push(self.offset);
        self.offset += text.chars().count();
        l.tokens.push(text);
        l.token_logprobs.push(lp.map(|lp| lp.logprob));
        l.top_logprobs.push(lp.map(|lp| {
            lp.top
                .iter()
                .take(top_n)
                .map(|&(id, logprob)| (tok.token_text(id), logprob))
                .collect::<BTreeMap<_, _>>()
        }));
    }

    /// Takes the entries added so far, leaving the builder empty (for streamed chunks).
    pub fn take(&mut self) -> CompletionLogprobs {
        std::mem::take(&mut self.logprobs)
    }
}
