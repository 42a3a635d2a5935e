//! `POST /v1/completions`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::common::{Finish, SamplingFields, Usage};
use crate::error::{Error, Result};
use crate::sampling::SamplingParams;

/// A text completion request.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
pub struct CompletionRequest {
    /// The model to use.
    pub model: String,
    /// The prompt(s).
    pub prompt: PromptInput,
    /// Most tokens to generate (default 16, as in OpenAI's API); 0 only with `echo`, to
    /// score the prompt.
    #[schema(minimum = 0)]
    pub max_tokens: Option<i64>,
    /// Return the prompt before the completion.
    #[serde(default)]
    pub echo: bool,
    /// Return log-probabilities with this many alternatives per token, 0 to 20.
    #[schema(minimum = 0, maximum = 20)]
    pub logprobs: Option<i64>,
    /// The structure of the completion: any text, a JSON object, or JSON under a schema (as
    /// in chat; an extension here).
    #[serde(default)]
    pub response_format: Option<super::tools::ResponseFormat>,
    /// Osprey's extensions (`{"osprey": {"priority": "batch"}}`).
    #[serde(default)]
    pub osprey: Option<super::common::OspreyOptions>,
    /// Sampling and streaming options (parsed from the same body by
    /// [`parse_request`](super::parse_request)).
    #[serde(skip)]
    pub sampling: SamplingFields,
}

impl super::ApiRequest for CompletionRequest {
    fn sampling_mut(&mut self) -> &mut SamplingFields {
        &mut self.sampling
    }
}

/// `prompt`: text, texts, token ids, or lists of token ids.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum PromptInput {
    /// One text prompt.
    Text(String),
    /// Several text prompts.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// Several prompts as token ids.
    TokenLists(Vec<Vec<u32>>),
}

/// One prompt, before tokenization.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Text to tokenize.
    Text(String),
    /// Token ids, used as given.
    Tokens(Vec<u32>),
}

impl CompletionRequest {
    /// The grammar the completion must follow (`response_format`, `osprey.grammar`).
    pub fn output_grammar(&self) -> Result<Option<crate::Grammar>> {
        super::tools::output_grammar(
            self.response_format.as_ref(),
            self.osprey.as_ref().and_then(|o| o.grammar.as_ref()),
        )
    }

    /// The prompts, each producing `n` choices; at least one, none empty.
    pub fn prompts(&self) -> Result<Vec<Prompt>> {
        let prompts: Vec<Prompt> = match &self.prompt {
            PromptInput::Text(t) => vec![Prompt::Text(t.clone())],
            PromptInput::Texts(v) => v.iter().cloned().map(Prompt::Text).collect(),
            PromptInput::Tokens(v) => vec![Prompt::Tokens(v.clone())],
            PromptInput::TokenLists(v) => v.iter().cloned().map(Prompt::Tokens).collect(),
        };
        if prompts.is_empty() {
            return Err(Error::invalid(
                "prompt",
                "`prompt` must not be an empty list",
            ));
        }
        if prompts.len() > 64 {
            return Err(Error::invalid("prompt", "at most 64 prompts per request"));
        }
        if prompts
            .iter()
            .any(|p| matches!(p, Prompt::Tokens(t) if t.is_empty()))
        {
            return Err(Error::invalid(
                "prompt",
                "a token-id prompt must not be empty",
            ));
        }
        Ok(prompts)
    }

    /// Validated sampling parameters.
    pub fn sampling_params(&self) -> Result<SamplingParams> {
        let logprobs = match self.logprobs {
            None => None,
            Some(n) if (0..=20).contains(&n) => Some(n as usize),
            Some(n) => {
                return Err(Error::invalid(
                    "logprobs",
                    format!("logprobs must be between 0 and 20, got {n}"),
                ));
            }
        };
        let max_tokens = self.max_tokens.unwrap_or(16);
        if max_tokens == 0 && self.echo {
            // `echo` with no output scores the prompt alone: how perplexity is measured.
            let mut p = self.sampling.to_params(Some(1), logprobs)?;
            p.max_tokens = 0;
            return Ok(p);
        }
        self.sampling.to_params(Some(max_tokens), logprobs)
    }
}

/// A complete (or streamed) text completion response; streaming sends one per event.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Completion {
    /// Response id (`cmpl-…`).
    pub id: String,
    /// Always `text_completion`.
    pub object: String,
    /// Unix time of creation.
    pub created: u64,
    /// The model.
    pub model: String,
    /// One choice per prompt and `n`.
    pub choices: Vec<CompletionChoice>,
    /// Token counts (on streamed chunks: only the last, with `include_usage`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
    /// Identifies the serving configuration.
    pub system_fingerprint: Option<String>,
}

/// One completion.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CompletionChoice {
    /// Which choice: `prompt_index * n + i`.
    pub index: usize,
    /// The text (with the prompt first when `echo`).
    pub text: String,
    /// Log-probabilities, if requested.
    pub logprobs: Option<CompletionLogprobs>,
    /// Why generation stopped.
    pub finish_reason: Finish,
}

/// OpenAI's legacy log-probability format: parallel arrays, one entry per token.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CompletionLogprobs {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Log-probability of each token (`null` for the first prompt token).
    pub token_logprobs: Vec<Option<f32>>,
    /// The most likely alternatives at each position.
    pub top_logprobs: Vec<Option<BTreeMap<String, f32>>>,
    /// Character offset of each token in the choice's text.
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Appends `other`'s entries.
    pub fn extend(&mut self, other: CompletionLogprobs) {
        self.tokens.extend(other.tokens);
        self.token_logprobs.extend(other.token_logprobs);
        self.top_logprobs.extend(other.top_logprobs);
        self.text_offset.extend(other.text_offset);
    }
}
