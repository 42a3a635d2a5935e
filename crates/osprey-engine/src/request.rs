//! What crosses between request handlers and the engine thread.

use osprey_core::{Error, FinishReason, SamplingParams};

use crate::sampler::{Sampled, TokenLogprob};

/// A request checked against the model: token ids inside the vocabulary, prompt and
/// `max_tokens` inside the context window. Built by [`Engine::validate`](crate::Engine::validate).
#[derive(Clone, Debug)]
pub struct ValidRequest {
    /// Prompt token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Decoding options; `max_tokens` already capped to the context window.
    pub params: SamplingParams,
    /// Whether to return the prompt tokens' log-probabilities (`echo` with `logprobs`).
    pub prompt_logprobs: bool,
    /// Seed of this sequence's sampler.
    pub seed: u64,
}

/// What the engine reports about one sequence, in order.
#[derive(Clone, Debug)]
pub enum SeqEvent {
    /// Log-probabilities of a run of prompt tokens (`None` for the very first token, which
    /// has no context). Sent once per prefill chunk when `prompt_logprobs` was asked for.
    PromptLogprobs(Vec<Option<TokenLogprob>>),
    /// A generated token.
    Token(Sampled),
    /// The sequence ended; no more events follow.
    Finished(FinishReason),
    /// The sequence failed; no more events follow.
    Failed(Error),
}

/// The engine's side of a sequence's event channel.
pub type EventSender = tokio::sync::mpsc::UnboundedSender<SeqEvent>;
/// The handler's side; dropping it cancels the sequence at the engine's next step.
pub type EventReceiver = tokio::sync::mpsc::UnboundedReceiver<SeqEvent>;
