//! Traces and the request log, end to end: a gateway (`osprey serve --worker`) in front of an
//! `osprey worker`, both exporting OTLP/HTTP to a receiver in this test (opentelemetry-proto's
//! types, decoded with prost). One chat request carrying a W3C `traceparent` must come back as
//! one trace: the gateway's stages under its request span, which continues the caller's span,
//! and the worker's spans under the gateway's. Its request-log row names the same trace, its
//! tokens and timings, and (the tenant sampling all text) its prompt with the e-mail address
//! redacted. The gateway samples none of the traces that start with it (`--otlp-sample 0`):
//! requests without a caller's sampled trace export nothing, from either process.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use osprey_testkit::{Process, eventually};
use prost::Message;
use serde_json::{Value, json};

use crate::support::{ServerSlot, ready};

/// The name a request's span is exported under: its method and route.
const ROOT: &str = "POST /v1/chat/completions";
const ADMIN: &str = "traces-test-admin";

fn start(args: &[&str]) -> Process {
    Process::spawn(
        Command::new(env!("CARGO_BIN_EXE_osprey"))
            .args(args)
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .stdout(Stdio::null()),
    )
}

/// A received span: (service, name, span id, parent id, trace id).
#[derive(Clone, Debug)]
struct Span {
    service: String,
    name: String,
    id: String,
    parent: String,
    trace: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An OTLP/HTTP receiver on a free port; spans arrive in the returned list.
async fn receiver() -> (u16, Arc<Mutex<Vec<Span>>>) {
    let spans = Arc::new(Mutex::new(Vec::new()));
    let sink = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let sink = sink.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                let mut got = sink.lock().unwrap();
                for rs in request.resource_spans {
                    let service = (rs.resource.iter().flat_map(|r| &r.attributes))
                        .find(|a| a.key == "service.name")
                        .and_then(|a| a.value.as_ref())
                        .map(|v| format!("{:?}", v.value))
                        .unwrap_or_default();
                    for s in rs.scope_spans.iter().flat_map(|s| &s.spans) {
                        got.push(Span {
                            service: service.clone(),
                            name: s.name.clone(),
                            id: hex(&s.span_id),
                            parent: hex(&s.parent_span_id),
                            trace: hex(&s.trace_id),
                        });
                    }
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (port, spans)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_is_one_trace_across_gateway_and_worker_and_one_log_row() {
    let _slot = ServerSlot::take_async().await;
    let (otlp, spans) = receiver().await;
    let otlp = format!("http://127.0.0.1:{otlp}");
    let model = osprey_testkit::default_model();
    let model = model.to_str().unwrap();
    let dir = std::env::temp_dir().join(format!("osprey-traces-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("osprey.toml");
    std::fs::write(&config, "[tenants.default]\nlog_text_sample_rate = 1.0\n").unwrap();
    let store = format!("sqlite://{}", dir.join("store.db").display());

    let worker_port = osprey_testkit::free_port().to_string();
    let _worker = start(&[
        "worker",
        "--port",
        &worker_port,
        "--model",
        model,
        "--threads",
        "1",
        "--otlp-endpoint",
        &otlp,
        "--served-model-name",
        "m",
    ]);
    let worker = format!("http://127.0.0.1:{worker_port}");
    let port = osprey_testkit::free_port().to_string();
    let config = config.to_str().unwrap();
    let _gateway = start(&[
        "serve",
        "--port",
        &port,
        "--worker",
        &worker,
        "--store",
        &store,
        "--config",
        config,
        "--admin-key",
        ADMIN,
        "--otlp-endpoint",
        &otlp,
        "--otlp-sample",
        "0",
        "--served-model-name",
        "m",
    ]);
    let gateway = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    ready(&client, &worker).await;
    ready(&client, &gateway).await;

    // Each about something else: a repeated request would be answered from the response cache.
    let ask = |about: &str, traceparent: Option<String>| {
        let mut request = client.post(format!("{gateway}/v1/chat/completions"));
        if let Some(traceparent) = traceparent {
            request = request.header("traceparent", traceparent);
        }
        let content = format!("Write to alice@example.com about the {about}.");
        let request = request.json(&json!({
            "model": "m", "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": content}],
        }));
        async move {
            let answer: Value = request.send().await.unwrap().json().await.unwrap();
            assert_eq!(answer["usage"]["completion_tokens"], 8, "{answer}");
        }
    };
    // Not sampled: a trace that starts here, and a caller's trace the caller does not sample.
    let unsampled = "0af7651916cd43dd8448eb211c80319c";
    ask("trains", None).await;
    ask(
        "planes",
        Some(format!("00-{unsampled}-b7ad6b7169203331-00")),
    )
    .await;
    let (trace, caller_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    ask("boats", Some(format!("00-{trace}-{caller_span}-01"))).await;

    // The spans of both processes, as they arrive.
    let wanted = [
        ROOT,
        "auth",
        "rate_limit",
        "guard.input",
        "backend",
        "engine.queue",
        "engine.decode",
    ];
    let spans = &spans;
    let got = eventually(
        || async move {
            let got: Vec<Span> = spans.lock().unwrap().clone();
            let services: std::collections::BTreeSet<&str> =
                got.iter().map(|s| s.name.as_str()).collect();
            let workers_root = got.iter().filter(|s| s.name == ROOT).count() >= 2;
            (wanted.iter().all(|w| services.contains(w)) && workers_root).then_some(got)
        },
        Duration::from_secs(60),
    )
    .await;
    // Spans are exported in the order they end: the unsampled requests' would be here by now.
    // (The worker samples all its own traces: the GETs of its readiness and of its events.)
    let traces: std::collections::BTreeSet<&str> = (got.iter())
        .filter(|s| !s.name.starts_with("GET /"))
        .map(|s| s.trace.as_str())
        .collect();
    assert_eq!(traces, [trace].into(), "only the sampled chat is exported");
    let ours: Vec<&Span> = got.iter().filter(|s| s.trace == trace).collect();
    let roots: Vec<&&Span> = ours.iter().filter(|s| s.name == ROOT).collect();
    assert_eq!(
        roots.len(),
        2,
        "one request span in each process: {ours:#?}"
    );
    let gateway_root = roots
        .iter()
        .find(|s| s.parent == caller_span)
        .expect("continues the caller's span");
    let worker_root = roots.iter().find(|s| s.parent != caller_span).unwrap();
    assert_ne!(gateway_root.service, "", "spans name their service");
    // Every span of the trace leads up to the gateway's root.
    let by_id: std::collections::HashMap<&str, &Span> =
        ours.iter().map(|s| (s.id.as_str(), *s)).collect();
    for s in &ours {
        let mut at = *s;
        let mut hops = 0;
        while at.id != gateway_root.id {
            at = by_id
                .get(at.parent.as_str())
                .unwrap_or_else(|| panic!("{} has no parent in the trace", s.name));
            hops += 1;
            assert!(hops < 20);
        }
    }
    assert!(
        by_id.contains_key(worker_root.parent.as_str()),
        "the worker's span hangs under the gateway's"
    );
    for name in wanted {
        assert!(
            ours.iter().any(|s| s.name == name),
            "no `{name}` span in the trace"
        );
    }

    // The request log's rows: the sampled request's names its trace, the others none.
    let (client, gateway) = (&client, &gateway);
    let rows = eventually(
        || async move {
            let list: Value = client
                .get(format!("{gateway}/admin/requests?limit=5"))
                .bearer_auth(ADMIN)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            list["data"].as_array().filter(|d| d.len() == 3).cloned()
        },
        Duration::from_secs(60),
    )
    .await;
    let traced: Vec<&Value> = rows.iter().map(|r| &r["trace_id"]).collect();
    assert_eq!(
        traced,
        [&json!(trace), &Value::Null, &Value::Null],
        "newest first"
    );
    let row = &rows[0];
    assert_eq!(row["tokens"]["completion"], 8, "{row}");
    assert!(
        row["timings"]["total_ms"].as_i64().unwrap()
            >= row["timings"]["ttft_ms"].as_i64().unwrap_or(0)
    );
    let prompt = row["text"]["prompt"]
        .as_str()
        .expect("the tenant samples all text");
    assert!(
        prompt.contains("about the boats") && !prompt.contains("alice@example.com"),
        "{prompt}"
    );
    assert!(row["text"]["response"].as_str().is_some());
    let one: Value = client
        .get(format!(
            "{gateway}/admin/requests/{}",
            row["id"].as_str().unwrap()
        ))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(one["id"], row["id"]);
    let _ = std::fs::remove_dir_all(&dir);
}
