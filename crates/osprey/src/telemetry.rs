//! Logs and traces: `tracing` to stderr as text, or to stdout as JSON lines (each with the
//! fields of the spans it was logged in: the request's id, its tenant, ...), filtered by
//! `RUST_LOG` (default `info`); and, given an OTLP endpoint, every span exported to it as
//! OpenTelemetry traces, with W3C trace context read from and written to HTTP headers.

use anyhow::Context;
use opentelemetry::trace::TracerProvider;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
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
/// `otlp` when given.
pub fn init(format: &str, otlp: Option<&str>) -> anyhow::Result<Telemetry> {
    let filter = || {
        EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| EnvFilter::new("info,hnsw_rs=warn,anndists=warn"))
    };
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let provider = match otlp {
        Some(endpoint) => {
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
            Some(
                SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(resource)
                    .build(),
            )
        }
        None => None,
    };
    let traces = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
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
        let logs = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(filter());
        registry.with(logs).init();
    }
    Ok(Telemetry { provider })
}
