//! The OpenAPI document (`GET /openapi.json`): served, well formed, and in step with the
//! router both ways: every route in the source is documented, and every documented operation
//! reaches a handler rather than the router's fallback.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;

use osprey_gateway::{Services, Wiring};
use osprey_limits::RateLimiter;
use osprey_services::auth::Authenticator;
use osprey_services::config::EdgeConfig;
use osprey_services::edge::Edge;
use serde_json::Value;
use utoipa::OpenApi;

use crate::common;

/// The methods an OpenAPI path item may hold that the gateway uses.
const METHODS: [&str; 4] = ["get", "post", "put", "delete"];

/// Route files whose routes are not the gateway's: `osprey worker`'s own router (left out of
/// the document, see `openapi.rs`), and the fault-injection route the reliability suites turn
/// on (never served in production).
const NOT_DOCUMENTED: [&str; 2] = ["worker.rs", "faults.rs"];

/// The admin key of [`closed_gateway`].
const ADMIN_KEY: &str = "admin-secret";

/// A gateway on a fresh store holding one key (so every `/v1` route wants one), with an admin
/// key and no model; its base URL and the key.
async fn closed_gateway() -> (String, String) {
    let (store, _) = common::store().await;
    let key = common::new_key(&store, "acme").await;
    let auth = Authenticator::new(store.clone()).await.unwrap();
    let config = EdgeConfig {
        admin_key: Some(ADMIN_KEY.into()),
        ..EdgeConfig::default()
    };
    let edge = Edge::new(config, auth, RateLimiter::local());
    let state = Services::new(Wiring {
        store: Some(store),
        ..Wiring::new(None, vec![], edge)
    });
    (common::serve(state).await, key)
}

async fn document(base: &str) -> Value {
    let response = reqwest::get(format!("{base}/openapi.json")).await.unwrap();
    assert_eq!(response.status(), 200);
    let kind = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(kind.starts_with("application/json"), "{kind}");
    response.json().await.unwrap()
}

/// Every `"$ref"` string anywhere in `v`.
fn refs<'v>(v: &'v Value, out: &mut Vec<&'v str>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => out.push(r),
                    _ => refs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

/// The `{name}`s of a path template.
fn template_params(path: &str) -> BTreeSet<&str> {
    path.split('/')
        .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
        .collect()
}

#[tokio::test]
async fn the_document_is_served_without_a_key_and_is_openapi_3() {
    let (base, _) = closed_gateway().await;
    let doc = document(&base).await;
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3."),
        "{}",
        doc["openapi"]
    );
    assert_eq!(doc["info"]["title"], "Osprey");
    // Valid under the OpenAPI 3.1 schema (OAI's `schemas/v3.1/schema.yaml` at 0035208, as
    // JSON: the version schemathesis validates documents with).
    let oas: Value = serde_json::from_str(include_str!("data/openapi-3.1.schema.json")).unwrap();
    let validator = jsonschema::validator_for(&oas).unwrap();
    let errors: Vec<String> = validator.iter_errors(&doc).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "not OpenAPI 3.1: {errors:#?}");
    assert!(doc["paths"].as_object().unwrap().len() > 50);

    let mut all = Vec::new();
    refs(&doc, &mut all);
    for r in all {
        let pointer = r
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("external $ref {r}"));
        assert!(doc.pointer(pointer).is_some(), "dangling $ref {r}");
    }
    let schemes = doc["components"]["securitySchemes"].as_object().unwrap();
    let mut ids = HashSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in METHODS {
            let Some(op) = item.get(method) else { continue };
            let at = format!("{method} {path}");
            let id = op["operationId"].as_str().unwrap();
            assert!(
                ids.insert(id.to_owned()),
                "{at}: operationId {id} used twice"
            );
            let declared: BTreeSet<&str> = (op["parameters"].as_array().into_iter().flatten())
                .filter(|p| p["in"] == "path")
                .map(|p| p["name"].as_str().unwrap())
                .collect();
            assert_eq!(declared, template_params(path), "{at}: path parameters");
            let responses = op["responses"].as_object().unwrap();
            assert!(responses.contains_key("500"), "{at}: no 500");
            for (status, response) in responses {
                let code: u16 = status.parse().unwrap();
                // Every error is OpenAI's envelope (bar `/ready`'s 503, a readiness report).
                if code >= 400 && !(path == "/ready" && code == 503) {
                    let r = response["$ref"].as_str().unwrap_or_default();
                    assert!(
                        r.starts_with("#/components/responses/"),
                        "{at} {status}: {r}"
                    );
                    let schema = &doc["components"]["responses"][&r[23..]]["content"]["application/json"]
                        ["schema"]["$ref"];
                    assert_eq!(
                        schema, "#/components/schemas/ErrorResponse",
                        "{at} {status}"
                    );
                }
            }
            for requirement in op["security"].as_array().into_iter().flatten() {
                for scheme in requirement.as_object().unwrap().keys() {
                    assert!(schemes.contains_key(scheme), "{at}: scheme {scheme}");
                }
            }
            let wants = |scheme: &str| {
                op["security"]
                    .as_array()
                    .is_some_and(|s| s.iter().any(|r| r.get(scheme).is_some()))
            };
            match path.as_str() {
                p if p.starts_with("/admin/") => assert!(wants("admin_key"), "{at}: admin key"),
                p if p.starts_with("/v1/") => assert!(wants("api_key"), "{at}: API key"),
                _ => assert!(op.get("security").is_none(), "{at}: needs no key"),
            }
        }
    }
}

