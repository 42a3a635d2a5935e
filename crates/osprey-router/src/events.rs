//! An OpenAI-compatible server's answer read once, as typed events ([`GenEvent`]): each
//! streamed chunk's choices become deltas, its usage chunk the usage, and an error event (or a
//! stream broken off) the stream's error. Chunks carry no token counts, so each delta counts
//! the tokens of its log-probabilities, or one if it has text or a tool call. A server that
//! answers with one JSON object instead (it was not asked to stream, or ignored it) is read the
//! same way, each choice one delta ([`read_response`]).
//!
//! A server that sends no usage (it ignored `stream_options.include_usage`) gets one made of
//! the prompt's length and the deltas' counts. Fields of a chat delta (or message) Osprey does
//! not know, such as a reasoning model's `reasoning_content`, ride along in
//! [`ChoiceDelta::extra`]; other unknown fields are not kept.

use std::collections::VecDeque;

use axum::body::Bytes;
use eventsource_stream::Eventsource;
use futures_util::{Stream, StreamExt};
use osprey_core::api::{ChatLogprobs, CompletionLogprobs, ErrorBody, ToolCallDelta, Usage};
use osprey_core::backend::{Asked, ChoiceDelta, GenEvent, GenStream, Logprobs};
use osprey_core::metrics as names;
use osprey_core::{Error, ErrorKind, FinishReason};
use serde::Deserialize;

/// Where an answer comes from, as its errors name it.
#[derive(Clone, Debug)]
pub struct Source {
    /// The model, as served here.
    pub model: String,
    /// Whether it answers the chat API (else the completions API).
    pub chat: bool,
    /// Tokens in the request's prompt, for a usage the server does not send.
    pub prompt_tokens: usize,
    /// The choices asked for: a chunk naming another is not read.
    pub choices: usize,
}

impl Source {
    /// The source of `asked`'s answer from `model`, whose prompt is `prompt_tokens` long.
    pub fn of(model: &str, asked: &Asked, prompt_tokens: usize) -> Result<Self, Error> {
        let prompts = match asked {
            Asked::Chat(_) => 1,
            Asked::Completion(r) => r.prompts()?.len(),
        };
        Ok(Self {
            model: model.to_owned(),
            chat: matches!(asked, Asked::Chat(_)),
            prompt_tokens,
            choices: prompts * asked.sampling().choices()?,
        })
    }
}

/// The events of an answer `response`, streamed (server-sent events) or whole (one JSON object).
pub fn read_response(response: reqwest::Response, source: Source) -> GenStream {
    let streamed = (response.headers().get(reqwest::header::CONTENT_TYPE))
        .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
    if streamed {
        return Box::pin(read(response.bytes_stream(), source));
    }
    let whole = async move {
        let mut reader = Reader::new(source);
        match response.bytes().await {
            Ok(bytes) => reader.take_whole(serde_json::from_slice(&bytes)),
            Err(e) => reader.fail("disconnected", broken(&reader.source, e)),
        }
        futures_util::stream::iter(reader.ready)
    };
    Box::pin(futures_util::stream::once(whole).flatten())
}

/// `events` read to their end, for an answer that is not streamed: nothing of it has gone out
/// yet, so one that failed is an error (and another backend may answer instead).
pub async fn to_end(events: GenStream) -> Result<GenStream, Error> {
    let events: Vec<_> = events.collect().await;
    if let Some(Err(e)) = events.last() {
        return Err(e.clone());
    }
    Ok(Box::pin(futures_util::stream::iter(events)))
}

/// The events of a whole `answer` kept as JSON (as the response cache keeps them).
pub fn whole(answer: serde_json::Value, source: Source) -> GenStream {
    let mut reader = Reader::new(source);
    reader.take_whole(serde_json::from_value(answer));
    Box::pin(futures_util::stream::iter(reader.ready))
}

/// The events of the SSE `body`, ending after the usage (or at the first error).
pub fn read<E: std::fmt::Display>(
    body: impl Stream<Item = Result<Bytes, E>> + Send + 'static,
    source: Source,
) -> impl Stream<Item = Result<GenEvent, Error>> + Send + 'static {
    let reader = Reader::new(source);
    let events = Box::pin(body.eventsource());
    futures_util::stream::unfold((reader, events), |(mut reader, mut events)| async move {
        loop {
            if let Some(event) = reader.ready.pop_front() {
                return Some((event, (reader, events)));
            }
            if reader.ended {
                return None;
            }
            match events.next().await {
                Some(Ok(event)) => reader.take(&event.data),
                Some(Err(e)) => reader.fail("disconnected", broken(&reader.source, e)),
                // A server that ends its stream after the usage without `[DONE]` has said all.
                None if reader.usage.is_some() => reader.take("[DONE]"),
                None => reader.fail(
                    "disconnected",
                    broken(&reader.source, "it ended before [DONE]"),
                ),
            }
        }
    })
}

