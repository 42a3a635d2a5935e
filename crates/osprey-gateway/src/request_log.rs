//! The request log's writer: every generation request becomes a row of the store's request
//! log ([`osprey_store::request_log`]) without waiting for the store. Rows go through a
//! bounded queue to one writer task that commits them in batches (one sync per batch, not per
//! request); when the queue is full (the store slow or gone) rows are dropped and counted in
//! `osprey_request_log_dropped_total`, so logging never holds up serving.

use std::time::Instant;

use axum::http::HeaderValue;
use axum::response::Response;
use osprey_context::builder::Injected;
use osprey_store::{RequestLogEntry, Store};
use tokio::sync::mpsc;

use crate::edge::Caller;

/// Rows waiting to be written at most.
const QUEUE: usize = 4096;
/// Rows written in one transaction at most.
const BATCH: usize = 256;

/// Hands rows to the writer task.
#[derive(Clone, Debug)]
pub struct RequestLog {
    tx: mpsc::Sender<RequestLogEntry>,
}

impl RequestLog {
    /// Starts the writer task on `store`.
    pub fn spawn(store: Store) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(write_task(store, rx));
        Self { tx }
    }

    /// Queues `entry`; drops it if the queue is full.
    pub fn record(&self, entry: RequestLogEntry) {
        if self.tx.try_send(entry).is_err() {
            metrics::counter!(osprey_core::metrics::REQUEST_LOG_DROPPED).increment(1);
        }
    }
}

async fn write_task(store: Store, mut rx: mpsc::Receiver<RequestLogEntry>) {
    let mut batch = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut batch, BATCH).await > 0 {
        if let Err(e) = store.log_requests(&batch).await {
            metrics::counter!(osprey_core::metrics::REQUEST_LOG_DROPPED)
                .increment(batch.len() as u64);
            tracing::warn!(error = %e, rows = batch.len(), "request log rows were not written");
        }
        batch.clear();
    }
}

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
/// `response` gets the request's id (`x-request-id`) if it has none.
pub fn entry(
    caller: &Caller,
    route: &str,
    model: &str,
    started: Instant,
    response: &mut Response,
) -> RequestLogEntry {
    let headers = response.headers_mut();
    let id = match headers.get(crate::upstream::REQUEST_ID) {
        Some(id) => id.to_str().unwrap_or_default().to_owned(),
        None => {
            let id = crate::upstream::new_request_id();
            headers.insert(crate::upstream::REQUEST_ID, id.clone());
            id.to_str().unwrap_or_default().to_owned()
        }
    };
    let header = |name: &str| {
        (headers.get(name))
            .and_then(|v: &HeaderValue| v.to_str().ok())
            .map(str::to_owned)
    };
    let cache = header(crate::replay::CACHE);
    let served = header(crate::upstream::SERVED_BY);
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
        created_at: 0,
    }
}
