//! `POST /v1/chat/completions`.

use serde::{Deserialize, Serialize};

use super::common::{Finish, SamplingFields, Usage};
use super::tools::{ResponseFormat, Tool, ToolCall, ToolCallDelta, ToolChoice, ToolMode};
use crate::error::{Error, Result};
use crate::grammar::Grammar;
use crate::sampling::SamplingParams;

/// A chat completion request.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
pub struct ChatCompletionRequest {
    /// The model to use.
    pub model: String,
    /// The conversation so far.
    #[schema(min_items = 1)]
    pub messages: Vec<ChatMessage>,
    /// Most tokens to generate (legacy name).
    #[schema(minimum = 1)]
    pub max_tokens: Option<i64>,
    /// Most tokens to generate.
    #[schema(minimum = 1)]
    pub max_completion_tokens: Option<i64>,
    /// Return log-probabilities of the output tokens.
    pub logprobs: Option<bool>,
    /// Alternatives per token to return with `logprobs`, 0 to 20.
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs: Option<i64>,
    /// Functions the model may call.
    #[serde(default)]
    pub tools: Option<Vec<Tool>>,
    /// Whether and which tool to call.
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    /// Whether one answer may call several tools (default true).
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// The structure of a text answer: any text, a JSON object, or JSON under a schema.
    #[serde(default)]
    pub response_format: Option<ResponseFormat>,
    /// Osprey's extensions (`{"osprey": {"priority": "batch"}}`).
    #[serde(default)]
    pub osprey: Option<super::common::OspreyOptions>,
    /// Sampling and streaming options (parsed from the same body by
    /// [`parse_request`](super::parse_request)).
    #[serde(skip)]
    pub sampling: SamplingFields,
}

impl super::ApiRequest for ChatCompletionRequest {
    fn sampling_mut(&mut self) -> &mut SamplingFields {
        &mut self.sampling
    }
}

/// One message of a conversation.
#[derive(Clone, Debug, Deserialize, Serialize, utoipa::ToSchema)]
pub struct ChatMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Text, or a list of content parts; may be null for an assistant message.
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// Optional participant name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The calls an assistant message made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// Message content: a string or OpenAI's array of parts.
#[derive(Clone, Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content parts; only `text` parts are supported by text models.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Clone, Debug, Deserialize, Serialize, utoipa::ToSchema)]
pub struct ContentPart {
    /// The part's type; `text` (or `input_text`) is what a text model can read.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text part.
    #[serde(default)]
    pub text: Option<String>,
}

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

