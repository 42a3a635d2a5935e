//! Types shared by the chat and completions endpoints.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::sampling::{FinishReason, SamplingParams};

/// `stop`: one string or a list of them.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum StopSpec {
    /// A single stop string.
    One(String),
    /// Several stop strings.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
pub struct StreamOptions {
    /// Send a last chunk with the usage of the whole request.
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling fields common to both endpoints, OpenAI's plus vLLM's extensions.
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
pub struct SamplingFields {
    /// Softmax temperature, 0 to 2 (default 1; 0 = greedy).
    #[schema(minimum = 0, maximum = 2)]
    pub temperature: Option<f32>,
    /// Nucleus sampling mass, in (0, 1].
    #[schema(exclusive_minimum = 0, maximum = 1)]
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens; 0 or -1 disables (vLLM).
    #[schema(minimum = -1)]
    pub top_k: Option<i64>,
    /// Minimum probability relative to the best token, in [0, 1] (vLLM).
    #[schema(minimum = 0, maximum = 1)]
    pub min_p: Option<f32>,
    /// Number of choices to generate, 1 to 16.
    #[schema(minimum = 1, maximum = 16)]
    pub n: Option<i64>,
    /// Stop strings.
    pub stop: Option<StopSpec>,
    /// Penalty for tokens already present, -2 to 2.
    #[schema(minimum = -2, maximum = 2)]
    pub presence_penalty: Option<f32>,
    /// Penalty per occurrence, -2 to 2.
    #[schema(minimum = -2, maximum = 2)]
    pub frequency_penalty: Option<f32>,
    /// Multiplicative penalty for repeated tokens, > 0 (vLLM; 1 = off).
    #[schema(exclusive_minimum = 0)]
    pub repetition_penalty: Option<f32>,
    /// Token id (as a string) to bias, -100 to 100.
    pub logit_bias: Option<std::collections::BTreeMap<String, f32>>,
    /// Seed for reproducible sampling.
    pub seed: Option<i64>,
    /// Generate past the end-of-sequence token (vLLM).
    pub ignore_eos: Option<bool>,
    /// Minimum tokens before EOS or a stop token may end the output, at most `max_tokens`
    /// (vLLM).
    #[schema(minimum = 0)]
    pub min_tokens: Option<i64>,
    /// Extra token ids that end the output (vLLM).
    pub stop_token_ids: Option<Vec<u32>>,
    /// Stream the response as server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// End-user identifier (recorded, not used for decoding).
    pub user: Option<String>,
}

impl SamplingFields {
    /// Validated sampling parameters, given the endpoint's `max_tokens` and `logprobs` choices.
    pub fn to_params(
        &self,
        max_tokens: Option<i64>,
        logprobs: Option<usize>,
    ) -> Result<SamplingParams> {
        let mut p = SamplingParams::default();
        if let Some(t) = self.temperature {
            range("temperature", t, 0.0, 2.0)?;
            p.temperature = t;
        }
        if let Some(v) = self.top_p {
            if !(v > 0.0 && v <= 1.0) {
                return Err(Error::invalid(
                    "top_p",
                    format!("top_p must be in (0, 1], got {v}"),
                ));
            }
            p.top_p = v;
        }
        if let Some(k) = self.top_k {
            if k < -1 {
                return Err(Error::invalid(
                    "top_k",
                    format!("top_k must be -1, 0 or positive, got {k}"),
                ));
            }
            p.top_k = k.max(0) as usize;
        }
        if let Some(v) = self.min_p {
            range("min_p", v, 0.0, 1.0)?;
            p.min_p = v;
        }
        if let Some(v) = self.presence_penalty {
            range("presence_penalty", v, -2.0, 2.0)?;
            p.presence_penalty = v;
        }
        if let Some(v) = self.frequency_penalty {
            range("frequency_penalty", v, -2.0, 2.0)?;
            p.frequency_penalty = v;
        }
        if let Some(v) = self.repetition_penalty {
            if !(v > 0.0 && v.is_finite()) {
                return Err(Error::invalid(
                    "repetition_penalty",
                    format!("repetition_penalty must be a positive number, got {v}"),
                ));
            }
            p.repetition_penalty = v;
        }
        if let Some(bias) = &self.logit_bias {
            for (k, &v) in bias {
                let id: u32 = k.parse().map_err(|_| {
                    Error::invalid(
                        "logit_bias",
                        format!("logit_bias keys must be token ids, got `{k}`"),
                    )
                })?;
                range("logit_bias", v, -100.0, 100.0)?;
                p.logit_bias.push((id, v));
            }
        }
        p.seed = self.seed.map(|s| s as u64);
        if let Some(m) = max_tokens {
            if m < 1 {
                return Err(Error::invalid(
                    "max_tokens",
                    format!("max_tokens must be at least 1, got {m}"),
                ));
            }
            p.max_tokens = m as usize;
        }
        if let Some(m) = self.min_tokens {
            if m < 0 || max_tokens.is_some_and(|mt| m > mt) {
                return Err(Error::invalid(
                    "min_tokens",
                    format!("min_tokens must be between 0 and max_tokens, got {m}"),
                ));
            }
            p.min_tokens = m as usize;
        }
        p.ignore_eos = self.ignore_eos.unwrap_or(false);
        p.stop_token_ids = self.stop_token_ids.clone().unwrap_or_default();
        p.stop = match &self.stop {
            None => Vec::new(),
            Some(StopSpec::One(s)) => vec![s.clone()],
            Some(StopSpec::Many(v)) => v.clone(),
        };
        p.stop.retain(|s| !s.is_empty());
        if p.stop.len() > 16 {
            return Err(Error::invalid(
                "stop",
                "at most 16 stop strings are allowed",
            ));
        }
        p.logprobs = logprobs;
        Ok(p)
    }

