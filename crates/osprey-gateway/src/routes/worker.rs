//! The routes of `osprey worker`: the OpenAI generation routes without the edge (the gateway
//! in front has authenticated, limited and admitted the request, and says in headers which
//! tenant's cache and priority it runs under), plus the worker protocol
//! ([`osprey_router::workers::protocol`]).

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use osprey_core::{Error, ErrorKind, Priority};
use tokio::sync::broadcast::error::RecvError;

use super::{generate_for, models};
use osprey_router::workers::protocol::{
    CACHE_SALT, HEARTBEAT, KvBatch, LOAD_INTERVAL, Load, PRIORITY, Snapshot,
};
use osprey_services::edge::Admitted;
use osprey_services::error::ApiError;
use osprey_services::sse::{async_stream, stream_response};
use osprey_services::state::Services;

/// The worker's own routes (health, readiness and metrics are added by the caller).
pub fn routes() -> Router<Services> {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(text_completions))
        .route("/v1/models", get(models::list))
        .route("/worker/load", get(load))
        .route("/worker/events", get(events))
}

/// The caller a gateway forwarded: the open tenant, under the cache salt and default priority
/// the gateway named.
fn forwarded(state: &Services, headers: &HeaderMap) -> Extension<Admitted> {
    let mut admitted = state.edge().unguarded();
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let mut tenant = (*admitted.caller.tenant).clone();
    if let Some(salt) = header(CACHE_SALT) {
        tenant.cache_salt = salt.to_owned();
    }
    if let Some(p) =
        header(PRIORITY).and_then(|p| serde_json::from_value::<Priority>(p.into()).ok())
    {
        tenant.priority = p;
    }
    admitted.caller.tenant = Arc::new(tenant);
    Extension(admitted)
}

async fn chat_completions(
    State(state): State<Services>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let admitted = forwarded(&state, &headers);
    let body = osprey_core::api::JsonBody::parse(body);
    generate_for("/v1/chat/completions", state, admitted, &headers, body).await
}

async fn text_completions(
    State(state): State<Services>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let admitted = forwarded(&state, &headers);
    let body = osprey_core::api::JsonBody::parse(body);
    generate_for("/v1/completions", state, admitted, &headers, body).await
}

fn engine(state: &Services) -> Result<osprey_engine::Engine, ApiError> {
    state.engine().cloned().ok_or_else(|| {
        Error::new(
            ErrorKind::Unavailable,
            "The model is still loading; retry shortly.",
        )
        .with_retry_after(1)
        .into()
    })
}

/// `GET /worker/load`.
async fn load(State(state): State<Services>) -> Result<Response, ApiError> {
    Ok(axum::Json(Load::of(
        engine(&state)?.stats(),
        state.degradation().recent_ttft(),
    ))
    .into_response())
}

/// `GET /worker/events`: a snapshot of the prefix cache, then its changes and the load.
async fn events(State(state): State<Services>) -> Result<Response, ApiError> {
    let engine = engine(&state)?;
    let ladder = state.degradation().clone();
    let stream = async_stream(move |tx| async move {
        loop {
            let (snapshot, mut batches) = engine.kv_events().subscribe();
            let snapshot = Snapshot {
                seq: snapshot.seq,
                blocks: snapshot.blocks,
                load: Load::of(engine.stats(), ladder.recent_ttft()),
            };
            tx.send(named("snapshot", &snapshot)).await?;
            let mut tick = tokio::time::interval(LOAD_INTERVAL);
            let (mut sent, mut sent_at) = (snapshot.load, tokio::time::Instant::now());
            loop {
                tokio::select! {
                    batch = batches.recv() => match batch {
                        Ok(b) => {
                            let b = KvBatch { seq: b.seq, stored: b.stored.clone(), evicted: b.evicted.clone() };
                            tx.send(named("kv", &b)).await?;
                        }
                        // Fell behind: start again from a snapshot.
                        Err(RecvError::Lagged(_)) => break,
                        Err(RecvError::Closed) => return Ok(()),
                    },
                    _ = tick.tick() => {
                        // When it changed, and every second as a heartbeat.
                        let load = Load::of(engine.stats(), ladder.recent_ttft());
                        if load != sent || sent_at.elapsed() >= HEARTBEAT {
                            (sent, sent_at) = (load, tokio::time::Instant::now());
                            tx.send(named("load", &load)).await?;
                        }
                    }
                }
            }
        }
    });
    Ok(stream_response(stream))
}

/// An SSE event `name` carrying `value` as JSON.
fn named(name: &str, value: &impl serde::Serialize) -> Event {
    let json = serde_json::to_string(value).expect("protocol messages serialise");
    Event::default().event(name).data(json)
}
