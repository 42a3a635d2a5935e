//! What a backend is: something that takes a typed generation request and streams typed
//! events back ([`Backend::generate`]). The local engine is one; writing those events as an
//! OpenAI answer (whole JSON, or server-sent events) is the caller's, done once, whoever
//! generated them.

use std::future::Future;
use std::pin::Pin;

use futures_core::Stream;

use crate::api::{
    ChatCompletionRequest, ChatTokenLogprob, CompletionLogprobs, CompletionRequest, JsonBody,
    OspreyOptions, SamplingFields, ToolCallDelta, Usage,
};
use crate::{Error, FinishReason, Priority};

/// A generation request as a backend gets it: typed, with what the caller's tenant adds.
#[derive(Clone, Debug)]
pub struct GenRequest {
    /// The request the client made.
    pub asked: Asked,
    /// The body it was typed from, as the stages left it: what a remote backend is sent, so
    /// that fields Osprey does not know reach a server that does.
    pub body: JsonBody,
    /// The priority it runs at (the request's own, or its tenant's).
    pub priority: Priority,
    /// Keeps the tenant's cached prefixes apart from other tenants'.
    pub cache_salt: String,
}

/// The two kinds of generation request.
#[derive(Clone, Debug)]
pub enum Asked {
    /// `POST /v1/chat/completions`.
    Chat(ChatCompletionRequest),
    /// `POST /v1/completions`.
    Completion(CompletionRequest),
}

impl Asked {
    /// The model it names.
    pub fn model(&self) -> &str {
        match self {
            Asked::Chat(r) => &r.model,
            Asked::Completion(r) => &r.model,
        }
    }

    /// Its Osprey options (`osprey` in the body).
    pub fn osprey(&self) -> &Option<OspreyOptions> {
        match self {
            Asked::Chat(r) => &r.osprey,
            Asked::Completion(r) => &r.osprey,
        }
    }

    /// Its sampling fields (`n`, `stream`, `stream_options`, …).
    pub fn sampling(&self) -> &SamplingFields {
        match self {
            Asked::Chat(r) => &r.sampling,
            Asked::Completion(r) => &r.sampling,
        }
    }
}

/// One thing a backend says about the answer it is generating.
#[derive(Clone, Debug, PartialEq)]
#[allow(
    clippy::large_enum_variant,
    reason = "all but one event of an answer are deltas: boxing them would allocate per token"
)]
pub enum GenEvent {
    /// More of one choice.
    Delta(ChoiceDelta),
    /// The token counts of the whole request; the last event of a complete answer.
    Usage(Usage),
}

/// More of one choice: text or a piece of a tool call, the log-probabilities of the tokens it
/// came from, and, on the choice's last delta, why it ended. A delta may be empty (a token
/// whose text is not final yet): it still counts its token.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChoiceDelta {
    /// Which choice.
    pub index: usize,
    /// Text added to the choice (empty with a tool call).
    pub text: String,
    /// A tool call begun or continued, instead of text.
    pub tool_call: Option<ToolCallDelta>,
    /// The log-probabilities of the tokens it came from, if they were asked for.
    pub logprobs: Option<Logprobs>,
    /// Generated tokens it came from (0 for echoed prompt text and later pieces of a token).
    pub tokens: usize,
    /// Set on the choice's last delta.
    pub finish: Option<FinishReason>,
    /// Fields another server's delta carried that Osprey does not know (a reasoning model's
    /// `reasoning_content`), passed on as they came.
    pub extra: Option<Box<serde_json::Map<String, serde_json::Value>>>,
}

impl ChoiceDelta {
    /// Whether there is nothing in it for the client.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
            && self.tool_call.is_none()
            && self.logprobs.as_ref().is_none_or(Logprobs::is_empty)
            && self.finish.is_none()
            && self.extra.is_none()
    }
}

/// Log-probabilities in the shape of the API that asked for them.
#[derive(Clone, Debug, PartialEq)]
pub enum Logprobs {
    /// The chat API's: one entry per token.
    Chat(Vec<ChatTokenLogprob>),
    /// The completions API's parallel arrays, with offsets into the choice's text.
    Completion(CompletionLogprobs),
}

impl Logprobs {
    /// Whether it holds no token.
    pub fn is_empty(&self) -> bool {
        match self {
            Logprobs::Chat(c) => c.is_empty(),
            Logprobs::Completion(c) => c.tokens.is_empty(),
        }
    }
}

/// The events of one answer, as they come. An error ends it; so does dropping it, which
/// cancels the generation.
pub type GenStream = Pin<Box<dyn Stream<Item = Result<GenEvent, Error>> + Send>>;

/// Where a generation request can be answered.
pub trait Backend: Send + Sync {
    /// Starts answering `request`. An error here (a bad request, no room) means nothing was
    /// generated.
    fn generate(
        &self,
        request: GenRequest,
    ) -> Pin<Box<dyn Future<Output = Result<GenStream, Error>> + Send + '_>>;
}
