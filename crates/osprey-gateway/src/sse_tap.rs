//! Reading a streamed answer on its way to the client: each event's data goes through a tap,
//! which may act on it (keep the text, write it somewhere once `[DONE]` comes) and says what
//! the client gets instead. The tap's work on an event finishes before the event is sent, so
//! a write made on `[DONE]` is done before the client sees the end. When the client leaves,
//! the answer's body is dropped, which cancels its generation.

use axum::body::{Body, Bytes};
use axum::response::Response;
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;

/// What a tap makes of an event's data: the data to send in its place.
pub type Tapped = BoxFuture<'static, String>;

/// Whether `response` is a stream of server-sent events.
pub fn is_stream(response: &Response) -> bool {
    (response.headers().get(axum::http::header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"))
}

/// `response` (a stream) with every event's data passed through `tap`.
pub fn tap(response: Response, mut tap: impl FnMut(String) -> Tapped + Send + 'static) -> Response {
    let (parts, body) = response.into_parts();
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let mut events = body.into_data_stream().eventsource();
        while let Some(Ok(event)) = events.next().await {
            let data = tap(event.data).await;
            if tx.send(format!("data: {data}\n\n").into()).await.is_err() {
                return;
            }
        }
    });
    let events =
        tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>);
    let mut response = Response::from_parts(parts, Body::from_stream(events));
    (response.headers_mut()).remove(axum::http::header::CONTENT_LENGTH);
    response
}
