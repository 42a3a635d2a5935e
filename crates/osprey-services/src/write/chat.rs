//! Chat answers: `chat.completion` whole, `chat.completion.chunk`s streamed (the role first,
//! then one chunk per piece of text or tool call, the finish in a chunk of its own). Fields
//! another server's deltas carried that Osprey does not know ([`ChoiceDelta::extra`]) go into
//! the chunk's delta; whole, into the message, pieces of text joined.

use axum::body::Bytes;
use axum::response::Response;
use osprey_core::Error;
use osprey_core::api::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
    ChatCompletionRequest, ChatDelta, ChatLogprobs, FunctionCall, ToolCall, Usage,
};
use osprey_core::backend::{ChoiceDelta, GenStream, Logprobs};
use serde_json::{Map, Value};

use super::{Chunks, Head, collect, fingerprint, whole_response};
use crate::outbound::Outbound;
use crate::sse::json_frame;

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

    /// The whole answer, through the steps of `out`.
    pub(super) async fn whole(self, events: GenStream, out: Outbound) -> Result<Response, Error> {
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
        let mut extras: Vec<Option<Map<String, Value>>> = vec![None; self.n];
        let (usage, osprey) = collect(&self.head, events, out, |mut delta| {
            if let Some(extra) = delta.extra.take() {
                join(extras[delta.index].get_or_insert_default(), *extra);
            }
            add(&mut choices[delta.index], delta)
        })
        .await?;
        for choice in &mut choices {
            // An answer of tool calls alone has no content.
            let message = &mut choice.message;
            if message.tool_calls.is_some() && message.content.as_deref() == Some("") {
                message.content = None;
            }
        }
        let answer = ChatCompletion {
            id: self.head.id,
            object: "chat.completion".into(),
            created: self.head.created,
            model: self.head.model,
            choices,
            usage,
            system_fingerprint: fingerprint(),
        };
        if extras.iter().all(Option::is_none) {
            return Ok(whole_response(answer, osprey));
        }
        let mut answer = serde_json::to_value(answer).expect("an answer serialises");
        for (i, extra) in extras.into_iter().enumerate() {
            if let Some(Value::Object(message)) = answer["choices"][i].get_mut("message") {
                message.extend(extra.into_iter().flatten());
            }
        }
        Ok(whole_response(answer, osprey))
    }

    fn object(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.head.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.head.created,
            model: self.head.model.clone(),
            choices,
            usage: self.head.include_usage.then_some(usage),
            system_fingerprint: fingerprint(),
        }
    }

    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> Bytes {
        json_frame(&self.object(choices, usage))
    }

    /// The chunk of `choice`, its delta given the `extra` fields.
    fn chunk_with(&self, choice: ChatChunkChoice, extra: Map<String, Value>) -> Bytes {
        let chunk = self.object(vec![choice], None);
        let mut chunk = serde_json::to_value(chunk).expect("a chunk serialises");
        if let Some(Value::Object(delta)) = chunk["choices"][0].get_mut("delta") {
            delta.extend(extra);
        }
        json_frame(&chunk)
    }
}

/// `more` unknown fields of a message added to `all`: text joined, anything else replaced.
fn join(all: &mut Map<String, Value>, more: Map<String, Value>) {
    for (name, value) in more {
        match (all.get_mut(&name), value) {
            (Some(Value::String(text)), Value::String(piece)) => text.push_str(&piece),
            (_, value) => {
                all.insert(name, value);
            }
        }
    }
}

/// Adds `delta` to its choice of a whole answer.
fn add(choice: &mut ChatChoice, delta: ChoiceDelta) {
    let message = &mut choice.message;
    if !delta.text.is_empty() || delta.tool_call.is_none() {
        message
            .content
            .get_or_insert_default()
            .push_str(&delta.text);
    }
    if let Some(call) = delta.tool_call {
        let calls = message.tool_calls.get_or_insert_with(Vec::new);
        let arguments = call.function.arguments.unwrap_or_default();
        match (call.id, calls.get_mut(call.index)) {
            // A call begun goes on, also when its id is sent again (as some servers do).
            (None, Some(started)) => started.function.arguments.push_str(&arguments),
            (Some(id), Some(started)) if started.id == id => {
                started.function.arguments.push_str(&arguments)
            }
            (Some(id), _) => calls.push(ToolCall {
                id,
                kind: call.kind.unwrap_or_else(|| "function".into()),
                function: FunctionCall {
                    name: call.function.name.unwrap_or_default(),
                    arguments,
                },
            }),
            (None, None) => {}
        }
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

    fn opening(&self) -> Vec<Bytes> {
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

    fn delta(&mut self, delta: ChoiceDelta) -> Vec<Bytes> {
        let index = delta.index;
        let mut chunks = Vec::new();
        let logprobs = match delta.logprobs {
            Some(Logprobs::Chat(content)) => Some(ChatLogprobs { content }),
            _ => None,
        };
        let extra = delta.extra;
        let said = !delta.text.is_empty() || delta.tool_call.is_some() || logprobs.is_some();
        if said || extra.is_some() {
            let bare = delta.tool_call.is_some() || extra.is_some();
            let delta = ChatDelta {
                content: (!delta.text.is_empty() || !bare).then_some(delta.text),
                tool_calls: delta.tool_call.map(|call| vec![call]),
                ..ChatDelta::default()
            };
            let choice = ChatChunkChoice {
                index,
                delta,
                logprobs,
                finish_reason: None,
            };
            chunks.push(match extra {
                None => self.chunk(vec![choice], None),
                Some(extra) => self.chunk_with(choice, *extra),
            });
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

    fn empty(&self, usage: Option<Usage>) -> Value {
        serde_json::to_value(self.object(Vec::new(), usage)).expect("a chunk serialises")
    }
}