struct Reader {
    source: Source,
    /// Tokens of the deltas so far.
    counted: usize,
    usage: Option<Usage>,
    ready: VecDeque<Result<GenEvent, Error>>,
    ended: bool,
}

impl Reader {
    fn new(source: Source) -> Self {
        Self {
            source,
            counted: 0,
            usage: None,
            ready: VecDeque::new(),
            ended: false,
        }
    }

    /// Reads a whole answer: its choices as one delta each (tool calls numbered in order),
    /// then its usage.
    fn take_whole(&mut self, answer: Result<Chunk, serde_json::Error>) {
        let mut answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                let why = format!(
                    "The upstream for `{}` answered with invalid JSON: {e}",
                    self.source.model
                );
                return self.invalid(why);
            }
        };
        for choice in answer.choices.iter_mut().flatten() {
            let calls = choice.delta.tool_calls.iter_mut().flatten();
            calls.enumerate().for_each(|(i, call)| call.index = i);
            // Every choice of a whole answer has ended, whether it says why or not.
            choice.finish_reason.get_or_insert_with(|| "stop".into());
        }
        if !self.chunk(answer) {
            self.take("[DONE]");
        }
    }

    /// Reads one event's data.
    fn take(&mut self, data: &str) {
        if data.trim() == "[DONE]" {
            let usage = (self.usage.take())
                .unwrap_or_else(|| Usage::new(self.source.prompt_tokens, self.counted));
            self.ready.push_back(Ok(GenEvent::Usage(usage)));
            self.ended = true;
            return;
        }
        let chunk = match serde_json::from_str::<Chunk>(data) {
            Ok(chunk) => chunk,
            Err(e) => {
                let why = format!(
                    "The upstream for `{}` sent an event that is not a chunk: {e}",
                    self.source.model
                );
                return self.invalid(why);
            }
        };
        self.chunk(chunk);
    }

    /// Reads one chunk (or whole answer); whether it ended the answer with an error.
    fn chunk(&mut self, chunk: Chunk) -> bool {
        if let Some(told) = chunk.error {
            self.fail("error", told.error());
            return true;
        }
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        for choice in chunk.choices.unwrap_or_default() {
            if choice.index >= self.source.choices {
                let why = format!(
                    "The upstream for `{}` sent choice {} of {}.",
                    self.source.model, choice.index, self.source.choices
                );
                let error =
                    Error::new(ErrorKind::BadGateway, why).with_code("upstream_invalid_response");
                self.fail("invalid", error);
                return true;
            }
            match self.deltas(choice) {
                Ok(deltas) => {
                    for delta in deltas {
                        self.counted += delta.tokens;
                        self.ready.push_back(Ok(GenEvent::Delta(delta)));
                    }
                }
                Err(e) => {
                    self.fail("invalid", e);
                    return true;
                }
            }
        }
        false
    }

    /// The deltas of one chunk's choice: one per tool call it carries, else one (none if it
    /// says nothing, like the opening role).
    fn deltas(&self, choice: Choice) -> Result<Vec<ChoiceDelta>, Error> {
        let logprobs = match choice.logprobs {
            Some(raw) if !raw.is_null() => Some(self.logprobs(raw)?),
            _ => None,
        };
        let text = (choice.delta.content).or(choice.text).unwrap_or_default();
        let tool_calls = choice.delta.tool_calls.unwrap_or_default();
        let mut extra = choice.delta.extra;
        extra.retain(|name, value| !value.is_null() && name != "role");
        let tokens = match &logprobs {
            Some(Logprobs::Chat(c)) => c.len(),
            Some(Logprobs::Completion(c)) => c.tokens.len(),
            None => usize::from(!text.is_empty() || !tool_calls.is_empty()),
        };
        let mut first = ChoiceDelta {
            index: choice.index,
            text,
            tool_call: None,
            logprobs,
            tokens,
            finish: None,
            extra: (!extra.is_empty()).then(|| Box::new(extra)),
        };
        let mut deltas: Vec<ChoiceDelta> = Vec::new();
        if !first.text.is_empty() && !tool_calls.is_empty() {
            // Text beside a tool call goes first, in a delta of its own.
            deltas.push(std::mem::take(&mut first));
            first.index = choice.index;
        }
        for call in tool_calls {
            let mut delta = match deltas.is_empty() {
                true => std::mem::take(&mut first),
                false => ChoiceDelta::default(),
            };
            delta.index = choice.index;
            delta.tool_call = Some(call);
            deltas.push(delta);
        }
        if deltas.is_empty() {
            deltas.push(first);
        }
        if let Some(last) = deltas.last_mut() {
            last.finish = choice.finish_reason.as_deref().map(finish_reason);
        }
        deltas.retain(|d| !d.is_empty() || d.tokens > 0);
        Ok(deltas)
    }

    /// A choice's log-probabilities in the shape of the API asked.
    fn logprobs(&self, raw: serde_json::Value) -> Result<Logprobs, Error> {
        let read = match self.source.chat {
            true => serde_json::from_value::<ChatLogprobs>(raw).map(|l| Logprobs::Chat(l.content)),
            false => serde_json::from_value::<CompletionLogprobs>(raw).map(Logprobs::Completion),
        };
        read.map_err(|e| {
            let why = format!(
                "The upstream for `{}` sent log-probabilities that cannot be read: {e}",
                self.source.model
            );
            Error::new(ErrorKind::BadGateway, why).with_code("upstream_invalid_response")
        })
    }

    /// Ends the answer as invalid, for `why`.
    fn invalid(&mut self, why: String) {
        let error = Error::new(ErrorKind::BadGateway, why).with_code("upstream_invalid_response");
        self.fail("invalid", error);
    }

    /// Ends the answer with `error`, counted under `outcome`.
    fn fail(&mut self, outcome: &'static str, error: Error) {
        metrics::counter!(names::UPSTREAM_REQUESTS, "model" => self.source.model.clone(), "outcome" => outcome)
            .increment(1);
        self.ready.push_back(Err(error));
        self.ended = true;
    }
}

