//! An answer's typed events written as the OpenAI API writes them, once: one JSON object, or
//! server-sent events ending in `[DONE]` (with the usage chunk before it when the request's
//! `stream_options.include_usage` asks for it). An error before the end is the answer's error;
//! in a stream, its last event.

mod chat;
mod completions;

use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream, StreamExt};
use osprey_core::Error;
use osprey_core::api::{SamplingFields, Usage};
use osprey_core::backend::{Asked, ChoiceDelta, GenEvent, GenStream};

use crate::error::ApiError;
use crate::sse::{FINGERPRINT, done_event, json_event, new_id, stream_response};
use crate::state::unix_now;

/// How one request's answer is written.
pub enum Writer {
    /// A chat completion's.
    Chat(chat::ChatWriter),
    /// A text completion's.
    Completion(completions::CompletionWriter),
}

impl Writer {
    /// The writer of `asked`'s answer; errors for the fields it reads (`n`, the log-probability
    /// options, the prompts) if they are invalid.
    pub fn of(asked: &Asked) -> Result<Self, Error> {
        Ok(match asked {
            Asked::Chat(request) => Writer::Chat(chat::ChatWriter::new(request)?),
            Asked::Completion(request) => {
                Writer::Completion(completions::CompletionWriter::new(request)?)
            }
        })
    }

    /// The answer of `events`, streamed or whole as the request asked.
    pub async fn answer(self, events: GenStream) -> Result<Response, ApiError> {
        Ok(match self {
            Writer::Chat(w) if w.head.streaming => stream_response(written(w, events)),
            Writer::Chat(w) => w.whole(events).await?,
            Writer::Completion(w) if w.head.streaming => stream_response(written(w, events)),
            Writer::Completion(w) => axum::Json(w.whole(events).await?).into_response(),
        })
    }
}

/// What every answer carries (its id, its time, the model that answered), and how the request
/// asked for it.
struct Head {
    id: String,
    created: u64,
    model: String,
    /// Whether its choices carry log-probabilities.
    logprobs: bool,
    /// Whether a stream ends with a usage chunk.
    include_usage: bool,
    /// Whether it is streamed.
    streaming: bool,
}

impl Head {
    fn new(prefix: &str, model: &str, sampling: &SamplingFields, logprobs: bool) -> Self {
        Self {
            id: new_id(prefix),
            created: unix_now(),
            model: model.to_owned(),
            logprobs,
            include_usage: sampling.include_usage(),
            streaming: sampling.streaming(),
        }
    }
}

/// How one API writes a stream's chunks.
trait Chunks: Send + 'static {
    /// The answer's head.
    fn head(&self) -> &Head;
    /// The chunks that open the stream.
    fn opening(&self) -> Vec<Event>;
    /// The chunks of one delta (none for a delta with nothing for the client).
    fn delta(&mut self, delta: ChoiceDelta) -> Vec<Event>;
    /// The chunk that carries the usage.
    fn usage(&self, usage: Usage) -> Event;
}

/// `events` written as server-sent events by `writer`.
fn written(writer: impl Chunks, events: GenStream) -> impl Stream<Item = Event> + Send + 'static {
    let opening = writer.opening();
    let rest = stream::unfold(Some((writer, events)), |state| async move {
        let (mut writer, mut events) = state?;
        let last = match events.next().await? {
            Ok(GenEvent::Delta(delta)) => {
                let chunks = writer.delta(delta);
                return Some((chunks, Some((writer, events))));
            }
            Ok(GenEvent::Usage(usage)) => (writer.head().include_usage)
                .then(|| writer.usage(usage))
                .into_iter()
                .chain([done_event()])
                .collect(),
            Err(e) => vec![json_event(&e.envelope())],
        };
        Some((last, None))
    });
    stream::iter(opening).chain(rest.flat_map(stream::iter))
}

/// The deltas of `events` handed to `each` in order; the usage at the end.
async fn collect(mut events: GenStream, mut each: impl FnMut(ChoiceDelta)) -> Result<Usage, Error> {
    while let Some(event) = events.next().await {
        match event? {
            GenEvent::Delta(delta) => each(delta),
            GenEvent::Usage(usage) => return Ok(usage),
        }
    }
    Err(Error::internal("the answer ended before its usage"))
}

