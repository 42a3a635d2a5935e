//! Traces: every HTTP request is one span (`request`), continuing the caller's trace when it
//! sends a W3C `traceparent`, with the stages below it as child spans (`auth`, `rate_limit`,
//! `guard.input`, `retrieval`, `prompt`, `route`, `engine.queue`, `engine.decode`, `tool`, ...);
//! the trace context goes on to upstreams and workers in the `traceparent` of their requests.
//! The spans are `tracing` spans: the binary exports them over OTLP when asked
//! (`--otlp-endpoint`), and its JSON logs carry the request span's fields (its request id) on
//! every line logged within it. Work done for observability off the request's path (writing
//! the request log, exporting spans) runs on threads of lowered priority
//! ([`lower_thread_priority`]), so that on a busy machine it waits for requests, not they for it.

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TraceContextExt;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use osprey_router::upstream::REQUEST_ID;

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(key), HeaderValue::try_from(value)) {
            self.0.insert(name, value);
        }
    }
}

tokio::task_local! {
    /// The id of the request this task is answering (set by [`trace`]).
    static REQUEST: HeaderValue;
}

/// The id of the request this task is answering (the caller's `x-request-id`, or the one
/// [`trace`] made for it), or a new one outside a request.
pub fn request_id() -> HeaderValue {
    REQUEST
        .try_with(HeaderValue::clone)
        .unwrap_or_else(|_| osprey_router::upstream::new_request_id())
}

/// What a request this one makes to a backend carries: this request's id (`x-request-id`) and
/// the current trace context.
pub fn outgoing() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(osprey_router::upstream::REQUEST_ID, request_id());
    inject(&mut headers);
    headers
}

/// Puts the current span's trace context into `headers` (`traceparent`), for a request this
/// one makes.
fn inject(headers: &mut HeaderMap) {
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut HeaderInjector(headers))
    });
}

/// The current trace's id, when the request's trace is exported (sampled).
pub fn trace_id() -> Option<String> {
    let cx = tracing::Span::current().context();
    let span = cx.span();
    let id = span.span_context();
    (id.is_valid() && id.is_sampled()).then(|| id.trace_id().to_string())
}

/// Middleware: the request's span (continuing the caller's trace), open until the response's
/// body has been sent; and its request id (`x-request-id`: the caller's, or a new one) on the
/// span, the response, and for [`request_id`] (the request log's row, upstream requests).
pub async fn trace(req: Request, next: Next) -> Response {
    let route = (req.extensions().get::<MatchedPath>())
        .map_or_else(|| req.uri().path().to_owned(), |p| p.as_str().to_owned());
    // A new id goes on the span and the response only: an `x-request-id` on the request is the
    // caller's, and makes a non-streamed request idempotent (`replay::idempotency_key`).
    let id = (req.headers().get(REQUEST_ID).cloned())
        .unwrap_or_else(osprey_router::upstream::new_request_id);
    let span = tracing::info_span!(
        "request",
        otel.name = format!("{} {route}", req.method()),
        http.request.method = %req.method(),
        http.route = %route,
        request_id = id.to_str().unwrap_or_default(),
        http.response.status_code = tracing::field::Empty,
    );
    let parent = opentelemetry::global::get_text_map_propagator(|p| {
        p.extract(&HeaderExtractor(req.headers()))
    });
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
    let answer = next.run(req).instrument(span.clone());
    let mut response = REQUEST.scope(id.clone(), answer).await;
    span.record("http.response.status_code", response.status().as_u16());
    response.headers_mut().entry(REQUEST_ID).or_insert(id);
    if axum::body::HttpBody::size_hint(response.body())
        .exact()
        .is_some()
    {
        return response; // Whole already: the span ends here.
    }
    let (parts, body) = response.into_parts();
    let stream = body.into_data_stream().map(move |chunk| {
        let _open = &span;
        chunk
    });
    Response::from_parts(parts, axum::body::Body::from_stream(stream))
}

/// How much lower than the server's the priority of observability's background threads is: a
/// nice value (Linux weighs a thread of nice 10 about a tenth of one of nice 0).
const BACKGROUND_NICE: libc::c_int = 10;

/// Lowers the calling thread's CPU priority (and that of the threads it starts from now on,
/// which inherit it) to [`BACKGROUND_NICE`] above the process's; does nothing but on Linux,
/// where a thread's nice value is its own. Logs a warning if the system refuses.
pub fn lower_thread_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain system calls on the calling thread, with no pointers involved.
        let refused = unsafe {
            let thread = libc::gettid() as libc::id_t;
            let now = libc::getpriority(libc::PRIO_PROCESS, thread);
            libc::setpriority(libc::PRIO_PROCESS, thread, now + BACKGROUND_NICE) != 0
        };
        if refused {
            let e = std::io::Error::last_os_error();
            tracing::warn!(error = %e, "a background thread keeps the server's priority");
        }
    }
}
