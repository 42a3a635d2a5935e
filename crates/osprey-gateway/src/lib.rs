//! Osprey's HTTP edge: the OpenAI-compatible API in front of the engine and of upstream
//! OpenAI-compatible servers. This crate holds HTTP; what its routes call is
//! [`osprey_services`]'s.
//!
//! - [`edge`]: the middleware every `/v1` request passes first: authentication, the body
//!   parsed once, admission control and rate limits, with OpenAI's `x-ratelimit-*` headers on
//!   the way out;
//! - [`routes`]: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, the
//!   Batch API (`/v1/files`, `/v1/batches`), conversations, memory, collections, the
//!   Responses API, `/v1/moderations`, the admin API, `/health`, `/ready`, `/metrics`; and the
//!   workers' side of the worker protocol ([`routes::worker_router`]);
//! - [`error`]: the JSON body extractor and the middleware that keep every error a client
//!   sees in OpenAI's envelope — including bodies too large, malformed JSON, unknown routes
//!   and handler panics;
//! - [`openapi`]: the OpenAPI document of the whole surface, generated from the handlers and
//!   served at `GET /openapi.json`;
//! - [`tls`]: TLS terminated by the server itself, for deployments without a proxy.
//!
//! ```no_run
//! # async fn demo(engine: osprey_engine::Engine) -> std::io::Result<()> {
//! let state = osprey_gateway::Services::serving("smollm2-135m-instruct");
//! state.set_engine(engine);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! osprey_gateway::serve(listener, state, &Default::default(), std::future::pending()).await
//! # }
//! ```
#![deny(missing_docs)]

pub mod edge;
pub mod error;
pub mod openapi;
pub mod routes;
pub mod tls;

pub use osprey_services::{Services, Wiring};
pub use routes::{HttpConfig, router, worker_router};

use std::time::Duration;

/// Serves the API on `listener` until `shutdown` completes, then finishes in-flight requests
/// and writes their request log rows.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Services,
    config: &HttpConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if state.policies().is_some() {
        // Trained before the first request rather than during it.
        let _ = tokio::task::spawn_blocking(osprey_policy::classifier::Classifier::shipped).await;
    }
    let sampler = sample_load(state.clone());
    let batches = tokio::spawn(routes::batches::run_batches(state.clone()));
    let app = router(state.clone(), config);
    let served = serve_router(listener, app, config.tls.clone(), shutdown).await;
    sampler.abort();
    batches.abort();
    if let Some(log) = state.started_request_log() {
        log.flush().await;
    }
    served
}

/// Serves an `osprey worker`'s routes on `listener` until `shutdown` completes, then finishes
/// in-flight requests.
pub async fn serve_worker(
    listener: tokio::net::TcpListener,
    state: Services,
    config: &HttpConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Keeps the worker's TTFT average current, for the gateways it reports it to.
    let sampler = sample_load(state.clone());
    let app = worker_router(state, config);
    let served = serve_router(listener, app, config.tls.clone(), shutdown).await;
    sampler.abort();
    served
}

/// Feeds the degradation ladder the load every [`osprey_router::degrade::SAMPLE_EVERY`].
fn sample_load(state: Services) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(osprey_router::degrade::SAMPLE_EVERY);
        loop {
            tick.tick().await;
            let edge = state.edge();
            let max = edge.config().admission.max_in_flight.max(1) as f64;
            let elsewhere = state.pool().map_or(Duration::ZERO, |p| p.reported_ttft());
            let degradation = state.degradation();
            degradation.observe(degradation.load(edge.in_flight() as f64 / max, elsewhere));
        }
    })
}

/// How long a client has to send a request's headers. (hyper's own default applies only with a
/// timer, which `axum::serve` does not set: a slowloris client could hold a connection open
/// for ever, one byte at a time.)
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request body may go without sending anything before the request is failed.
pub const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `app` (from [`router`] or [`worker_router`]) on `listener` until `shutdown`
/// completes, then finishes in-flight requests. HTTP/1.1, over TLS when `tls` is given, with
/// [`HEADER_READ_TIMEOUT`] (which also bounds the TLS handshake) and [`BODY_IDLE_TIMEOUT`].
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    tls: Option<std::sync::Arc<tls::ServerConfig>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    osprey_services::metrics::install();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, most likely: wait for some to close rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let service = tower::ServiceBuilder::new()
            .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
                BODY_IDLE_TIMEOUT,
            ))
            .service(app.clone());
        let service = hyper_util::service::TowerToHyperService::new(service);
        let (http, watcher, tls) = (http.clone(), graceful.watcher(), tls.clone());
        tokio::spawn(async move {
            let served = match tls {
                None => {
                    let connection = http.serve_connection(TokioIo::new(stream), service);
                    watcher.watch(connection).await
                }
                Some(tls) => {
                    let handshake = tokio::time::timeout(HEADER_READ_TIMEOUT, tls.accept(stream));
                    let stream = match handshake.await {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(e)) => return tracing::debug!(error = %e, "TLS handshake failed"),
                        Err(_) => return tracing::debug!("TLS handshake timed out"),
                    };
                    let connection = http.serve_connection(TokioIo::new(stream), service);
                    watcher.watch(connection).await
                }
            };
            if let Err(e) = served {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
