//! An answer's typed events written as the OpenAI API writes them, once: one JSON object, or
//! server-sent events ending in `[DONE]` (with the usage chunk before it when the request's
//! `stream_options.include_usage` asks for it). The way out ([`Outbound`]) runs as they are
//! written: each delta passes its steps first, and their ends run when the answer is complete
//! (what they add goes under the answer's `osprey`; in a stream, in a chunk of its own before
//! `[DONE]`). An error before the end is the answer's error; in a stream, its last event.

mod chat;
mod completions;

use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream, StreamExt};
use osprey_core::Error;
use osprey_core::api::{SamplingFields, Usage};
use osprey_core::backend::{Asked, ChoiceDelta, GenEvent, GenStream};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::outbound::{Complete, Outbound, Seen};
use crate::sse::{DONE_FRAME, FINGERPRINT, answer_stream, json_frame, new_id};
use crate::state::unix_now;

/// An answer begun: its events, how they are written, and the headers it goes out with.
pub struct Answered {
    /// How it is written.
    pub writer: Writer,
    /// Its events, as they come.
    pub events: GenStream,
    /// Its headers (which model, which worker, why).
    pub headers: HeaderMap,
}

impl Answered {
    /// The answer written through the steps of `out`.
    pub async fn write(self, out: Outbound) -> Result<Response, ApiError> {
        let mut response = self.writer.answer(self.events, out).await?;
        response.headers_mut().extend(self.headers);
        Ok(response)
    }
}

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

    /// The same writer, writing the answer kept as `answer` under its own id, time and model.
    pub fn kept_as(mut self, answer: &Value) -> Self {
        let head = match &mut self {
            Writer::Chat(w) => &mut w.head,
            Writer::Completion(w) => &mut w.head,
        };
        if let Some(id) = answer["id"].as_str() {
            head.id = id.to_owned();
        }
        if let Some(model) = answer["model"].as_str() {
            head.model = model.to_owned();
        }
        head.created = answer["created"].as_u64().unwrap_or(head.created);
        self
    }

    /// The answer of `events` through the steps of `out`, streamed or whole as the request
    /// asked.
    pub async fn answer(self, events: GenStream, mut out: Outbound) -> Result<Response, ApiError> {
        let mut headers = HeaderMap::new();
        out.headers(&mut headers);
        let mut response = match self {
            Writer::Chat(w) if w.head.streaming => answer_stream(written(w, events, out)),
            Writer::Chat(w) => w.whole(events, out).await?,
            Writer::Completion(w) if w.head.streaming => answer_stream(written(w, events, out)),
            Writer::Completion(w) => w.whole(events, out).await?,
        };
        response.headers_mut().extend(headers);
        Ok(response)
    }
}

/// What every answer carries (its id, its time, the model that answered), and how the request
/// asked for it.
struct Head {
    id: String,
    created: u64,
    model: String,
    /// Whether it is a chat answer.
    chat: bool,
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
            chat: prefix == "chatcmpl",
            logprobs,
            include_usage: sampling.include_usage(),
            streaming: sampling.streaming(),
        }
    }

    /// The answer, complete, as the steps' ends see it.
    fn complete<'a>(&'a self, usage: Option<&'a Usage>) -> Complete<'a> {
        Complete {
            id: &self.id,
            created: self.created,
            model: &self.model,
            chat: self.chat,
            usage,
        }
    }
}

/// How one API writes a stream's chunks.
trait Chunks: Send + Sync + 'static {
    /// The answer's head.
    fn head(&self) -> &Head;
    /// The chunks that open the stream.
    fn opening(&self) -> Vec<Bytes>;
    /// The chunks of one delta (none for a delta with nothing for the client).
    fn delta(&mut self, delta: ChoiceDelta) -> Vec<Bytes>;
    /// A chunk without choices, carrying `usage` if the request asked for it: as JSON.
    fn empty(&self, usage: Option<Usage>) -> Value;
}

