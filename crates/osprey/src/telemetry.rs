//! Logs and traces: `tracing` to stderr as text, or to stdout as JSON lines (each with the
//! fields of the spans it was logged in: the request's id, its tenant, ...), filtered by
//! `RUST_LOG` (default `info`); and, given an OTLP endpoint, every span exported to it as
//! OpenTelemetry traces (a share of them, `--otlp-sample`, decided where each trace starts),
//! with W3C trace context read from and written to HTTP headers.

use std::io::IsTerminal;

use anyhow::Context;
use opentelemetry::trace::TracerProvider;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Flushes and stops the trace exporter when dropped.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take()
            && let Err(e) = p.shutdown()
        {
            eprintln!("traces not flushed: {e}");
        }
    }
}

/// Installs the global subscriber: logs in `format` (`text` or `json`), and spans exported to
/// `otlp` when given, for the share `sample` of the traces that start here.
pub fn init(format: &str, otlp: Option<&str>, sample: f64) -> anyhow::Result<Telemetry> {
    let filter = || {
        EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| EnvFilter::new("info,hnsw_rs=warn,anndists=warn"))
    };
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    // The exporter's threads (the batch processor's, the HTTP client's) start from a thread
    // of lowered priority and inherit it: exporting waits for requests, not they for it.
    let provider = match otlp {
        Some(endpoint) => Some(
            std::thread::scope(|s| {
                s.spawn(|| {
                    osprey_services::telemetry::lower_thread_priority();
                    provider(endpoint, sample)
                })
                .join()
            })
            .map_err(|_| anyhow::anyhow!("the trace exporter did not start"))??,
        ),
        None => None,
    };
    // Spans carry what the code records on them, not the layer's extras (source location,
    // thread, busy and idle time: allocations and clock reads on every poll of every span); and
    // the OpenTelemetry context is not activated on each entry, as nothing here reads it but
    // through the spans.
    let traces = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_context_activation(false)
            .with_tracer(p.tracer("osprey"))
            .with_filter(filter())
    });
    let registry = tracing_subscriber::registry().with(traces);
    if format == "json" {
        let logs = tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .with_writer(std::io::stdout)
            .with_filter(filter());
        registry.with(logs).init();
    } else {
        // Colours for a person at a terminal; plain text when piped to a file or a collector.
        let logs = tracing_subscriber::fmt::layer()
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .with_filter(filter());
        registry.with(logs).init();
    }
    Ok(Telemetry { provider })
}

/// A tracer provider exporting the share `sample` of the traces starting here, batched, to the
/// OTLP/HTTP collector at `endpoint`.
fn provider(endpoint: &str, sample: f64) -> anyhow::Result<SdkTracerProvider> {
    let endpoint = endpoint.trim_end_matches('/');
    let url = match endpoint.ends_with("/v1/traces") {
        true => endpoint.to_owned(),
        false => format!("{endpoint}/v1/traces"),
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(url)
        .build()
        .context("--otlp-endpoint")?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("osprey")
        .build();
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(sample)));
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .with_sampler(sampler)
        .build())
}
