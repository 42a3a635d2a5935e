//! The memory stage's ties to the server ([`osprey_context::memory`] does the work): the
//! store, the local model's tokenizer, the model that writes summaries (the smallest tier's),
//! the `x-osprey-memory` header saying what went in, and the conversation's turn kept on the
//! way out ([`crate::outbound`]).

use axum::http::HeaderValue;
use axum::response::Response;
use futures_util::future::BoxFuture;
use osprey_context::conversation::Turn;
use osprey_context::memory::{Context, Memory};
use osprey_context::summary::SummaryWriter;
use osprey_core::Error;
use osprey_core::api::JsonBody;
use serde_json::{Map, Value};

use crate::edge::Caller;
use crate::outbound::{Added, Complete, Seen, Step};
use crate::request_log::Noted;
use crate::state::Services;
use osprey_core::backend::ChoiceDelta;

/// The response header saying what memory went into the prompt.
pub const MEMORY_HEADER: &str = "x-osprey-memory";

/// Puts the body's context in (see [`osprey_context::memory`]): what went in.
pub async fn prepare(
    state: &Services,
    caller: &Caller,
    flags: &Map<String, Value>,
    body: &mut JsonBody,
) -> Result<Context, Error> {
    let tokens = |text: &str| count_tokens(state, text);
    let summaries = Summaries {
        state,
        caller,
        asked_model: body.model().to_owned(),
    };
    let memory = Memory {
        store: state.context_store(),
        tokens: &tokens,
        summaries: &summaries,
    };
    osprey_context::memory::prepare(&memory, |user| caller.owner(user), flags, body).await
}

/// Marks `response` with what went into `context`.
pub fn mark(context: &Context, response: &mut Response) {
    if let Some(v) = context
        .summary()
        .and_then(|s| HeaderValue::from_str(&s).ok())
    {
        response.headers_mut().insert(MEMORY_HEADER, v);
    }
}

/// Notes what went into `context` for the request log.
pub fn note(context: &mut Context, noted: &mut Noted) {
    noted.conversation = context.conversation.clone();
    noted.user = Some(context.owner.user.clone());
    noted.injected = std::mem::take(&mut context.injected);
}

/// Tokens of `text` for the local model's tokenizer, or the estimate when no model is local.
pub fn count_tokens(state: &Services, text: &str) -> usize {
    match state.engine() {
        Some(engine) => engine.prompter().tokenizer().encode(text, false).len(),
        None => osprey_core::tokens::estimate(text),
    }
}

/// Summaries written for a caller's conversation: by the smallest tier's model the caller may
/// use, else the local one, else the model the request asked for; sent as the gateway's own
/// request ([`crate::pipeline::complete_chat`]).
struct Summaries<'a> {
    state: &'a Services,
    caller: &'a Caller,
    asked_model: String,
}

impl Summaries<'_> {
    fn model(&self) -> String {
        let models = self.caller.tenant.models.as_ref();
        let allowed = |m: &str| models.is_none_or(|ms| ms.iter().any(|a| a == m));
        (self.state.tiers().into_iter())
            .flat_map(|t| t.tiers())
            .map(|t| t.model.clone())
            .find(|m| allowed(m))
            .or_else(|| self.state.model_name().map(str::to_owned))
            .unwrap_or_else(|| self.asked_model.clone())
    }
}

impl SummaryWriter for Summaries<'_> {
    fn write(&self, mut request: Value) -> BoxFuture<'_, Result<String, Error>> {
        request["model"] = self.model().into();
        Box::pin(crate::pipeline::complete_chat(
            self.state,
            self.caller,
            request,
        ))
    }
}

/// Turn keep, a step of the way out: the answer (choice 0) heard as it passes, and the turn
/// appended before the client sees the end of it.
impl Step for Turn {
    fn delta(&mut self, delta: &mut ChoiceDelta) -> Seen {
        if delta.index == 0 {
            self.hear(&delta.text);
        }
        Seen::Send
    }

    fn end<'a>(&'a mut self, _answer: &'a Complete<'a>) -> BoxFuture<'a, Result<Added, Error>> {
        Box::pin(async move { self.keep_heard().await.map(|()| None) })
    }
}
