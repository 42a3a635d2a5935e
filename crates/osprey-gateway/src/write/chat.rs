//! Chat answers: `chat.completion` whole, `chat.completion.chunk`s streamed (the role first,
//! then one chunk per piece of text or tool call, the finish in a chunk of its own).

use axum::response::sse::Event;
use osprey_core::Error;
use osprey_core::api::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
    ChatCompletionRequest, ChatDelta, ChatLogprobs, FunctionCall, ToolCall, Usage,
};
use osprey_core::backend::{ChoiceDelta, GenStream, Logprobs};

use super::{Chunks, Head, collect, fingerprint};
use crate::sse::json_event;

pub struct ChatWriter {
    pub(super) head: Head,
    n: usize,
}

impl ChatWriter {
    pub(super) fn new(request: &ChatCompletionRequest) -> Result<Self, Error> {
        let logprobs = request.sampling_params()?.logprobs.is_some();
        Ok(Self {
            head: Head::new("chatcmpl", &request.model, &request.sampling, logprobs),
            n: request.sampling.choices()?,
        })
    }

    /// The whole answer.
    pub(super) async fn whole(self, events: GenStream) -> Result<ChatCompletion, Error> {
        let mut choices: Vec<ChatChoice> = (0..self.n)
            .map(|index| ChatChoice {
                index,
                message: AssistantMessage {
                    role: "assistant".into(),
                    content: Some(String::new()),
                    tool_calls: None,
                },
                logprobs: self.head.logprobs.then(ChatLogprobs::default),
                finish_reason: None,
            })
            .collect();
        let usage = collect(events, |delta| add(&mut choices[delta.index], delta)).await?;
        for choice in &mut choices {
            // An answer of tool calls alone has no content.
            let message = &mut choice.message;
            if message.tool_calls.is_some() && message.content.as_deref() == Some("") {
                message.content = None;
            }
        }
        Ok(ChatCompletion {
            id: self.head.id,
            object: "chat.completion".into(),
            created: self.head.created,
            model: self.head.model,
            choices,
            usage,
            system_fingerprint: fingerprint(),
        })
    }

    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> Event {
        json_event(&ChatCompletionChunk {
            id: self.head.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.head.created,
            model: self.head.model.clone(),
            choices,
            usage: self.head.include_usage.then_some(usage),
            system_fingerprint: fingerprint(),
        })
    }
}

/// Adds `delta` to its choice of a whole answer.
fn add(choice: &mut ChatChoice, delta: ChoiceDelta) {
    let message = &mut choice.message;
    match delta.tool_call {
        Some(call) => {
            let calls = message.tool_calls.get_or_insert_with(Vec::new);
            let arguments = call.function.arguments.unwrap_or_default();
            match (call.id, calls.get_mut(call.index)) {
                (Some(id), _) => calls.push(ToolCall {
                    id,
                    kind: call.kind.unwrap_or_else(|| "function".into()),
                    function: FunctionCall {
                        name: call.function.name.unwrap_or_default(),
                        arguments,
                    },
                }),
                (None, Some(started)) => started.function.arguments.push_str(&arguments),
                (None, None) => {}
            }
        }
        None => message
            .content
            .get_or_insert_default()
            .push_str(&delta.text),
    }
    if let (Some(all), Some(Logprobs::Chat(more))) = (choice.logprobs.as_mut(), delta.logprobs) {
        all.content.extend(more);
    }
    choice.finish_reason = delta.finish.or(choice.finish_reason);
}

impl Chunks for ChatWriter {
    fn head(&self) -> &Head {
        &self.head
    }

    fn opening(&self) -> Vec<Event> {
        (0..self.n)
            .map(|index| {
                let delta = ChatDelta {
                    role: Some("assistant".into()),
                    content: Some(String::new()),
                    tool_calls: None,
                };
                let choice = ChatChunkChoice {
                    index,
                    delta,
                    logprobs: None,
                    finish_reason: None,
                };
                self.chunk(vec![choice], None)
            })
            .collect()
    }

    fn delta(&mut self, delta: ChoiceDelta) -> Vec<Event> {
        let index = delta.index;
        let mut chunks = Vec::new();
        let logprobs = match delta.logprobs {
            Some(Logprobs::Chat(content)) => Some(ChatLogprobs { content }),
            _ => None,
        };
        if !delta.text.is_empty() || delta.tool_call.is_some() || logprobs.is_some() {
            let delta = match delta.tool_call {
                Some(call) => ChatDelta {
                    tool_calls: Some(vec![call]),
                    ..ChatDelta::default()
                },
                None => ChatDelta {
                    content: Some(delta.text),
                    ..ChatDelta::default()
                },
            };
            let choice = ChatChunkChoice {
                index,
                delta,
                logprobs,
                finish_reason: None,
            };
            chunks.push(self.chunk(vec![choice], None));
        }
        if let Some(reason) = delta.finish {
            let last = ChatChunkChoice {
                index,
                delta: ChatDelta::default(),
                logprobs: None,
                finish_reason: Some(reason),
            };
            chunks.push(self.chunk(vec![last], None));
        }
        chunks
    }

    fn usage(&self, usage: Usage) -> Event {
        self.chunk(Vec::new(), Some(usage))
    }
}