/// `events` written as server-sent events by `writer`, through the steps of `out`.
fn written(
    writer: impl Chunks,
    events: GenStream,
    out: Outbound,
) -> impl Stream<Item = Bytes> + Send + 'static {
    let opening = writer.opening();
    let rest = stream::unfold(Some((writer, events, out)), |state| async move {
        let (mut writer, mut events, mut out) = state?;
        let last = match events.next().await? {
            Ok(GenEvent::Delta(mut delta)) => match out.delta(&mut delta) {
                Seen::Send => {
                    let chunks = writer.delta(delta);
                    return Some((chunks, Some((writer, events, out))));
                }
                Seen::Drop => return Some((Vec::new(), Some((writer, events, out)))),
                Seen::Last => {
                    // Dropping the backend's events cancels its generation.
                    drop(events);
                    let mut chunks = writer.delta(delta);
                    chunks.extend(ending(&writer, &mut out, None).await);
                    chunks
                }
            },
            Ok(GenEvent::Usage(usage)) => ending(&writer, &mut out, Some(usage)).await,
            Err(e) => {
                out.error(&e);
                vec![json_frame(&e.envelope())]
            }
        };
        Some((last, None))
    });
    stream::iter(opening).chain(rest.flat_map(stream::iter))
}

/// The last events of a complete stream: every step's end, then the usage chunk (if asked),
/// the steps' additions and `[DONE]`; the error event instead if a step fails.
async fn ending(writer: &impl Chunks, out: &mut Outbound, usage: Option<Usage>) -> Vec<Bytes> {
    let head = writer.head();
    let osprey = match out.end(&head.complete(usage.as_ref())).await {
        Ok(osprey) => osprey,
        Err(e) => return vec![json_frame(&e.envelope())],
    };
    let usage = usage.filter(|_| head.include_usage);
    let usage = usage.map(|u| json_frame(&writer.empty(Some(u))));
    let added = (!osprey.is_empty()).then(|| {
        let mut chunk = writer.empty(None);
        chunk["osprey"] = Value::Object(osprey);
        json_frame(&chunk)
    });
    usage
        .into_iter()
        .chain(added)
        .chain([Bytes::from_static(DONE_FRAME)])
        .collect()
}

/// The deltas of `events` through the steps of `out`, handed to `each` in order; then every
/// step's end: the usage, and what the steps add. A step that ends the answer early drops the
/// deltas after it (the backend still finishes, for its usage).
async fn collect(
    head: &Head,
    mut events: GenStream,
    mut out: Outbound,
    mut each: impl FnMut(ChoiceDelta),
) -> Result<(Usage, Map<String, Value>), Error> {
    let mut ended = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(GenEvent::Delta(mut delta)) if !ended => match out.delta(&mut delta) {
                Seen::Send => each(delta),
                Seen::Drop => {}
                Seen::Last => {
                    each(delta);
                    ended = true;
                }
            },
            Ok(GenEvent::Delta(_)) => {}
            Ok(GenEvent::Usage(usage)) => {
                let osprey = out.end(&head.complete(Some(&usage))).await?;
                return Ok((usage, osprey));
            }
            Err(e) => {
                out.error(&e);
                return Err(e);
            }
        }
    }
    Err(Error::internal("the answer ended before its usage"))
}

/// The whole `answer` as a response, with what the steps added under its `osprey`.
fn whole_response(answer: impl Serialize, osprey: Map<String, Value>) -> Response {
    if osprey.is_empty() {
        return axum::Json(answer).into_response();
    }
    let mut answer = serde_json::to_value(answer).expect("an answer serialises");
    answer["osprey"] = Value::Object(osprey);
    axum::Json(answer).into_response()
}