    /// `n`, checked.
    pub fn choices(&self) -> Result<usize> {
        match self.n {
            None => Ok(1),
            Some(n) if (1..=16).contains(&n) => Ok(n as usize),
            Some(n) => Err(Error::invalid(
                "n",
                format!("n must be between 1 and 16, got {n}"),
            )),
        }
    }

    /// Whether to stream.
    pub fn streaming(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Whether a streamed response ends with a usage chunk.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }
}

fn range(param: &str, v: f32, lo: f32, hi: f32) -> Result<()> {
    if v >= lo && v <= hi {
        Ok(())
    } else {
        Err(Error::invalid(
            param,
            format!("{param} must be between {lo} and {hi}, got {v}"),
        ))
    }
}

/// Osprey's own request options, in the `osprey` object of a request body.
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
pub struct OspreyOptions {
    /// `interactive` (default) or `batch`.
    #[serde(default)]
    pub priority: Option<crate::sampling::Priority>,
    /// A regular expression or Lark grammar the output must follow.
    #[serde(default)]
    pub grammar: Option<super::tools::GrammarOption>,
    /// When the first token is due, in milliseconds from arrival: the `kda` scheduler runs
    /// earlier deadlines first, and promotes a batch request once its deadline has passed.
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// `false` keeps the engine from speculating on this request (it does by default when
    /// the server speculates); the output is the same either way.
    #[serde(default)]
    pub speculative: Option<bool>,
}

/// Whether a request lets the engine speculate (unless it says `"speculative": false`).
pub fn speculative_of(options: &Option<OspreyOptions>) -> bool {
    options.as_ref().and_then(|o| o.speculative).unwrap_or(true)
}

/// The first-token deadline a request asks for, if any (at most a day).
pub fn deadline_of(options: &Option<OspreyOptions>) -> Option<std::time::Duration> {
    let ms = options.as_ref()?.deadline_ms?;
    Some(std::time::Duration::from_millis(ms.min(86_400_000)))
}

/// The priority a request asks for (interactive when it says nothing).
pub fn priority_of(options: &Option<OspreyOptions>) -> crate::sampling::Priority {
    options
        .as_ref()
        .and_then(|o| o.priority)
        .unwrap_or_default()
}

/// Token counts of a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Usage {
    /// Tokens in the prompt (counted once, whatever `n`).
    pub prompt_tokens: usize,
    /// Tokens generated, over all choices.
    pub completion_tokens: usize,
    /// The sum.
    pub total_tokens: usize,
    /// How speculative decoding went, when the engine drafted tokens for the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

/// Details of the generated tokens: OpenAI's names for tokens of a prediction, here the
/// engine's own drafts, which the model either accepted (and so generated) or rejected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CompletionTokensDetails {
    /// Drafted tokens the model accepted.
    #[serde(default)]
    pub accepted_prediction_tokens: usize,
    /// Drafted tokens it rejected (computed, not generated, not counted in
    /// `completion_tokens`).
    #[serde(default)]
    pub rejected_prediction_tokens: usize,
}

impl Usage {
    /// Usage from the two counts.
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            completion_tokens_details: None,
        }
    }

    /// The same usage with the engine's `drafted` and `accepted` tokens, if it drafted any.
    pub fn with_drafts(self, drafted: u64, accepted: u64) -> Self {
        let details = (drafted > 0).then(|| CompletionTokensDetails {
            accepted_prediction_tokens: accepted as usize,
            rejected_prediction_tokens: (drafted - accepted) as usize,
        });
        Self {
            completion_tokens_details: details,
            ..self
        }
    }
}

/// The body of every error response: `{"error": {...}}`.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorResponse {
    /// The error.
    pub error: ErrorBody,
}

/// OpenAI's error object.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What went wrong, for a person.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `server_error`…).
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault.
    pub param: Option<String>,
    /// A machine-readable code.
    pub code: Option<String>,
}

/// OpenAI's finish reason, or `null` while a choice is still streaming.
pub type Finish = Option<FinishReason>;
