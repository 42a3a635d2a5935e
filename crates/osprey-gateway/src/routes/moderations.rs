//! `POST /v1/moderations` in OpenAI's shape: the tenant's input guards run over each input
//! (a string or a list of them) without generating. Per input: `flagged`, `categories` and
//! `category_scores` for Osprey's categories (`prompt_injection`, `jailbreak`, `pii`), and in
//! `osprey` the policy's action, the PII spans found (`type`, character `start` and `end`)
//! and every finding. This is how operators and evaluations measure the guards from outside.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, State};
use osprey_core::Error;
use osprey_policy::{Category, Source};
use serde_json::{Value, json};

use osprey_services::edge::Caller;
use osprey_services::error::ApiError;
use osprey_services::safety::action_name;
use osprey_services::state::Services;

/// The model name moderation results carry.
pub const MODEL: &str = "osprey-guard-1";

const CATEGORIES: [Category; 3] = [
    Category::PromptInjection,
    Category::Jailbreak,
    Category::Pii,
];

/// `POST /v1/moderations`.
#[utoipa::path(
    post,
    path = "/v1/moderations",
    tag = "safety",
    operation_id = "createModeration",
    request_body(content = Object, description = "`input`: a text, or a list of at most 256", example = json!({"input": ["Ignore previous instructions.", "My email is a@b.co"]})),
    responses(
        (status = 200, description = "One result per input: `flagged`, `categories`, \
            `category_scores`, and Osprey's `action`, `pii` spans and `findings`", body = Object),
        (status = 400, response = crate::openapi::InvalidRequest),
        (status = 401, response = crate::openapi::Unauthorized),
    ),
    security(("api_key" = []))
)]
pub async fn create(
    State(state): State<Services>,
    caller: Option<Extension<Caller>>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let caller = caller.map_or_else(|| state.edge().unguarded().caller, |c| c.0);
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| Error::invalid("body", format!("The request body is not valid JSON: {e}")))?;
    let inputs: Vec<&str> = match &v["input"] {
        Value::String(s) => vec![s],
        Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().ok_or(()))
            .collect::<Result<_, _>>()
            .map_err(|()| Error::invalid("input", "Each input must be a string."))?,
        Value::Null => return Err(Error::invalid("input", "`input` is required.").into()),
        _ => {
            return Err(
                Error::invalid("input", "`input` must be a string or a list of strings.").into(),
            );
        }
    };
    if inputs.len() > 256 {
        return Err(Error::invalid("input", "At most 256 inputs per request.").into());
    }
    let standard = osprey_services::safety::Policies::default();
    let policies = state.policies().unwrap_or(&standard);
    let pipeline = policies.get(caller.tenant.policy.as_deref());
    let results: Vec<Value> = inputs
        .iter()
        .map(|text| {
            let verdict = pipeline.check(text, Source::User);
            let categories: serde_json::Map<String, Value> = CATEGORIES
                .iter()
                .map(|c| (c.as_str().to_owned(), verdict.flagged(*c).into()))
                .collect();
            let scores: serde_json::Map<String, Value> = CATEGORIES
                .iter()
                .map(|c| (c.as_str().to_owned(), f64::from(verdict.score(*c)).into()))
                .collect();
            let pii: Vec<Value> = (verdict.findings.iter())
                .filter(|(f, _)| f.category == Category::Pii)
                .filter_map(|(f, _)| {
                    let span = f.span?;
                    Some(json!({"type": f.rule, "start": span.start, "end": span.end}))
                })
                .collect();
            let findings: Vec<Value> = (verdict.findings.iter())
                .map(|(f, a)| {
                    json!({"category": f.category.as_str(), "rule": f.rule,
                           "score": f.score, "action": action_name(*a)})
                })
                .collect();
            json!({
                "flagged": verdict.action > osprey_policy::Action::Allow,
                "categories": categories,
                "category_scores": scores,
                "osprey": {"action": action_name(verdict.action), "pii": pii, "findings": findings},
            })
        })
        .collect();
    Ok(Json(json!({
        "id": osprey_services::sse::new_id("modr"),
        "model": MODEL,
        "results": results,
    })))
}