/// The system fingerprint every answer carries.
fn fingerprint() -> Option<String> {
    Some(FINGERPRINT.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use osprey_core::FinishReason::{Length, Stop, ToolCalls};
    use osprey_core::backend::{Backend, GenRequest};
    use osprey_core::{ErrorKind, Priority};
    use osprey_testkit::backend::{ScriptedBackend, call, finish, text, usage};
    use serde_json::{Value, json};

    fn asked(body: Value) -> Asked {
        let bytes = serde_json::to_vec(&body).unwrap();
        match body.get("messages") {
            Some(_) => Asked::Chat(osprey_core::api::parse_request(&bytes).unwrap()),
            None => Asked::Completion(osprey_core::api::parse_request(&bytes).unwrap()),
        }
    }

    /// `body`'s answer from a backend scripted with `script`: its JSON, or its events' data.
    async fn written(body: Value, script: Vec<Result<GenEvent, Error>>) -> Vec<String> {
        let asked = asked(body);
        let writer = Writer::of(&asked).unwrap();
        let backend = ScriptedBackend::new(script);
        let request = GenRequest {
            asked,
            body: Default::default(),
            priority: Priority::default(),
            cache_salt: String::new(),
        };
        let events = backend.generate(request).await.unwrap();
        let response = match writer.answer(events).await {
            Ok(response) => response,
            Err(e) => return vec![format!("error: {}", e.0.message)],
        };
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let body = String::from_utf8(bytes.to_vec()).unwrap();
        match body.starts_with("data: ") {
            true => (body.split("\n\n").filter(|e| !e.is_empty()))
                .map(|e| e.trim_start_matches("data: ").to_owned())
                .collect(),
            false => vec![body],
        }
    }

    fn json(s: &str) -> Value {
        serde_json::from_str(s).unwrap()
    }

    #[tokio::test]
    async fn a_whole_chat_answer_assembles_its_tool_calls_and_has_no_empty_content() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let script = vec![
            call(0, 0, Some("get_weather"), "{\"city\":"),
            call(0, 0, None, "\"Paris\""),
            // The call's id sent again with a piece (as some servers do): the same call.
            call(0, 0, Some("get_weather"), "}"),
            call(0, 1, Some("add"), "{}"),
            finish(0, ToolCalls),
            usage(7, 3),
        ];
        let answer = json(&written(body, script).await[0]);
        let message = &answer["choices"][0]["message"];
        assert_eq!(message["content"], Value::Null);
        assert_eq!(message["tool_calls"][0]["function"]["name"], "get_weather");
        assert_eq!(
            message["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Paris\"}"
        );
        assert_eq!(message["tool_calls"][0]["id"], "call_0_0");
        assert_eq!(message["tool_calls"][1]["function"]["name"], "add");
        assert_eq!(answer["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(
            answer["usage"],
            json!({"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10})
        );
        assert_eq!(answer["object"], "chat.completion");
    }

    #[tokio::test]
    async fn a_chat_stream_opens_with_the_role_and_ends_with_usage_then_done() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "stream": true, "stream_options": {"include_usage": true}});
        let script = vec![
            text(0, "Hel", 1),
            text(0, "", 1),
            text(0, "lo", 1),
            finish(0, Stop),
            usage(2, 3),
        ];
        let events = written(body, script).await;
        let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| json(e)).collect();
        assert_eq!(events.last().unwrap(), "[DONE]");
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let texts: Vec<&str> = (chunks[1..].iter())
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        // The empty delta (a token whose text is not final yet) sends nothing.
        assert_eq!(texts, ["Hel", "lo"]);
        assert_eq!(chunks[3]["choices"][0]["finish_reason"], "stop");
        let last = chunks.last().unwrap();
        assert_eq!(last["choices"], json!([]));
        assert_eq!(last["usage"]["completion_tokens"], 3);
        // Only the last chunk carries usage; the others say null.
        assert_eq!(chunks[1]["usage"], Value::Null);
    }

    #[tokio::test]
    async fn an_error_halfway_ends_a_stream_without_done_and_fails_a_whole_answer() {
        let failed = || Err(Error::new(ErrorKind::Unavailable, "the engine stopped"));
        let body = json!({"model": "m", "prompt": "a", "stream": true});
        let events = written(body, vec![text(0, "x", 1), failed()]).await;
        assert_eq!(events.len(), 2);
        assert_eq!(json(&events[0])["choices"][0]["text"], "x");
        assert!(events[1].contains("the engine stopped"), "{events:?}");

        let body = json!({"model": "m", "prompt": "a"});
        let answer = written(body, vec![text(0, "x", 1), failed()]).await;
        assert_eq!(answer, ["error: the engine stopped"]);
    }

    #[tokio::test]
    async fn a_whole_completion_keeps_every_choice_apart() {
        let body = json!({"model": "m", "prompt": ["a", "b"], "n": 2});
        let script = vec![
            text(3, "d", 1),
            text(0, "a", 1),
            finish(3, Length),
            text(0, "!", 1),
            finish(0, Stop),
            finish(1, Stop),
            finish(2, Stop),
            usage(2, 3),
        ];
        let answer = json(&written(body, script).await[0]);
        let choices = answer["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 4);
        assert_eq!(choices[0]["text"], "a!");
        assert_eq!(choices[3]["text"], "d");
        assert_eq!(choices[3]["finish_reason"], "length");
        assert_eq!(choices[1]["text"], "");
        assert_eq!(answer["object"], "text_completion");
    }

    #[tokio::test]
    async fn fields_another_server_sent_reach_the_delta_and_the_whole_message() {
        let thought = |piece: &str| {
            let mut extra = serde_json::Map::new();
            extra.insert("reasoning_content".into(), piece.into());
            Ok(GenEvent::Delta(osprey_core::backend::ChoiceDelta {
                tokens: 1,
                extra: Some(Box::new(extra)),
                ..Default::default()
            }))
        };
        let script = || {
            vec![
                thought("think "),
                thought("hard"),
                text(0, "42", 1),
                finish(0, Stop),
                usage(1, 3),
            ]
        };
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "?"}]});
        let answer = json(&written(body.clone(), script()).await[0]);
        let message = &answer["choices"][0]["message"];
        assert_eq!(message["reasoning_content"], "think hard");
        assert_eq!(message["content"], "42");

        let mut body = body;
        body["stream"] = true.into();
        let events = written(body, script()).await;
        let deltas: Vec<Value> = (events[1..3].iter())
            .map(|e| json(e)["choices"][0]["delta"].clone())
            .collect();
        assert_eq!(deltas[0], json!({"reasoning_content": "think "}));
        assert_eq!(deltas[1], json!({"reasoning_content": "hard"}));
        assert_eq!(json(&events[3])["choices"][0]["delta"]["content"], "42");
    }
}