/// The system fingerprint every answer carries.
fn fingerprint() -> Option<String> {
    Some(FINGERPRINT.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbound::Step;
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
        written_through(body, script, Outbound::default()).await
    }

    /// [`written`], through the steps of `out`.
    async fn written_through(
        body: Value,
        script: Vec<Result<GenEvent, Error>>,
        out: Outbound,
    ) -> Vec<String> {
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
        let response = match writer.answer(events, out).await {
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

    /// Upper-cases every text; holds back "hold"; ends the answer at "stop"; adds its name
    /// under `osprey` at the end, or fails there when told to.
    #[derive(Default)]
    struct Shout {
        heard: Vec<String>,
        fail: bool,
    }

    impl Step for Shout {
        fn headers(&mut self, headers: &mut axum::http::HeaderMap) {
            headers.insert("x-shout", "yes".parse().unwrap());
        }
        fn delta(&mut self, delta: &mut ChoiceDelta) -> Seen {
            self.heard.push(delta.text.clone());
            let seen = match delta.text.as_str() {
                "hold" => Seen::Drop,
                "stop" => Seen::Last,
                _ => Seen::Send,
            };
            delta.text = delta.text.to_uppercase();
            seen
        }
        fn end<'a>(
            &'a mut self,
            answer: &'a crate::outbound::Complete<'a>,
        ) -> futures_util::future::BoxFuture<'a, Result<crate::outbound::Added, Error>> {
            let heard = format!(
                "{} {:?}",
                self.heard.join(","),
                answer.usage.map(|u| u.total_tokens)
            );
            let fail = self.fail;
            Box::pin(async move {
                match fail {
                    true => Err(Error::new(osprey_core::ErrorKind::Internal, "no room")),
                    false => Ok(Some(("shout", heard.into()))),
                }
            })
        }
    }

    fn chain(steps: impl IntoIterator<Item = Shout>) -> Outbound {
        let mut out = Outbound::default();
        steps.into_iter().for_each(|s| out.push(s));
        out
    }

    #[tokio::test]
    async fn every_delta_passes_the_steps_in_order_and_their_ends_go_under_osprey() {
        let body = json!({"model": "m", "prompt": "a", "stream": true});
        let script = vec![
            text(0, "a", 1),
            text(0, "hold", 1),
            text(0, "b", 1),
            usage(1, 3),
        ];
        let events = written_through(
            body.clone(),
            script.clone(),
            chain([Shout::default(), Shout::default()]),
        )
        .await;
        let texts: Vec<Value> = events
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .map(|c| c["choices"][0]["text"].clone())
            .collect();
        // The second step sees the first one's change; a held-back delta reaches neither the
        // second step nor the client.
        assert_eq!(texts[..2], [json!("A"), json!("B")]);
        let last = json(&events[events.len() - 2]);
        assert_eq!(last["osprey"]["shout"], "A,B Some(4)");
        assert_eq!(events.last().unwrap(), "[DONE]");

        let mut body = body;
        body["stream"] = false.into();
        let answer = json(&written_through(body, script, chain([Shout::default()])).await[0]);
        assert_eq!(answer["choices"][0]["text"], "AB");
        assert_eq!(answer["osprey"]["shout"], "a,hold,b Some(4)");
    }

    #[tokio::test]
    async fn a_step_may_end_the_answer_and_a_failed_end_fails_it() {
        let body = json!({"model": "m", "prompt": "a", "stream": true});
        let script = vec![text(0, "stop", 1), text(0, "never", 1), usage(1, 2)];
        let events = written_through(body.clone(), script.clone(), chain([Shout::default()])).await;
        assert_eq!(json(&events[0])["choices"][0]["text"], "STOP");
        assert_eq!(
            json(&events[1])["osprey"]["shout"],
            "stop None",
            "ended before the usage"
        );
        assert_eq!(events[2..], ["[DONE]"]);
        let failing = Shout {
            fail: true,
            ..Shout::default()
        };
        let events = written_through(body.clone(), script.clone(), chain([failing])).await;
        assert!(events.last().unwrap().contains("no room"), "{events:?}");

        let mut body = body;
        body["stream"] = false.into();
        // Whole, the backend finishes (for its usage) but nothing after the end goes out.
        let answer = json(
            &written_through(body.clone(), script.clone(), chain([Shout::default()])).await[0],
        );
        assert_eq!(answer["choices"][0]["text"], "STOP");
        assert_eq!(answer["osprey"]["shout"], "stop Some(3)");
        let failing = Shout {
            fail: true,
            ..Shout::default()
        };
        let answer = written_through(body, script, chain([failing])).await;
        assert_eq!(answer, ["error: no room"]);
    }

    #[tokio::test]
    async fn text_beside_a_tool_call_is_written_whole_and_streamed() {
        let both = || {
            let Ok(GenEvent::Delta(mut delta)) = call(0, 0, Some("f"), "{}") else {
                unreachable!("a delta")
            };
            delta.text = "Let me look.".into();
            delta.finish = Some(ToolCalls);
            Ok(GenEvent::Delta(delta))
        };
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "?"}]});
        let answer = json(&written(body.clone(), vec![both(), usage(1, 1)]).await[0]);
        let message = &answer["choices"][0]["message"];
        assert_eq!(message["content"], "Let me look.");
        assert_eq!(message["tool_calls"][0]["function"]["name"], "f");
        body["stream"] = true.into();
        let events = written(body, vec![both(), usage(1, 1)]).await;
        let delta = &json(&events[1])["choices"][0]["delta"];
        assert_eq!(delta["content"], "Let me look.");
        assert_eq!(delta["tool_calls"][0]["function"]["name"], "f");
    }
}
