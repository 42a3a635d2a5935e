//! What crosses between request handlers and the engine thread.

use osprey_core::{Error, FinishReason, Grammar, Priority, SamplingParams};

use crate::sampler::{Sampled, TokenLogprob};
use crate::speculative::DraftTally;
use crate::structured::Constraint;

/// A request for one sequence, before it is checked against the model.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Decoding options; `max_tokens == usize::MAX` means "as many as the context allows".
    pub params: SamplingParams,
    /// Whether to return the prompt tokens' log-probabilities (`echo` with `logprobs`).
    pub prompt_logprobs: bool,
    /// Seed of this sequence's sampler.
    pub seed: u64,
    /// Scheduling class.
    pub priority: Priority,
    /// When the first token is due, from arrival (the scheduler's default when `None`).
    pub deadline: Option<std::time::Duration>,
    /// Separates prefix-cache entries: sequences share cached KV only with the same salt.
    pub cache_salt: String,
    /// The structure the output must follow, enforced token by token.
    pub grammar: Option<Grammar>,
    /// Whether it may speculate, when the engine does (`"osprey": {"speculative": false}`
    /// says not).
    pub speculative: bool,
    /// Where its drafted and accepted tokens are counted (shared by its choices).
    pub drafts: std::sync::Arc<DraftTally>,
}

impl GenerateRequest {
    /// A request with default options besides the prompt and sampling parameters.
    pub fn new(prompt: Vec<u32>, params: SamplingParams) -> Self {
        Self {
            prompt,
            params,
            prompt_logprobs: false,
            seed: 0,
            priority: Priority::Interactive,
            deadline: None,
            cache_salt: String::new(),
            grammar: None,
            speculative: true,
            drafts: Default::default(),
        }
    }
}

/// A request checked against the model: token ids inside the vocabulary, prompt and
/// `max_tokens` inside the context window, its grammar compiled. Only
/// [`Engine::validate`](crate::Engine::validate) makes one.
#[derive(Clone)]
pub struct ValidRequest {
    pub(crate) request: GenerateRequest,
    pub(crate) constraint: Option<Constraint>,
}

impl ValidRequest {
    /// The checked request.
    pub fn request(&self) -> &GenerateRequest {
        &self.request
    }

    /// The same request with another sampler seed (another choice of `n`): checked and
    /// compiled once, run as often as wanted.
    pub fn with_seed(&self, seed: u64) -> Self {
        let mut copy = self.clone();
        copy.request.seed = seed;
        copy
    }
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
