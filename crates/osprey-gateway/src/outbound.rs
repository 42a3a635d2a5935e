//! The way out: one chain of [`Step`]s over an answer, in one task.
//!
//! Guard-out, cache keep, turn keep, citations and the request log's text each act on the
//! answer as it passes, in that order. A whole answer is parsed once, handed to every step in
//! turn, and written once. A stream is read by one SSE reader in one task: each chunk is parsed
//! once, passes the steps in order (a step may change it, hold it back, or end the stream with
//! it), and is written once. At `[DONE]` every step's [`Step::end`] runs (a write it makes is
//! done before the client sees the end), then `[DONE]` goes out; a step that fails there ends
//! the stream with an error event instead. A stream cut short (the backend gone, the client
//! gone) ends no step: nothing half-done is kept. When the client leaves, the answer's body is
//! dropped, which cancels its generation.
//!
//! A failed answer (not 2xx) passes as it is, with the steps' headers.

use axum::body::{Body, Bytes};
use axum::http::HeaderMap;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use osprey_core::{Error, ErrorKind};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::error::ApiError;

/// The largest whole answer read: far more than any model writes.
const MAX_ANSWER: usize = 64 << 20;
/// Events written ahead of a slow client.
const AHEAD: usize = 64;

/// What a step makes of a streamed chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Pass it on to the next step.
    Send,
    /// Nothing in it is for the client yet: the later steps do not see it and it is not sent.
    Drop,
    /// Pass it on, and end the stream after it.
    Last,
}

/// One step of the way out. Every method does nothing by default.
pub trait Step: Send {
    /// Marks the response's headers, before any of its body goes.
    fn headers(&mut self, _headers: &mut HeaderMap) {}

    /// Sees (and may change) a chunk of a successful stream.
    fn chunk(&mut self, _chunk: &mut Value) -> Seen {
        Seen::Send
    }

    /// The stream is complete: a last chunk to send before `[DONE]`, if any.
    fn end(&mut self) -> BoxFuture<'_, Result<Option<Value>, Error>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Sees (and may change) a successful whole answer.
    fn whole<'a>(&'a mut self, _answer: &'a mut Value) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// The steps an answer passes on its way out, in order.
#[derive(Default)]
pub struct Outbound {
    steps: Vec<Box<dyn Step>>,
}

impl Outbound {
    /// Adds `step` after the others.
    pub fn push(&mut self, step: impl Step + 'static) {
        self.steps.push(Box::new(step));
    }

    /// Adds `step`, if there is one, after the others.
    pub fn push_some(&mut self, step: Option<impl Step + 'static>) {
        if let Some(step) = step {
            self.push(step);
        }
    }

