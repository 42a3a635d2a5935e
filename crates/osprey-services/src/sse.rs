//! Server-sent events as the OpenAI API writes them, and the ids and fingerprint its answers
//! carry.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::HeaderValue;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};

/// Identifies this build in responses' `system_fingerprint`.
pub const FINGERPRINT: &str = concat!("osprey-", env!("CARGO_PKG_VERSION"));

/// A fresh response id with `prefix`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::random::<u128>())
}

/// One SSE event carrying `value` as JSON, as it goes on the wire.
pub fn json_frame(value: &impl serde::Serialize) -> Bytes {
    let mut frame = b"data: ".to_vec();
    if let Err(e) = serde_json::to_writer(&mut frame, value) {
        frame.truncate(6);
        frame.extend_from_slice(format!("{{\"error\":\"{e}\"}}").as_bytes());
    }
    frame.extend_from_slice(b"\n\n");
    frame.into()
}

/// The `data: [DONE]` event that ends an OpenAI stream, as it goes on the wire.
pub const DONE_FRAME: &[u8] = b"data: [DONE]\n\n";

/// An answer's SSE response over `frames` ([`json_frame`]): frames ready together go out in
/// one write. No keep-alive comments: an answer's first frame goes at once.
pub fn answer_stream(frames: impl Stream<Item = Bytes> + Send + 'static) -> Response {
    let body = frames.ready_chunks(64).map(|frames| {
        let frame = match frames.len() {
            1 => frames.into_iter().next().expect("one frame"),
            _ => frames.concat().into(),
        };
        Ok::<_, Infallible>(frame)
    });
    let mut response = Response::new(Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// An SSE response over `events`, with keep-alive comments while it is quiet.
pub fn stream_response(events: impl Stream<Item = Event> + Send + 'static) -> Response {
    Sse::new(events.map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// Runs `body` as a task feeding a stream of events; the task stops (dropping its generations,
/// which cancels them) when the client's connection goes away.
pub fn async_stream<F, Fut>(body: F) -> impl Stream<Item = Event> + Send + 'static
where
    F: FnOnce(tokio::sync::mpsc::Sender<Event>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(), tokio::sync::mpsc::error::SendError<Event>>>
        + Send
        + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let _ = body(tx).await;
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