impl ChatMessage {
    /// The message's text: a string as is, text parts joined.
    pub fn text(&self) -> Result<String> {
        match &self.content {
            None => Ok(String::new()),
            Some(MessageContent::Text(t)) => Ok(t.clone()),
            Some(MessageContent::Parts(parts)) => {
                let mut out = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text" | "input_text", Some(t)) => out.push_str(t),
                        (kind, _) => {
                            return Err(Error::invalid(
                                "messages",
                                format!(
                                    "content parts of type `{kind}` are not supported by this text model; use `text` parts"
                                ),
                            ));
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}

impl ChatCompletionRequest {
    /// Checks the conversation's shape.
    pub fn validate_messages(&self) -> Result<()> {
        if self.messages.is_empty() {
            return Err(Error::invalid(
                "messages",
                "`messages` must contain at least one message",
            ));
        }
        for (i, m) in self.messages.iter().enumerate() {
            if !ROLES.contains(&m.role.as_str()) {
                return Err(Error::invalid(
                    format!("messages[{i}].role"),
                    format!(
                        "messages[{i}].role must be one of {ROLES:?}, got `{}`",
                        m.role
                    ),
                ));
            }
            if m.content.is_none() && m.role != "assistant" {
                return Err(Error::invalid(
                    format!("messages[{i}].content"),
                    format!("messages[{i}] ({}) needs `content`", m.role),
                ));
            }
            if m.role == "tool" && m.tool_call_id.is_none() {
                return Err(Error::invalid(
                    format!("messages[{i}].tool_call_id"),
                    format!("messages[{i}] (tool) needs the `tool_call_id` it answers"),
                ));
            }
            if m.tool_calls.is_some() && m.role != "assistant" {
                return Err(Error::invalid(
                    format!("messages[{i}].tool_calls"),
                    format!("messages[{i}] ({}) cannot carry `tool_calls`", m.role),
                ));
            }
            for (j, call) in m.tool_calls.iter().flatten().enumerate() {
                if serde_json::from_str::<serde_json::Value>(&call.function.arguments).is_err() {
                    return Err(Error::invalid(
                        format!("messages[{i}].tool_calls[{j}].function.arguments"),
                        "a tool call's arguments must be JSON text",
                    ));
                }
            }
            m.text()?;
        }
        Ok(())
    }

    /// The tools offered and what the model may do with them, checked.
    pub fn tool_mode(&self) -> Result<ToolMode> {
        super::tools::tool_mode(
            self.tools.as_deref().unwrap_or(&[]),
            self.tool_choice.as_ref(),
        )
    }

    /// Whether one answer may call several tools.
    pub fn parallel_tool_calls(&self) -> bool {
        self.parallel_tool_calls.unwrap_or(true)
    }

    /// The grammar a text answer must follow (`response_format`, `osprey.grammar`).
    pub fn output_grammar(&self) -> Result<Option<Grammar>> {
        super::tools::output_grammar(
            self.response_format.as_ref(),
            self.osprey.as_ref().and_then(|o| o.grammar.as_ref()),
        )
    }

    /// Validated sampling parameters.
    pub fn sampling_params(&self) -> Result<SamplingParams> {
        let logprobs = match (self.logprobs.unwrap_or(false), self.top_logprobs) {
            (_, Some(n)) if !(0..=20).contains(&n) => {
                return Err(Error::invalid(
                    "top_logprobs",
                    format!("top_logprobs must be between 0 and 20, got {n}"),
                ));
            }
            (false, Some(n)) if n > 0 => {
                return Err(Error::invalid(
                    "top_logprobs",
                    "top_logprobs requires `logprobs: true`",
                ));
            }
            (true, n) => Some(n.unwrap_or(0) as usize),
            (false, _) => None,
        };
        let max_tokens = self.max_completion_tokens.or(self.max_tokens);
        let mut p = self.sampling.to_params(max_tokens, logprobs)?;
        if max_tokens.is_none() {
            // No limit asked for: the engine caps at the context window.
            p.max_tokens = usize::MAX;
        }
        Ok(p)
    }
}

/// A complete (non-streamed) chat response.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatCompletion {
    /// Response id (`chatcmpl-…`).
    pub id: String,
    /// Always `chat.completion`.
    pub object: String,
    /// Unix time of creation.
    pub created: u64,
    /// The model that answered.
    pub model: String,
    /// One choice per `n`.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
    /// Identifies the serving configuration.
    pub system_fingerprint: Option<String>,
}

/// One answer.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatChoice {
    /// Which of the `n` choices.
    pub index: usize,
    /// The assistant's message.
    pub message: AssistantMessage,
    /// Log-probabilities, if requested.
    pub logprobs: Option<ChatLogprobs>,
    /// Why generation stopped.
    pub finish_reason: Finish,
}

/// The generated message.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: String,
    /// The text (null when the answer is only tool calls).
    pub content: Option<String>,
    /// The tools the answer calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// Log-probabilities of a chat choice's tokens.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatLogprobs {
    /// One entry per output token; read as empty when `null`.
    #[serde(default, deserialize_with = "null_as_no_tokens")]
    pub content: Vec<ChatTokenLogprob>,
}

/// A token with its log-probability and the most likely alternatives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its UTF-8 bytes (a token may hold part of a character); read as empty when `null`.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub bytes: Vec<u8>,
    /// The most likely tokens at this position.
    #[serde(default)]
    pub top_logprobs: Vec<TopLogprob>,
}

/// An alternative token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TopLogprob {
    /// Token text.
    pub token: String,
    /// Log-probability.
    pub logprob: f32,
    /// UTF-8 bytes; read as empty when `null`.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub bytes: Vec<u8>,
}

/// Bytes another server wrote as `null` (OpenAI's API allows it), read as none.
fn null_as_no_tokens<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<ChatTokenLogprob>, D::Error> {
    Ok(Option::<Vec<ChatTokenLogprob>>::deserialize(d)?.unwrap_or_default())
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    Ok(Option::<Vec<u8>>::deserialize(d)?.unwrap_or_default())
}

/// One server-sent event of a streamed chat response.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatCompletionChunk {
    /// Same id on every chunk of a response.
    pub id: String,
    /// Always `chat.completion.chunk`.
    pub object: String,
    /// Unix time of creation.
    pub created: u64,
    /// The model.
    pub model: String,
    /// Deltas, one per choice that advanced (empty on the usage chunk).
    pub choices: Vec<ChatChunkChoice>,
    /// Present (non-null) only on the last chunk, with `stream_options.include_usage`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
    /// Identifies the serving configuration.
    pub system_fingerprint: Option<String>,
}

/// A choice's increment.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatChunkChoice {
    /// Which choice.
    pub index: usize,
    /// New role and/or text.
    pub delta: ChatDelta,
    /// Log-probabilities of the tokens in this delta.
    pub logprobs: Option<ChatLogprobs>,
    /// Set on the choice's last chunk.
    pub finish_reason: Finish,
}

/// New content of a streamed message.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatDelta {
    /// `assistant`, on the first chunk only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Text added.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Tool calls begun or continued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}
