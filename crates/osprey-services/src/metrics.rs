//! Prometheus export and per-route HTTP metrics.

use std::sync::OnceLock;
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use osprey_core::metrics as names;

/// Latency buckets (seconds) shared by the request-level histograms.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];
/// Buckets for per-token times (seconds).
const TOKEN_BUCKETS: &[f64] = &[
    0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
];
/// Buckets for batch sizes (tokens or sequences per step).
const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0,
];

/// Buckets for the scheduler's planning time (seconds): microseconds, not milliseconds.
const PLAN_BUCKETS: &[f64] = &[
    0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.0025, 0.01,
];
/// Buckets for expert-load imbalance (busiest over mean expert).
const IMBALANCE_BUCKETS: &[f64] = &[
    1.0, 1.1, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0, 16.0,
];
/// Buckets for accepted tokens per verified draft.
const DRAFT_BUCKETS: &[f64] = &[0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0];
/// Buckets for experts run per MoE layer in a step.
const EXPERT_BUCKETS: &[f64] = &[
    1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 12.0, 16.0, 32.0, 64.0,
];

/// Whether metrics are off (`--no-metrics`): no recorder is installed, every metric call is a
/// no-op and `/metrics` answers 404.
static DISABLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turns metrics off for the process (before anything records one).
pub fn disable() {
    DISABLED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether metrics are on.
pub fn enabled() -> bool {
    !DISABLED.load(std::sync::atomic::Ordering::Relaxed)
}

/// The process-wide Prometheus recorder (installed on first use), unless metrics are off.
pub fn install() -> Option<&'static PrometheusHandle> {
    enabled().then(prometheus)
}

/// The process-wide Prometheus recorder (installed on first use).
fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(names::TIME_PER_OUTPUT_TOKEN.into()),
                    TOKEN_BUCKETS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Prefix("osprey_batch_".into()), BATCH_BUCKETS)
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(names::SCHEDULE_DURATION.into()),
                    PLAN_BUCKETS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(names::EXPERT_LOAD_IMBALANCE.into()),
                    IMBALANCE_BUCKETS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(names::EXPERTS_ACTIVE.into()),
                    EXPERT_BUCKETS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(names::SPEC_ACCEPTED_LENGTH.into()),
                    DRAFT_BUCKETS,
                )
            })
            .expect("static bucket lists are non-empty");
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        // Another recorder may already be installed (several servers in one test process):
        // then this handle renders an empty registry, which is harmless.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

/// Middleware counting requests and timing them by route and status.
pub async fn track(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let start = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!(names::HTTP_REQUESTS, "route" => route.clone(), "status" => status.clone())
        .increment(1);
    metrics::histogram!(names::HTTP_REQUEST_DURATION, "route" => route, "status" => status)
        .record(start.elapsed().as_secs_f64());
    response
}
