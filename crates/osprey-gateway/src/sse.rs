//! Server-sent events as the OpenAI API writes them, and the ids and fingerprint its answers
//! carry.

use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};

/// Identifies this build in responses' `system_fingerprint`.
pub const FINGERPRINT: &str = concat!("osprey-", env!("CARGO_PKG_VERSION"));

/// A fresh response id with `prefix`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::random::<u128>())
}

/// One SSE event carrying `value` as JSON.
pub fn json_event(value: &impl serde::Serialize) -> Event {
    Event::default()
        .data(serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}")))
}

/// The `data: [DONE]` event that ends an OpenAI stream.
pub fn done_event() -> Event {
    Event::default().data("[DONE]")
}

/// An SSE response over `events`.
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