/// The error of a stream `source`'s server broke off.
fn broken(source: &Source, why: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::BadGateway,
        format!(
            "The upstream for `{}` broke off the stream: {why}",
            source.model
        ),
    )
    .with_code("upstream_disconnected")
}

/// Why a choice ended, as another server says it: its own words for a stop (TGI's
/// `eos_token`, `stop_sequence`; `abort`) read as a stop.
fn finish_reason(told: &str) -> FinishReason {
    match told {
        "length" => FinishReason::Length,
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "content_filter" => FinishReason::ContentFilter,
        _ => FinishReason::Stop,
    }
}

/// One streamed chunk of either API, or an error event. Fields sent as `null` read as absent.
#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<Told>,
}

/// An error event's error: OpenAI's envelope, its `code` a string or a number (vLLM's).
#[derive(Deserialize)]
struct Told {
    #[serde(default)]
    message: String,
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    param: Option<String>,
    #[serde(default)]
    code: Option<serde_json::Value>,
}

impl Told {
    /// The error, as ours: a failure of the server (not the request's) is a bad gateway.
    fn error(self) -> Error {
        let kind = match ErrorKind::of_type(&self.kind) {
            ErrorKind::Internal => ErrorKind::BadGateway,
            kind => kind,
        };
        let code = self.code.map(|c| match c {
            serde_json::Value::String(s) => s,
            other => other.to_string(),
        });
        let body = ErrorBody {
            message: self.message,
            kind: self.kind,
            param: self.param,
            code,
        };
        Error::told(kind, body)
    }
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    index: usize,
    /// A chat chunk's delta, or a whole chat answer's message.
    #[serde(default, alias = "message", deserialize_with = "null_as_default")]
    delta: Delta,
    /// A completion chunk's.
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    logprobs: Option<serde_json::Value>,
    #[serde(default)]
    finish_reason: Option<String>,
}

fn null_as_default<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Delta, D::Error> {
    Ok(Option::<Delta>::deserialize(d)?.unwrap_or_default())
}

#[derive(Default)]
struct Delta {
    content: Option<String>,
    tool_calls: Option<Vec<ToolCallDelta>>,
    /// The fields Osprey does not know.
    extra: serde_json::Map<String, serde_json::Value>,
}