/// The path of every `.route("PATH", …)` in the gateway's route files, as OpenAPI writes it
/// (axum's catch-all `{*id}` is `{id}`).
fn routes_in_source() -> BTreeSet<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/routes");
    let mut paths = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if !name.ends_with(".rs") || NOT_DOCUMENTED.contains(&name.as_str()) {
            continue;
        }
        let source = std::fs::read_to_string(&path).unwrap();
        for (at, _) in source.match_indices(".route(") {
            let rest = source[at + ".route(".len()..].trim_start();
            let Some(quoted) = rest.strip_prefix('"') else {
                panic!(
                    "{name}: a route whose path is not a literal: {}",
                    &rest[..40]
                );
            };
            let route = &quoted[..quoted.find('"').unwrap()];
            paths.insert(route.replace("{*", "{"));
        }
    }
    paths
}

#[test]
fn every_route_in_the_source_is_documented() {
    let routes = routes_in_source();
    assert!(routes.len() > 50, "found only {routes:?}");
    let doc = osprey_gateway::openapi::ApiDoc::openapi();
    let documented: BTreeSet<String> = doc.paths.paths.keys().cloned().collect();
    let missing: Vec<&String> = routes.difference(&documented).collect();
    assert!(missing.is_empty(), "routed but not documented: {missing:?}");
}

#[tokio::test]
async fn every_documented_operation_is_routed() {
    let (base, _) = closed_gateway().await;
    let doc = document(&base).await;
    let client = reqwest::Client::new();
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        // A number where the handler parses one, so the request reaches it.
        let concrete = path.replace("{version}", "1");
        let concrete: String = (concrete.split('/'))
            .map(|s| if s.starts_with('{') { "x" } else { s })
            .collect::<Vec<_>>()
            .join("/");
        for method in METHODS.into_iter().filter(|m| item.get(*m).is_some()) {
            let request = match method {
                "get" => client.get(format!("{base}{concrete}")),
                "post" => client.post(format!("{base}{concrete}")),
                "put" => client.put(format!("{base}{concrete}")),
                _ => client.delete(format!("{base}{concrete}")),
            };
            let response = request
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body = response.text().await.unwrap();
            let at = format!("{method} {path} ({concrete}): {status} {body}");
            assert_ne!(status, 405, "{at}");
            let fallback = status == 404 && body.contains("There is no route");
            assert!(!fallback, "{at}");
            checked += 1;
        }
    }
    assert!(checked > 60, "{checked}");
}

/// What axum itself rejects (a query string or path segment that does not parse, a malformed
/// multipart form) answers in OpenAI's envelope too, with axum's status.
#[tokio::test]
async fn errors_axum_answers_are_in_the_envelope() {
    let (base, _) = closed_gateway().await;
    let client = reqwest::Client::new();
    let admin = |path: &str| {
        (client.get(format!("{base}{path}"))).header("authorization", format!("Bearer {ADMIN_KEY}"))
    };
    let cases = [
        admin("/admin/audit?limit=many"),
        admin("/admin/prompts/p/versions/latest"),
        admin("/admin/requests?nonsense=1"),
    ];
    for request in cases {
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap();
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        assert!(
            body["error"]["message"].as_str().unwrap().len() > 10,
            "{body}"
        );
    }
}

/// Found by schemathesis: listing runs `after=` (empty) or after a run that does not exist
/// answered 404 "No run  exists." (undocumented, and about the cursor, not the list). Empty
/// filters are no filters; an unknown cursor is a 400 naming `after`.
#[tokio::test]
async fn listing_runs_after_an_unknown_run_is_a_bad_request() {
    let (base, key) = closed_gateway().await;
    let client = reqwest::Client::new();
    let lists = [("/v1/responses", key.as_str()), ("/admin/runs", ADMIN_KEY)];
    for (path, key) in lists {
        let get = |query: &str| {
            (client.get(format!("{base}{path}?{query}")))
                .header("authorization", format!("Bearer {key}"))
        };
        let response = get("after=&status=&limit=5").send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let page: Value = response.json().await.unwrap();
        assert_eq!(page["data"], serde_json::json!([]), "{path}");
        let response = get("after=resp_nope").send().await.unwrap();
        assert_eq!(response.status(), 400, "{path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["param"], "after", "{path}: {body}");
    }
}