    /// `response` through every step (see the module docs).
    pub async fn apply(self, response: Response) -> Response {
        if self.steps.is_empty() {
            return response;
        }
        let mut steps = self.steps;
        let (mut parts, body) = response.into_parts();
        for step in &mut steps {
            step.headers(&mut parts.headers);
        }
        if !parts.status.is_success() {
            return Response::from_parts(parts, body);
        }
        parts.headers.remove(CONTENT_LENGTH);
        let body = match is_stream(&parts.headers) {
            true => Body::from_stream(stream(steps, body)),
            false => match whole(steps, body).await {
                Ok(bytes) => Body::from(bytes),
                Err(e) => return ApiError(e).into_response(),
            },
        };
        Response::from_parts(parts, body)
    }
}

/// Whether `headers` are those of a stream of server-sent events.
pub fn is_stream(headers: &HeaderMap) -> bool {
    (headers.get(CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"))
}

/// A whole answer's bytes through `steps`; as they are if they are not JSON.
async fn whole(mut steps: Vec<Box<dyn Step>>, body: Body) -> Result<Bytes, Error> {
    let bytes = axum::body::to_bytes(body, MAX_ANSWER).await.map_err(|e| {
        Error::new(
            ErrorKind::BadGateway,
            format!("The answer could not be read: {e}"),
        )
    })?;
    let Ok(mut answer) = serde_json::from_slice::<Value>(&bytes) else {
        return Ok(bytes);
    };
    for step in &mut steps {
        step.whole(&mut answer).await?;
    }
    Ok(serde_json::to_vec(&answer).expect("JSON serialises").into())
}

/// A stream's events through `steps`, in one task.
fn stream(
    mut steps: Vec<Box<dyn Step>>,
    body: Body,
) -> impl futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> + Send {
    let (tx, rx) = mpsc::channel::<Bytes>(AHEAD);
    tokio::spawn(async move {
        let mut events = body.into_data_stream().eventsource();
        while let Some(Ok(event)) = events.next().await {
            if event.data.trim() == "[DONE]" {
                return end(&mut steps, &tx).await;
            }
            let Ok(mut chunk) = serde_json::from_str::<Value>(&event.data) else {
                // Not a chunk: as it is.
                if tx.send(data(&event.data)).await.is_err() {
                    return;
                }
                continue;
            };
            let mut seen = Seen::Send;
            for step in &mut steps {
                match step.chunk(&mut chunk) {
                    Seen::Send => {}
                    Seen::Drop => {
                        seen = Seen::Drop;
                        break;
                    }
                    Seen::Last => seen = Seen::Last,
                }
            }
            if seen != Seen::Drop && tx.send(data(&chunk.to_string())).await.is_err() {
                return;
            }
            if seen == Seen::Last {
                // Dropping the answer's body cancels its generation.
                return end(&mut steps, &tx).await;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok)
}

/// Ends a complete stream: every step's end, then `[DONE]`; an error event instead of
/// `[DONE]` if a step fails.
async fn end(steps: &mut [Box<dyn Step>], tx: &mpsc::Sender<Bytes>) {
    for step in steps {
        let last = match step.end().await {
            Ok(Some(chunk)) => chunk.to_string(),
            Ok(None) => continue,
            Err(e) => {
                let error = serde_json::to_string(&e.envelope());
                let _ = tx.send(data(&error.unwrap_or_default())).await;
                return;
            }
        };
        if tx.send(data(&last)).await.is_err() {
            return;
        }
    }
    let _ = tx.send(data("[DONE]")).await;
}

fn data(payload: &str) -> Bytes {
    format!("data: {payload}\n\n").into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    /// Upper-cases every text; holds back chunks saying "hold"; ends the stream at "stop";
    /// adds a chunk at the end; fails at the end when told to.
    #[derive(Default)]
    struct Shout {
        seen: Vec<String>,
        fail: bool,
    }

    impl Step for Shout {
        fn headers(&mut self, headers: &mut HeaderMap) {
            headers.insert("x-shout", "yes".parse().unwrap());
        }
        fn chunk(&mut self, chunk: &mut Value) -> Seen {
            let text = chunk["text"].as_str().unwrap_or_default().to_owned();
            self.seen.push(text.clone());
            chunk["text"] = text.to_uppercase().into();
            match text.as_str() {
                "hold" => Seen::Drop,
                "stop" => Seen::Last,
                _ => Seen::Send,
            }
        }
        fn end(&mut self) -> BoxFuture<'_, Result<Option<Value>, Error>> {
            let fail = self.fail;
            let seen = self.seen.join(",");
            Box::pin(async move {
                match fail {
                    true => Err(Error::new(ErrorKind::Internal, "no room")),
                    false => Ok(Some(serde_json::json!({ "seen": seen }))),
                }
            })
        }
        fn whole<'a>(&'a mut self, answer: &'a mut Value) -> BoxFuture<'a, Result<(), Error>> {
            answer["shouted"] = true.into();
            Box::pin(std::future::ready(Ok(())))
        }
    }

    fn sse(events: &[&str]) -> Response {
        let body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        let mut r = Response::new(Body::from(body));
        (r.headers_mut()).insert(CONTENT_TYPE, "text/event-stream".parse().unwrap());
        r
    }

    async fn events(response: Response) -> Vec<String> {
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        (text.split("\n\n").filter(|e| !e.is_empty()))
            .map(|e| e.trim_start_matches("data: ").to_owned())
            .collect()
    }

    fn chain(steps: impl IntoIterator<Item = Shout>) -> Outbound {
        let mut out = Outbound::default();
        steps.into_iter().for_each(|s| out.push(s));
        out
    }

    #[tokio::test]
    async fn a_stream_passes_every_step_in_order_and_ends_after_their_ends() {
        let response = sse(&[r#"{"text":"a"}"#, r#"{"text":"hold"}"#, "[DONE]"]);
        let response = chain([Shout::default(), Shout::default()])
            .apply(response)
            .await;
        assert_eq!(response.headers()["x-shout"], "yes");
        let got = events(response).await;
        // The second step sees the first one's change; a held-back chunk reaches neither the
        // second step nor the client.
        assert_eq!(
            got,
            [
                r#"{"text":"A"}"#,
                r#"{"seen":"a,hold"}"#,
                r#"{"seen":"A"}"#,
                "[DONE]"
            ]
        );
    }

    #[tokio::test]
    async fn a_last_chunk_ends_the_stream_and_a_failed_end_replaces_done() {
        let response = sse(&[r#"{"text":"stop"}"#, r#"{"text":"never"}"#, "[DONE]"]);
        let got = events(chain([Shout::default()]).apply(response).await).await;
        assert_eq!(got, [r#"{"text":"STOP"}"#, r#"{"seen":"stop"}"#, "[DONE]"]);

        let failing = Shout {
            fail: true,
            ..Shout::default()
        };
        let got = events(chain([failing]).apply(sse(&["[DONE]"])).await).await;
        assert_eq!(got.len(), 1);
        assert!(got[0].contains("no room"), "{got:?}");
    }

    #[tokio::test]
    async fn a_stream_cut_short_ends_no_step() {
        let got = events(
            chain([Shout::default()])
                .apply(sse(&[r#"{"text":"a"}"#]))
                .await,
        )
        .await;
        assert_eq!(got, [r#"{"text":"A"}"#]);
    }

    #[tokio::test]
    async fn a_whole_answer_is_changed_once_and_a_failed_one_passes_as_it_is() {
        let response = Response::new(Body::from(r#"{"a":1}"#));
        let response = chain([Shout::default()]).apply(response).await;
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let answer: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(answer, serde_json::json!({"a": 1, "shouted": true}));

        let mut failed = Response::new(Body::from(r#"{"error":{}}"#));
        *failed.status_mut() = StatusCode::BAD_GATEWAY;
        let failed = chain([Shout::default()]).apply(failed).await;
        assert_eq!(failed.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(failed.headers()["x-shout"], "yes");
        let bytes = axum::body::to_bytes(failed.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(&bytes[..], br#"{"error":{}}"#);
    }
}