/// Read field by field (not with `#[serde(flatten)]`, which buffers every delta first): the
/// known fields typed, any other kept as it came.
impl<'de> Deserialize<'de> for Delta {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = Delta;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a delta or message object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Delta, A::Error> {
                let mut delta = Delta::default();
                while let Some(name) = map.next_key::<Field>()? {
                    match name {
                        Field::Content => delta.content = map.next_value()?,
                        Field::ToolCalls => delta.tool_calls = map.next_value()?,
                        Field::Other(name) => {
                            delta.extra.insert(name, map.next_value()?);
                        }
                    }
                }
                Ok(delta)
            }
        }
        d.deserialize_map(Fields)
    }
}

/// A field of a delta, by name (read without allocating for the known ones).
enum Field {
    Content,
    ToolCalls,
    Other(String),
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = Field;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E>(self, name: &str) -> Result<Field, E> {
                Ok(match name {
                    "content" => Field::Content,
                    "tool_calls" => Field::ToolCalls,
                    other => Field::Other(other.to_owned()),
                })
            }
        }
        d.deserialize_identifier(Name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    async fn events(chat: bool, data: &[&str]) -> Vec<Result<GenEvent, Error>> {
        let body: String = data.iter().map(|d| format!("data: {d}\n\n")).collect();
        // Split mid-event, as a network would.
        let (a, b) = body.split_at(body.len() / 2);
        let chunks = vec![
            Ok::<_, std::io::Error>(Bytes::from(a.to_owned())),
            Ok(Bytes::from(b.to_owned())),
        ];
        let source = Source {
            model: "m".into(),
            chat,
            prompt_tokens: 5,
            choices: 2,
        };
        read(futures_util::stream::iter(chunks), source)
            .collect()
            .await
    }

    fn delta(event: &Result<GenEvent, Error>) -> &ChoiceDelta {
        match event {
            Ok(GenEvent::Delta(d)) => d,
            other => panic!("not a delta: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_chat_stream_becomes_its_deltas_then_its_usage() {
        let role = json!({"choices": [{"index": 0, "delta": {"role": "assistant"}}]});
        let text = json!({"choices": [{"index": 1, "delta": {"content": "Hi"},
            "logprobs": {"content": [{"token": "Hi", "logprob": -0.5, "bytes": null, "top_logprobs": []}]}}]});
        let calls = json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "c0", "type": "function", "function": {"name": "f", "arguments": "{"}},
            {"index": 1, "function": {"arguments": "}"}}]}, "finish_reason": "tool_calls"}]});
        let usage = json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}});
        let data = [role, text, calls, usage].map(|v| v.to_string());
        let mut data: Vec<&str> = data.iter().map(String::as_str).collect();
        data.push("[DONE]");
        let got = events(true, &data).await;
        assert_eq!(got.len(), 4, "{got:?}");
        assert_eq!(
            (delta(&got[0]).index, delta(&got[0]).text.as_str()),
            (1, "Hi")
        );
        assert!(matches!(&delta(&got[0]).logprobs, Some(Logprobs::Chat(l)) if l.len() == 1));
        let (first, second) = (delta(&got[1]), delta(&got[2]));
        assert_eq!(first.tool_call.as_ref().unwrap().id.as_deref(), Some("c0"));
        assert_eq!(
            (first.finish, second.finish),
            (None, Some(FinishReason::ToolCalls))
        );
        assert_eq!(second.tool_call.as_ref().unwrap().index, 1);
        assert_eq!(got[3].as_ref().unwrap(), &GenEvent::Usage(Usage::new(3, 4)));
    }

    #[tokio::test]
    async fn a_completion_without_usage_is_counted_and_an_error_event_ends_it() {
        let text = json!({"choices": [{"index": 0, "text": "ab", "finish_reason": "length"}]});
        let got = events(false, &[&text.to_string(), "[DONE]"]).await;
        assert_eq!(delta(&got[0]).finish, Some(FinishReason::Length));
        assert_eq!(got[1].as_ref().unwrap(), &GenEvent::Usage(Usage::new(5, 1)));

        let error = json!({"error": {"message": "no room", "type": "server_error", "param": null, "code": "full"}});
        let got = events(false, &[&text.to_string(), &error.to_string(), "[DONE]"]).await;
        assert_eq!(got.len(), 2);
        let e = got[1].as_ref().unwrap_err();
        assert_eq!(
            (e.message.as_str(), e.code.as_deref()),
            ("no room", Some("full"))
        );
        assert_eq!(e.kind, ErrorKind::BadGateway);
    }

    #[tokio::test]
    async fn a_stream_cut_short_or_not_json_ends_with_an_error() {
        let text = json!({"choices": [{"index": 0, "text": "ab"}]}).to_string();
        let got = events(false, &[&text]).await;
        let e = got.last().unwrap().as_ref().unwrap_err();
        assert_eq!(e.code.as_deref(), Some("upstream_disconnected"));

        let got = events(false, &["not json", &text, "[DONE]"]).await;
        assert_eq!(got.len(), 1);
        let e = got[0].as_ref().unwrap_err();
        assert_eq!(e.code.as_deref(), Some("upstream_invalid_response"));

        // A choice that was not asked for is not read (a writer would have no place for it).
        let third = json!({"choices": [{"index": 2, "text": "c"}]}).to_string();
        let got = events(false, &[&third, "[DONE]"]).await;
        let e = got[0].as_ref().unwrap_err();
        assert_eq!(e.code.as_deref(), Some("upstream_invalid_response"));
    }

    #[tokio::test]
    async fn other_servers_words_and_nulls_are_read_and_a_stream_may_end_after_its_usage() {
        let tgi = json!({"choices": [{"index": 0, "delta": null, "text": "a",
            "finish_reason": "eos_token"}], "usage": null});
        let usage = json!({"choices": null,
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}});
        let filtered =
            json!({"choices": [{"index": 1, "text": "", "finish_reason": "content_filter"}]});
        let got = events(
            false,
            &[&tgi.to_string(), &filtered.to_string(), &usage.to_string()],
        )
        .await;
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(delta(&got[0]).finish, Some(FinishReason::Stop));
        assert_eq!(delta(&got[1]).finish, Some(FinishReason::ContentFilter));
        assert_eq!(got[2].as_ref().unwrap(), &GenEvent::Usage(Usage::new(1, 1)));

        let vllm = json!({"error": {"message": "overloaded", "type": "ServiceUnavailable",
            "code": 503}});
        let got = events(true, &[&vllm.to_string()]).await;
        let e = got[0].as_ref().unwrap_err();
        assert_eq!(
            (e.message.as_str(), e.code.as_deref()),
            ("overloaded", Some("503"))
        );
    }

    fn whole(chat: bool, body: &str) -> Vec<Result<GenEvent, Error>> {
        let source = Source {
            model: "m".into(),
            chat,
            prompt_tokens: 5,
            choices: 2,
        };
        let mut reader = Reader::new(source);
        reader.take_whole(serde_json::from_str(body));
        reader.ready.into()
    }

    #[test]
    fn a_whole_answer_is_read_as_one_delta_per_choice_keeping_unknown_fields() {
        let answer = json!({"id": "x", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Hi",
                "reasoning_content": "think", "refusal": null}, "finish_reason": "stop"},
            {"index": 1, "message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
             "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}});
        let got = whole(true, &answer.to_string());
        assert_eq!(got.len(), 4, "{got:?}");
        let first = delta(&got[0]);
        assert_eq!(
            (first.text.as_str(), first.finish),
            ("Hi", Some(FinishReason::Stop))
        );
        let extra = first.extra.as_deref().unwrap();
        assert_eq!(extra.len(), 1, "role and nulls are not extra: {extra:?}");
        assert_eq!(extra["reasoning_content"], "think");
        let calls: Vec<_> = got[1..3]
            .iter()
            .map(|e| delta(e).tool_call.clone().unwrap())
            .collect();
        assert_eq!(
            (calls[0].index, calls[1].index),
            (0, 1),
            "numbered in order"
        );
        assert_eq!(delta(&got[2]).finish, Some(FinishReason::ToolCalls));
        assert_eq!(got[3].as_ref().unwrap(), &GenEvent::Usage(Usage::new(3, 4)));

        let both = json!({"choices": [{"index": 0, "message": {"content": "Let me look.",
            "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{}"}}]}}]});
        let got = whole(true, &both.to_string());
        let (text, call) = (delta(&got[0]), delta(&got[1]));
        assert_eq!(
            (text.text.as_str(), text.tool_call.is_none()),
            ("Let me look.", true)
        );
        assert_eq!(
            (
                call.text.as_str(),
                call.tool_call.as_ref().unwrap().id.as_deref()
            ),
            ("", Some("a"))
        );

        let got = whole(true, "{\"choices\": [{\"message\": ");
        let e = got[0].as_ref().unwrap_err();
        assert_eq!(e.code.as_deref(), Some("upstream_invalid_response"));
        let told = json!({"error": {"message": "busy", "type": "server_error"}});
        let got = whole(false, &told.to_string());
        assert_eq!(got[0].as_ref().unwrap_err().message, "busy");
    }
}
