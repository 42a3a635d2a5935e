//! Decoding options, validated.

use serde::{Deserialize, Serialize};

/// How a token is chosen from the model's next-token distribution, and when to stop.
///
/// Built from a request by `sampling_params()` on the API types, which checks every range;
/// the engine trusts these values.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy (argmax).
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches this (1 = off).
    pub top_p: f32,
    /// Keep only the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Drop tokens less likely than `min_p` times the most likely one (0 = off).
    pub min_p: f32,
    /// Subtracted from a token's logit once it has appeared in the output.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit per occurrence in the output.
    pub frequency_penalty: f32,
    /// Divides positive (multiplies negative) logits of tokens seen in prompt or output (1 = off).
    pub repetition_penalty: f32,
    /// Added to the logits of the given token ids.
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed for the sampler's random generator: same seed, same output.
    pub seed: Option<u64>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// End-of-sequence and stop tokens are suppressed until this many tokens are generated.
    pub min_tokens: usize,
    /// Keep generating past the end-of-sequence token.
    pub ignore_eos: bool,
    /// Generation stops after any of these token ids (in addition to the model's EOS).
    pub stop_token_ids: Vec<u32>,
    /// Generation stops before any of these strings; the string itself is not returned.
    pub stop: Vec<String>,
    /// Return the chosen token's log-probability and this many alternatives (`None` = off).
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            seed: None,
            max_tokens: 16,
            min_tokens: 0,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            stop: Vec::new(),
            logprobs: None,
        }
    }
}

impl SamplingParams {
    /// Whether decoding is deterministic argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }
}

/// Why a sequence stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model ended, or a stop string or stop token was hit.
    Stop,
    /// `max_tokens` or the context window was reached.
    Length,
    /// The answer ended with tool calls.
    ToolCalls,
    /// The output filter stopped the answer.
    ContentFilter,
}

/// How urgently a request wants its tokens. Interactive requests are admitted first and their
/// decodes are never held up by batch prefills; batch requests use what is left, and one that
/// has waited too long is treated as interactive, so it is never starved.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// A person is waiting on the stream.
    #[default]
    Interactive,
    /// Throughput matters, latency does not.
    Batch,
}

impl Priority {
    /// The label used in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Interactive => "interactive",
            Self::Batch => "batch",
        }
    }
}
