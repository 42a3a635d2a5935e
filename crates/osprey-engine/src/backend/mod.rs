//! The engine as a [`Backend`]: a typed chat or text completion request in, its choices
//! started on the engine, and their deltas out as typed [`GenEvent`]s (text or tool-call
//! pieces, log-probabilities in the asking API's shape, the finish, then the usage).
//!
//! ```no_run
//! # async fn demo(engine: osprey_engine::Engine) -> Result<(), osprey_core::Error> {
//! use futures_util::StreamExt;
//! use osprey_core::backend::{Asked, Backend, GenEvent, GenRequest};
//! let asked: osprey_core::api::ChatCompletionRequest = osprey_core::api::parse_request(
//!     br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
//! )?;
//! let request = GenRequest {
//!     asked: Asked::Chat(asked),
//!     body: Default::default(),
//!     priority: Default::default(),
//!     cache_salt: String::new(),
//! };
//! let mut events = Backend::generate(&engine, request).await?;
//! while let Some(event) = events.next().await {
//!     if let GenEvent::Delta(d) = event? { print!("{}", d.text) }
//! }
//! # Ok(()) }
//! ```

pub mod chat;
pub mod completions;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::stream::{self, Stream, StreamExt};
use osprey_core::api::Usage;
use osprey_core::backend::{Asked, Backend, GenEvent, GenRequest, GenStream};
use osprey_core::metrics as names;
use osprey_core::{Error, ErrorKind};

use crate::speculative::DraftTally;
use crate::{Delta, Engine, GenerateRequest, Generation};

impl Backend for Engine {
    fn generate(
        &self,
        request: GenRequest,
    ) -> Pin<Box<dyn Future<Output = Result<GenStream, Error>> + Send + '_>> {
        let GenRequest {
            asked,
            priority,
            cache_salt,
            ..
        } = request;
        let started = match asked {
            Asked::Chat(asked) => chat::start(self, &asked, priority, cache_salt),
            Asked::Completion(asked) => completions::start(self, &asked, priority, cache_salt),
        };
        Box::pin(std::future::ready(started))
    }
}

/// What turns one request's engine deltas into events.
trait Answer: Send + 'static {
    /// The events one delta of choice `index` makes.
    fn events(&mut self, index: usize, delta: Delta) -> Vec<GenEvent>;
    /// The request's token counts, at the end.
    fn usage(&self) -> Usage;
}

/// The events of `answer` over `choices`' deltas, as they come; an engine error ends them.
/// The usage at the end tells what the engine drafted for them, counted in `drafts`.
fn events(
    answer: impl Answer,
    choices: Vec<(usize, Generation)>,
    drafts: Arc<DraftTally>,
) -> GenStream {
    let deltas = merge(choices);
    let state = Some((answer, deltas, drafts));
    stream::unfold(state, |state| async move {
        let (mut answer, mut deltas, drafts) = state?;
        let batch = match deltas.next().await {
            Some((index, Ok(delta))) => {
                let events = answer.events(index, delta).into_iter().map(Ok);
                return Some((events.collect::<Vec<_>>(), Some((answer, deltas, drafts))));
            }
            Some((_, Err(e))) => vec![Err(e)],
            None => {
                let (drafted, accepted) = drafts.get();
                vec![Ok(GenEvent::Usage(
                    answer.usage().with_drafts(drafted, accepted),
                ))]
            }
        };
        Some((batch, None))
    })
    .flat_map(stream::iter)
    .boxed()
}

/// Starts `n` choices of `request`, numbered from `first_index`. Each gets its own seed: the
/// request's seed plus the choice's number, or a random one.
fn start_choices(
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

/// A stream of `(choice index, delta)` from several generations, as they arrive.
type Deltas = Pin<Box<dyn Stream<Item = (usize, Result<Delta, Error>)> + Send>>;

/// Merges choices into one stream; dropping it cancels every choice still running.
fn merge(choices: Vec<(usize, Generation)>) -> Deltas {
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
