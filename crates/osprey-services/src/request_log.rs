//! Every generation request becomes a row of the store's request log
//! ([`osprey_store::request_log`]), handed to its writer ([`osprey_store::log_writer`], on a
//! thread of lowered priority) without waiting for the store: what the route learned of the
//! request on its way, and its text when the tenant samples it.

use std::sync::Arc;
use std::time::Instant;

use futures_util::StreamExt;

use axum::http::HeaderValue;
use axum::response::Response;
use osprey_context::builder::Injected;
use osprey_store::RequestLogEntry;
use osprey_store::log_writer::RequestLog;

use crate::edge::Caller;
use crate::outbound::{Seen, Step};
use crate::record::RequestRecord;
use osprey_core::backend::ChoiceDelta;

/// What the route learned of a request on its way, for its row (an extension of the
/// response).
#[derive(Clone, Debug, Default)]
pub struct Noted {
    /// The prompt and version it used.
    pub prompt: Option<(String, i64)>,
    /// Its conversation.
    pub conversation: Option<String>,
    /// Whose context it had (the user), when it had one.
    pub user: Option<String>,
    /// What the prompt builder put in.
    pub injected: Injected,
}

/// The row of a request for `route` naming `model`, answered with `response` after `started`;
/// `response` gets the request's id (`request_id`, else a new one) if it has none. What is known only at the
/// end of the answer (tokens, timings, errors, the answer's text) is filled in by [`finish`].
pub fn entry(
    caller: &Caller,
    (route, model): (&str, &str),
    request_id: Option<&HeaderValue>,
    started: Instant,
    response: &mut Response,
) -> RequestLogEntry {
    let headers = response.headers_mut();
    let id = match headers.get(osprey_router::upstream::REQUEST_ID) {
        Some(id) => id.to_str().unwrap_or_default().to_owned(),
        None => {
            let id = request_id
                .cloned()
                .unwrap_or_else(crate::telemetry::request_id);
            headers.insert(osprey_router::upstream::REQUEST_ID, id.clone());
            id.to_str().unwrap_or_default().to_owned()
        }
    };
    let header = |name: &str| {
        (headers.get(name))
            .and_then(|v: &HeaderValue| v.to_str().ok())
            .map(str::to_owned)
    };
    let cache = header(crate::replay::CACHE);
    let served = header(osprey_router::upstream::SERVED_BY);
    let mut detail = serde_json::Map::new();
    for (key, name) in [
        ("worker", osprey_router::workers::SERVED_BY_WORKER),
        ("degraded", osprey_router::degrade::DEGRADED),
        ("rag", crate::rag::RAG_HEADER),
        ("memory", crate::context::MEMORY_HEADER),
    ] {
        if let Some(v) = header(name) {
            detail.insert(key.into(), v.into());
        }
    }
    let (tier, route_reason) = (
        header(osprey_router::auto::TIER),
        header(osprey_router::upstream::ROUTE_REASON),
    );
    let noted = response
        .extensions()
        .get::<Noted>()
        .cloned()
        .unwrap_or_default();
    RequestLogEntry {
        id,
        tenant: caller.tenant.name.clone(),
        user_id: noted
            .user
            .unwrap_or_else(|| caller.user.clone().unwrap_or_default()),
        route: route.trim_start_matches("/v1/").to_owned(),
        model: served.unwrap_or_else(|| model.to_owned()),
        status: i64::from(response.status().as_u16()),
        prompt_name: noted.prompt.as_ref().map(|p| p.0.clone()),
        prompt_version: noted.prompt.map(|p| p.1),
        conversation_id: noted.conversation,
        injected: serde_json::to_string(&noted.injected).unwrap_or_else(|_| "{}".into()),
        cache,
        latency_ms: started.elapsed().as_millis() as i64,
        key_id: caller.key_id.clone(),
        tier,
        route_reason,
        trace_id: crate::telemetry::trace_id(),
        detail: serde_json::Value::Object(detail).to_string(),
        ..RequestLogEntry::default()
    }
}

/// The end of a request's row, once its answer's last byte has gone (or its client left):
/// tokens, timings, the error if any, and what was noted on the way.
pub fn finish(
    mut entry: RequestLogEntry,
    caller: &Caller,
    usage: &osprey_core::UsageReport,
    started: Instant,
) -> RequestLogEntry {
    let (prompt, completion) = usage.tokens();
    entry.prompt_tokens = prompt.map(|n| n as i64);
    entry.completion_tokens = completion.map(|n| n as i64);
    entry.total_ms = Some(started.elapsed().as_millis() as i64);
    caller.record.read(|notes| {
        entry.ttft_ms = notes.first_token.map(|t| (t - started).as_millis() as i64);
        if let (Some(first), Some(last)) = (notes.first_token, notes.last_token)
            && notes.tokens > 1
        {
            entry.tpot_us = Some(((last - first).as_micros() / (notes.tokens as u128 - 1)) as i64);
        }
        entry.error = entry.error.take().or_else(|| notes.error.clone());
        entry.prompt_text = notes.prompt_text.clone();
        entry.response_text = notes.response_text.clone();
        let mut detail: serde_json::Value =
            serde_json::from_str(&entry.detail).unwrap_or_else(|_| serde_json::json!({}));
        if let (Some(d), Ok(serde_json::Value::Object(n))) =
            (detail.as_object_mut(), serde_json::to_value(notes))
        {
            d.extend(n);
        }
        entry.detail = detail.to_string();
    });
    entry
}

/// `response` with its row written to `log` once its body has been sent or dropped. A failed
/// answer's error message is noted for the row first.
pub async fn attach(
    log: RequestLog,
    entry: RequestLogEntry,
    caller: Caller,
    usage: std::sync::Arc<osprey_core::UsageReport>,
    started: Instant,
    response: Response,
) -> Response {
    let response = match response.status().is_success() {
        true => response,
        false => note_error(&caller.record, response).await,
    };
    let (parts, body) = response.into_parts();
    let mut row = Some((entry, caller, usage));
    let write = move || {
        if let Some((entry, caller, usage)) = row.take() {
            let mut entry = finish(entry, &caller, &usage, started);
            entry.response_text = entry.response_text.map(|t| redact(&t));
            log.record(entry);
        }
    };
    let guard = OnDrop(Some(write));
    let stream = body.into_data_stream().map(move |chunk| {
        let _ = &guard;
        chunk
    });
    Response::from_parts(parts, axum::body::Body::from_stream(stream))
}

/// Notes the error message of `response` (a failed answer, a small JSON error) in `record`.
async fn note_error(record: &RequestRecord, response: Response) -> Response {
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    if let Some(e) = error_of(&serde_json::from_slice(&bytes).unwrap_or_default()) {
        record.note(|n| n.error = Some(e));
    }
    Response::from_parts(parts, axum::body::Body::from(bytes))
}

fn error_of(v: &serde_json::Value) -> Option<String> {
    v["error"]["message"].as_str().map(str::to_owned)
}

/// The request log's share of the way out ([`crate::outbound`]), for a request whose tenant
/// samples its text: the answer's text (choice 0) is kept, and an error that ends a stream is
/// noted.
pub struct LogText {
    record: Arc<RequestRecord>,
}

impl LogText {
    /// The step noting into `record`; none if the request's prompt was not sampled.
    pub fn new(record: Arc<RequestRecord>) -> Option<Self> {
        let sampled = record.read(|n| n.prompt_text.is_some());
        sampled.then_some(Self { record })
    }

    /// Notes the text of a whole `answer` given again as it was (a recent answer).
    pub fn note_whole(&self, answer: &serde_json::Value) {
        let text = osprey_core::api::choice_text(&answer["choices"][0]).unwrap_or_default();
        self.hear(text);
    }

    fn hear(&self, text: &str) {
        self.record
            .note(|n| (n.response_text.get_or_insert_with(String::new)).push_str(text));
    }
}

impl Step for LogText {
    fn delta(&mut self, delta: &mut ChoiceDelta) -> Seen {
        if delta.index == 0 {
            self.hear(&delta.text);
        }
        Seen::Send
    }

    fn error(&mut self, error: &osprey_core::Error) {
        self.record.note(|n| n.error = Some(error.message.clone()));
    }
}

/// Calls its closure when dropped.
struct OnDrop<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// `text` with personal data replaced by typed placeholders.
pub fn redact(text: &str) -> String {
    osprey_policy::redact::Redactor::default().redact(text, None)
}

/// Whether a request of a tenant keeping `rate` of its requests' text is kept; if so, its
/// prompt's text (the messages' or the prompt's, redacted) goes into `record`.
pub fn sample_prompt(
    rate: f64,
    body: &osprey_core::api::JsonBody,
    record: &crate::record::RequestRecord,
) {
    if rate <= 0.0 || rand::random::<f64>() >= rate {
        return;
    }
    let v = body.value();
    let text = match v["messages"].as_array() {
        Some(messages) => (messages.iter())
            .filter_map(|m| {
                let content = osprey_core::api::content_text(&m["content"])?;
                Some(format!("{}: {content}", m["role"].as_str().unwrap_or("?")))
            })
            .collect::<Vec<_>>()
            .join("\n"),
        None => match &v["prompt"] {
            serde_json::Value::String(p) => p.clone(),
            other => other.to_string(),
        },
    };
    record.note(|n| n.prompt_text = Some(redact(&text)));
}
